"""The paper's big Transformer (Table 3, "big"): d_model 1024, d_ff 4096, 16 heads, dropout 0.3.

    python -m translate.train --config=configs/big.py --workdir=DIR --config.data.dir=DATA

The paper trained it for 300,000 steps (3.5 days on 8 P100 GPUs) and reported 28.4 tokenized
BLEU on WMT14 En-De newstest2014 (it used dropout 0.1 for En-Fr). configs/wmt14_big.py applies
`make_big` to the WMT14 data of configs/wmt14_base.py.
"""

from translate.config import Config


def make_big(config: Config) -> Config:
    """`config` with the big model, its 300,000 steps and its checkpoint averaging."""
    config.model.d_model = 1024
    config.model.d_ff = 4096
    config.model.num_heads = 16
    config.model.dropout_rate = 0.3
    config.train.num_train_steps = 300_000
    # Sec. 6.1: the mean of the last 20 checkpoints, written at 10-minute intervals: about 600
    # of the paper's 1.0 s big-model steps (300,000 in 3.5 days).
    config.decode.average_last = 20
    config.train.keep_checkpoints = 20
    config.train.checkpoint_every_steps = 600
    return config


def get_config() -> Config:
    return make_big(Config())
