"""Greedy and beam search (Sec. 6.1) over the model's explicit KV cache, batched and jitted.

Each model reads the source once per sentence (`prefill`: the encoder, or the decoder-only
stack over the source prefix); each step feeds one token per hypothesis through its
`decode_step`, which writes its keys and values into a preallocated cache. What the searches
share is translate/decoding/loop.py's: the start (`start_search`) and the loop, whose cache
starts short and grows as the outputs do and whose live sentences go on alone once they fit in
a quarter of the batch; the outputs are those of the whole batch run with a cache allocated
for the longest output from the start, which is what a smaller batch runs.

Every search takes an ensemble: `graphdefs` a tuple of graph definitions and `params` a tuple
of their parameters, models that share one vocabulary; a single model is an ensemble of one.
Each step scores tokens by the mean of the models' log-probabilities, so an ensemble of one
computes what the model alone does. `translate_sentences` is the one loop from sentences to
translations (length-sorted batches, n-best lists) that evaluation and the translate command use.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from translate.decoding.loop import (
    MIN_LEVEL_ROWS,
    NEG_INF,
    Forced,
    force_prefix,
    last_token,
    next_log_probs,
    run_loop,
    start_search,
)
from translate.decoding.sampling import NEVER_DRAWN, argmax, draw, stream_keys
from translate.decoding.settings import DecodeSettings


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
    """GNMT length penalty lp(Y) = ((5 + |Y|) / 6) ** alpha (Wu et al. 2016, eq. 14)."""
    return ((5.0 + jnp.asarray(length, jnp.float32)) / 6.0) ** alpha


class GreedyState(NamedTuple):
    """The loop carry of `greedy_search`, one row per sentence."""

    t: jax.Array  # [] int32: the step, the output position written next
    tokens: jax.Array  # [B, L] int32: the outputs so far, PAD after EOS
    last: jax.Array  # [B] int32: the token fed at step t
    score: jax.Array  # [B] float32: the outputs' log-probabilities
    done: jax.Array  # [B] bool: EOS written
    limit: jax.Array  # [B] int32: output tokens before EOS, at most
    cache: list  # one per model: the decoding cache of B rows
    forced: Forced | None  # the prefixes, or None


class BeamState(NamedTuple):
    """The loop carry of `beam_search`: W live and W finished hypotheses per sentence."""

    t: jax.Array  # [] int32: the step, the output position written next
    live_tokens: jax.Array  # [B, W, L] int32: the live hypotheses, PAD after the step
    live_lp: jax.Array  # [B, W] float32: their log-probabilities, best first
    fin_tokens: jax.Array  # [B, W, L] int32: the finished hypotheses, PAD after EOS
    fin_scores: jax.Array  # [B, W] float32: their length-normalised scores, best first
    limit: jax.Array  # [B] int32: output tokens before EOS, at most
    cache: list  # one per model: the decoding cache of B * W rows
    forced: Forced | None  # the prefixes, or None


class SampleState(NamedTuple):
    """The loop carry of `sample_search`: N candidates per sentence, each drawn on its own."""

    t: jax.Array  # [] int32: the step, the output position written next
    tokens: jax.Array  # [B, N, L] int32: the candidates so far, PAD after EOS
    last: jax.Array  # [B, N] int32: the tokens fed at step t
    score: jax.Array  # [B, N] float32: the candidates' log-probabilities under the model
    done: jax.Array  # [B, N] bool: EOS drawn
    stream: jax.Array  # [B, 2] uint32: each sentence's seed and line (`stream_keys`)
    limit: jax.Array  # [B] int32: output tokens before EOS, at most
    cache: list  # one per model: the decoding cache of B * N rows
    forced: Forced | None  # the prefixes, or None


def top_k(x: jax.Array, k: int, block: int = 128) -> jax.Array:
    """`jax.lax.top_k(x, k)` over rows x [R, N], the same values and indices, found faster.

    XLA's CPU top-k walks each row element by element: 3.3 ms of a 19.5 ms beam step on
    [64, 32,000]. Here each row is cut into blocks of `block`; the k blocks with the largest
    maxima hold the k largest elements (a block left out has k blocks above it, each with an
    element above every element of the block left out, or equal at a lower index), so top-k
    runs over those k blocks alone, kept in index order so that ties fall to the lower index
    as in `jax.lax.top_k`.
    """
    rows, n = x.shape
    if n <= 4 * k * block:
        return jax.lax.top_k(x, k)
    pad = -n % block
    if pad:  # -inf never outranks a real element (NEG_INF is finite)
        x = jnp.pad(x, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    blocks = x.reshape(rows, -1, block)  # [R, N / block, block]
    _, best_blocks = jax.lax.top_k(jnp.max(blocks, axis=-1), k)  # [R, k]
    best_blocks = jnp.sort(best_blocks, axis=-1)
    kept = jnp.take_along_axis(blocks, best_blocks[:, :, None], axis=1)  # [R, k, block]
    values, where = jax.lax.top_k(kept.reshape(rows, k * block), k)  # [R, k]
    index = jnp.take_along_axis(best_blocks, where // block, axis=1) * block + where % block
    return values, index


@functools.partial(jax.jit, static_argnames=("graphdefs", "max_extra_len", "min_level_rows"))
def greedy_search(
    graphdefs,
    params,
    src: jax.Array,
    max_extra_len: int = 50,
    min_level_rows: int = MIN_LEVEL_ROWS,
    prefix: jax.Array | None = None,
    never: tuple[int, ...] = (),
):
    """Arg-max decoding: tokens [B, L] (PAD after EOS) and their log-probabilities [B].

    `graphdefs` and `params` are an ensemble's tuples (module docstring); `min_level_rows` is
    `batch_levels`'; `prefix` [B, P] (PAD after each), target pieces every output starts with
    (`_start_after_prefix`), the score then counting them too.
    """
    start = start_search(graphdefs, params, src, prefix, (), max_extra_len, min_level_rows)
    models, batch = start.models, src.shape[0]
    if start.forced is None:
        last = jnp.full((batch,), BOS_ID, jnp.int32)
    else:
        last = last_token(start.tokens, start.t)
    state = GreedyState(
        start.t,
        start.tokens,  # [B, L]
        last,
        start.score,
        jnp.zeros((batch,), bool),
        start.limit,
        start.caches,
        start.forced,
    )

    def step(s: GreedyState) -> GreedyState:
        log_probs, cache = next_log_probs(models, s.last, s.t, s.cache)  # [B, V]
        log_probs = force_prefix(choosable(log_probs, s.t, s.limit, never), s.forced, s.t)
        token, token_lp = argmax(log_probs)  # [B], [B]
        written = jnp.where(s.done, PAD_ID, token)
        return s._replace(
            t=s.t + 1,
            tokens=s.tokens.at[:, s.t].set(written),
            last=token,
            score=s.score + jnp.where(s.done, 0.0, token_lp),
            done=s.done | (token == EOS_ID),
            cache=cache,
        )

    state = run_loop(
        models, lambda s: s.done, step, state, start.max_len, 1, min_level_rows, start.first
    )
    return state.tokens, state.score


def choosable(
    log_probs: jax.Array, t: jax.Array, limit: jax.Array, never: tuple[int, ...]
) -> jax.Array:
    """`log_probs` [B, ..., V] at step `t` with what the search may not choose at NEG_INF: the
    ids `never` (sampling's `sampling.NEVER_DRAWN`; BOS under `decode.ban_start`), and at a
    sentence's length limit [B] every piece but EOS."""
    vocab = jnp.arange(log_probs.shape[-1])
    at_limit = (t >= limit).reshape(-1, *[1] * (log_probs.ndim - 1))
    banned = at_limit & (vocab != EOS_ID)
    if never:
        banned = jnp.isin(vocab, jnp.asarray(never)) | banned
    return jnp.where(banned, NEG_INF, log_probs)


def _beam_done(alpha: float, stop: str, s: BeamState) -> jax.Array:
    """[B] whether each sentence's search is over (`beam_search`'s `stop`)."""
    limit = s.limit
    if stop == "finished":
        return (s.fin_scores[:, -1] > NEG_INF / 2) | (s.t > limit)  # [B]
    best_possible = s.live_lp[:, 0] / length_penalty(limit + 1, alpha)  # [B]
    return (s.fin_scores[:, -1] >= best_possible) | (s.t > limit)


def _beam_step(
    models, width: int, alpha: float, stop: str, never: tuple[int, ...], s: BeamState
) -> BeamState:
    """One step of `beam_search`: extend the live beams, keep the best finished and live."""
    t, limit = s.t, s.limit
    batch = limit.shape[0]
    last = jnp.where(t == 0, BOS_ID, s.live_tokens[:, :, jnp.maximum(t - 1, 0)])
    log_probs, cache = next_log_probs(models, last.reshape(-1), t, s.cache)
    vocab = log_probs.shape[-1]
    log_probs = log_probs.reshape(batch, width, vocab)  # [B, W, V]
    log_probs = force_prefix(choosable(log_probs, t, limit, never), s.forced, t)
    candidates = (s.live_lp[:, :, None] + log_probs).reshape(batch, width * vocab)
    cand_lp, cand_idx = top_k(candidates, 2 * width)  # [B, 2W]
    parent, token = cand_idx // vocab, (cand_idx % vocab).astype(jnp.int32)  # [B, 2W]
    cand_tokens = jnp.take_along_axis(s.live_tokens, parent[:, :, None], axis=1)
    cand_tokens = cand_tokens.at[:, :, t].set(token)  # [B, 2W, L]
    ended = token == EOS_ID
    # A sentence that is already done accepts no new hypotheses.
    ended_ok = ended & ~_beam_done(alpha, stop, s)[:, None] & (cand_lp > NEG_INF / 2)
    if stop == "finished":
        ended_ok &= jnp.arange(2 * width) < width  # EOS counts among the W best only

    fin_new = jnp.where(ended_ok, cand_lp / length_penalty(t + 1, alpha), NEG_INF)
    fin_all = jnp.concatenate([s.fin_scores, fin_new], axis=1)  # [B, 3W]
    fin_scores, fin_pick = jax.lax.top_k(fin_all, width)  # [B, W]
    fin_pool = jnp.concatenate([s.fin_tokens, cand_tokens], axis=1)  # [B, 3W, L]
    fin_tokens = jnp.take_along_axis(fin_pool, fin_pick[:, :, None], axis=1)

    live_lp, live_pick = jax.lax.top_k(jnp.where(ended, NEG_INF, cand_lp), width)  # [B, W]
    live_tokens = jnp.take_along_axis(cand_tokens, live_pick[:, :, None], axis=1)
    live_parent = jnp.take_along_axis(parent, live_pick, axis=1)  # [B, W]
    rows = (jnp.arange(batch)[:, None] * width + live_parent).reshape(-1)  # [B * W]
    cache = [model.reorder_cache(c, rows) for model, c in zip(models, cache)]
    return s._replace(
        t=t + 1,
        live_tokens=live_tokens,
        live_lp=live_lp,
        fin_tokens=fin_tokens,
        fin_scores=fin_scores,
        cache=cache,
    )


@functools.partial(
    jax.jit,
    static_argnames=("graphdefs", "beam_size", "max_extra_len", "stop", "min_level_rows"),
)
def beam_search(
    graphdefs,
    params,
    src: jax.Array,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_extra_len: int = 50,
    stop: str = "exact",
    min_level_rows: int = MIN_LEVEL_ROWS,
    prefix: jax.Array | None = None,
    never: tuple[int, ...] = (),
):
    """Beam search with the GNMT length penalty, of one model or an ensemble (module docstring).

    Each step keeps the 2W best extensions of the W live beams: those ending in EOS become
    finished hypotheses scored log P / lp(length), the best W others stay live. With `stop`
    "exact" a sentence stops when no live beam could still beat its W finished ones: log P only
    falls as a hypothesis grows, so a live beam's best possible score is log P / lp(longest
    allowed length). With "finished" (fairseq's and CTranslate2's rule) only an EOS among the W
    best extensions finishes a hypothesis, and a sentence stops once W have finished.
    `min_level_rows` is `batch_levels`'; `prefix` [B, P] (PAD after each), target pieces every
    hypothesis starts with (`_start_after_prefix`), counted in its score.

    Returns:
      tokens [B, W, L] of the finished hypotheses, best first (PAD after EOS), and their
      length-normalised scores [B, W].
    """
    batch, width = src.shape[0], beam_size
    start = start_search(graphdefs, params, src, prefix, (width,), max_extra_len, min_level_rows)
    models, max_len = start.models, start.max_len
    # Only beam 0 starts live, so the first step does not pick W copies of one token.
    live_lp = jnp.tile(jnp.array([0.0] + [NEG_INF] * (width - 1), jnp.float32), (batch, 1))
    if start.forced is not None:
        live_lp = live_lp.at[:, 0].set(start.score)
    state = BeamState(
        start.t,
        start.tokens,  # live_tokens [B, W, L]
        live_lp,
        jnp.full((batch, width, max_len), PAD_ID, jnp.int32),  # fin_tokens [B, W, L]
        jnp.full((batch, width), NEG_INF, jnp.float32),  # fin_scores [B, W]
        start.limit,
        start.caches,
        start.forced,
    )

    is_done = functools.partial(_beam_done, alpha, stop)
    step = functools.partial(_beam_step, models, width, alpha, stop, never)
    state = run_loop(models, is_done, step, state, max_len, width, min_level_rows, start.first)
    return state.fin_tokens, state.fin_scores


def _sample_step(
    models, width, method, temperature, top_k, top_p, epsilon, s: SampleState
) -> SampleState:
    """One step of `sample_search`: each candidate draws its next token from its own key."""
    t, b = s.t, s.limit.shape[0]
    log_probs, cache = next_log_probs(models, s.last.reshape(-1), t, s.cache)
    vocab = log_probs.shape[-1]
    log_probs = log_probs.reshape(b, width, vocab)  # [B, N, V]
    log_probs = force_prefix(choosable(log_probs, t, s.limit, NEVER_DRAWN), s.forced, t)
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(
        stream_keys(s.stream, width).reshape(-1), t
    )  # [B * N]
    uniform = 1.0 - jax.vmap(jax.random.uniform)(keys)  # (0, 1]
    # The draw divides by the temperature: the masked pieces go to it at -inf, which no
    # temperature makes drawable (NEG_INF / 1e9 is -1, a likely piece).
    drawable = jnp.where(log_probs > NEG_INF / 2, log_probs, -jnp.inf)
    token = draw(
        drawable.reshape(-1, vocab), uniform, method, temperature, top_k, top_p, epsilon
    ).reshape(b, width)  # [B, N]
    token_lp = jnp.take_along_axis(log_probs, token[..., None], axis=-1)[..., 0]
    written = jnp.where(s.done, PAD_ID, token)
    return s._replace(
        t=t + 1,
        tokens=s.tokens.at[:, :, t].set(written),
        last=token,
        score=s.score + jnp.where(s.done, 0.0, token_lp),
        done=s.done | (token == EOS_ID),
        cache=cache,
    )


@functools.partial(
    jax.jit,
    static_argnames=(
        "graphdefs",
        "method",
        "temperature",
        "top_k",
        "top_p",
        "epsilon",
        "num_candidates",
        "alpha",
        "max_extra_len",
        "min_level_rows",
    ),
)
def sample_search(
    graphdefs,
    params,
    src: jax.Array,
    stream: jax.Array,
    prefix: jax.Array | None = None,
    *,
    method: str = "ancestral",
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    epsilon: float = 0.0,
    num_candidates: int = 1,
    alpha: float = 0.6,
    max_extra_len: int = 50,
    min_level_rows: int = MIN_LEVEL_ROWS,
):
    """N sampled outputs of each source sentence, of one model or an ensemble, batched.

    Each row draws its tokens (`draw`) from its own key: the sentence's stream [B, 2] (the
    seed and the input line, `stream_keys`), the candidate n and the step t; so a candidate's
    random numbers are the same whatever the batch, its size, the batches in flight or a
    restart, and so are its tokens as far as its log-probabilities are. Those are not quite:
    a batch of another shape (other rows, another source width or cache length) sums the
    products and the attention in another order, to other last bits. In float32 a draw changes
    only if its random number falls within those bits of the boundary between two pieces (rare,
    not never: 6 and 3 of 800 lines changed between batches of 32 and 7, docs/translating.md);
    rounding the operands to bfloat16 (`model.matmul_dtype=bfloat16`, or bfloat16 compute) can
    turn them into differences of bfloat16's last bit, 2^16 times larger, and a line's samples
    can then change with the batch (1 of 1,600 on the tiny model between batches of 3 and 64).
    An ensemble draws from the mean of its models' log-probabilities, as the beam scores. PAD
    and BOS are never drawn (`sampling.NEVER_DRAWN`); at the length limit only EOS may follow;
    `prefix` [B, P] forces each output's first pieces; at any temperature.

    Returns:
      tokens [B, N, L] (PAD after EOS) best first, and scores [B, N]: each output's
      log-probability under the model (not the tempered, cut distribution it was drawn from),
      divided by the GNMT length penalty at `alpha`, as beam search's finished hypotheses are.
    """
    batch, width = src.shape[0], num_candidates
    start = start_search(graphdefs, params, src, prefix, (width,), max_extra_len, min_level_rows)
    models = start.models
    state = SampleState(
        start.t,
        start.tokens,  # [B, N, L]
        last_token(start.tokens, start.t),
        jnp.broadcast_to(start.score[:, None], (batch, width)),
        jnp.zeros((batch, width), bool),
        stream,
        start.limit,
        start.caches,
        start.forced,
    )

    step = functools.partial(
        _sample_step, models, width, method, temperature, top_k, top_p, epsilon
    )
    state = run_loop(
        models,
        lambda s: jnp.all(s.done, axis=1),
        step,
        state,
        start.max_len,
        width,
        min_level_rows,
        start.first,
    )
    lengths = jnp.sum(state.tokens != PAD_ID, axis=-1)  # [B, N], EOS included
    scores = state.score / length_penalty(lengths, alpha)
    order = jnp.argsort(-scores, axis=1, stable=True)  # best first, ties in drawn order
    tokens = jnp.take_along_axis(state.tokens, order[:, :, None], axis=1)
    return tokens, jnp.take_along_axis(scores, order, axis=1)


def search(
    graphdefs,
    params,
    src: jax.Array,
    settings: DecodeSettings,
    min_level_rows: int = MIN_LEVEL_ROWS,
    stream: jax.Array | None = None,
    prefix: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Hypotheses [B, W, L] best first and their scores [B, W], as `settings` say.

    Beam size 1 is greedy decoding (W = 1, plain log-probabilities as scores) unless
    `settings.nbest` asks for beam search's length-normalised scores whatever the width.
    `settings.beam_stop` is beam search's stopping rule (`beam_search`); `min_level_rows` is
    `batch_levels`'. With `settings.sampling` the W are `num_candidates` samples
    (`sample_search`), drawn from each sentence's `stream` [B, 2] (seed, line; zeros by
    default). `prefix` [B, P] (PAD after each) forces the outputs' first pieces.
    """
    if settings.sampling:
        if stream is None:
            stream = jnp.zeros((src.shape[0], 2), jnp.uint32)
        return sample_search(
            graphdefs,
            params,
            src,
            stream,
            prefix,
            method=settings.sampling,
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            epsilon=settings.epsilon,
            num_candidates=settings.num_candidates,
            alpha=settings.length_penalty,
            max_extra_len=settings.max_extra_len,
            min_level_rows=min_level_rows,
        )
    if settings.beam_size == 1 and not settings.nbest:
        tokens, scores = greedy_search(
            graphdefs,
            params,
            src,
            max_extra_len=settings.max_extra_len,
            min_level_rows=min_level_rows,
            prefix=prefix,
            never=(BOS_ID,) if settings.ban_start else (),
        )
        return tokens[:, None], scores[:, None]
    return beam_search(
        graphdefs,
        params,
        src,
        beam_size=settings.beam_size,
        alpha=settings.length_penalty,
        max_extra_len=settings.max_extra_len,
        stop=settings.beam_stop,
        min_level_rows=min_level_rows,
        prefix=prefix,
        never=(BOS_ID,) if settings.ban_start else (),
    )


def translate_tokens(graphdefs, params, src: jax.Array, settings: DecodeSettings) -> jax.Array:
    """Best output tokens [B, L] for source tokens [B, S]; beam size 1 is greedy decoding."""
    return search(graphdefs, params, src, settings)[0][:, 0]
