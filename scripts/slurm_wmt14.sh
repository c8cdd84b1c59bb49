#!/bin/bash
# Train the paper's WMT14 En->De Transformer on several GPU hosts under SLURM.
#
#   sbatch --nodes=2 scripts/slurm_wmt14.sh                          # base, 2 x 8 GPUs
#   CONFIG=configs/wmt14_big.py WORKDIR=runs/wmt14_big sbatch --nodes=4 scripts/slurm_wmt14.sh
#
# One SLURM task per GPU: every task runs the same command, and translate.train calls
# jax.distributed.initialize() (sharding.initialize_distributed), which reads the coordinator,
# the task count and the task id from SLURM and gives each task the GPU numbered by its
# SLURM_LOCALID. So the tasks of a node must all see the node's GPUs: do not bind one GPU per
# task (no --gpus-per-task / --gpu-bind), or GPU SLURM_LOCALID would not exist in the task.
#
# WORKDIR and the TFDS data directory must be on a filesystem every node sees: Orbax writes
# one checkpoint from all processes together, and every process reads the same prepared data
# (process 0 prepares what is missing first) and loads only its own rows of each batch. The
# global batch stays at the config's ~25,000 tokens per side whatever the number of GPUs;
# re-running the script resumes from the newest checkpoint.
# Afterwards, evaluate as the paper did (average of the last 5 checkpoints; 20 for big):
#   python -m translate.evaluate --workdir=$WORKDIR --average=5 --src=... --ref=...
#
#SBATCH --job-name=wmt14
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --time=24:00:00
#SBATCH --output=%x-%j.out

set -euo pipefail

CONFIG=${CONFIG:-configs/wmt14_base.py}
WORKDIR=${WORKDIR:-runs/wmt14_base}

# jax.distributed.initialize() picks its port from the job id; override with JAX_COORDINATOR_PORT.
srun --kill-on-bad-exit=1 python -m translate.train --config="$CONFIG" --workdir="$WORKDIR" "$@"
