"""A small Transformer for CPUs and quick experiments: 2+2 layers, d_model 256, 4 heads, d_ff 1024.

    python -m translate.train --config=configs/small.py --workdir=DIR --config.data.dir=DATA

The size of the small model measured against Flax's examples/wmt in BENCHMARKS.md
(`scripts/benchmark.py --config=configs/small.py ...`). Rows of 128 slots suit sentences of
news length; a batch is 2,048 target token slots, about what two CPU cores take in a step.
"""

from translate.config import Config


def get_config() -> Config:
    config = Config()
    config.model.num_layers = 2
    config.model.d_model = 256
    config.model.num_heads = 4
    config.model.d_ff = 1024
    config.data.vocab_size = 8000
    config.data.max_len = 128
    config.data.row_len = 128
    config.data.tokens_per_batch = 2048
    return config
