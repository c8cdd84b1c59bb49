"""The Multi30k recipe (configs/multi30k.py) with a decoder-only Transformer of the same size.

    translate-data multi30k --dir=data/multi30k      # once
    translate-train --config=multi30k_decoder_only --workdir=/tmp/multi30k_decoder_only \
        [--config.model.prefix_attention=bidirectional]

One causal stack reads `source <sep> target` and is scored on the target (translate/models/
decoder_only.py); `--config.model.prefix_attention=bidirectional` makes it a prefix LM. The
stack has as many layers as the recipe's encoder and decoder together (2N) and the feed-forward
width that brings its parameters to the recipe's (the test suite holds them within 5%).
Everything else (data, batch, schedule, steps) is the recipe's, whatever it currently is.
Result to expect: not measured yet on the current recipe (docs/variants.md).
"""

import pathlib

import jax

from translate.config import Config, load_config
from translate.models.factory import abstract_model


def num_params(config: Config) -> int:
    _, shapes = abstract_model(config, config.data.vocab_size)
    return sum(x.size for x in jax.tree.leaves(shapes))


def get_config() -> Config:
    config = load_config(pathlib.Path(__file__).with_name("multi30k.py"))
    target = num_params(config)
    m = config.model
    m.architecture = "decoder_only"
    m.num_layers = 2 * m.num_layers
    # Parameters grow linearly with d_ff: solve for the width that matches, a multiple of 8.
    m.d_ff = 8
    at_8 = num_params(config)
    m.d_ff = 16
    per_unit = (num_params(config) - at_8) / 8
    m.d_ff = max(8, 8 * round((8 + (target - at_8) / per_unit) / 8))
    return config
