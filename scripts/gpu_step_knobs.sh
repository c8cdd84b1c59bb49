#!/usr/bin/env bash
# The training step's knobs of issue 60 on one GPU, each measured alone on it beside its
# baseline in the same call (scripts/benchmark.py, synchronous and steady state):
#
#     bash scripts/gpu_step_knobs.sh OUT_DIR
#
#   m30k_packed, m30k_trees  configs/multi30k_gpu.py's step (4,096 slots) with the arrays
#                            packed (steps.Packed, what the trainer calls) and as nnx.State trees
#                            (TREES=0 leaves the trees out: measured on 2026-11-28)
#   m30k_calls5              the packed step, five steps a call (--steps_per_call=5, a lax.scan
#                            over stacked batches): one host dispatch for five steps
#   m30k_no_graphs,          the packed step with XLA's command buffers (CUDA graphs) off, and
#   m30k_graphs_all          with every kind of thunk in them and no smallest graph size: whether
#                            launching the 1,012 kernels is the host's 13 ms (2026-11-28). A flag
#                            this XLA does not know stops its run at once, said in log.txt
#   base, base_bf16_logits   configs/base.py at the paper's batch (25,000 slots, bfloat16): the
#                            GPU's loss (train.loss_keep=logits), then with the logits rounded to
#                            bfloat16 (logits_bf16)
#   base_rbg                 the same as base with JAX's "rbg" generator for dropout's bits
#   recipe_packed            configs/multi30k.py's step (2,048 slots): the CPU recipe's, which
#                            scripts/gpu_multi30k_grid.sh trains on the GPU
# In that order (the most wanted first), each under its own time limit. OUT_DIR gets two files
# (the device tool brings back 8 at most): log.txt, and knobs.json, every finished run's
# scripts/benchmark.py JSON by name, rewritten after each run; a table of the step times is
# printed last. The
# predictions written before the first run are in docs/benchmarks/gpu-h100.md.
#
# Needs, carried: .whl/ (scripts/fetch_gpu_wheels.sh), data/multi30k, and gpu_data/ with
# opennmt_toy_ende/ and the vocabularies news37k.model and multi30k8k.model (trained here, so
# that the GPU machine trains none; scripts/gpu_lease.sh's header says how).
# ONLY=NAME,NAME,... runs those alone (ONLY=base,base_bf16_logits,base_rbg: base's knobs).
# KNOBS_LIMIT (seconds, default 480): each run gets at most the time left before it, and one
# with under 30 s left is skipped, so that the table is printed inside the lease's limit.
# SMOKE=1 shrinks every shape: the whole script on a CPU in a few minutes.
set -u
T0=$(date +%s)
KNOBS_LIMIT=${KNOBS_LIMIT:-480}
OUT=${1:?usage: bash scripts/gpu_step_knobs.sh OUT_DIR}
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1 && ! $PY -c "import sacremoses, tensorboardX" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
LOG=$OUT/log.txt
RUNS=/tmp/gpu_step_knobs
rm -rf "$RUNS" && mkdir -p "$RUNS"
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
say "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv \
    || echo "no nvidia-smi") >>"$LOG" 2>&1

NEWS=gpu_data/opennmt_toy_ende
M30K=(--src=data/multi30k/train.en --tgt=data/multi30k/train.de
    --vocab=gpu_data/multi30k8k.model)
if [ "${SMOKE:-0}" = 1 ]; then
    BASE=(--batch_tokens=512 --steps=3 --warmup=1 --config.model.num_layers=1
        --config.model.d_model=32 --config.model.num_heads=4 --config.model.d_ff=64
        --config.data.vocab_size=500)
    SMALL=(--batch_tokens=512 --steps=3 --warmup=1 --config.model.num_layers=1
        --config.decode.alignment_layer=0)
    M30K_TOKENS=512
    RECIPE_TOKENS=512
    CALLS=(--batch_tokens=512 --steps=4 --warmup=2 --steps_per_call=2
        --config.model.num_layers=1 --config.decode.alignment_layer=0)
else
    BASE=(--batch_tokens=25000 --steps=20 --warmup=3 --config.model.compute_dtype=bfloat16)
    SMALL=(--steps=50 --warmup=5)
    M30K_TOKENS=4096
    RECIPE_TOKENS=2048
    CALLS=(--steps=50 --warmup=5 --steps_per_call=5)
