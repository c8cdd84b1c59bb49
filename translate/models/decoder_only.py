"""A decoder-only Transformer that translates by reading `source <sep> target` as one sequence.

A variant, not the paper's model: one stack of `num_layers` layers, each the encoder layer's
self-attention and feed-forward (layers.EncoderLayer) under a causal mask, and no
cross-attention (the GPT family). A pair is the encoder-decoder's two inputs one after the
other,

    x_1 .. x_n EOS  BOS y_1 .. y_m       (EOS BOS is the separator)

and only the target part is scored: at BOS and at each y_j the model predicts y_1 .. y_m EOS,
exactly the encoder-decoder's targets, so the two are trained and evaluated on equal terms.
Positions run on through the pair: BOS is at position n + 1.

`model.prefix_attention` says what source tokens see: "causal", the tokens before them;
"bidirectional" (a prefix LM), every source token of their pair. Target tokens always see the
whole source and the target tokens before them.

Batches are the data pipeline's (batching.Batch), packed as for the encoder-decoder: a row's
source side and target side hold the same pairs under the same segment ids. The stack runs over
the two sides side by side, [B, S + T]; attention joins tokens of one pair (same segment id)
and orders them by position within the pair, so where a token sits in the row never matters and
padding or packing leaves every output unchanged.

Cached decoding: `prefill` runs the stack once over the source as the search gives it (x EOS,
padded to S), which fills the first S slots of each layer's key and value cache; step t writes
slot S + t, at position (source tokens) + t.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from translate.config import ModelConfig, PrefixAttention, check_choice
from translate.models.attention import KV, Slots
from translate.models.dropout import fold
from translate.models.layers import EncoderLayer
from translate.models.norms import is_pre_norm, make_norm
from translate.models.positions import Positions
from translate.models.transformer import TranslationModel

if TYPE_CHECKING:  # for annotations only: the data pipeline feeds the model, not the reverse
    from translate.data.batching import Batch


# `model.prefix_attention` -> whether a source token sees the whole source of its pair (a
# prefix LM), rather than the source tokens before it.
SEES_WHOLE_SOURCE: dict[str, bool] = {"causal": False, "bidirectional": True}


class PrefixCache(NamedTuple):
    """Keys and values of every layer for cached decoding: the source's S slots, then L steps."""

    layers: list[KV]  # per layer [B, G, K, S + L] (keys, transposed), [B, G, S + L, K]
    prefix_valid: jax.Array  # [B, S] True on real source tokens
    prefix_len: jax.Array  # [B] source tokens (EOS included): the first step's position


def prefix_lm_mask(
    segments: jax.Array, positions: jax.Array, in_prefix: jax.Array, bidirectional: bool
) -> jax.Array:
    """Boolean [B, 1, N, N] mask, True = attend, over tokens [B, N] of packed pairs.

    A query sees keys of its own pair (same segment, not padding) at positions up to its own;
    with `bidirectional`, a source (prefix) query also sees every source key of its pair.
    A padding query sees every key, so that no row is empty (see attention.attention_mask).
    """
    same = segments[:, :, None] == segments[:, None, :]
    visible = positions[:, None, :] <= positions[:, :, None]  # key position <= query position
    if bidirectional:
        visible |= in_prefix[:, :, None] & in_prefix[:, None, :]
    return ((same & visible) | (segments[:, :, None] == 0))[:, None]  # [B, 1, N, N]


