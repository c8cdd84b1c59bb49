"""The Multi30k CPU recipe (configs/multi30k.py) with the paper's post-LayerNorm: the variant.

    python -m translate.train --config=configs/multi30k_postnorm.py \
        --workdir=/tmp/multi30k_postnorm --config.data.dir=../shared/data/multi30k

Everything but the position of each LayerNorm follows the recipe, whatever it currently is: each
sub-layer computes LayerNorm(x + Dropout(Sublayer(x))) (Sec. 5.4) and the stacks end without a
LayerNorm of their own, 2 x 2 x d_model parameters fewer than the recipe's pre-LayerNorm
(Xiong et al. 2020). Not measured on the current recipe, so no time or BLEU to expect yet;
docs/benchmarks/config-history.md has it on an earlier one.
"""

import pathlib

from translate.config import Config, load_config


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    config.model.norm_position = "post"
    return config
