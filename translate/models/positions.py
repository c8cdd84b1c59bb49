"""Where tokens are: the three position schemes of `model.positions`.

- "sinusoidal" (Sec. 3.5): a fixed vector per position, added to the embeddings once.
- "rotary" (Su et al. 2021, RoFormer): each self-attention's queries and keys are turned, pair
  of channels by pair, by an angle proportional to their position, so that a query-key product
  depends on the two positions only through their difference.
- "relative" (Raffel et al. 2020, T5, Sec. 2.1): a learned bias per head on each
  self-attention score, looked up by the key's distance from the query in logarithmic buckets.
  Chosen over Shaw et al. 2018's relative keys and values: the bias leaves both products of
  attention as they are (a fused kernel takes it as its bias input), costs no extra product,
  and the buckets reach any distance with one small table.

Rotary and relative act inside self-attention (models/attention.py), which gets the queries'
and keys' positions from the layer (`Positions`); cross-attention takes none, as in T5 and
T5Gemma: a target token's place is already in its query. What each scheme does is one row of
`POSITIONS`, which every place that acts on the choice reads. Shape letters as in
translate/models/transformer.py.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from translate.config import ModelConfig, PositionScheme, check_choice

# Rotary: channel pair i turns at position p by p * ROTARY_BASE^(-2i/K) (Su et al. 2021, Sec. 3.2).
ROTARY_BASE = 10000.0
# Relative: T5's 32 buckets (16 a direction where keys on both sides count), exact up to half
# of them, logarithmic beyond, all distances past 128 in the last (Raffel et al. 2020).
RELATIVE_BUCKETS = 32
RELATIVE_MAX_DISTANCE = 128


class Scheme(NamedTuple):
    """What one value of `model.positions` does to the model.

    `added`: a vector per position is added to the embeddings once (Sec. 3.5). `rotates`:
    self-attention turns its queries and keys by their positions. `bias`: self-attention adds a
    learned bias to its scores. `kernels`: the kernels of jax.nn.dot_product_attention the
    scheme has been run through, "auto" choosing among them (translate/models/factory.py).
    """

    added: bool
    rotates: bool
    bias: bool
    kernels: tuple[str, ...]


# `model.positions` -> what it does. A relative bias runs on XLA's attention alone: its gradient
# per batch row has not been run through cuDNN's fused kernel.
POSITIONS: dict[str, Scheme] = {
    "sinusoidal": Scheme(added=True, rotates=False, bias=False, kernels=("xla", "cudnn")),
    "rotary": Scheme(added=False, rotates=True, bias=False, kernels=("xla", "cudnn")),
    "relative": Scheme(added=False, rotates=False, bias=True, kernels=("xla",)),
}


def position_scheme(config: ModelConfig) -> Scheme:
    """What `config.positions` does; a value outside the choice is refused, naming the field."""
    return POSITIONS[check_choice(config.positions, PositionScheme, "model.positions")]


class Positions(NamedTuple):
    """Where one self-attention's queries and keys sit in their sentences (Sec. 3.5's `pos`).

    The keys are every key the attention reads: a decoding cache's slots included, each at the
    position of the token whose key it holds.
    """

    query: jax.Array  # [B, Tq] int
    key: jax.Array  # [B or 1, Tk] int


def sinusoidal_positions(positions: jax.Array, d_model: int) -> jax.Array:
    """Sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(same)."""
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., D/2]
    # Interleave sin and cos so even channels are sines and odd channels cosines.
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(
        *positions.shape, d_model
    )  # [..., D]


def rotate(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotary positions: x [B, T, N, K] turned by its positions [B, T], in float32.

    Channels pair as (i, i + K/2) (the two halves, as GPT-NeoX, Llama and Gemma lay them out;
    RoFormer pairs neighbours, which is the same up to an order of the channels).
    """
    half = x.shape[-1] // 2
    inv_freq = ROTARY_BASE ** (-jnp.arange(half, dtype=jnp.float32) / half)  # [K/2]
    angles = positions[:, :, None, None].astype(jnp.float32) * inv_freq  # [B, T, 1, K/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    turned = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return turned.astype(x.dtype)  # [B, T, N, K]


def relative_buckets(offset: jax.Array, bidirectional: bool) -> jax.Array:
    """T5's bucket of each key's offset from its query (key position - query position).

    With `bidirectional`, keys before and after the query have buckets of their own (half the
    table each); otherwise (causal attention) every key after the query shares bucket 0.
    """
    buckets, first = RELATIVE_BUCKETS, jnp.zeros_like(offset)
    if bidirectional:
        buckets //= 2
        first = jnp.where(offset > 0, buckets, 0)
        distance = jnp.abs(offset)
    else:
        distance = jnp.maximum(-offset, 0)
    exact = buckets // 2
    # Distances from `exact` to RELATIVE_MAX_DISTANCE share the other buckets on a log scale.
    scale = (buckets - exact) / math.log(RELATIVE_MAX_DISTANCE / exact)
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / exact)
    far = jnp.minimum(exact + (log_ratio * scale).astype(offset.dtype), buckets - 1)
    return first + jnp.where(distance < exact, distance, far)


class RelativeBias(nnx.Module):
    """One self-attention's learned bias [buckets, H] on its scores, by relative position.

    Each layer has its own table (T5 shares one a stack); initialised as T5's, N(0, D^-1).
    """

    def __init__(self, num_heads: int, d_model: int, bidirectional: bool, rngs: nnx.Rngs):
        self.bidirectional = bidirectional
        init = nnx.initializers.normal(d_model**-0.5)
        self.table = nnx.Param(init(rngs.params(), (RELATIVE_BUCKETS, num_heads)))

    def __call__(self, positions: Positions) -> jax.Array:
        """The bias [B or 1, H, Tq, Tk] (float32) of queries and keys at these positions."""
        offset = positions.key[:, None, :] - positions.query[:, :, None]  # [B, Tq, Tk]
        bias = self.table[...][relative_buckets(offset, self.bidirectional)]  # [B, Tq, Tk, H]
        return bias.transpose(0, 3, 1, 2).astype(jnp.float32)
