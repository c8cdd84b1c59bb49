# The setup the GPU lease scripts share (scripts/gpu_recipe_visit.sh, gpu_multi30k_grid.sh):
#
#     . "$(dirname "$0")/gpu_common.sh"
#     gpu_start OUT_DIR WORK_DIR
#
# goes to the checkout's root, makes OUT_DIR (relative to that root) and sets OUT to its
# absolute path, installs the wheels carried in .whl/ (scripts/fetch_gpu_wheels.sh) when the
# machine lacks them, empties WORK_DIR into W, and sets PY (the python to run), LOG
# (OUT/log.txt) and `say` (a timestamped line, printed and appended to LOG), whose first line
# names the commit (COMMIT, else git's HEAD).
gpu_start() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
    mkdir -p "$1"
    OUT=$(cd "$1" && pwd)
    export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
    PY=${PYTHON:-python3}
    if ls .whl/*.whl >/dev/null 2>&1 && ! $PY -c "import sacremoses, tensorboardX" 2>/dev/null; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
    fi
    W=$2
    rm -rf "$W" && mkdir -p "$W"
    LOG=$OUT/log.txt
    say "commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}"
}

say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
