"""The Transformer of Vaswani et al. 2017, "Attention Is All You Need", in Flax NNX.

This file assembles the encoder-decoder (Sec. 3.1) and its KV cache for decoding; the blocks it
is built of are in translate/models/: attention.py (Sec. 3.2), positions.py (Sec. 3.5 and its
variants), norms.py (LayerNorm and its variant), layers.py (the feed-forward network and the
encoder and decoder layers), precision.py and dropout.py; factory.py builds the configured
model.

Shape letters used in comments and einsum strings:
  B batch rows, S source length, T target length, D d_model, H heads, K head dim (D / H),
  G key and value heads (H unless `model.num_kv_heads`), F d_ff, V vocabulary size,
  L cache length.

Batches may be packed: several sentences share a row. `segments` (int, 0 = padding) says which
sentence each token belongs to and `positions` its index inside that sentence; attention never
crosses sentences, so a packed row computes exactly what separate rows would.

Deviations from the paper, all of them (the one list; docs/architecture.md links here). With
the default config:
  - Padding and packing as above (an implementation detail with identical outputs).
  - Linear layers have biases (except the key projection, whose bias cannot change any output)
    and Xavier-uniform initialisation, and embeddings are initialised with N(0, d_model^-0.5);
    the paper does not state either.
  - LayerNorm epsilon is 1e-6; the paper does not state it.
  - Dropout draws 16 random bits per element, so its rate is rounded to a multiple of 2^-16
    (0.1 becomes 0.100006); see `dropout.dropout`.
  - Label smoothing (Sec. 5.4) spreads eps over the whole vocabulary, the target piece and the
    special pieces included: (1 - eps) NLL + eps * cross-entropy against 1/V
    (training/losses.py). The paper does not say over which pieces.
  - A batch is a number of token slots per side, `data.tokens_per_batch` (25,000, Sec. 5.1),
    padding of the packed rows included, rather than of real tokens.
  - On a GPU or TPU the model computes in bfloat16 (`model.compute_dtype=auto`) while the
    parameters, softmax and the loss stay float32; on a CPU it computes in float32.
There is no final LayerNorm on either stack: with post-LayerNorm the last sub-layer already
ends in one (Sec. 3.1).

Options that depart further, each off unless a config sets it:
  - `model.norm_position="pre"` moves each LayerNorm to the sub-layer's input,
    x + Dropout(Sublayer(LayerNorm(x))), and adds a final LayerNorm to each stack (Xiong et
    al. 2020); "post" computes exactly the paper's model above.
  - `model.matmul_dtype="bfloat16"`: the linear layers' and the projection's products take
    bfloat16 operands with float32 accumulation, in both passes.
  - `model.attention_dropout_rate` (dropout on the attention weights) and
    `model.activation_dropout_rate` (on the feed-forward's inner ReLU): tensor2tensor's two
    extra dropouts; the paper uses neither.
  - `model.dropout_bits="hash"`: dropout's bits from a counter hash instead of threefry.
  - Today's blocks (docs/variants.md): `model.positions` rotary or relative (a T5 bias) in
    place of Sec. 3.5's sinusoids, `model.normalization="rmsnorm"`, `model.feed_forward`
    GELU, SiLU, SwiGLU or GeGLU in place of Sec. 3.3's ReLU, `model.num_kv_heads` below
    `num_heads` (grouped-query attention), `model.use_bias=False`,
    `model.scale_embeddings=False` (no sqrt(d_model) on the embeddings, Sec. 3.4) and
    `model.logits_bias` (a bias on the pre-softmax projection), and
    `model.share_encoder_decoder_embeddings=False` (the encoder's own embedding matrix).
  - `model.architecture="decoder_only"` (models/decoder_only.py) replaces the encoder-decoder.
  - Training (translate/training/optim.py): `train.lr_decay` linear or cosine in place of the
    paper's inverse square root, `train.weight_decay` (AdamW), `train.optimizer="muon"`, and a
    moving average of the parameters (`train.ema_decay`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from translate.config import DropoutBits, ModelConfig, check_choice
from translate.models.attention import KV, MultiHeadAttention, Slots, attention_mask, num_kv_heads
from translate.models.dropout import dropout, fold
from translate.models.layers import DecoderLayer, EncoderLayer, LayerCache
from translate.models.norms import is_pre_norm, make_norm
from translate.models.positions import Positions, position_scheme, sinusoidal_positions
from translate.models.precision import compute_dtype, product_dtype

if TYPE_CHECKING:  # for annotations only: the data pipeline feeds the model, not the reverse
    from translate.data.batching import Batch


Cache = list[LayerCache]  # one per decoder layer


class TranslationModel(nnx.Module):
    """The base of every architecture: what training, the search and the tools call.

    Holds Sec. 3.4's one embedding matrix, which serves the inputs and the pre-softmax
    projection (and the encoder's own matrix where that sharing is off). The encoder-decoder
    (`Transformer`) and the decoder-only variant (translate/models/decoder_only.py) each define
    `hidden`, their teacher-forced output, and their cached decoding;
    translate/models/factory.py builds the configured one.
    """

    def __init__(self, config: ModelConfig, vocab_size: int, rngs: nnx.Rngs, dtype: Any = None):
        # Plain numbers, not the config object: the graph definition must stay hashable.
        self.d_model, self.num_heads = config.d_model, config.num_heads
        self.num_kv_heads = num_kv_heads(config)
        # Sec. 3.5's sinusoids are added to the embeddings; rotary and relative positions act
        # inside self-attention instead (positions.py).
        self.adds_positions = position_scheme(config).added
        self.scales_embeddings = config.scale_embeddings
        self.dropout_rate = config.dropout_rate
        self.dropout_bits = check_choice(config.dropout_bits, DropoutBits, "model.dropout_bits")
        self.dtype = compute_dtype(config) if dtype is None else jnp.dtype(dtype)
        # The operands' dtype of the pre-softmax projection (`model.matmul_dtype`).
        self.product_dtype = product_dtype(config, self.dtype)
        self.embed = nnx.Embed(
            vocab_size,
            config.d_model,
            dtype=self.dtype,
            rngs=rngs,
            embedding_init=nnx.initializers.normal(config.d_model**-0.5),
        )
        # A learned bias on the pre-softmax projection (`model.logits_bias`, Marian's
        # final_logits_bias), from zero; Sec. 3.4's projection has none.
        self.logits_bias = (
            nnx.Param(jnp.zeros((vocab_size,), jnp.float32)) if config.logits_bias else None
        )
        # The encoder's own embedding matrix where Sec. 3.4's sharing is off
        # (`model.share_encoder_decoder_embeddings`); None: the encoder reads `embed`.
        self.source_embed = (
            None
            if config.share_encoder_decoder_embeddings
            else nnx.Embed(
                vocab_size,
                config.d_model,
                dtype=self.dtype,
                rngs=rngs,
                embedding_init=nnx.initializers.normal(config.d_model**-0.5),
            )
        )

    def embed_tokens(self, tokens, positions, key, source: bool = False):
        """Tokens -> their embeddings with positions, dropped out; `source`: the encoder's."""
        # Sec. 3.4: embeddings are multiplied by sqrt(d_model); Sec. 3.5: positions are added.
        # Rows are gathered from the float32 table and then cast, so that the gradient's
        # scatter-add runs in float32: casting the table first made XLA scatter in bfloat16,
        # 9.6 ms of the base model's 61 ms step on an H100.
        embed = self.source_embed if source and self.source_embed is not None else self.embed
        table = embed.embedding[...]  # [V, D] float32
        x = jnp.take(table, tokens, axis=0).astype(self.dtype)
        if self.scales_embeddings:
            x = x * math.sqrt(self.d_model)
        if self.adds_positions:
            x = x + sinusoidal_positions(positions, self.d_model).astype(self.dtype)
        return dropout(x, self.dropout_rate, key, self.dropout_bits)  # Sec. 5.4

    @staticmethod
    def projection_flops(config: ModelConfig, vocab_size: int, tgt: np.ndarray) -> float:
        """Sec. 3.4's pre-softmax projection onto the shared embedding: [D, V] per target token.

        FLOPs as counted in translate/models/flops.py; `tgt` holds target lengths.
        """
        return tgt.sum() * 2 * float(config.d_model) * vocab_size

    def logits(self, y: jax.Array) -> jax.Array:
        """Sec. 3.4: the pre-softmax projection is the shared embedding; [..., D] -> [..., V].

        Accumulated and returned in float32, as in training (losses.projected_cross_entropy):
        beam search ranks hypotheses on these numbers.
        """
        embedding = self.embed.embedding[...].astype(self.product_dtype)
        y = y.astype(self.product_dtype)
        logits = jnp.einsum("...d,vd->...v", y, embedding, preferred_element_type=jnp.float32)
        bias = self.output_bias()
        return logits if bias is None else logits + bias

    def output_bias(self) -> jax.Array | None:
        """The projection's bias [V] (float32), or None where the model has none."""
        return None if self.logits_bias is None else self.logits_bias[...]

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

    `dtype` is the compute dtype and `attention` the kernel of jax.nn.dot_product_attention
    ("xla" or "cudnn"), both resolved for the device by translate/models/factory.py; built
    directly, the model computes in `compute_dtype(config)` with XLA's kernel.
    """

    def __init__(
        self, config: ModelConfig, vocab_size: int, *, rngs: nnx.Rngs, dtype=None, attention="xla"
    ):
        super().__init__(config, vocab_size, rngs, dtype)
        self.encoder = nnx.List(
            [EncoderLayer(config, self.dtype, attention, rngs) for _ in range(config.num_layers)]
        )
        self.decoder = nnx.List(
            [DecoderLayer(config, self.dtype, attention, rngs) for _ in range(config.num_layers)]
        )
        # Pre-LayerNorm only: each stack's output is normalised once more (post-LayerNorm's
        # last sub-layer already ends in a LayerNorm).
        pre_norm = is_pre_norm(config)
        self.encoder_norm = make_norm(config, self.dtype, rngs) if pre_norm else None
        self.decoder_norm = make_norm(config, self.dtype, rngs) if pre_norm else None

    @classmethod
    def forward_flops(
        cls, config: ModelConfig, vocab_size: int, src: np.ndarray, tgt: np.ndarray
    ) -> float:
        """Forward FLOPs of sentence pairs with source and target lengths `src`, `tgt` (float
        arrays), counted as translate/models/flops.py says."""
        encoder = config.num_layers * EncoderLayer.flops(config, src)
        decoder = config.num_layers * DecoderLayer.flops(config, src, tgt)
        return float(encoder + decoder + cls.projection_flops(config, vocab_size, tgt))

    def encode(self, src, src_segments, src_positions, *, dropout_key=None) -> jax.Array:
        """Source tokens [B, S] -> memory [B, S, D]."""
        x = self.embed_tokens(src, src_positions, fold(dropout_key, 0), source=True)
        mask = attention_mask(src_segments, src_segments, causal=False)  # [B, 1, S, S]
        positions = Positions(src_positions, src_positions)
        for i, layer in enumerate(self.encoder):
            x, _ = layer(x, positions, mask, fold(dropout_key, 1 + i))
        return x if self.encoder_norm is None else self.encoder_norm(x)

    def decode(
        self, tgt_in, tgt_segments, tgt_positions, memory, src_segments, *, dropout_key=None
    ) -> jax.Array:
        """Shifted target [B, T] and memory [B, S, D] -> decoder output [B, T, D]."""
        key = fold(dropout_key, 1000)
        y = self.embed_tokens(tgt_in, tgt_positions, fold(key, 0))
        self_mask = attention_mask(tgt_segments, tgt_segments, causal=True)  # [B, 1, T, T]
        cross_mask = attention_mask(tgt_segments, src_segments, causal=False)  # [B, 1, T, S]
        positions = Positions(tgt_positions, tgt_positions)
        for i, layer in enumerate(self.decoder):
            y, _ = layer(y, positions, memory, self_mask, cross_mask, fold(key, 1 + i))
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

        Keys are kept transposed, [B, G, K, L], and values as [B, G, L, K] (attention.KV);
        the encoder side has S in place of L.
        """
        b, g = memory.shape[0], self.num_kv_heads
        k = self.d_model // self.num_heads
        cache = []
        for layer in self.decoder:
            cross_kv = layer.cross_attention.project_memory(memory)
            empty_k = jnp.zeros((b, g, k, max_len), self.dtype)
            empty_v = jnp.zeros((b, g, max_len, k), self.dtype)
            cache.append(LayerCache(KV(empty_k, empty_v), cross_kv, src_segments > 0))
        return cache

    @staticmethod
    def extend_cache(cache: Cache, max_len: int) -> Cache:
        """The cache with room for `max_len` steps: empty slots appended to the keys and values.

        The search grows the cache as its outputs grow (decoding/loop.py, `cache_lengths`):
        every step's attention, and beam search's reordering, read the whole cache, written or
        not.
        """
        grow = max_len - cache[0].self_kv.k.shape[-1]
        if grow == 0:
            return cache
        return [
            c._replace(
                self_kv=KV(
                    jnp.pad(c.self_kv.k, ((0, 0), (0, 0), (0, 0), (0, grow))),  # [B, G, K, max_len]
                    jnp.pad(c.self_kv.v, ((0, 0), (0, 0), (0, grow), (0, 0))),  # [B, G, max_len, K]
                )
            )
            for c in cache
        ]

    @staticmethod
    def reorder_cache(cache: Cache, rows: jax.Array) -> Cache:
        """The cache of rows `rows` [B'] (beam search's surviving hypotheses).

        Self-attention keys and values follow their rows; the encoder side is the same for
        every hypothesis of a sentence and stays.
        """
        return [c._replace(self_kv=KV(c.self_kv.k[rows], c.self_kv.v[rows])) for c in cache]

    def decode_block(self, tokens: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
        """Tokens [B, P] at positions 0..P-1 in one pass -> logits [B, P, V] and the cache with
        their keys and values in slots 0..P-1 (a forced target prefix, decoding/search.py).

        What P calls of `decode_step` compute, in one causal pass: each position's query sees
        the keys of the positions up to its own, and the encoder's through the cache.
        """
        b, p = tokens.shape
        positions = jnp.broadcast_to(jnp.arange(p), (b, p))  # [B, P]
        y = self.embed_tokens(tokens, positions, None)  # [B, P, D]
        causal = jnp.tril(jnp.ones((p, p), bool))[None, None]  # [1, 1, P, P]
        cross_mask = cache[0].src_valid[:, None, None, :]  # [B, 1, 1, S]
        positions = Positions(positions, jnp.arange(p)[None])  # keys in slots 0..P-1
        y, cache = self.decode_cached(y, positions, causal, cross_mask, cache, Slots(0, step=False))
        return self.logits(y).astype(jnp.float32), cache

    def decode_step(
        self, tokens: jax.Array, index: jax.Array, cache: Cache
    ) -> tuple[jax.Array, Cache]:
        """One step of cached decoding: tokens [B] at position `index` -> logits [B, V], cache."""
        positions = jnp.full((tokens.shape[0], 1), index)  # [B, 1]
        y = self.embed_tokens(tokens[:, None], positions, None)
        slots = jnp.arange(cache[0].self_kv.k.shape[-1])  # [L]: slot i holds position i
        self_mask = (slots <= index)[None, None, None, :]  # [1, 1, 1, L]
        cross_mask = cache[0].src_valid[:, None, None, :]  # [B, 1, 1, S]
        positions = Positions(positions, slots[None])
        y, cache = self.decode_cached(
            y, positions, self_mask, cross_mask, cache, Slots(index, step=True)
        )
        return self.logits(y[:, 0]).astype(jnp.float32), cache

    def decode_cached(self, y, positions, self_mask, cross_mask, cache: Cache, slots: Slots):
        """Embedded targets y [B, T, D] at `positions` through every decoder layer with its
        cache -> output [B, T, D] (the final norm included) and the updated cache."""
        new_cache = []
        for layer, c in zip(self.decoder, cache):
            y, c = layer(y, positions, None, self_mask, cross_mask, cache=c, slots=slots)
            new_cache.append(c)
        return (y if self.decoder_norm is None else self.decoder_norm(y)), new_cache
