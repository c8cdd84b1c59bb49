#!/usr/bin/env bash
# The GPU checks that fit one short lease (at most 9 min 25 s of commands), in order of value:
#
#   1. the GPU tests (`pytest -m gpu tests/test_gpu.py`), each stopped after 120 s, all after 150 s;
#   2. training speed at the paper's batch (25,000 target token slots, bf16) in the synchronous
#      and the steady-state modes (scripts/benchmark.py): base and big with the GPU's loss path
#      (train.loss_keep=logits), then base with the CPU's (exp), for the difference;
#   3. the Multi30k GPU config's step (configs/multi30k_gpu.py, 4,096 tokens) in both modes,
#      with the host's time per step and a profile of 5 steps: host-bound or launch-bound;
#      then the same step on nnx.State trees (--packed=false), for what steps.Packed saves.
#
#     bash scripts/gpu_lease.sh OUT_DIR [COMMIT]
#
# Needs what scripts/gpu_check.py needs (its docstring): the wheels in .whl/ and the data in
# gpu_data/, plus two vocabularies trained where the data is, so the GPU machine trains none:
# gpu_data/news37k.model (configs/base.py's 37,000 pieces on opennmt_toy_ende) and
# gpu_data/multi30k8k.model (8,000 on multi30k), as scripts.benchmark would train them.
# Writes 8 files (the device tool's limit), each as soon as it is ready: log.txt (nvidia-smi's
# table first), tests.xml, one JSON per benchmark and profile_multi30k.json (the profile's summary).
# SMOKE=1 shrinks every shape so that the whole script runs on a CPU in a few minutes.
set -u
OUT=${1:?usage: bash scripts/gpu_lease.sh OUT_DIR [COMMIT]}
COMMIT=${2:-}
cd "$(dirname "$0")/.."
rm -rf /tmp/gpu_lease && mkdir -p "$OUT" /tmp/gpu_lease
export PYTHONUNBUFFERED=1
LOG=$OUT/log.txt
PY=${PYTHON:-python3}
if ls .whl/*.whl >/dev/null 2>&1 && ! $PY -c "import sacremoses, tensorboardX" 2>/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
say "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
(nvidia-smi || echo "no nvidia-smi") >>"$LOG" 2>&1

NEWS=gpu_data/opennmt_toy_ende
if [ "${SMOKE:-0}" = 1 ]; then
    BASE_SHAPE=(--batch_tokens=512 --steps=4 --warmup=1 --config.model.num_layers=1
        --config.model.d_model=32 --config.model.num_heads=4 --config.model.d_ff=64
        --config.data.vocab_size=500)
    M30K_SHAPE=(--batch_tokens=512 --steps=4 --warmup=1 --config.model.num_layers=1)
    TEST_BUDGET=60
else
    BASE_SHAPE=(--batch_tokens=25000 --steps=20 --warmup=3 --config.model.compute_dtype=bfloat16)
    M30K_SHAPE=(--batch_tokens=4096 --steps=50 --warmup=5)
    TEST_BUDGET=150
fi

say "GPU tests (pytest -m gpu), at most ${TEST_BUDGET} s"
TIMEOUT_FLAG=()
$PY -c "import pytest_timeout" 2>/dev/null && TIMEOUT_FLAG=(--timeout=120)
timeout -k 10 "$TEST_BUDGET" $PY -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider \
    "${TIMEOUT_FLAG[@]}" --junitxml="$OUT/tests.xml" >>"$LOG" 2>&1
say "GPU tests: exit $?"

bench() {  # NAME SECONDS ARGS...
    local name=$1 budget=$2
    shift 2
    say "benchmark $name, at most $budget s"
    timeout -k 10 "$budget" $PY -m scripts.benchmark --json="$OUT/$name.json" "$@" \
        >>"$LOG" 2>&1
    say "benchmark $name: exit $?"
}
bench base_logits 90 --config=configs/base.py --src=$NEWS/train.en --tgt=$NEWS/train.de \
    --vocab=gpu_data/news37k.model "${BASE_SHAPE[@]}" --config.train.loss_keep=logits
bench big_logits 100 --config=configs/big.py --src=$NEWS/train.en --tgt=$NEWS/train.de \
    --vocab=gpu_data/news37k.model "${BASE_SHAPE[@]}" --config.train.loss_keep=logits
bench base_exp 95 --config=configs/base.py --src=$NEWS/train.en --tgt=$NEWS/train.de \
    --vocab=gpu_data/news37k.model "${BASE_SHAPE[@]}" --config.train.loss_keep=exp
bench multi30k 70 --config=configs/multi30k_gpu.py --src=gpu_data/multi30k/train.en \
    --tgt=gpu_data/multi30k/train.de --vocab=gpu_data/multi30k8k.model "${M30K_SHAPE[@]}" \
    --profile=/tmp/gpu_lease/profile_multi30k
bench multi30k_trees 60 --config=configs/multi30k_gpu.py --src=gpu_data/multi30k/train.en \
    --tgt=gpu_data/multi30k/train.de --vocab=gpu_data/multi30k8k.model "${M30K_SHAPE[@]}" \
    --packed=false

cp /tmp/gpu_lease/profile_multi30k/profile_summary.json "$OUT/profile_multi30k.json" 2>/dev/null
say "done"
grep -E "^(== |tests/|[0-9]+ passed|FAILED|ERROR|step time|steady state|host per step|MFU|target tokens/s|peak memory|time summed)" "$LOG" | tail -60
