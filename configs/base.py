"""The paper's base Transformer (Table 3, "base"): N=6, d_model 512, 8 heads, d_ff 2048.

    python -m translate.train --config=configs/base.py --workdir=DIR --config.data.dir=DATA

DATA holds train/val/test .en/.de files. The paper trained this model on WMT14 En-De for
100,000 steps (12 hours on 8 P100 GPUs) and reported 27.3 tokenized BLEU on newstest2014.
"""

from translate.config import Config


def get_config() -> Config:
    config = Config()
    # Sec. 6.1: the base model is evaluated with the mean of its last 5 checkpoints, written at
    # 10-minute intervals (about 1,400 of its 0.43 s steps); 1,000 steps apart here.
    config.decode.average_last = 5
    config.train.checkpoint_every_steps = 1000
    return config
