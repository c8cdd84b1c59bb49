"""What every search shares: the ensemble, the source read once, target prefixes forced, and
the loop whose cache grows and whose batch shrinks as the outputs do.

`start_search` reads the source (`prefill`) and any target prefixes of every model of the
ensemble and gives the output buffers; `run_loop` runs a search's `step` until `done`, the
cache of a batch of more than `MIN_LEVEL_ROWS` hypotheses starting short and growing
(`cache_lengths`), and the live sentences going on alone once they fit in a quarter of the
batch (`batch_levels`); `next_log_probs` is one step of every model, averaged. The searches
themselves (greedy, beam, sampling) are translate/decoding/search.py's.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from translate.data.tokenizer import BOS_ID, PAD_ID

NEG_INF = -1.0e9


def merge_models(graphdefs: tuple, params: tuple) -> list:
    """The models of an ensemble (one or more), from their graph definitions and parameters.

    Flax is imported here, when a search is traced: running a search saved compiled
    (translate/decoding/saved_searches.py) needs neither Flax nor the models.
    """
    from flax import nnx

    return [nnx.merge(g, p) for g, p in zip(graphdefs, params, strict=True)]


# The first cache length of a search; it doubles from there (`cache_lengths`). 16 decoded
# the recipe model's test2016 no faster than 32 (14.57-16.70 s against 14.48-16.01 s for its 32
# batches of 32, the same tokens), for one more loop per batch shape to compile and load.
FIRST_CACHE_LENGTH = 32


def cache_lengths(max_len: int, rows: int, min_rows: int) -> list[int]:
    """The lengths a search's cache grows through: 32, 64, 128, ... then `max_len`.

    Each step's attention, and beam search's reordering of the cache, read every slot of the
    cache, written or not; most outputs are far shorter than the longest allowed, so a cache
    sized for the step reached costs a fraction of one sized for the limit. Each length is one
    more loop to compile (about 1 s on 2 cores) and to load from a saved executable, so a
    doubling within 1.5x of `max_len` is left out: 67 grows through 32, 67, and 99 through 32,
    64, 99. A batch of at most `min_rows` rows (hypotheses; `batch_levels`) keeps one cache of
    `max_len`: its steps cost little beside their fixed costs, and one loop instead of three
    made a one-sentence beam-4 search load in 0.19 s instead of 0.51 s and run in 39 ms instead
    of 31 (BENCHMARKS.md).
    """
    if rows <= min_rows:
        return [max_len]
    lengths = []
    length = FIRST_CACHE_LENGTH
    while 3 * length < 2 * max_len:
        lengths.append(length)
        length *= 2
    return [*lengths, max_len]


def _limits(src: jax.Array, max_extra_len: int) -> tuple[jax.Array, jax.Array, int]:
    """Source segments [B, S], each sentence's output limit [B] and the output length L."""
    src_segments = (src != PAD_ID).astype(jnp.int32)  # [B, S]
    # Output tokens before EOS may number at most (source tokens before EOS) + max_extra_len.
    limit = jnp.maximum(jnp.sum(src_segments, axis=1) - 1, 0) + max_extra_len  # [B]
    limit = jnp.where(src_segments[:, 0] > 0, limit, 0)  # batch-filler rows end at once
    return src_segments, limit, src.shape[1] + max_extra_len + 1


def _encode_for_decoding(models, src, max_extra_len, copies, min_rows):
    """Reads the source once per model (`prefill`); returns caches, output limit and length L.

    The caches have room for the first of `cache_lengths` steps; `run_loop` grows them.
    """
    src_segments, limit, max_len = _limits(src, max_extra_len)
    first = cache_lengths(max_len, src.shape[0] * copies, min_rows)[0]
    caches = [model.prefill(src, src_segments, copies, first) for model in models]
    return caches, limit, max_len


class Forced(NamedTuple):
    """The target prefixes a search forces: every output starts with its row's pieces."""

    prefix: jax.Array  # [B, P] int32, PAD after each prefix
    plen: jax.Array  # [B] int32, each prefix's length


class PrefixStart(NamedTuple):
    """Where a search with forced target prefixes starts (`_start_after_prefix`)."""

    caches: list  # one per model, B * copies rows, slots 0..P-1 written
    limit: jax.Array  # [B] output tokens before EOS, at most
    max_len: int  # L, the output buffer's length
    first: int  # the cache's length: the first of `cache_lengths` past P
    t: jax.Array  # the first step searched: the shortest real prefix's length
    forced: Forced  # the prefixes, for `force_prefix`
    score: jax.Array  # [B] the log-probability of each prefix's first t pieces


