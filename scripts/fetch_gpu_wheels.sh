#!/usr/bin/env bash
# Downloads the wheels a bare GPU machine lacks (sacremoses, tensorboardX) into .whl/.
#
#     bash scripts/fetch_gpu_wheels.sh        # here, with network to PyPI
#
# Both are pure-Python (py3-none-any) wheels; every package they require (click, joblib,
# regex, tqdm; numpy, packaging, protobuf) is already on the GPU machine, so they are fetched
# without dependencies. There, with .whl/ carried beside the checkout:
#
#     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#         --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#
# .whl/ is git-ignored. The versions are those of the development venv (requirements.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl sacremoses==0.2.0 tensorboardX==2.6.5
ls -l .whl
