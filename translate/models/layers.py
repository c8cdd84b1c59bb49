"""The Transformer's building blocks (Sec. 3.1-3.5): attention, feed-forward, positions, layers.

Shape letters as declared in translate/models/transformer.py: B batch rows, S source length,
T target length, D d_model, H heads, K head dim, F d_ff, L cache length. Masks are boolean,
True = attend. Each block takes its compute dtype, and attention its kernel, from the caller:
translate/models/factory.py resolves both once, so building a model never asks the hardware.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from translate.config import MatmulDtype, ModelConfig, NormPosition, check_choice


def compute_dtype(config: ModelConfig) -> Any:
    """The dtype `model.compute_dtype` names, where that needs no device: "auto" is float32.

    translate/models/factory.py resolves "auto" for the device (bfloat16 on GPUs and TPUs) and
    passes the dtype in; a model built directly, as tests do, computes in float32.
    """
    return jnp.dtype("float32" if config.compute_dtype == "auto" else config.compute_dtype)


def product_dtype(config: ModelConfig, dtype: Any) -> Any:
    """The operands' dtype of the linear layers' and the projection's products: `dtype`, the
    compute dtype, unless `model.matmul_dtype` rounds float32 operands to bfloat16."""
    matmul = check_choice(config.matmul_dtype, MatmulDtype, "model.matmul_dtype")
    if matmul == "bfloat16" and jnp.dtype(dtype) == jnp.float32:
        return jnp.dtype(jnp.bfloat16)
    return jnp.dtype(dtype)


@jax.custom_vjp
def bfloat16_product(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., I] @ w [I, O] with both rounded to bfloat16, accumulated and returned in float32.

    The gradient's two products round the incoming gradient to bfloat16 as well, so all three
    products of a linear layer run at the bfloat16 rate; what they return is float32.
    """
    return _bfloat16_product_fwd(x, w)[0]


def _bfloat16_product_fwd(x, w):
    xb, wb = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
    return jnp.einsum("...i,io->...o", xb, wb, preferred_element_type=jnp.float32), (xb, wb)


def _bfloat16_product_bwd(residuals, g):
    xb, wb = residuals
    gb = g.astype(jnp.bfloat16)
    dx = jnp.einsum("...o,io->...i", gb, wb, preferred_element_type=jnp.float32)  # [..., I]
    dw = jnp.einsum("...i,...o->io", xb, gb, preferred_element_type=jnp.float32)  # [I, O]
    return dx.astype(jnp.float32), dw


bfloat16_product.defvjp(_bfloat16_product_fwd, _bfloat16_product_bwd)


def bfloat16_dot_general(x, w, dimension_numbers, precision=None, **kwargs):
    """nnx.Linear's product, x [..., I] @ w [I, O], through `bfloat16_product`."""
    assert dimension_numbers == (((x.ndim - 1,), (0,)), ((), ())), dimension_numbers
    return bfloat16_product(x, w)


def attention_scores(subscripts: str, q: jax.Array, k: jax.Array, mask: jax.Array) -> jax.Array:
    """Sec. 3.2.1: QK^T / sqrt(K) in float32 where mask is True, -1e9 elsewhere.

    The products accumulate and come out in float32 even when q and k are bfloat16: rounded
    to bfloat16, scores near 20 would move in steps of 0.125.
    """
    scores = jnp.einsum(subscripts, q, k, preferred_element_type=jnp.float32)
    return jnp.where(mask, scores / math.sqrt(q.shape[-1]), -1e9)


def sinusoidal_positions(positions: jax.Array, d_model: int) -> jax.Array:
    """Sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(same)."""
    inv_freq = 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [..., D/2]
    # Interleave sin and cos so even channels are sines and odd channels cosines.
    return jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1).reshape(
        *positions.shape, d_model
    )  # [..., D]