def _start_after_prefix(models, src, prefix, max_extra_len, copies, min_rows) -> PrefixStart:
    """Reads the source, then each target prefix [B, P] in one causal pass (`decode_block`).

    Every output starts with its prefix's pieces. The pass fills the cache for positions 0..P-1
    of every row; the search starts at the shortest real prefix's length and forces the rest of
    the longer ones (`force_prefix`), each such step rewriting its slot with the same token.
    """
    src_segments, limit, max_len = _limits(src, max_extra_len)
    batch, p = prefix.shape
    first = next(n for n in cache_lengths(max_len, batch * copies, min_rows) if n > p)
    plen = jnp.sum(prefix != PAD_ID, axis=1).astype(jnp.int32)  # [B]
    t = jnp.min(jnp.where(src_segments[:, 0] > 0, plen, p))  # batch fillers do not count
    block = jnp.concatenate([jnp.full((batch, 1), BOS_ID, jnp.int32), prefix[:, :-1]], 1)
    total, caches = 0.0, []
    for model in models:
        logits, cache = model.decode_block(block, model.prefill(src, src_segments, 1, first))
        total = total + jax.nn.log_softmax(logits)  # [B, P, V]
        # Each sentence's cache once per hypothesis: every leaf leads with the batch.
        caches.append(jax.tree.map(lambda a: jnp.repeat(a, copies, axis=0), cache))
    pieces = jnp.take_along_axis(total / len(models), prefix[:, :, None], axis=2)[:, :, 0]
    score = jnp.sum(jnp.where(jnp.arange(p) < t, pieces, 0.0), axis=1)  # [B]
    return PrefixStart(caches, limit, max_len, first, t, Forced(prefix, plen), score)


def force_prefix(log_probs: jax.Array, forced: Forced | None, t: jax.Array) -> jax.Array:
    """log_probs [B, ..., V] with only each prefix's piece allowed at a step t inside it."""
    if forced is None:
        return log_probs
    prefix = forced.prefix
    piece = prefix[:, jnp.minimum(t, prefix.shape[1] - 1)]  # [B]
    inside = t < forced.plen  # [B]
    shape = (-1,) + (1,) * (log_probs.ndim - 1)
    allowed = jnp.arange(log_probs.shape[-1]) == piece.reshape(shape)
    return jnp.where(inside.reshape(shape) & ~allowed, NEG_INF, log_probs)


# The fewest rows (hypotheses) a search step runs on once sentences leave the batch.
MIN_LEVEL_ROWS = 32


