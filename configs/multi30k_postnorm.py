"""The Multi30k recipe (configs/multi30k.py) with the paper's post-LayerNorm.

    translate-data multi30k --dir=data/multi30k      # once
    translate-train --config=multi30k_postnorm --workdir=/tmp/multi30k_postnorm

Everything but the position of each LayerNorm follows the recipe, whatever it currently is: each
sub-layer computes LayerNorm(x + Dropout(Sublayer(x))) (Sec. 5.4) and the stacks end without a
LayerNorm of their own, 2 x 2 x d_model parameters fewer than the recipe's pre-LayerNorm
(Xiong et al. 2020). Result to expect: not measured yet on the current recipe
(docs/variants.md).
"""

import pathlib

from translate.config import Config, load_config


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    config.model.norm_position = "post"
    return config