def dropout(x: jax.Array, rate: float, key: jax.Array | None, bits: str = "threefry") -> jax.Array:
    """Inverted dropout; `key=None` is evaluation mode.

    Each element draws 16 random bits, two from every 32-bit word: half the random-number work
    of `jax.random.bernoulli`, whose 32 bits per element cost a sixth of a training step on
    CPUs. The rate is rounded to a multiple of 2^-16 (0.1 becomes 0.100006) and kept elements
    are scaled by the exact inverse keep probability. `bits` names the words' source
    (`model.dropout_bits`): "threefry" is JAX's counter-based generator, "hash" the cheaper
    `hashed_words`.
    """
    if key is None or rate == 0.0:
        return x
    threshold = round(rate * 2**16)
    keep_prob = 1.0 - threshold / 2**16
    *lead, last = x.shape
    shape = (*lead, (last + 1) // 2)
    if bits == "hash":
        words = hashed_words(key, shape)  # [..., ceil(last/2)]
    elif bits == "threefry":
        words = jax.random.bits(key, shape, jnp.uint32)  # [..., ceil(last/2)]
    else:
        raise ValueError(f"model.dropout_bits={bits!r}: must be 'threefry' or 'hash'")
    halves = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(*lead, -1)[..., :last]
    return jnp.where(halves >= threshold, x / keep_prob, 0).astype(x.dtype)


def mix32(x: jax.Array) -> jax.Array:
    """A bijective avalanche of uint32 words: xor-shift-multiply rounds (C. Wellons' lowbias32)."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def hashed_words(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """uint32 words of `shape`, each a hash of its position and the key: mix(mix(i ^ a) + b).

    About 17 integer operations per word against about 55 for threefry's 20 rounds per pair of
    words; good enough for dropout masks (tested: rate, independence between neighbours, keys
    and sites), not for anything that needs a cryptographic generator. On the Multi30k
    recipe's forward and backward pass it saved 3-9%, and 4.5% of the whole step timed in turn
    (docs/recipe.md). `a` and `b`
    are the key's first and last words, so keys folded apart (per step, micro-batch, layer and
    site) give unrelated streams.
    """
    size = math.prod(shape)
    if size >= 2**32:
        raise ValueError(f"hashed dropout bits count positions in 32 bits; {shape} is larger")
    data = jax.random.key_data(key).reshape(-1)  # uint32 [2] for threefry keys
    index = jax.lax.iota(jnp.uint32, size).reshape(shape)
    return mix32(mix32(index ^ data[0]) + data[-1])


def fold(key: jax.Array | None, site: int) -> jax.Array | None:
    return None if key is None else jax.random.fold_in(key, site)


class KV(NamedTuple):
    """One attention's cached keys and values, in the layout its products want."""

    k: jax.Array  # [B, H, K, L] keys, transposed
    v: jax.Array  # [B, H, L, K] values


class Slots(NamedTuple):
    """Where a cached call's tokens sit in the cache: `start`, the first slot they are written
    to (an int for a block, the search's step index for one step); `step`, one token whose
    query reads the whole cache under a mask, else a block read up to its last slot."""

    start: int | jax.Array
    step: bool


class LayerCache(NamedTuple):
    """One encoder-decoder decoder layer's cache: its self-attention's keys and values, and the
    encoder output projected once for its cross-attention."""

    self_kv: KV  # [B, H, K, L], [B, H, L, K]
    cross_kv: KV  # [B, H, K, S], [B, H, S, K]
    src_valid: jax.Array  # [B, S] True on real source tokens: the cross-attention's mask


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


def xavier_linear(
    config: ModelConfig,
    d_in: int,
    d_out: int,
    dtype: Any,
    rngs: nnx.Rngs,
    use_bias: bool = True,
) -> nnx.Linear:
    """A linear layer; its product takes bfloat16 operands where `model.matmul_dtype` says so."""
    bfloat16 = product_dtype(config, dtype) != jnp.dtype(dtype)
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=use_bias,
        dtype=dtype,
        rngs=rngs,
        kernel_init=nnx.initializers.xavier_uniform(),
        **({"dot_general": bfloat16_dot_general} if bfloat16 else {}),
    )


def is_pre_norm(config: ModelConfig) -> bool:
    """Whether each LayerNorm sits before its sub-layer (`model.norm_position`)."""
    return check_choice(config.norm_position, NormPosition, "model.norm_position") == "pre"