fi

bench() {  # NAME SECONDS ARGS...
    local name=$1 budget=$2
    shift 2
    if [ -n "${ONLY:-}" ] && [[ ",$ONLY," != *",$name,"* ]]; then
        return
    fi
    [ "${SMOKE:-0}" = 1 ] && budget=$((budget * 5))  # a CPU compiles and tokenizes slower
    local left=$((KNOBS_LIMIT - ($(date +%s) - T0)))
    if [ "$left" -lt 30 ]; then
        say "$name: skipped, $left s left of KNOBS_LIMIT"
        return
    fi
    [ "$left" -lt "$budget" ] && budget=$left
    say "$name, at most $budget s"
    timeout -k 10 "$budget" $PY -m scripts.benchmark --json="$RUNS/$name.json" "$@" >>"$LOG" 2>&1
    say "$name: exit $?"
    $PY - "$RUNS" "$OUT/knobs.json" <<'EOF'
import json, pathlib, sys
runs = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
out = pathlib.Path(sys.argv[2])
out.with_suffix(".tmp").write_text(json.dumps(runs, indent=1) + "\n")
out.with_suffix(".tmp").replace(out)
EOF
}
bench m30k_packed 70 --config=configs/multi30k_gpu.py "${M30K[@]}" "${SMALL[@]}" \
    --batch_tokens=$M30K_TOKENS
bench m30k_calls5 70 --config=configs/multi30k_gpu.py "${M30K[@]}" "${CALLS[@]}" \
    --batch_tokens=$M30K_TOKENS
[ "${TREES:-1}" = 1 ] && bench m30k_trees 70 --config=configs/multi30k_gpu.py "${M30K[@]}" \
    "${SMALL[@]}" --batch_tokens=$M30K_TOKENS --packed=false
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=" bench m30k_no_graphs 70 \
    --config=configs/multi30k_gpu.py "${M30K[@]}" "${SMALL[@]}" --batch_tokens=$M30K_TOKENS
GRAPHS=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,COLLECTIVES,CONDITIONAL,WHILE
XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_command_buffer=$GRAPHS --xla_gpu_graph_min_graph_size=1" \
    bench m30k_graphs_all 70 --config=configs/multi30k_gpu.py "${M30K[@]}" "${SMALL[@]}" \
    --batch_tokens=$M30K_TOKENS
NEWS_ARGS=(--config=configs/base.py --src=$NEWS/train.en --tgt=$NEWS/train.de
    --vocab=gpu_data/news37k.model "${BASE[@]}")
bench base 90 "${NEWS_ARGS[@]}" --config.train.loss_keep=logits
bench base_bf16_logits 120 "${NEWS_ARGS[@]}" --config.train.loss_keep=logits_bf16
JAX_DEFAULT_PRNG_IMPL=rbg bench base_rbg 90 "${NEWS_ARGS[@]}" --config.train.loss_keep=logits
bench recipe_packed 60 --config=configs/multi30k.py "${M30K[@]}" "${SMALL[@]}" \
    --batch_tokens=$RECIPE_TOKENS
say "done"
$PY - "$RUNS" <<'EOF'
import json, pathlib, sys
print(f"{'run':18} {'sync ms':>8} {'steady ms':>9} {'dispatch ms':>11} {'tokens/s steady':>15} "
      f"{'MFU pub.':>8} {'peak GiB':>8}")
for name in ("m30k_packed", "m30k_calls5", "m30k_trees", "m30k_no_graphs", "m30k_graphs_all", "base",
             "base_bf16_logits", "base_rbg", "recipe_packed"):
    try:
        r = json.loads((pathlib.Path(sys.argv[1]) / f"{name}.json").read_text())
    except (OSError, ValueError):
        print(f"{name:18} missing")
        continue
    def get(key, scale=1.0, spec=".1f"):
        value = r.get(key)
        return "-" if value is None else format(value * scale, spec)
    print(f"{name:18} {get('step_seconds_median', 1e3):>8} {get('steady_step_seconds', 1e3):>9} "
          f"{get('steady_dispatch_seconds', 1e3):>11} "
          f"{get('train_tgt_tokens_per_sec_steady', 1, '.0f'):>15} "
          f"{get('mfu_published_steady', 100):>8} {get('peak_memory_bytes', 2**-30, '.2f'):>8}")
EOF
