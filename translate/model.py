"""The Transformer of Vaswani et al. 2017, "Attention Is All You Need", in Flax NNX.

Shape letters used in comments and einsum strings:
  B batch rows, S source length, T target length, D d_model, H heads, K head dim (D / H),
  F d_ff, V vocabulary size, L cache length.

Batches may be packed: several sentences share a row. `segments` (int, 0 = padding) says which
sentence each token belongs to and `positions` its index inside that sentence; attention never
crosses sentences, so a packed row computes exactly what separate rows would.

Deviations from the paper, all of them:
  - Padding and packing as above (an implementation detail with identical outputs).
  - Linear layers have biases (except the key projection, whose bias cannot change any output)
    and Xavier-uniform initialisation, and embeddings are initialised with N(0, d_model^-0.5);
    the paper does not state either.
  - LayerNorm epsilon is 1e-6; the paper does not state it.
  - Compute may run in bfloat16 (config) while parameters, softmax and the loss stay float32.
  - Dropout draws 16 random bits per element, so its rate is rounded to a multiple of 2^-16
    (0.1 becomes 0.100006); see `dropout`.
There is no final LayerNorm on either stack: with post-LayerNorm the last sub-layer already
ends in one (Sec. 3.1). Dropout on attention probabilities is not used, as in the paper.

A variant, not the paper: `model.norm_position="pre"` moves each LayerNorm to the sub-layer's
input, x + Dropout(Sublayer(LayerNorm(x))), and adds a final LayerNorm to each stack (Xiong et
al. 2020); the default "post" computes exactly the paper's model above.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from translate.config import ModelConfig

if TYPE_CHECKING:  # for annotations only: the data pipeline feeds the model, not the reverse
    from translate.batching import Batch


class LayerCache(NamedTuple):
    """One decoder layer's keys and values for cached decoding, in the products' layout."""

    k: jax.Array  # [B, H, K, L] self-attention keys, transposed
    v: jax.Array  # [B, H, L, K] self-attention values
    cross_k: jax.Array  # [B, H, K, S] encoder-output keys, transposed
    cross_v: jax.Array  # [B, H, S, K] encoder-output values
    src_valid: jax.Array  # [B, S] True on real source tokens


Cache = list[LayerCache]


def resolve_dtype(name: str) -> Any:
    """Maps the config's compute dtype to a jnp dtype; "auto" is bfloat16 on GPU/TPU."""
    if name == "auto":
        return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    return jnp.dtype(name)


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


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
    """Inverted dropout; `key=None` is evaluation mode.

    Each element draws 16 random bits, two from every 32-bit word of JAX's counter-based
    generator: half the random-number work of `jax.random.bernoulli`, whose 32 bits per element
    cost a sixth of a training step on CPUs. The rate is rounded to a multiple of 2^-16 (0.1
    becomes 0.100006) and kept elements are scaled by the exact inverse keep probability.
    """
    if key is None or rate == 0.0:
        return x
    threshold = round(rate * 2**16)
    keep_prob = 1.0 - threshold / 2**16
    *lead, last = x.shape
    words = jax.random.bits(key, (*lead, (last + 1) // 2), jnp.uint32)  # [..., ceil(last/2)]
    bits = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(*lead, -1)[..., :last]
    return jnp.where(bits >= threshold, x / keep_prob, 0).astype(x.dtype)


def fold(key: jax.Array | None, site: int) -> jax.Array | None:
    return None if key is None else jax.random.fold_in(key, site)


def attention_mask(q_segments: jax.Array, k_segments: jax.Array, causal: bool) -> jax.Array:
    """Boolean [B, 1, Tq, Tk] mask, True = attend: a token sees its own sentence, (causally).

    A padding query (segment 0) sees every key instead. Its output reaches no loss and no real
    token (no real query attends to padding), so nothing a sentence computes changes; but no
    row of the mask is empty. XLA's softmax takes an empty row in its stride; with cuDNN's
    fused kernel the gradients were NaN from the first step on an H100 (issue 29), likely
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
    d_in: int, d_out: int, dtype: Any, rngs: nnx.Rngs, use_bias: bool = True
) -> nnx.Linear:
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=use_bias,
        dtype=dtype,
        rngs=rngs,
        kernel_init=nnx.initializers.xavier_uniform(),
    )


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
        self.query = xavier_linear(d, d, dtype, rngs)
        # No key bias: it adds the same amount to every score of a query, which softmax ignores,
        # so its true gradient is zero and Adam would only amplify rounding noise in it.
        self.key = xavier_linear(d, d, dtype, rngs, use_bias=False)
        self.value = xavier_linear(d, d, dtype, rngs)
        self.out = xavier_linear(d, d, dtype, rngs)
        # Set only by Transformer.attention_weights: the fused kernel never forms the weights.
        self.keep_weights = False

    def split_heads(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        return x.reshape(b, t, self.num_heads, d // self.num_heads)  # [B, T, H, K]

    def project_kv(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return self.split_heads(self.key(x)), self.split_heads(self.value(x))

    def attend(self, x: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
        """Attention of x's queries over keys and values [B, Tk, H, K] under mask [B, 1, Tq, Tk]."""
        q = self.split_heads(self.query(x))  # [B, Tq, H, K]
        if self.keep_weights:
            scores = attention_scores("bqhk,bshk->bhqs", q, k, mask)  # [B, H, Tq, Tk]
            weights = jax.nn.softmax(scores, axis=-1)
            self.sow(nnx.Intermediate, "weights", weights)
            y = jnp.einsum("bhqs,bshk->bqhk", weights.astype(v.dtype), v)  # [B, Tq, H, K]
        else:
            # softmax(QK^T / sqrt(K)) V; the fused kernel scales by 1/sqrt(K) itself.
            y = jax.nn.dot_product_attention(
                q, k, v, mask=mask, implementation=self.implementation
            )  # [B, Tq, H, K]
        return self.out(y.reshape(*x.shape[:2], -1))  # [B, Tq, D]

    def __call__(self, x: jax.Array, context: jax.Array, mask: jax.Array) -> jax.Array:
        k, v = self.project_kv(context)  # [B, Tk, H, K] each
        return self.attend(x, k, v, mask)

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


class FeedForward(nnx.Module):
    """Sec. 3.3: FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, config: ModelConfig, dtype: Any, rngs: nnx.Rngs):
        self.inner = xavier_linear(config.d_model, config.d_ff, dtype, rngs)
        self.outer = xavier_linear(config.d_ff, config.d_model, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.outer(jax.nn.relu(self.inner(x)))  # [B, T, F] -> [B, T, D]


class ResidualLayer(nnx.Module):
    """Sec. 3.1's residual connection around each sub-layer, LayerNorm after it or before it.

    Post-LayerNorm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-LayerNorm (the variant): x + Dropout(Sublayer(LayerNorm(x))).
    Subclasses set `rate` (dropout) and `pre_norm`.
    """

    rate: float
    pre_norm: bool

    def normed(self, norm: nnx.LayerNorm, x: jax.Array) -> jax.Array:
        """A sub-layer's input: LayerNorm(x) with pre-LayerNorm, x itself with post."""
        return norm(x) if self.pre_norm else x

    def add(self, norm: nnx.LayerNorm, x: jax.Array, out: jax.Array, key) -> jax.Array:
        """The residual sum of x and a sub-layer's output, normalised after it with post."""
        x = x + dropout(out, self.rate, key)
        return x if self.pre_norm else norm(x)

    def sublayer(self, norm: nnx.LayerNorm, x: jax.Array, fn, key) -> jax.Array:
        return self.add(norm, x, fn(self.normed(norm, x)), key)


class EncoderLayer(ResidualLayer):
    """Sec. 3.1: self-attention then feed-forward, each inside a residual connection."""

    def __init__(self, config: ModelConfig, dtype: Any, attention: str, rngs: nnx.Rngs):
        self.rate = config.dropout_rate
        self.pre_norm = config.norm_position == "pre"
        self.self_attention = MultiHeadAttention(config, dtype, attention, rngs)
        self.norm1 = layer_norm(config, dtype, rngs)
        self.feed_forward = FeedForward(config, dtype, rngs)
        self.norm2 = layer_norm(config, dtype, rngs)

    def __call__(self, x, mask, key):
        x = self.sublayer(self.norm1, x, lambda h: self.self_attention(h, h, mask), fold(key, 0))
        return self.sublayer(self.norm2, x, self.feed_forward, fold(key, 1))


class DecoderLayer(ResidualLayer):
    """Sec. 3.1: masked self-attention, attention over the encoder output, feed-forward."""

    def __init__(self, config: ModelConfig, dtype: Any, attention: str, rngs: nnx.Rngs):
        self.rate = config.dropout_rate
        self.pre_norm = config.norm_position == "pre"
        self.self_attention = MultiHeadAttention(config, dtype, attention, rngs)
        self.norm1 = layer_norm(config, dtype, rngs)
        self.cross_attention = MultiHeadAttention(config, dtype, attention, rngs)
        self.norm2 = layer_norm(config, dtype, rngs)
        self.feed_forward = FeedForward(config, dtype, rngs)
        self.norm3 = layer_norm(config, dtype, rngs)

    def finish(self, x, self_out, cross_attend, key):
        """Everything after self-attention, shared by full and cached decoding.

        `self_out` is self-attention's output for the input `self.normed(self.norm1, x)`;
        `cross_attend` maps a query input to its attention over the encoder output.
        """
        x = self.add(self.norm1, x, self_out, fold(key, 0))
        x = self.sublayer(self.norm2, x, cross_attend, fold(key, 1))
        return self.sublayer(self.norm3, x, self.feed_forward, fold(key, 2))

    def __call__(self, x, memory, self_mask, cross_mask, key):
        h = self.normed(self.norm1, x)
        self_out = self.self_attention(h, h, self_mask)
        return self.finish(x, self_out, lambda h: self.cross_attention(h, memory, cross_mask), key)


class TranslationModel(nnx.Module):
    """The base of every architecture: what training, the search and the tools call.

    Holds Sec. 3.4's one embedding matrix, which serves the inputs and the pre-softmax
    projection. The encoder-decoder (`Transformer`) and the decoder-only variant
    (translate/decoder_only.py) each define `hidden`, their teacher-forced output, and their
    cached decoding; translate/factory.py builds the configured one.
    """

    def __init__(self, config: ModelConfig, vocab_size: int, rngs: nnx.Rngs):
        # Plain numbers, not the config object: the graph definition must stay hashable.
        self.d_model, self.num_heads = config.d_model, config.num_heads
        self.dropout_rate = config.dropout_rate
        self.dtype = resolve_dtype(config.compute_dtype)
        self.embed = nnx.Embed(
            vocab_size,
            config.d_model,
            dtype=self.dtype,
            rngs=rngs,
            embedding_init=nnx.initializers.normal(config.d_model**-0.5),
        )

    def embed_tokens(self, tokens, positions, key):
        # Sec. 3.4: embeddings are multiplied by sqrt(d_model); Sec. 3.5: positions are added.
        # Rows are gathered from the float32 table and then cast, so that the gradient's
        # scatter-add runs in float32: casting the table first made XLA scatter in bfloat16,
        # 9.6 ms of the base model's 61 ms step on an H100 (issue 29).
        table = self.embed.embedding[...]  # [V, D] float32
        x = jnp.take(table, tokens, axis=0).astype(self.dtype) * math.sqrt(self.d_model)
        x = x + sinusoidal_positions(positions, self.d_model).astype(self.dtype)
        return dropout(x, self.dropout_rate, key)  # Sec. 5.4

    def logits(self, y: jax.Array) -> jax.Array:
        """Sec. 3.4: the pre-softmax projection is the shared embedding; [..., D] -> [..., V].

        Accumulated and returned in float32, as in training (losses.projected_cross_entropy):
        beam search ranks hypotheses on these numbers.
        """
        embedding = self.embed.embedding[...].astype(self.dtype)
        return jnp.einsum("...d,vd->...v", y, embedding, preferred_element_type=jnp.float32)

    def hidden(self, batch: Batch, *, dropout_key=None) -> jax.Array:
        """Teacher-forced output [B, T, D] at the target tokens; each architecture's own."""
        raise NotImplementedError

    def __call__(self, batch: Batch, *, dropout_key=None) -> jax.Array:
        """Teacher-forced logits [B, T, V] (float32) for a batch of the data pipeline."""
        return self.logits(self.hidden(batch, dropout_key=dropout_key)).astype(jnp.float32)

    def attention_weights(self, batch: Batch) -> dict[str, jax.Array]:
        """Teacher-forced attention weights [B, H, Tq, Tk] by module path, for inspection.

        Keys look like "encoder.0.self_attention" or "decoder.1.cross_attention". The weights
        are formed explicitly on a copy of the model, so the normal path stays fused.
        """
        model = nnx.clone(self)
        for _, module in nnx.iter_modules(model):
            if isinstance(module, MultiHeadAttention):
                module.keep_weights = True
        _, found = nnx.capture(model, nnx.Intermediate)(batch)
        return {
            ".".join(map(str, path[:-1])): value.get_value()[0]
            for path, value in nnx.to_flat_state(found)
        }


class Transformer(TranslationModel):
    """The paper's encoder-decoder (Sec. 3.1).

    `attention` is the kernel of jax.nn.dot_product_attention ("xla" or "cudnn"), resolved for
    the device by translate/factory.py from `model.attention`.
    """

    def __init__(
        self, config: ModelConfig, vocab_size: int, *, rngs: nnx.Rngs, attention: str = "xla"
    ):
        super().__init__(config, vocab_size, rngs)
        self.encoder = nnx.List(
            [EncoderLayer(config, self.dtype, attention, rngs) for _ in range(config.num_layers)]
        )
        self.decoder = nnx.List(
            [DecoderLayer(config, self.dtype, attention, rngs) for _ in range(config.num_layers)]
        )
        # Pre-LayerNorm only: each stack's output is normalised once more (post-LayerNorm's
        # last sub-layer already ends in a LayerNorm).
        pre_norm = config.norm_position == "pre"
        self.encoder_norm = layer_norm(config, self.dtype, rngs) if pre_norm else None
        self.decoder_norm = layer_norm(config, self.dtype, rngs) if pre_norm else None

    def encode(self, src, src_segments, src_positions, *, dropout_key=None) -> jax.Array:
        """Source tokens [B, S] -> memory [B, S, D]."""
        x = self.embed_tokens(src, src_positions, fold(dropout_key, 0))
        mask = attention_mask(src_segments, src_segments, causal=False)  # [B, 1, S, S]
        for i, layer in enumerate(self.encoder):
            x = layer(x, mask, fold(dropout_key, 1 + i))
        return x if self.encoder_norm is None else self.encoder_norm(x)

    def decode(
        self, tgt_in, tgt_segments, tgt_positions, memory, src_segments, *, dropout_key=None
    ) -> jax.Array:
        """Shifted target [B, T] and memory [B, S, D] -> decoder output [B, T, D]."""
        key = fold(dropout_key, 1000)
        y = self.embed_tokens(tgt_in, tgt_positions, fold(key, 0))
        self_mask = attention_mask(tgt_segments, tgt_segments, causal=True)  # [B, 1, T, T]
        cross_mask = attention_mask(tgt_segments, src_segments, causal=False)  # [B, 1, T, S]
        for i, layer in enumerate(self.decoder):
            y = layer(y, memory, self_mask, cross_mask, fold(key, 1 + i))
        return y if self.decoder_norm is None else self.decoder_norm(y)

    def hidden(self, batch: Batch, *, dropout_key=None) -> jax.Array:
        """Teacher-forced decoder output [B, T, D] for a batch of the data pipeline.

        Training projects it onto the vocabulary inside the loss (losses.projected_cross_entropy).
        """
        memory = self.encode(
            batch.src, batch.src_segments, batch.src_positions, dropout_key=dropout_key
        )
        return self.decode(
            batch.tgt_in,
            batch.tgt_segments,
            batch.tgt_positions,
            memory,
            batch.src_segments,
            dropout_key=dropout_key,
        )

    def prefill(self, src: jax.Array, src_segments: jax.Array, copies: int, max_len: int) -> Cache:
        """The decoding cache for sources [B, S], each repeated `copies` times (beam search).

        The encoder runs once per sentence; its memory is then repeated per hypothesis.
        """
        positions = jnp.broadcast_to(jnp.arange(src.shape[1]), src.shape)  # [B, S]
        memory = self.encode(src, src_segments, positions)  # [B, S, D]
        memory = jnp.repeat(memory, copies, axis=0)  # [B * W, S, D]
        return self.init_cache(memory, jnp.repeat(src_segments, copies, axis=0), max_len)

    def init_cache(self, memory: jax.Array, src_segments: jax.Array, max_len: int) -> Cache:
        """Projects the memory once per layer; allocates empty self-attention keys and values.

        Keys are kept transposed, [B, H, K, L], and values as [B, H, L, K]
        (MultiHeadAttention.attend_cached); the encoder side has S in place of L.
        """
        b, h = memory.shape[0], self.num_heads
        k = self.d_model // h
        cache = []
        for layer in self.decoder:
            cross_k, cross_v = layer.cross_attention.project_kv_cached(memory)
            empty_k = jnp.zeros((b, h, k, max_len), self.dtype)
            empty_v = jnp.zeros((b, h, max_len, k), self.dtype)
            cache.append(LayerCache(empty_k, empty_v, cross_k, cross_v, src_segments > 0))
        return cache

    @staticmethod
    def extend_cache(cache: Cache, max_len: int) -> Cache:
        """The cache with room for `max_len` steps: empty slots appended to the keys and values.

        The search grows the cache as its outputs grow (decode.cache_lengths): every step's
        attention, and beam search's reordering, read the whole cache, written or not.
        """
        grow = max_len - cache[0].k.shape[-1]
        if grow == 0:
            return cache
        return [
            c._replace(
                k=jnp.pad(c.k, ((0, 0), (0, 0), (0, 0), (0, grow))),  # [B, H, K, max_len]
                v=jnp.pad(c.v, ((0, 0), (0, 0), (0, grow), (0, 0))),  # [B, H, max_len, K]
            )
            for c in cache
        ]

    @staticmethod
    def reorder_cache(cache: Cache, rows: jax.Array) -> Cache:
        """The cache of rows `rows` [B'] (beam search's surviving hypotheses).

        Self-attention keys and values follow their rows; the encoder side is the same for
        every hypothesis of a sentence and stays.
        """
        return [c._replace(k=c.k[rows], v=c.v[rows]) for c in cache]

    def decode_step(
        self, tokens: jax.Array, index: jax.Array, cache: Cache
    ) -> tuple[jax.Array, Cache]:
        """One step of cached decoding: tokens [B] at position `index` -> logits [B, V], cache."""
        y = self.embed_tokens(tokens[:, None], jnp.full((tokens.shape[0], 1), index), None)
        new_cache = []
        for layer, c in zip(self.decoder, cache):
            attn = layer.self_attention
            h = layer.normed(layer.norm1, y)  # [B, 1, D]
            k_new, v_new = attn.project_kv_cached(h)  # [B, H, K, 1], [B, H, 1, K]
            # Written in place: the cache is a loop carry that nothing else reads.
            k = jax.lax.dynamic_update_slice_in_dim(c.k, k_new.astype(c.k.dtype), index, 3)
            v = jax.lax.dynamic_update_slice_in_dim(c.v, v_new.astype(c.v.dtype), index, 2)
            self_mask = (jnp.arange(k.shape[-1]) <= index)[None, None, :]  # [1, 1, L]
            self_out = attn.attend_cached(h, k, v, self_mask)
            cross_mask = c.src_valid[:, None, :]  # [B, 1, S]
            y = layer.finish(
                y,
                self_out,
                functools.partial(
                    layer.cross_attention.attend_cached,
                    keys_t=c.cross_k,
                    values=c.cross_v,
                    mask=cross_mask,
                ),
                None,
            )
            new_cache.append(c._replace(k=k, v=v))
        if self.decoder_norm is not None:
            y = self.decoder_norm(y)
        return self.logits(y[:, 0]).astype(jnp.float32), new_cache
