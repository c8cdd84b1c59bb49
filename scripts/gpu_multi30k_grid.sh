#!/usr/bin/env bash
# Multi30k on one GPU, in one lease: a small grid of recipes trained side by side, chosen on all
# of val, and the compilation-cache checks of issue 60, as one command.
#
#     bash scripts/gpu_multi30k_grid.sh OUT_DIR
#
# `pytest -m gpu` runs first, alone (TESTS=first, the default; TESTS=beside runs it beside the
# trainings, as on 2026-11-28, when it did not finish; TESTS=off skips it); its JUnit XML goes
# to OUT_DIR. Then four trainings share the GPU, each a separate process (the small model's step
# is host-bound, so processes side by side fill the GPU's idle time; each one's wall time is
# therefore an upper bound on its time alone):
#   a_s0, a_s1  configs/multi30k.py as it is (the CPU recipe: 4 + 4 layers of d_model 128)
#   b_s0, b_s1  the same with d_model 256, d_ff 1,024 and dropout 0.3 (a larger model)
# Each training ends with its own test2016 report; then each model decodes all 1,014 val
# sentences (translate.evaluate), and the ensemble of each pair (a_s0 + a_s1, b_s0 + b_s1)
# decodes val and test2016. Val chooses; test2016 is printed. On 2026-11-28 (with c_s0, 9,600
# steps at dropout 0.2, in b_s1's place) val chose the ensemble of a: 42.25 against 41.20-41.72.
#
# The cache checks: a_s0's val decoding runs twice against one fresh compilation cache (cold,
# then warm), translate-text twice over test2016.en against another; a training is stopped by
# SIGTERM at step 100 and resumed by the same command against a third, and each run's log says
# how long its train step took to compile and how many programs it read from the cache. OUT_DIR gets summary.json and summary.txt (the table), tests.xml, and grid.tar.gz
# (every log, report and metrics file).
#
# Needs the data in data/multi30k (translate-data multi30k --dir=data/multi30k) and, on a bare
# GPU machine, the wheels of scripts/fetch_gpu_wheels.sh in .whl/; carry both.
# GRID_LIMIT (seconds, default 500): every decoding after a training gets only the time left
# before it, and one that has none is skipped, so that the summary and the archive are always
# written inside a lease's command limit.
# SMOKE=1: a few steps each, val and test cut to 40 sentences: the whole script on a CPU.
set -u
T0=$(date +%s)
GRID_LIMIT=${GRID_LIMIT:-500}
left() { echo $((GRID_LIMIT - ($(date +%s) - T0))); }
. "$(dirname "$0")/gpu_common.sh"
gpu_start "${1:?usage: bash scripts/gpu_multi30k_grid.sh OUT_DIR}" "${GRID_DIR:-/tmp/gpu_grid}"
(nvidia-smi || echo "no nvidia-smi") >>"$LOG" 2>&1

DATA=data/multi30k
for f in train.en train.de val.en val.de test2016.en test2016.de; do
    if [ ! -s "$DATA/$f" ]; then
        say "missing $DATA/$f: run translate-data multi30k --dir=$DATA here and carry it"
        exit 1
    fi
done
EXTRA=()
TRAIN_BUDGET=${TRAIN_BUDGET:-330}
TEST_BUDGET=240
if [ "${SMOKE:-0}" = 1 ]; then
    mkdir -p "$W/data"
    cp "$DATA"/train.* "$W/data/"
    for f in val.en val.de test2016.en test2016.de; do head -n 40 "$DATA/$f" >"$W/data/$f"; done
    DATA=$W/data
    EXTRA=(--config.train.num_train_steps=6 --config.train.eval_every_steps=3
        --config.train.checkpoint_every_steps=3 --config.train.log_every_steps=2
        --config.train.warmup_steps=2
        --config.decode.max_extra_len=5 --config.model.num_layers=1
        --config.decode.alignment_layer=0)
    TRAIN_BUDGET=300
    TEST_BUDGET=60
fi
RECIPE=(--config=configs/multi30k.py --config.data.dir=$DATA)

(nvidia-smi dmon -s u -d 5 >"$W/dmon.txt" 2>&1 &) 2>/dev/null

gpu_tests() {
    timeout -k 10 "$TEST_BUDGET" $PY -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider \
        --junitxml="$OUT/tests.xml" >"$W/tests.log" 2>&1
    echo "exit $?" >>"$W/tests.log"
}
case ${TESTS:-first} in
    first)
        say "pytest -m gpu, alone, at most $TEST_BUDGET s"
        gpu_tests
        tail -n 4 "$W/tests.log" | tee -a "$LOG"
        ;;
    beside)
        say "pytest -m gpu, at most $TEST_BUDGET s, beside the trainings"
        gpu_tests &
        ;;
esac

secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", (b - a) / 1e9 }'; }
train() {  # NAME CACHE ARGS...: trains, then decodes all of val
    local name=$1 cache=$2 start rc
    shift 2
    start=$(date +%s%N)
    timeout -k 20 "$TRAIN_BUDGET" $PY -m translate.train "${RECIPE[@]}" --workdir="$W/$name" \
        "$@" "${EXTRA[@]}" >"$W/$name.log" 2>&1
    rc=$?
    echo "{\"name\": \"$name\", \"rc\": $rc, \"wall_s\": $(secs "$start" "$(date +%s%N)")}" \
        >"$W/$name.train.json"
    start=$(date +%s%N)
    if [ "$(left)" -gt 5 ]; then
        timeout -k 5 "$(left)" $PY -m translate.evaluate --workdir="$W/$name" \
            --src="$DATA/val.en" --ref="$DATA/val.de" --output="$W/${name}_val" \
            --compilation_cache="$cache" >"$W/${name}_val.log" 2>&1
        rc=$?
    else
        echo "skipped: GRID_LIMIT reached" >"$W/${name}_val.log"
        rc=-1
    fi
    echo "{\"rc\": $rc, \"wall_s\": $(secs "$start" "$(date +%s%N)")}" >"$W/${name}_val.json"
}
say "four trainings side by side, each at most $TRAIN_BUDGET s"
train a_s0 "$W/cc_eval" --config.train.seed=0 &
train a_s1 "" --config.train.seed=1 &
B=(--config.model.d_model=256 --config.model.d_ff=1024 --config.model.dropout_rate=0.3)
train b_s0 "" --config.train.seed=0 "${B[@]}" &
train b_s1 "" --config.train.seed=1 "${B[@]}" &

resume() {  # a training stopped by SIGTERM once it has logged step $stop, then resumed
    local stop=100 total=400 pid
    [ "${SMOKE:-0}" = 1 ] && stop=20 total=200
    local args=("${RECIPE[@]}" --workdir="$W/resume" --config.train.num_train_steps=$total
        --config.train.warmup_steps=$((total / 8)) --config.train.eval_every_steps=100000
        --config.train.log_every_steps=$((stop / 2)) --compilation_cache="$W/cc_resume")
    [ "${SMOKE:-0}" = 1 ] && args+=(--config.model.num_layers=1 --config.decode.alignment_layer=0)
    $PY -m translate.train "${args[@]}" >"$W/resume_1.log" 2>&1 &
    pid=$!
    for _ in $(seq 400); do
        grep -q "step $stop/$total" "$W/resume_1.log" && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.5
    done
    kill -TERM $pid 2>/dev/null
    wait $pid
    echo "exit $?" >>"$W/resume_1.log"
    timeout -k 20 200 $PY -m translate.train "${args[@]}" >"$W/resume_2.log" 2>&1
    echo "exit $?" >>"$W/resume_2.log"
}
resume &
wait
say "trainings done"

timed() {  # NAME COMMAND...: runs it, writes NAME.json with its exit status and wall time
    local name=$1 start rc
    shift
    start=$(date +%s%N)
    if [ "$(left)" -le 5 ]; then
        echo "skipped: GRID_LIMIT reached" >"$W/$name.log"
        echo "{\"rc\": -1, \"wall_s\": 0}" >"$W/$name.json"
        return
    fi
    timeout -k 5 "$(left)" "$@" >"$W/$name.log" 2>&1
    rc=$?
    echo "{\"rc\": $rc, \"wall_s\": $(secs "$start" "$(date +%s%N)")}" >"$W/$name.json"
}
say "the warm decodings, then the ensembles of a and of b"
timed a_s0_val_warm $PY -m translate.evaluate --workdir="$W/a_s0" --src="$DATA/val.en" \
    --ref="$DATA/val.de" --output="$W/a_s0_val_warm" --compilation_cache="$W/cc_eval"
for run in cold warm; do
    timed text_$run $PY -m translate.translate_text --workdir="$W/a_s0" \
        --input="$DATA/test2016.en" --output="$W/text_$run.de" --compilation_cache="$W/cc_text"
done
for pair in a b; do
    for split in val test2016; do
        timed ensemble_${pair}_$split $PY -m translate.evaluate --workdir="$W/${pair}_s0" \
            --workdir="$W/${pair}_s1" --src="$DATA/$split.en" --ref="$DATA/$split.de" \
            --output="$W/ensemble_${pair}_$split"
    done
done
pkill -f "nvidia-smi dmon" 2>/dev/null
say "summary"
$PY -m scripts.grid_summary "$W" "$OUT" | tee -a "$LOG"
tar -czf "$OUT/grid.tar.gz" -C "$W" --exclude='*/checkpoints' --exclude='cc_*' \
    --exclude='data' --exclude='*/data' --exclude='*/tokens' --exclude='*/tensorboard' . 2>>"$LOG"
say "done"