def layer_norm(config: ModelConfig, dtype: Any, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(config.d_model, epsilon=1e-6, dtype=dtype, rngs=rngs)


class MultiHeadAttention(nnx.Module):
    """Sec. 3.2.2: h heads of scaled dot-product attention (Sec. 3.2.1), concatenated."""

    def __init__(self, config: ModelConfig, dtype: Any, attention: str, rngs: nnx.Rngs):
        d = config.d_model
        self.num_heads = config.num_heads
        # The kernel of jax.nn.dot_product_attention, "xla" or "cudnn": resolved for the device
        # once, by translate.factory, so building a model never queries the hardware.
        self.implementation = attention
        self.query = xavier_linear(config, d, d, dtype, rngs)
        # No key bias: it adds the same amount to every score of a query, which softmax ignores,
        # so its true gradient is zero and Adam would only amplify rounding noise in it.
        self.key = xavier_linear(config, d, d, dtype, rngs, use_bias=False)
        self.value = xavier_linear(config, d, d, dtype, rngs)
        self.out = xavier_linear(config, d, d, dtype, rngs)
        # Dropout on the attention weights in training (`model.attention_dropout_rate`; not in
        # the paper, tensor2tensor's attention_dropout); 0 keeps the fused kernel.
        self.weights_rate = config.attention_dropout_rate
        self.bits = config.dropout_bits
        # Set only by Transformer.attention_weights: the fused kernel never forms the weights.
        self.keep_weights = False

    def split_heads(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        return x.reshape(b, t, self.num_heads, d // self.num_heads)  # [B, T, H, K]

    def project_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self.split_heads(self.key(x)), self.split_heads(self.value(x))

    def attend(
        self, x: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, key=None
    ) -> jax.Array:
        """Attention of x's queries over keys and values [B, Tk, H, K] under mask [B, 1, Tq, Tk].

        `key` is the sub-layer's dropout key (None in evaluation); the weights' own dropout
        draws from a key folded off it.
        """
        q = self.split_heads(self.query(x))  # [B, Tq, H, K]
        drop_weights = key is not None and self.weights_rate > 0.0
        if self.keep_weights or drop_weights:
            scores = attention_scores("bqhk,bshk->bhqs", q, k, mask)  # [B, H, Tq, Tk]
            weights = jax.nn.softmax(scores, axis=-1)
            if self.keep_weights:
                self.sow(nnx.Intermediate, "weights", weights)
            if drop_weights:
                weights = dropout(weights, self.weights_rate, fold(key, 1), self.bits)
            y = jnp.einsum("bhqs,bshk->bqhk", weights.astype(v.dtype), v)  # [B, Tq, H, K]
        else:
            # softmax(QK^T / sqrt(K)) V; the fused kernel scales by 1/sqrt(K) itself.
            y = jax.nn.dot_product_attention(
                q, k, v, mask=mask, implementation=self.implementation
            )  # [B, Tq, H, K]
        return self.out(y.reshape(*x.shape[:2], -1))  # [B, Tq, D]

    def __call__(self, x: jax.Array, context: jax.Array, mask: jax.Array, key=None) -> jax.Array:
        k, v = self.project_kv(context)  # [B, Tk, H, K] each
        return self.attend(x, k, v, mask, key)

    def attend_cached(
        self, x: jax.Array, keys_t: jax.Array, values: jax.Array, mask: jax.Array
    ) -> jax.Array:
        """One query per row over a decoding cache, stored in the layout the products want.

        Args:
          x: [B, 1, D] the step's input.
          keys_t: [B, H, K, L] keys, transposed; values: [B, H, L, K].
          mask: [B or 1, 1, L] True where a key may be attended.

        With the heads leading, both products are plain batched matrix products; keeping the
        cache as [B, L, H, K] made XLA transpose all of it at every step of the search.
        """
        b, _, d = x.shape
        q = self.query(x).reshape(b, self.num_heads, 1, d // self.num_heads)  # [B, H, 1, K]
        scores = attention_scores("bhqk,bhkl->bhql", q, keys_t, mask[:, :, None, :])  # [B, H, 1, L]
        weights = jax.nn.softmax(scores, axis=-1).astype(values.dtype)
        y = jnp.einsum("bhql,bhlk->bqhk", weights, values)  # [B, 1, H, K]
        return self.out(y.reshape(b, 1, d))  # [B, 1, D]

    def project_kv_cached(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Keys [B, H, K, T] (transposed) and values [B, H, T, K] of x [B, T, D], for caching."""
        k, v = self.project_kv(x)  # [B, T, H, K] each
        return k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)

    def attend_self_cached(
        self, x: jax.Array, kv: KV, slots: Slots, mask: jax.Array
    ) -> tuple[jax.Array, KV]:
        """Self-attention of x [B, T, D] whose keys and values go into the cache `kv`.

        x's own keys and values are written at `slots.start`; its queries then attend over the
        cache up to them under `mask`: one step ([B or 1, 1, L]) reads the whole cache in its
        own layout (`attend_cached`); a block ([B or 1, 1, T, start + T]) reads the slots
        written so far.
        """
        k_new, v_new = self.project_kv_cached(x)  # [B, H, K, T], [B, H, T, K]
        k = jax.lax.dynamic_update_slice_in_dim(kv.k, k_new.astype(kv.k.dtype), slots.start, 3)
        v = jax.lax.dynamic_update_slice_in_dim(kv.v, v_new.astype(kv.v.dtype), slots.start, 2)
        if slots.step:
            return self.attend_cached(x, k, v, mask), KV(k, v)
        seen = slots.start + x.shape[1]  # a block starts at a static slot
        keys = k[..., :seen].transpose(0, 3, 1, 2)  # [B, start + T, H, K]
        values = v[:, :, :seen].transpose(0, 2, 1, 3)  # [B, start + T, H, K]
        return self.attend(x, keys, values, mask), KV(k, v)

    def attend_projected(self, x: jax.Array, kv: KV, mask: jax.Array, step: bool) -> jax.Array:
        """Attention of x [B, T, D] over keys and values projected once (the encoder output's,
        `kv` in the cache's layout) under `mask` ([B, 1, S] for a step, [B, 1, 1, S] else)."""
        if step:
            return self.attend_cached(x, kv.k, kv.v, mask)
        return self.attend(x, kv.k.transpose(0, 3, 1, 2), kv.v.transpose(0, 2, 1, 3), mask)


class FeedForward(nnx.Module):
    """Sec. 3.3: FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: ModelConfig, dtype: Any, rngs: nnx.Rngs):
        self.inner = xavier_linear(config, config.d_model, config.d_ff, dtype, rngs)
        self.outer = xavier_linear(config, config.d_ff, config.d_model, dtype, rngs)
        # Dropout on the inner activations in training (`model.activation_dropout_rate`; not
        # in the paper, tensor2tensor's relu_dropout).
        self.inner_rate = config.activation_dropout_rate
        self.bits = config.dropout_bits

    def __call__(self, x: jax.Array, key=None) -> jax.Array:
        """`key` is the sub-layer's dropout key (None in evaluation); see MultiHeadAttention."""
        h = jax.nn.relu(self.inner(x))  # [B, T, F]
        if self.inner_rate > 0.0:
            h = dropout(h, self.inner_rate, fold(key, 1), self.bits)
        return self.outer(h)  # [B, T, D]


class ResidualLayer(nnx.Module):
    """Sec. 3.1's residual connection around each sub-layer, LayerNorm after it or before it.

    Post-LayerNorm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-LayerNorm (the variant): x + Dropout(Sublayer(LayerNorm(x))).
    Subclasses set `rate` (dropout), `bits` (its random bits' source) and `pre_norm`.
    """

    rate: float
    bits: str
    pre_norm: bool

    def normed(self, norm: nnx.LayerNorm, x: jax.Array) -> jax.Array:
        """A sub-layer's input: LayerNorm(x) with pre-LayerNorm, x itself with post."""
        return norm(x) if self.pre_norm else x

    def add(self, norm: nnx.LayerNorm, x: jax.Array, out: jax.Array, key) -> jax.Array:
        """The residual sum of x and a sub-layer's output, normalised after it with post."""
        x = x + dropout(out, self.rate, key, self.bits)
        return x if self.pre_norm else norm(x)

    def sublayer(self, norm: nnx.LayerNorm, x: jax.Array, fn, key) -> jax.Array:
        return self.add(norm, x, fn(self.normed(norm, x)), key)


class EncoderLayer(ResidualLayer):
    """Sec. 3.1: self-attention then feed-forward, each inside a residual connection."""

    def __init__(self, config: ModelConfig, dtype: Any, attention: str, rngs: nnx.Rngs):
        self.rate, self.bits = config.dropout_rate, config.dropout_bits
        self.pre_norm = is_pre_norm(config)
        self.self_attention = MultiHeadAttention(config, dtype, attention, rngs)
        self.norm1 = layer_norm(config, dtype, rngs)
        self.feed_forward = FeedForward(config, dtype, rngs)
        self.norm2 = layer_norm(config, dtype, rngs)

    def __call__(
        self, x, mask, key=None, cache: KV | None = None, slots: Slots | None = None
    ) -> tuple[jax.Array, KV | None]:
        """x [B, T, D] -> the layer's output [B, T, D] and its cache.

        Without `cache`, self-attention reads x alone (the encoder; the decoder-only stack in
        training). With it, x's keys and values are written at `slots` and attended with those
        before them (the decoder-only stack's cached decoding); the cache comes back updated.
        """
        # Each sub-layer's key drops its output; its own dropouts fold theirs off it.
        k0, k1 = fold(key, 0), fold(key, 1)
        h = self.normed(self.norm1, x)
        if cache is None:
            attended = self.self_attention(h, h, mask, k0)
        else:
            attended, cache = self.self_attention.attend_self_cached(h, cache, slots, mask)
        # Sec. 3.1: LayerNorm(x + Dropout(Sublayer(x))) (post), x + Dropout(Sublayer(LN(x))) (pre).
        x = self.add(self.norm1, x, attended, k0)
        return self.sublayer(self.norm2, x, lambda h: self.feed_forward(h, k1), k1), cache


class DecoderLayer(ResidualLayer):
    """Sec. 3.1: masked self-attention, attention over the encoder output, feed-forward."""

    def __init__(self, config: ModelConfig, dtype: Any, attention: str, rngs: nnx.Rngs):
        self.rate, self.bits = config.dropout_rate, config.dropout_bits
        self.pre_norm = is_pre_norm(config)
        self.self_attention = MultiHeadAttention(config, dtype, attention, rngs)
        self.norm1 = layer_norm(config, dtype, rngs)
        self.cross_attention = MultiHeadAttention(config, dtype, attention, rngs)
        self.norm2 = layer_norm(config, dtype, rngs)
        self.feed_forward = FeedForward(config, dtype, rngs)
        self.norm3 = layer_norm(config, dtype, rngs)

    def __call__(
        self,
        x,
        memory,
        self_mask,
        cross_mask,
        key=None,
        cache: LayerCache | None = None,
        slots: Slots | None = None,
    ) -> tuple[jax.Array, LayerCache | None]:
        """Target x [B, T, D], the encoder output, their masks -> output [B, T, D], cache.

        Without `cache`, the encoder output is `memory` [B, S, D] and self-attention reads x
        alone (training, teacher forcing). With it, the encoder output is the cache's
        projection of it (`memory` unused) and x's keys and values are written at `slots`:
        one step of the search, or a block of forced prefix tokens. Full, block and step
        decoding all run this one function.
        """
        k0, k1, k2 = fold(key, 0), fold(key, 1), fold(key, 2)
        h = self.normed(self.norm1, x)
        if cache is None:
            attended = self.self_attention(h, h, self_mask, k0)
            cross = lambda h: self.cross_attention(h, memory, cross_mask, k1)  # noqa: E731
        else:
            attended, self_kv = self.self_attention.attend_self_cached(
                h, cache.self_kv, slots, self_mask
            )
            cache = cache._replace(self_kv=self_kv)
            cross = lambda h: self.cross_attention.attend_projected(  # noqa: E731
                h, cache.cross_kv, cross_mask, slots.step
            )
        # Sec. 3.1: LayerNorm(x + Dropout(Sublayer(x))) (post), x + Dropout(Sublayer(LN(x))) (pre).
        x = self.add(self.norm1, x, attended, k0)
        x = self.sublayer(self.norm2, x, cross, k1)
        return self.sublayer(self.norm3, x, lambda h: self.feed_forward(h, k2), k2), cache
