"""The Transformer's layers (Sec. 3.1-3.3): the feed-forward network, residual connections, and
the encoder and decoder layers built of them, of attention (translate/models/attention.py) and
of the norms (translate/models/norms.py).

Shape letters as declared in translate/models/transformer.py: B batch rows, S source length,
T target length, D d_model, H heads, K head dim, F d_ff, L cache length. Masks are boolean,
True = attend. Each block takes its compute dtype, and attention its kernel, from the caller:
translate/models/factory.py resolves both once, so building a model never asks the hardware.
Each block counts its own FLOPs (`flops`), as translate/models/flops.py says; the
architectures sum them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from translate.config import FeedForwardKind, ModelConfig, check_choice
from translate.models.attention import KV, MultiHeadAttention, Slots
from translate.models.dropout import dropout, fold
from translate.models.norms import Norm, is_pre_norm, make_norm
from translate.models.positions import Positions
from translate.models.precision import xavier_linear


class LayerCache(NamedTuple):
    """One encoder-decoder decoder layer's cache: its self-attention's keys and values, and the
    encoder output projected once for its cross-attention."""

    self_kv: KV  # [B, G, K, L], [B, G, L, K]
    cross_kv: KV  # [B, G, K, S], [B, G, S, K]
    src_valid: jax.Array  # [B, S] True on real source tokens: the cross-attention's mask


# `model.feed_forward` -> (the activation, whether a linear unit gates it). GELU is the tanh
# form (Hendrycks & Gimpel 2016), as T5 and Gemma use it; SiLU is Swish with beta 1
# (Ramachandran et al. 2017), Marian's `swish`.
ACTIVATIONS = {
    "relu": (jax.nn.relu, False),
    "gelu": (jax.nn.gelu, False),
    "silu": (jax.nn.silu, False),
    "swiglu": (jax.nn.silu, True),
    "geglu": (jax.nn.gelu, True),
}


class FeedForward(nnx.Module):
    """Sec. 3.3: FFN(x) = max(0, x W1 + b1) W2 + b2, or a variant of `model.feed_forward`.

    A gated one (Shazeer 2020) is act(x W1) * (x V) W2: `inner_linear` is V, a third matrix of
    D x F, so d_ff = 2/3 of an ungated network's width keeps its parameters.
    """

    def __init__(self, config: ModelConfig, dtype: Any, rngs: nnx.Rngs):
        kind = check_choice(config.feed_forward, FeedForwardKind, "model.feed_forward")
        self.activation, gated = ACTIVATIONS[kind]
        self.inner = xavier_linear(config, config.d_model, config.d_ff, dtype, rngs)
        self.outer = xavier_linear(config, config.d_ff, config.d_model, dtype, rngs)
        self.inner_linear = (
            xavier_linear(config, config.d_model, config.d_ff, dtype, rngs) if gated else None
        )
        # Dropout on the inner activations in training (`model.activation_dropout_rate`; not
        # in the paper, tensor2tensor's relu_dropout).
        self.inner_rate = config.activation_dropout_rate
        self.bits = config.dropout_bits

    @staticmethod
    def flops(config: ModelConfig, tokens: np.ndarray) -> float:
        """Forward FLOPs on `tokens` tokens (a float array): [D, F] and [F, D], and a second
        [D, F] when gated."""
        matrices = 3 if ACTIVATIONS[config.feed_forward][1] else 2
        return float(tokens.sum() * matrices * 2 * float(config.d_model) * config.d_ff)

    def __call__(self, x: jax.Array, key=None) -> jax.Array:
        """`key` is the sub-layer's dropout key (None in evaluation), as for attention."""
        h = self.activation(self.inner(x))  # [B, T, F]
        if self.inner_linear is not None:
            h = h * self.inner_linear(x)  # [B, T, F]
        if self.inner_rate > 0.0:
            h = dropout(h, self.inner_rate, fold(key, 1), self.bits)
        return self.outer(h)  # [B, T, D]


class ResidualLayer(nnx.Module):
    """Sec. 3.1's residual connection around each sub-layer, its norm after it or before it.

    Post-LayerNorm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-LayerNorm (the variant): x + Dropout(Sublayer(LayerNorm(x))).
    Subclasses set `rate` (dropout), `bits` (its random bits' source) and `pre_norm`.
    """

    rate: float
    bits: str
    pre_norm: bool
    # Sec. 3.3: every layer's position-wise network, chosen here once; the layers build it and
    # sum its FLOPs through this name, whichever variant `model.feed_forward` names.
    feed_forward_class: type[FeedForward] = FeedForward

    def normed(self, norm: Norm, x: jax.Array) -> jax.Array:
        """A sub-layer's input: LayerNorm(x) with pre-LayerNorm, x itself with post."""
        return norm(x) if self.pre_norm else x

    def add(self, norm: Norm, x: jax.Array, out: jax.Array, key) -> jax.Array:
        """The residual sum of x and a sub-layer's output, normalised after it with post."""
        x = x + dropout(out, self.rate, key, self.bits)
        return x if self.pre_norm else norm(x)

    def sublayer(self, norm: Norm, x: jax.Array, fn, key) -> jax.Array:
        return self.add(norm, x, fn(self.normed(norm, x)), key)


