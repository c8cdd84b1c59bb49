"""Sec. 3.2: multi-head attention, one call for training and for every way of decoding.

A reader finds the whole of attention in `MultiHeadAttention.__call__`: the projections
(written once, `project`), the positions that act inside attention (rotary, relative: see
translate/models/positions.py), the decoding cache (optional), and the two products, which are
written once (`weigh`: softmax(QK^T / sqrt(K)); `mix`: the weights times V) unless the fused
kernel of jax.nn.dot_product_attention computes both.

Key and value heads may be fewer than the query heads (`model.num_kv_heads`, grouped-query
attention): query head h reads key and value head h // (H / G). Shape letters as in
translate/models/transformer.py, with G key and value heads; masks are boolean, True = attend.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from translate.config import ModelConfig
from translate.models.dropout import dropout, fold
from translate.models.positions import Positions, RelativeBias, position_scheme, rotate
from translate.models.precision import xavier_linear


class KV(NamedTuple):
    """One attention's cached keys and values, in the layout its products want.

    With the heads leading, both products of a decoding step are plain batched matrix
    products; keeping the cache as [B, L, G, K] made XLA transpose all of it at every step of
    the search.
    """

    k: jax.Array  # [B, G, K, L] keys, transposed
    v: jax.Array  # [B, G, L, K] values


class Slots(NamedTuple):
    """Where a cached call's tokens sit in the cache: `start`, the first slot they are written
    to (an int for a block, the search's step index for one step); `step`, one token whose
    query reads the whole cache under a mask, else a block read up to its last slot."""

    start: int | jax.Array
    step: bool


def num_kv_heads(config: ModelConfig) -> int:
    """G, the key and value heads (`model.num_kv_heads`; 0 means one per query head)."""
    return config.num_kv_heads or config.num_heads


def attention_mask(q_segments: jax.Array, k_segments: jax.Array, causal: bool) -> jax.Array:
    """Boolean [B, 1, Tq, Tk] mask, True = attend: a token sees its own sentence, (causally).

    A padding query (segment 0) sees every key instead. Its output reaches no loss and no real
    token (no real query attends to padding), so nothing a sentence computes changes; but no
    row of the mask is empty. XLA's softmax takes an empty row in its stride; with cuDNN's
    fused kernel the gradients were NaN from the first step on an H100, likely
    because its backward pass recomputes such a row from a log-sum-exp near its -2^41 mask
    value, where float32 steps are 2^18 apart.
    """
    padding_query = q_segments[:, :, None] == 0  # [B, Tq, 1]
    mask = q_segments[:, :, None] == k_segments[:, None, :]  # [B, Tq, Tk]
    if causal:
        tq, tk = q_segments.shape[1], k_segments.shape[1]
        mask &= jnp.arange(tq)[:, None] >= jnp.arange(tk)[None, :]
    return (mask | padding_query)[:, None]  # [B, 1, Tq, Tk]


# The two layouts keys and values are read in, and the two products' subscripts in each: the
# cache's (KV), and the tokens' ([B, Tk, G, K] both), in which XLA rounds the weighted sum
# otherwise.
SUBSCRIPTS = {
    "cache": ("bgqk,bgkl->bgql", "bgql,bglk->bqgk"),
    "tokens": ("bgqk,blgk->bgql", "bgql,blgk->bqgk"),
}


def weigh(q, keys: jax.Array, mask: jax.Array, bias: jax.Array | None, layout: str) -> jax.Array:
    """Sec. 3.2.1: softmax(QK^T / sqrt(K) + bias) where mask is True; weights [B, H, Tq, Tk].

    q [B, Tq, H, K]; keys in `layout` (SUBSCRIPTS); mask [B or 1, 1, Tq, Tk]; bias [B or 1, H,
    Tq, Tk]. The H / G query heads of a key head are read as that many more queries, so the
    product stays one batched matrix product whatever G is. Scores accumulate and come out in
    float32 even when q and k are bfloat16: rounded to bfloat16, scores near 20 would move in
    steps of 0.125.
    """
    b, t, h, k = q.shape
    g = keys.shape[1] if layout == "cache" else keys.shape[2]
    q = q.transpose(0, 2, 1, 3).reshape(b, g, h // g * t, k)  # [B, G, H/G Tq, K]
    scores = jnp.einsum(SUBSCRIPTS[layout][0], q, keys, preferred_element_type=jnp.float32)
    scores = scores.reshape(b, h, t, -1) / math.sqrt(k)  # [B, H, Tq, Tk]
    if bias is not None:
        scores = scores + bias
    return jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)


def mix(weights: jax.Array, values: jax.Array, layout: str) -> jax.Array:
    """Sec. 3.2.1: the weights [B, H, Tq, Tk] times values in `layout` -> [B, Tq, H, K]."""
    b, h, t, tk = weights.shape
    g, k = (values.shape[1] if layout == "cache" else values.shape[2]), values.shape[-1]
    weights = weights.astype(values.dtype).reshape(b, g, h // g * t, tk)  # [B, G, H/G Tq, Tk]
    y = jnp.einsum(SUBSCRIPTS[layout][1], weights, values)  # [B, H/G Tq, G, K]
    return y.reshape(b, h // g, t, g, k).transpose(0, 2, 3, 1, 4).reshape(b, t, h, k)


class MultiHeadAttention(nnx.Module):
    """Sec. 3.2.2: h heads of scaled dot-product attention (Sec. 3.2.1), concatenated."""

    def __init__(
        self,
        config: ModelConfig,
        dtype: Any,
        attention: str,
        rngs: nnx.Rngs,
        *,
        self_attention: bool,
        bidirectional: bool = True,
    ):
        """`self_attention`: keys from the queries' own sequence, where positions act (rotary,
        relative); else from the encoder output. `bidirectional`: keys after a query can be
        seen (the relative bias then tells the two sides apart)."""
        d, k = config.d_model, config.d_model // config.num_heads
        self.num_heads, self.num_kv_heads = config.num_heads, num_kv_heads(config)
        self.is_self = self_attention
        # The kernel of jax.nn.dot_product_attention, "xla" or "cudnn": resolved for the device
        # once, by translate/models/factory.py, so building a model never queries the hardware.
        self.implementation = attention
        self.query = xavier_linear(config, d, d, dtype, rngs)
        # No key bias: it adds the same amount to every score of a query, which softmax ignores,
        # so its true gradient is zero and Adam would only amplify rounding noise in it.
        self.key = xavier_linear(config, d, self.num_kv_heads * k, dtype, rngs, use_bias=False)
        self.value = xavier_linear(config, d, self.num_kv_heads * k, dtype, rngs)
        self.out = xavier_linear(config, d, d, dtype, rngs)
        # Positions act in self-attention alone (positions.py).
        scheme = position_scheme(config)
        self.rotary = self_attention and scheme.rotates
        relative = self_attention and scheme.bias
        self.relative = RelativeBias(config.num_heads, d, bidirectional, rngs) if relative else None
        # Dropout on the attention weights in training (`model.attention_dropout_rate`; not in
        # the paper, tensor2tensor's attention_dropout); 0 keeps the fused kernel.
        self.weights_rate = config.attention_dropout_rate
        self.bits = config.dropout_bits
        # Set only by Transformer.attention_weights: the fused kernel never forms the weights.
        self.keep_weights = False

    @staticmethod
    def flops(config: ModelConfig, queries: np.ndarray, keys: np.ndarray) -> float:
        """Forward FLOPs over sentences with `queries` and `keys` tokens each (float arrays),
        counted as translate/models/flops.py says: Q and O [D, D] on every query, K and V
        [D, G K] on every key, and the two products, 2 * Tq * Tk * D each per sentence."""
        d = float(config.d_model)
        kv = d * num_kv_heads(config) / config.num_heads
        projections = queries.sum() * 4 * d * d + keys.sum() * 4 * d * kv
        return float(projections + 4 * d * (queries * keys).sum())

    def project(self, x: jax.Array, positions: Positions | None) -> tuple[jax.Array, jax.Array]:
        """Keys and values [B, T, G, K] of x [B, T, D]; self-attention's keys turned to their
        positions (the queries' own) when positions are rotary."""
        b, t, _ = x.shape
        k = self.key(x).reshape(b, t, self.num_kv_heads, -1)  # [B, T, G, K]
        v = self.value(x).reshape(b, t, self.num_kv_heads, -1)  # [B, T, G, K]
        return (rotate(k, positions.query) if self.rotary else k), v

    def project_memory(self, memory: jax.Array) -> KV:
        """The encoder output's keys and values [B, S, D] -> the cache's layout, projected once
        per sentence for every step of the search."""
        k, v = self.project(memory, None)  # [B, S, G, K] each
        return KV(k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3))

    def __call__(
        self,
        x: jax.Array,
        mask: jax.Array,
        positions: Positions | None = None,
        *,
        context: jax.Array | None = None,
        cache: KV | None = None,
        slots: Slots | None = None,
        key: jax.Array | None = None,
    ) -> tuple[jax.Array, KV | None]:
        """Attention of x's queries [B, Tq, D] -> output [B, Tq, D] and the cache.

        Args:
          mask: [B or 1, 1, Tq, Tk] over the keys read.
          positions: the queries' and keys' positions (self-attention; positions.py).
          context: cross-attention without a cache: the encoder output [B, S, D].
          cache: cross-attention's, the encoder output as `project_memory` made it, read as it
            is; self-attention's, where x's keys and values are written at `slots`, and which
            is then read: all of it for a step (in its own layout), its slots up to x's last
            for a block. It comes back updated.
          key: the sub-layer's dropout key (None in evaluation); the weights' own dropout
            draws from a key folded off it.
        """
        b, t, _ = x.shape
        if cache is None or self.is_self:
            # Keys and values first, then queries: the order the gradients are summed in.
            k, v = self.project(x if context is None else context, positions)  # [B, Tk, G, K]
        q = self.query(x).reshape(b, t, self.num_heads, -1)  # [B, Tq, H, K]
        if self.rotary:
            q = rotate(q, positions.query)
        bias = None if self.relative is None else self.relative(positions)  # [B|1, H, Tq, Tk]
        if cache is None:
            return self.out(self.attend(q, k, v, mask, bias, key).reshape(b, t, -1)), None
        if self.is_self:
            k_new, v_new = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
            start = slots.start
            cache = KV(
                jax.lax.dynamic_update_slice_in_dim(cache.k, k_new.astype(cache.k.dtype), start, 3),
                jax.lax.dynamic_update_slice_in_dim(cache.v, v_new.astype(cache.v.dtype), start, 2),
            )
        if slots.step:
            y = mix(weigh(q, cache.k, mask, bias, "cache"), cache.v, "cache")  # [B, 1, H, K]
        else:
            # A block reads the slots written so far (it starts at a static slot), as tokens.
            seen = slots.start + t if self.is_self else cache.k.shape[-1]
            keys = cache.k[..., :seen].transpose(0, 3, 1, 2)  # [B, seen, G, K]
            values = cache.v[:, :, :seen].transpose(0, 2, 1, 3)  # [B, seen, G, K]
            y = self.attend(q, keys, values, mask, bias, key)
        return self.out(y.reshape(b, t, -1)), cache

    def attend(self, q, k, v, mask, bias, key) -> jax.Array:
        """q [B, Tq, H, K] over keys and values [B, Tk, G, K] -> [B, Tq, H, K]: the fused
        kernel, or `weigh` and `mix` where the weights are kept or dropped out."""
        drop_weights = key is not None and self.weights_rate > 0.0
        if not (self.keep_weights or drop_weights):
            # softmax(QK^T / sqrt(K) + bias) V; the kernel scales by 1/sqrt(K) itself.
            return jax.nn.dot_product_attention(
                q, k, v, bias=bias, mask=mask, implementation=self.implementation
            )
        weights = weigh(q, k, mask, bias, "tokens")  # [B, H, Tq, Tk]
        if self.keep_weights:
            self.sow(nnx.Intermediate, "weights", weights)
        if drop_weights:
            weights = dropout(weights, self.weights_rate, fold(key, 1), self.bits)
        return mix(weights, v, "tokens")
