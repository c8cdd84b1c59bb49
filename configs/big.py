"""The paper's big Transformer (Table 3, "big"): d_model 1024, d_ff 4096, 16 heads, dropout 0.3.

    translate-train --config=big --workdir=DIR --config.data.dir=DATA

Trains on DATA's train, val and test .en/.de files for 300,000 steps of 25,000 token slots and
decodes the test set with the mean of the last 20 checkpoints; configs/wmt14_big.py applies
`make_big` to the WMT14 data of configs/wmt14_base.py. Result to expect: not measured yet (the
paper: 28.4 tokenized BLEU on WMT14 En-De newstest2014 after 3.5 days on 8 P100 GPUs, with
dropout 0.1 for En-Fr). Its step alone is measured: 88.7 ms at the paper's batch, bf16, on one
H100 (2026-11-26, commit c8cb3ea; BENCHMARKS.md).
"""

from translate.config import Config


def make_big(config: Config) -> Config:
    """`config` with the big model, its 300,000 steps and its checkpoint averaging."""
    config.model.d_model = 1024
    config.model.d_ff = 4096
    config.model.num_heads = 16
    config.model.dropout_rate = 0.3
    config.train.num_train_steps = 300_000
    # Sec. 6.1: the mean of the last 20 checkpoints, 10 minutes (about 600 steps) apart.
    config.decode.average_last = 20
    config.train.keep_checkpoints = 20
    config.train.checkpoint_every_steps = 600
    return config


def get_config() -> Config:
    return make_big(Config())
