"""The paper's base Transformer (Table 3, "base"): 6 + 6 layers, d_model 512, 8 heads, d_ff 2048.

    translate-train --config=base --workdir=DIR --config.data.dir=DATA

Trains on DATA's train, val and test .en/.de files with the paper's schedule and batch (100,000
steps of 25,000 token slots) and decodes the test set with the mean of the last 5 checkpoints;
configs/wmt14_base.py is the same model on WMT14 from TFDS. Result to expect: not measured yet
(the paper: 27.3 tokenized BLEU on WMT14 En-De newstest2014 after 12 hours on 8 P100 GPUs). Its
step alone is measured: 40.7 ms at the paper's batch, bf16, on one H100 (2026-11-28, commit
508f3c7; BENCHMARKS.md).
"""

from translate.config import Config


def get_config() -> Config:
    config = Config()
    # Sec. 6.1: the mean of the last 5 checkpoints, 10 minutes (about 1,400 steps) apart.
    config.decode.average_last = 5
    config.train.checkpoint_every_steps = 1000
    return config
