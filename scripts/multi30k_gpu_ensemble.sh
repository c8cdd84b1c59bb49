#!/usr/bin/env bash
# Multi30k on one GPU as an ensemble, one command: two seeds of configs/multi30k_adamw.py (AdamW,
# 7,200 steps, threefry dropout bits) trained side by side on the GPU, then decoded together.
# Muon (configs/multi30k.py) and hash dropout bits have not run on a GPU.
#
#     bash scripts/multi30k_gpu_ensemble.sh WORKDIR [--config.SECTION.FIELD=VALUE ...]
#
# The small model's step is host-bound on a GPU (6.1 ms of GPU work in a 15 ms step on one H100,
# BENCHMARKS.md), so a second training in another process costs the first little. The seeds
# train in WORKDIR/s0 and WORKDIR/s1 (logs appended to WORKDIR/s0.log, s1.log), each ending with
# its test2016 report; then their ensemble decodes all of val and test2016 (translate-evaluate
# with two --workdir) into WORKDIR/ensemble_val and ensemble_test2016. Flags after WORKDIR go to
# both trainings (--config.model.d_model=256 --config.model.d_ff=1024 for a wider model). The
# last lines printed: the reports' scores and the whole command's wall time.
#
# One H200 from an empty compilation cache (2026-11-28, 72042fa): 268 s for the whole command;
# ensemble val 42.48, test2016 41.66 (literature BLEU 42.05); the seeds alone 41.25 and 40.52 on
# test2016 (BENCHMARKS.md, "Multi30k on one GPU"). `python -m scripts.gpu_check --phase=multi30k`
# runs it and collects the reports.
#
# Needs data/multi30k (translate-data multi30k --dir=data/multi30k) or --config.data.dir=DIR. A
# WORKDIR holding another run is refused by the trainer; an interrupted command resumes when run
# again; one whose ensemble is decoded is refused.
set -u
WORK=${1:?usage: bash scripts/multi30k_gpu_ensemble.sh WORKDIR [--config.x=y ...]}
shift
PY=${PYTHON:-python3}
START=$(date +%s)
DATA=data/multi30k
for arg in "$@"; do
    case $arg in --config.data.dir=*) DATA=${arg#--config.data.dir=} ;; esac
done
for f in val.en val.de test2016.en test2016.de; do
    if [ ! -s "$DATA/$f" ]; then
        echo "multi30k_gpu_ensemble: $DATA/$f is missing: run translate-data multi30k --dir=$DATA" >&2
        exit 2
    fi
done
for split in val test2016; do
    if [ -e "$WORK/ensemble_$split" ]; then
        echo "multi30k_gpu_ensemble: $WORK/ensemble_$split exists: this WORKDIR's ensemble is" \
            "decoded already; give a new WORKDIR (nothing was changed)" >&2
        exit 2
    fi
done
mkdir -p "$WORK" || exit 2

pids=()
for seed in 0 1; do
    echo "training seed $seed in $WORK/s$seed (log: $WORK/s$seed.log)"
    $PY -m translate.train --config=configs/multi30k_adamw.py --workdir="$WORK/s$seed" \
        --config.train.seed=$seed "$@" >>"$WORK/s$seed.log" 2>&1 &
    pids+=($!)
done
failed=0
for i in 0 1; do
    if ! wait "${pids[$i]}"; then
        echo "multi30k_gpu_ensemble: seed $i's training failed; its log's end:" >&2
        tail -n 5 "$WORK/s$i.log" >&2
        failed=1
    fi
done
[ $failed = 0 ] || exit 1
for seed in 0 1; do
    grep -h "test: sacreBLEU" "$WORK/s$seed.log" | tail -n 1 | sed "s/^[0-9:]* test:/seed $seed, test2016:/"
done
for split in val test2016; do
    $PY -m translate.evaluate --workdir="$WORK/s0" --workdir="$WORK/s1" \
        --src="$DATA/$split.en" --ref="$DATA/$split.de" --output="$WORK/ensemble_$split" \
        >"$WORK/ensemble_$split.log" 2>&1 || {
        echo "multi30k_gpu_ensemble: the ensemble's $split decoding failed:" >&2
        tail -n 5 "$WORK/ensemble_$split.log" >&2
        exit 1
    }
    echo "ensemble, $split: $(grep -m1 '^sacreBLEU' "$WORK/ensemble_$split.log")"
done
echo "whole command: $(($(date +%s) - START)) s"
