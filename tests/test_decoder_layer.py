"""One decoder layer, one path: full, block (prefix) and step decoding all call the layer."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_model import unpacked_batch

from translate.config import ModelConfig
from translate.data.tokenizer import BOS_ID, EOS_ID
from translate.models import layers
from translate.models.factory import make_model

VOCAB = 40
# Sources of different lengths (trailing padding), as the search gives them.
SRC = jnp.array([[5, 6, 7, 8, 9, 10, EOS_ID, 0], [11, 12, EOS_ID, 0, 0, 0, 0, 0]])
TGT = jnp.array([[BOS_ID, 14, 15, 16, 17, 18], [BOS_ID, 19, 20, 21, 22, 23]])
# The layer class each architecture's decoding stack is made of.
LAYER = {"encoder_decoder": layers.DecoderLayer, "decoder_only": layers.EncoderLayer}


def tiny(architecture, norm_position, **fields):
    config = ModelConfig(
        num_layers=2,
        d_model=32,
        num_heads=4,
        d_ff=64,
        compute_dtype="float32",
        architecture=architecture,
        norm_position=norm_position,
        **fields,
    )
    return make_model(config, VOCAB, nnx.Rngs(0))


def three_ways(model):
    """Logits [B, T, V] of the full forward pass, of one decode_block, and of decode_step."""
    full = model(unpacked_batch(SRC, TGT))
    segments = (SRC > 0).astype(jnp.int32)
    block, _ = model.decode_block(TGT, model.prefill(SRC, segments, 1, 8))
    cache = model.prefill(SRC, segments, 1, 8)
    steps = []
    for t in range(TGT.shape[1]):
        logits, cache = model.decode_step(TGT[:, t], jnp.array(t), cache)
        steps.append(logits)
    return np.asarray(full), np.asarray(block), np.asarray(jnp.stack(steps, axis=1))


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only"])
def test_cached_block_and_step_decoding_equal_the_full_forward_pass(architecture, norm_position):
    full, block, steps = three_ways(tiny(architecture, norm_position))
    np.testing.assert_allclose(block, full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5)


# Today's blocks alone and together: each acts in the layers, and positions in self-attention,
# so full, block and step decoding must agree under every one of them.
SWITCHES = {
    "rotary": {"positions": "rotary"},
    "relative": {"positions": "relative"},
    "rmsnorm": {"normalization": "rmsnorm"},
    "gelu": {"feed_forward": "gelu"},
    "swiglu": {"feed_forward": "swiglu"},
    "geglu": {"feed_forward": "geglu"},
    "grouped": {"num_kv_heads": 2},
    "multi-query": {"num_kv_heads": 1},
    "no-bias": {"use_bias": False},
    "rotary-grouped-geglu-rmsnorm": {
        "positions": "rotary",
        "num_kv_heads": 2,
        "feed_forward": "geglu",
        "normalization": "rmsnorm",
    },
    "relative-multi-query-swiglu": {
        "positions": "relative",
        "num_kv_heads": 1,
        "feed_forward": "swiglu",
        "use_bias": False,
    },
}


ALONE_ELSEWHERE = pytest.mark.slow(
    reason="each switch alone under pre-norm and in the decoder-only model (about 1.5 s each "
    "on 2 cores): each stays alone in the post-norm encoder-decoder and in the two "
    "combinations on all three, in the default run"
)


@pytest.mark.parametrize(
    "architecture, norm_position, switch",
    [
        pytest.param(
            architecture,
            norm,
            switch,
            marks=[ALONE_ELSEWHERE] if norm == "pre" and len(SWITCHES[switch]) == 1 else [],
        )
        for architecture, norm in [
            ("encoder_decoder", "post"),
            ("encoder_decoder", "pre"),
            ("decoder_only", "pre"),
        ]
        for switch in SWITCHES
    ],
)
def test_todays_blocks_decode_in_blocks_and_steps_as_the_full_pass(
    architecture, norm_position, switch
):
    full, block, steps = three_ways(tiny(architecture, norm_position, **SWITCHES[switch]))
    np.testing.assert_allclose(block, full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5)


def test_a_prefix_lm_with_relative_positions_decodes_as_the_full_pass():
    # Its source tokens see keys after them: the relative bias's bidirectional buckets.
    model = tiny("decoder_only", "post", positions="relative", prefix_attention="bidirectional")
    full, block, steps = three_ways(model)
    np.testing.assert_allclose(block, full, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only"])
def test_a_change_to_the_layer_reaches_full_block_and_step_decoding(architecture, monkeypatch):
    # A change made once, in the layer's own call (here: its output shifted), must reach every
    # way of decoding and keep them equal: none of them assembles the layer from its parts.
    model = tiny(architecture, "post")
    before = three_ways(model)
    layer_class = LAYER[architecture]
    original = layer_class.__call__
    modes = set()

    def shifted(self, *args, **kwargs):
        slots = kwargs.get("slots")
        modes.add("full" if slots is None else "step" if slots.step else "block")
        y, cache = original(self, *args, **kwargs)
        return y + 0.25, cache

    monkeypatch.setattr(layer_class, "__call__", shifted)
    after = three_ways(model)
    assert modes == {"full", "block", "step"}
    for old, new in zip(before, after):
        assert not np.allclose(old, new, atol=1e-3)
    np.testing.assert_allclose(after[1], after[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(after[2], after[0], rtol=1e-5, atol=1e-5)
