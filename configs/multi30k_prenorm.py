"""The Multi30k CPU recipe (configs/multi30k.py) with pre-LayerNorm: the variant, on equal terms.

    python -m translate.train --config=configs/multi30k_prenorm.py --workdir=/tmp/multi30k_prenorm \
        --config.data.dir=../shared/data/multi30k

Everything but the position of each LayerNorm follows the recipe, whatever it currently is: each
sub-layer computes x + Dropout(Sublayer(LayerNorm(x))) and each stack ends in a LayerNorm
(Xiong et al. 2020), which adds 2 x 2 x d_model parameters. Measured: the README's variants
table (test2016 35.50 against the recipe's 35.36, at 13f3c10).
"""

import pathlib

from translate.config import Config, load_config


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    config.model.norm_position = "pre"
    return config
