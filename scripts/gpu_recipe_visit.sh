#!/usr/bin/env bash
# Issue 60's GPU recipe as a user runs it, then the caches warm, as one device command:
#
#     bash scripts/gpu_recipe_visit.sh OUT_DIR
#
#   1. `scripts/multi30k_gpu_ensemble.sh` alone on the GPU from a fresh compilation cache: two
#      seeds of configs/multi30k.py trained side by side to the end, each with its own test2016
#      report, then their ensemble decoding val and test2016. Its own wall time is the whole
#      command's, as a user feels it (issue 60: at least 41 on test2016 within 10 minutes).
#   2. translate-text over test2016.en with seed 0's model, cold then warm against a new cache
#      (the saved searches: the warm one should trace and compile nothing).
#   3. `pytest -m gpu`, alone (tests.xml in OUT_DIR).
#   4. The ensemble's val decoding again, against the cache the first run filled: the warm
#      second translate-evaluate, its wall time and how many programs it read from the cache.
# Steps 2 and 4 count what JAX traced and compiled (jax_log_compiles) in their logs.
# RECIPE_ARGS: flags for both trainings of step 1 (RECIPE_ARGS=--config.train.steps_per_call=5).
# VISIT_LIMIT (seconds, default 575): steps 2-4 each get only the time left before it, and
# are skipped with under 10 s, so that the files below are always written inside the command's
# limit. OUT_DIR gets log.txt (the lines a person reads, each step's wall time and exit status)
# and runs.tar.gz (every log, report and hypothesis file; no checkpoints or caches).
# Needs data/multi30k and, on a bare GPU machine, the wheels of scripts/fetch_gpu_wheels.sh in
# .whl/; carry both. SMOKE=1: a few steps, val and test cut to 40 sentences, on a CPU.
set -u
T0=$(date +%s)
VISIT_LIMIT=${VISIT_LIMIT:-575}
left() { echo $((VISIT_LIMIT - ($(date +%s) - T0))); }
. "$(dirname "$0")/gpu_common.sh"
gpu_start "${1:?usage: bash scripts/gpu_recipe_visit.sh OUT_DIR}" "${VISIT_DIR:-/tmp/gpu_recipe_visit}"
(nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv \
    || echo "no nvidia-smi") >>"$LOG" 2>&1
(command -v nvidia-smi >/dev/null && nvidia-smi dmon -s u -d 5 >"$W/dmon.txt" 2>&1 &) 2>/dev/null

DATA=data/multi30k
EXTRA=()
if [ "${SMOKE:-0}" = 1 ]; then
    mkdir -p "$W/data"
    cp "$DATA"/train.* "$W/data/"
    for f in val.en val.de test2016.en test2016.de; do head -n 40 "$DATA/$f" >"$W/data/$f"; done
    DATA=$W/data
    EXTRA=(--config.data.dir=$DATA --config.train.num_train_steps=6
        --config.train.eval_every_steps=3 --config.train.checkpoint_every_steps=3
        --config.train.log_every_steps=2 --config.train.warmup_steps=2
        --config.decode.max_extra_len=5 --config.model.num_layers=1
        --config.decode.alignment_layer=0)
fi

timed() {  # NAME SECONDS COMMAND...: runs it under the time left, logs its exit and wall time
    local name=$1 budget=$2 start rc
    shift 2
    [ "$(left)" -lt "$budget" ] && budget=$(left)
    if [ "$budget" -lt 10 ]; then
        say "$name: skipped, $(left) s left of VISIT_LIMIT"
        return
    fi
    say "$name, at most $budget s"
    start=$(date +%s%N)
    timeout -k 10 "$budget" "$@" >"$W/$name.log" 2>&1
    rc=$?
    say "$name: exit $rc, $(awk -v a="$start" -v b="$(date +%s%N)" \
        'BEGIN { printf "%.1f", (b - a) / 1e9 }') s"
}

# 1. The recipe from a fresh cache (the default cache location, emptied: as on a new machine).
export TRANSLATE_COMPILATION_CACHE=$W/cache
# shellcheck disable=SC2086  # RECIPE_ARGS: several flags, split on spaces
timed recipe "$(left)" bash scripts/multi30k_gpu_ensemble.sh "$W/ens" "${EXTRA[@]}" ${RECIPE_ARGS:-}
tail -n 6 "$W/recipe.log" | tee -a "$LOG"
for seed in 0 1; do
    grep -h -E "compiled|steps/s" "$W/ens/s$seed.log" | head -n 4 | sed "s/^/s$seed: /" >>"$LOG"
done

# Steps 2 and 4 log each program JAX traces and compiles (jax_log_compiles): counted here.
export JAX_LOG_COMPILES=1
compiles() {  # LOG: how many functions were traced and compiled, and how many XLA compiles
    # were persistent-cache hits (a compile that read its program from the cache is still logged)
    [ -f "$1" ] || return 0
    say "$(basename "$1"): traced $(grep -c "Finished tracing" "$1"), XLA compiles" \
        "$(grep -c "Finished XLA compilation" "$1"), of them persistent-cache hits" \
        "$(grep -c "Persistent compilation cache hit" "$1")"
}

# 2. translate-text, cold then warm, against a cache of its own.
for run in cold warm; do
    timed text_$run 120 $PY -m translate.translate_text --workdir="$W/ens/s0" \
        --input="$DATA/test2016.en" --output="$W/text_$run.de" --compilation_cache="$W/cc_text"
    compiles "$W/text_$run.log"
done
cmp -s "$W/text_cold.de" "$W/text_warm.de" && say "text: cold and warm outputs identical" \
    || say "text: cold and warm outputs DIFFER (or one is missing)"

# 3. The GPU tests, alone, with the time left (they took 141 s on 2026-11-26).
TIMEOUT_FLAG=()
$PY -c "import pytest_timeout" 2>/dev/null && TIMEOUT_FLAG=(--timeout=120)
unset JAX_LOG_COMPILES
timed gpu_tests 240 $PY -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider \
    "${TIMEOUT_FLAG[@]}" --junitxml="$OUT/tests.xml"
tail -n 3 "$W/gpu_tests.log" | tee -a "$LOG"
export JAX_LOG_COMPILES=1

# 4. The ensemble's val decoding again, warm.
timed ensemble_val_warm 120 $PY -m translate.evaluate --workdir="$W/ens/s0" \
    --workdir="$W/ens/s1" --src="$DATA/val.en" --ref="$DATA/val.de" \
    --output="$W/ens/ensemble_val_warm"
grep -h -E "^sacreBLEU|^speed" "$W/ensemble_val_warm.log" | head -n 4 | tee -a "$LOG"
compiles "$W/ensemble_val_warm.log"

pkill -f "nvidia-smi dmon" 2>/dev/null
tar -czf "$OUT/runs.tar.gz" -C "$W" --exclude='*/checkpoints' --exclude='cache' \
    --exclude='cc_*' --exclude='data' --exclude='*/tokens' --exclude='*/tensorboard' . 2>>"$LOG"
say "done in $(($(date +%s) - T0)) s"
