"""A small Transformer for CPUs and quick experiments: 2+2 layers, d_model 256, 4 heads, d_ff 1024.

    translate-train --config=small --workdir=DIR --config.data.dir=DATA

Trains on DATA's train, val and test .en/.de files with the paper's schedule (100,000 steps), in
batches of 2,048 target token slots, about what two CPU cores take in a step. Result to expect:
not measured yet. Its training step is measured against Flax's examples/wmt on the same batches:
2,814 target tokens/s on 2 AMD EPYC vCPUs, 1.36x Flax's (2026-11-21, commit e79e1df;
BENCHMARKS.md, "Training speed on the CPU").
"""

from translate.config import Config


def get_config() -> Config:
    config = Config()
    config.model.num_layers = 2
    config.model.d_model = 256
    config.model.num_heads = 4
    config.model.d_ff = 1024
    config.data.vocab_size = 8000
    config.data.max_len = 128  # rows of 128 slots suit sentences of news length
    config.data.row_len = 128
    config.data.tokens_per_batch = 2048
    return config
