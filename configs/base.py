"""The paper's base Transformer (Table 3, "base"): N=6, d_model 512, 8 heads, d_ff 2048.

    python -m translate.train --config=configs/base.py --workdir=DIR --config.data.dir=DATA

DATA holds train/val/test .en/.de files. The paper trained this model on WMT14 En-De for
100,000 steps (12 hours on 8 P100 GPUs) and reported 27.3 tokenized BLEU on newstest2014.
"""

from translate.config import Config


def get_config() -> Config:
    return Config()
