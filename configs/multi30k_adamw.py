"""The Multi30k recipe (configs/multi30k.py) with AdamW for every parameter and 7,200 steps.

    translate-data multi30k --dir=data/multi30k      # once
    translate-train --config=multi30k_adamw --workdir=/tmp/multi30k_adamw

The recipe before Muon: everything else (model, data, schedule, decoding) is
configs/multi30k.py's. Expect, on 2 Intel Xeon vCPUs (AVX-512 BF16; 2026-11-28/29, commits
370a054 and c9af50f), 35 min 3 s for the whole command from a fresh clone; val 41.45 / 41.21 /
40.77 for seeds 0-2 (mean 41.14), test2016 sacreBLEU mean 40.57 (BENCHMARKS.md).

On one GPU, `bash scripts/multi30k_gpu_ensemble.sh WORKDIR` trains two seeds of it side by side
and ensembles them: test2016 41.66 in 4 min 28 s for the whole script on one H200 (2026-11-28,
commit 72042fa).
"""

import pathlib

from translate.config import Config, load_config


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    config.train.optimizer = "adam"
    config.train.num_train_steps = 7200
    config.model.dropout_bits = "threefry"  # measured with JAX's bits, whatever the default
    return config