class EncoderLayer(ResidualLayer):
    """Sec. 3.1: self-attention then feed-forward, each inside a residual connection.

    Self-attention sees keys on both sides unless `causal` (the decoder-only stack, whose
    prefix LM passes `causal=False`); only a relative position bias needs to know.
    """

    def __init__(
        self, config: ModelConfig, dtype: Any, attention: str, rngs: nnx.Rngs, causal=False
    ):
        self.rate, self.bits = config.dropout_rate, config.dropout_bits
        self.pre_norm = is_pre_norm(config)
        self.self_attention = MultiHeadAttention(
            config, dtype, attention, rngs, self_attention=True, bidirectional=not causal
        )
        self.norm1 = make_norm(config, dtype, rngs)
        self.feed_forward = self.feed_forward_class(config, dtype, rngs)
        self.norm2 = make_norm(config, dtype, rngs)

    @classmethod
    def flops(cls, config: ModelConfig, lengths: np.ndarray) -> float:
        """Forward FLOPs over sentences of `lengths` tokens (a float array)."""
        attention = MultiHeadAttention.flops(config, lengths, lengths)
        return attention + cls.feed_forward_class.flops(config, lengths)

    def __call__(
        self,
        x: jax.Array,
        positions: Positions,
        mask: jax.Array,
        key=None,
        cache: KV | None = None,
        slots: Slots | None = None,
    ) -> tuple[jax.Array, KV | None]:
        """x [B, T, D] at `positions` -> the layer's output [B, T, D] and its cache.

        Without `cache`, self-attention reads x alone (the encoder; the decoder-only stack in
        training). With it, x's keys and values are written at `slots` and attended with those
        before them (the decoder-only stack's cached decoding); the cache comes back updated.
        """
        # Each sub-layer's key drops its output; its own dropouts fold theirs off it.
        k0, k1 = fold(key, 0), fold(key, 1)
        h = self.normed(self.norm1, x)
        attended, cache = self.self_attention(h, mask, positions, cache=cache, slots=slots, key=k0)
        # Sec. 3.1: LayerNorm(x + Dropout(Sublayer(x))) (post), x + Dropout(Sublayer(LN(x))) (pre).
        x = self.add(self.norm1, x, attended, k0)
        return self.sublayer(self.norm2, x, lambda h: self.feed_forward(h, k1), k1), cache


class DecoderLayer(ResidualLayer):
    """Sec. 3.1: masked self-attention, attention over the encoder output, feed-forward."""

    def __init__(self, config: ModelConfig, dtype: Any, attention: str, rngs: nnx.Rngs):
        self.rate, self.bits = config.dropout_rate, config.dropout_bits
        self.pre_norm = is_pre_norm(config)
        self.self_attention = MultiHeadAttention(
            config, dtype, attention, rngs, self_attention=True, bidirectional=False
        )
        self.norm1 = make_norm(config, dtype, rngs)
        self.cross_attention = MultiHeadAttention(
            config, dtype, attention, rngs, self_attention=False
        )
        self.norm2 = make_norm(config, dtype, rngs)
        self.feed_forward = self.feed_forward_class(config, dtype, rngs)
        self.norm3 = make_norm(config, dtype, rngs)

    @classmethod
    def flops(cls, config: ModelConfig, src: np.ndarray, tgt: np.ndarray) -> float:
        """Forward FLOPs over pairs of `src` and `tgt` tokens (float arrays): self-attention
        on the targets, cross-attention of targets over sources, the feed-forward."""
        self_attention = MultiHeadAttention.flops(config, tgt, tgt)
        cross_attention = MultiHeadAttention.flops(config, tgt, src)
        return self_attention + cross_attention + cls.feed_forward_class.flops(config, tgt)

    def __call__(
        self,
        x,
        positions: Positions,
        memory,
        self_mask,
        cross_mask,
        key=None,
        cache: LayerCache | None = None,
        slots: Slots | None = None,
    ) -> tuple[jax.Array, LayerCache | None]:
        """Target x [B, T, D] at `positions`, the encoder output, their masks -> output
        [B, T, D], cache.

        Without `cache`, the encoder output is `memory` [B, S, D] and self-attention reads x
        alone (training, teacher forcing). With it, the encoder output is the cache's
        projection of it (`memory` unused) and x's keys and values are written at `slots`:
        one step of the search, or a block of forced prefix tokens. Full, block and step
        decoding all run this one function.
        """
        k0, k1, k2 = fold(key, 0), fold(key, 1), fold(key, 2)
        h = self.normed(self.norm1, x)
        self_kv = None if cache is None else cache.self_kv
        attended, self_kv = self.self_attention(
            h, self_mask, positions, cache=self_kv, slots=slots, key=k0
        )
        if cache is not None:
            cache = cache._replace(self_kv=self_kv)
        cross_kv = None if cache is None else cache.cross_kv

        def cross(h):
            context = memory if cache is None else None
            return self.cross_attention(
                h, cross_mask, context=context, cache=cross_kv, slots=slots, key=k1
            )[0]

        # Sec. 3.1: LayerNorm(x + Dropout(Sublayer(x))) (post), x + Dropout(Sublayer(LN(x))) (pre).
        x = self.add(self.norm1, x, attended, k0)
        x = self.sublayer(self.norm2, x, cross, k1)
        return self.sublayer(self.norm3, x, lambda h: self.feed_forward(h, k2), k2), cache