def batch_levels(batch: int, width: int, min_rows: int = MIN_LEVEL_ROWS) -> list[int]:
    """Sentences a search's steps run on: the batch, then quarters of it, each >= `min_rows` rows.

    Sentences finish at different steps and a step costs about its rows; once the live sentences
    fit in a quarter of the batch, the search goes on with those alone (`run_loop`): 64 sentences of
    beam 4 go on as 16 (64 rows). Halves ran no faster on 2 cores and compiled three more loops
    per batch shape instead of one (BENCHMARKS.md); fewer than `min_rows` rows gain little,
    since a step's fixed costs then dominate.
    """
    sizes = [batch]
    while sizes[-1] % 4 == 0 and sizes[-1] // 4 * width >= min_rows:
        sizes.append(sizes[-1] // 4)
    return sizes


def _take(state: NamedTuple, index: jax.Array, width: int) -> NamedTuple:
    """The search state of sentences `index` [n]: their rows of every array, the same step."""
    rows = (index[:, None] * width + jnp.arange(width)).reshape(-1)  # [n * W]
    return state._replace(
        **{
            key: jax.tree.map(lambda a: a[rows], value)
            if key == "cache"
            else jax.tree.map(lambda a: a[index], value)
            for key, value in state._asdict().items()
            if key != "t"
        }
    )


def _put(state: NamedTuple, index: jax.Array, sub: NamedTuple, width: int) -> NamedTuple:
    """`state` with sentences `index` [n] (sorted, distinct) replaced by `sub`'s."""
    rows = (index[:, None] * width + jnp.arange(width)).reshape(-1)  # [n * W]

    def put(a, b, where):
        return a.at[where].set(b, indices_are_sorted=True, unique_indices=True)

    return sub._replace(
        **{
            key: jax.tree.map(lambda a, b: put(a, b, rows), value, getattr(sub, key))
            if key == "cache"
            else jax.tree.map(lambda a, b: put(a, b, index), value, getattr(sub, key))
            for key, value in state._asdict().items()
            if key != "t"
        }
    )


def run_loop(models, done, step, state, max_len, width, min_rows, first=0):
    """Runs `step` on `state` until every sentence is `done` or t = max_len.

    The whole batch first, one `while_loop` per cache length: each runs until its cache is full,
    the search ends or the live sentences fit in the next batch level (`batch_levels`), and
    hands the next a longer cache. Then one loop per level, with the cache at its longest: the
    live sentences are taken out of the batch, go on alone, and are put back when it ends. A
    sentence's hypotheses are computed as in the whole batch: the same tokens, with scores that
    can differ in the last bits, since matrix products of fewer rows may sum in another order.
    """
    sizes = batch_levels(state.limit.shape[0], width, min_rows)
    floors = [*sizes[1:], 0]  # a level's loop ends once the live sentences fit in the next

    def going(s, end, floor):
        return (s.t < end) & (jnp.sum(~done(s)) > floor)

    for length in cache_lengths(max_len, state.limit.shape[0] * width, min_rows):
        if length < first:  # the cache starts longer (a prefix filled its first slots)
            continue
        state = state._replace(
            cache=[m.extend_cache(c, length) for m, c in zip(models, state.cache)]
        )
        state = jax.lax.while_loop(
            functools.partial(going, end=length, floor=floors[0]), step, state
        )
    for size, floor in zip(sizes[1:], floors[1:]):
        live = ~done(state)  # [B]
        # The live sentences all fit, unless the loops above stopped at t = max_len.
        fits = jnp.sum(live) <= size
        index = jnp.sort(jnp.argsort(~live, stable=True)[:size])  # [size], the live ones first
        sub = jax.lax.while_loop(
            lambda s, floor=floor, fits=fits: fits & going(s, max_len, floor),
            step,
            _take(state, index, width),
        )
        state = _put(state, index, sub, width)
    return state


def next_log_probs(models, tokens, index, caches):
    """Mean over the models of log P(next token) [B, V], and the updated caches."""
    total, new_caches = 0.0, []
    for model, cache in zip(models, caches):
        logits, cache = model.decode_step(tokens, index, cache)  # [B, V]
        total = total + jax.nn.log_softmax(logits)
        new_caches.append(cache)
    return total / len(models), new_caches


class SearchStart(NamedTuple):
    """Where every search starts (`start_search`): the models, their caches after the source
    (and any prefixes), the output buffers and the step to search first."""

    models: list  # the ensemble's models (`merge_models`)
    caches: list  # one per model, B * copies rows
    limit: jax.Array  # [B] output tokens before EOS, at most
    max_len: int  # L, the output buffer's length
    first: int  # the cache's length the loop starts from (0: `run_loop`'s first level)
    t: jax.Array  # [] the first step searched
    score: jax.Array  # [B] the log-probability of the forced pieces before t (0 without)
    forced: Forced | None  # the prefixes, or None
    tokens: jax.Array  # [B, ..., L] PAD, each prefix written in its first slots


def start_search(
    graphdefs, params, src, prefix, shape: tuple[int, ...], max_extra_len, min_level_rows
) -> SearchStart:
    """Reads the source (and the target prefixes [B, P], when given) once per model, for
    outputs of `shape` per sentence ((): greedy's one; (W,): a beam's or N samples)."""
    models = merge_models(graphdefs, params)
    batch, copies = src.shape[0], math.prod(shape)
    if prefix is None or prefix.shape[1] == 0:
        caches, limit, max_len = _encode_for_decoding(
            models, src, max_extra_len, copies, min_level_rows
        )
        tokens = jnp.full((batch, *shape, max_len), PAD_ID, jnp.int32)
        score = jnp.zeros((batch,), jnp.float32)
        return SearchStart(models, caches, limit, max_len, 0, jnp.array(0), score, None, tokens)
    start = _start_after_prefix(models, src, prefix, max_extra_len, copies, min_level_rows)
    tokens = _with_prefix(jnp.full((batch, *shape, start.max_len), PAD_ID, jnp.int32), start)
    return SearchStart(
        models,
        start.caches,
        start.limit,
        start.max_len,
        start.first,
        start.t,
        start.score,
        start.forced,
        tokens,
    )


def _with_prefix(tokens: jax.Array, start: PrefixStart) -> jax.Array:
    """Output buffers [B, ..., L] with each prefix written in their first slots."""
    prefix = start.forced.prefix  # [B, P]
    shape = (prefix.shape[0],) + (1,) * (tokens.ndim - 2) + (prefix.shape[1],)
    prefix = jnp.broadcast_to(prefix.reshape(shape), (*tokens.shape[:-1], prefix.shape[1]))
    return tokens.at[..., : prefix.shape[-1]].set(prefix)


def last_token(tokens: jax.Array, t: jax.Array) -> jax.Array:
    """The token each row feeds at step t [B, ...]: BOS at t = 0, else the output at t - 1."""
    return jnp.where(t == 0, BOS_ID, tokens[..., jnp.maximum(t - 1, 0)]).astype(jnp.int32)