class DecoderOnlyTransformer(TranslationModel):
    """One causal stack over `source <sep> target`; the interface of transformer.Transformer."""

    def __init__(
        self, config: ModelConfig, vocab_size: int, *, rngs: nnx.Rngs, dtype=None, attention="xla"
    ):
        super().__init__(config, vocab_size, rngs, dtype)
        prefix = check_choice(config.prefix_attention, PrefixAttention, "model.prefix_attention")
        self.bidirectional = SEES_WHOLE_SOURCE[prefix]
        causal = not self.bidirectional
        self.decoder = nnx.List(
            [
                EncoderLayer(config, self.dtype, attention, rngs, causal=causal)
                for _ in range(config.num_layers)
            ]
        )
        # Pre-LayerNorm only, as in transformer.Transformer.
        pre_norm = is_pre_norm(config)
        self.decoder_norm = make_norm(config, self.dtype, rngs) if pre_norm else None

    @classmethod
    def forward_flops(
        cls, config: ModelConfig, vocab_size: int, src: np.ndarray, tgt: np.ndarray
    ) -> float:
        """Forward FLOPs of pairs with source and target lengths `src`, `tgt` (float arrays),
        counted as translate/models/flops.py says: one stack of self-attention and feed-forward
        layers over each pair, source then target."""
        stack = config.num_layers * EncoderLayer.flops(config, src + tgt)
        return float(stack + cls.projection_flops(config, vocab_size, tgt))

    def stack(self, tokens, segments, positions, in_prefix, *, dropout_key=None) -> jax.Array:
        """Tokens [B, N] of packed pairs -> output [B, N, D] (final LayerNorm included)."""
        x = self.embed_tokens(tokens, positions, fold(dropout_key, 0))  # [B, N, D]
        mask = prefix_lm_mask(segments, positions, in_prefix, self.bidirectional)
        for i, layer in enumerate(self.decoder):
            x, _ = layer(x, Positions(positions, positions), mask, fold(dropout_key, 1 + i))
        return x if self.decoder_norm is None else self.decoder_norm(x)

    def hidden(self, batch: Batch, *, dropout_key=None) -> jax.Array:
        """Teacher-forced output [B, T, D] at the target tokens of a batch of the data pipeline.

        Training projects it onto the vocabulary inside the loss, as for the encoder-decoder.
        """
        (b, s), t = batch.src.shape, batch.tgt_in.shape[1]
        # Each target token's offset: the length of its pair's source, EOS included.
        same_pair = batch.tgt_segments[:, :, None] == batch.src_segments[:, None, :]  # [B, T, S]
        src_len = jnp.sum(same_pair & (batch.src_segments[:, None, :] > 0), axis=-1)  # [B, T]
        y = self.stack(
            jnp.concatenate([batch.src, batch.tgt_in], axis=1),  # [B, S + T]
            jnp.concatenate([batch.src_segments, batch.tgt_segments], axis=1),
            jnp.concatenate([batch.src_positions, batch.tgt_positions + src_len], axis=1),
            jnp.broadcast_to(jnp.arange(s + t) < s, (b, s + t)),  # the source side
            dropout_key=dropout_key,
        )
        return y[:, s:]  # [B, T, D]

    def prefill(
        self, src: jax.Array, src_segments: jax.Array, copies: int, max_len: int
    ) -> PrefixCache:
        """The decoding cache for sources [B, S], each repeated `copies` times (beam search).

        Runs the stack once over the source, keeping each layer's keys and values, followed by
        room for `max_len` steps.
        """
        b, s = src.shape
        positions = jnp.broadcast_to(jnp.arange(s), (b, s))  # [B, S]
        in_prefix = src_segments > 0  # [B, S]
        mask = prefix_lm_mask(src_segments, positions, in_prefix, self.bidirectional)
        x = self.embed_tokens(src, positions, None)  # [B, S, D]
        g, k = self.num_kv_heads, self.d_model // self.num_heads
        empty = KV(
            jnp.zeros((b, g, k, s + max_len), self.dtype),
            jnp.zeros((b, g, s + max_len, k), self.dtype),
        )  # [B, G, K, S + L], [B, G, S + L, K]
        layers = []
        for layer in self.decoder:
            # The source's keys and values go into slots 0..S-1, kept for the steps.
            x, kv = layer(
                x, Positions(positions, positions), mask, cache=empty, slots=Slots(0, step=False)
            )
            layers.append(KV(*(jnp.repeat(a, copies, axis=0) for a in kv)))  # B * W rows
        return PrefixCache(
            layers,
            jnp.repeat(in_prefix, copies, axis=0),
            jnp.repeat(jnp.sum(in_prefix, axis=1), copies, axis=0),
        )

    @staticmethod
    def extend_cache(cache: PrefixCache, max_len: int) -> PrefixCache:
        """The cache with room for `max_len` steps after the source (transformer.Transformer's)."""
        grow = cache.prefix_valid.shape[1] + max_len - cache.layers[0].k.shape[-1]
        if grow == 0:
            return cache
        return cache._replace(
            layers=[
                KV(
                    jnp.pad(c.k, ((0, 0), (0, 0), (0, 0), (0, grow))),  # [B, G, K, S + max_len]
                    jnp.pad(c.v, ((0, 0), (0, 0), (0, grow), (0, 0))),  # [B, G, S + max_len, K]
                )
                for c in cache.layers
            ]
        )

    @staticmethod
    def reorder_cache(cache: PrefixCache, rows: jax.Array) -> PrefixCache:
        """The cache of rows `rows` [B'] (beam search's surviving hypotheses).

        Rows move only within their sentence, whose source is the same for every hypothesis.
        """
        return cache._replace(layers=[KV(c.k[rows], c.v[rows]) for c in cache.layers])

    def decode_block(self, tokens: jax.Array, cache: PrefixCache) -> tuple[jax.Array, PrefixCache]:
        """Tokens [B, P] at target positions 0..P-1 in one pass -> logits [B, P, V] and the
        cache with their keys and values in the slots after the source (a forced prefix)."""
        b, p = tokens.shape
        s = cache.prefix_valid.shape[1]
        positions = cache.prefix_len[:, None] + jnp.arange(p)  # [B, P]
        y = self.embed_tokens(tokens, positions, None)  # [B, P, D]
        causal = jnp.broadcast_to(jnp.tril(jnp.ones((p, p), bool)), (b, p, p))
        source = jnp.broadcast_to(cache.prefix_valid[:, None, :], (b, p, s))
        mask = jnp.concatenate([source, causal], axis=2)[:, None]  # [B, 1, P, S + P]
        keys = jnp.concatenate([jnp.broadcast_to(jnp.arange(s), (b, s)), positions], axis=1)
        positions = Positions(positions, keys)  # the source's slots, then the block's
        y, cache = self.decode_cached(y, positions, mask, cache, Slots(s, step=False))
        return self.logits(y).astype(jnp.float32), cache

    def decode_step(
        self, tokens: jax.Array, index: jax.Array, cache: PrefixCache
    ) -> tuple[jax.Array, PrefixCache]:
        """One step of cached decoding: tokens [B] at target index `index` -> logits [B, V]."""
        s = cache.prefix_valid.shape[1]
        steps = cache.layers[0].k.shape[-1] - s
        positions = (cache.prefix_len + index)[:, None]  # [B, 1]
        y = self.embed_tokens(tokens[:, None], positions, None)  # [B, 1, D]
        b = tokens.shape[0]
        step_valid = jnp.broadcast_to(jnp.arange(steps) <= index, (b, steps))
        mask = jnp.concatenate([cache.prefix_valid, step_valid], axis=1)  # [B, S + L]
        keys = jnp.concatenate(
            [
                jnp.broadcast_to(jnp.arange(s), (b, s)),  # the source's slots
                cache.prefix_len[:, None] + jnp.arange(steps),  # the steps'
            ],
            axis=1,
        )  # [B, S + L]
        y, cache = self.decode_cached(
            y, Positions(positions, keys), mask[:, None, None], cache, Slots(s + index, step=True)
        )
        return self.logits(y[:, 0]).astype(jnp.float32), cache

    def decode_cached(self, y, positions: Positions, mask, cache: PrefixCache, slots: Slots):
        """Embedded tokens y [B, T, D] at `positions` through every layer with its cache ->
        output [B, T, D] (the final norm included) and the updated cache."""
        layers = []
        for layer, kv in zip(self.decoder, cache.layers):
            y, kv = layer(y, positions, mask, None, cache=kv, slots=slots)
            layers.append(kv)
        y = y if self.decoder_norm is None else self.decoder_norm(y)
        return y, cache._replace(layers=layers)
