"""Drawing tokens from the model's distribution: the cuts (top-k, nucleus, epsilon) and the keys.

`draw` turns one step's log-probabilities into one token per row; `stream_keys` gives each
candidate of each sentence its own random stream. The search that steps through the KV cache
with them is `search.sample_search`, which translate-text and translate-sample both run.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from translate.data.tokenizer import BOS_ID, PAD_ID

# The pieces no sample holds (`search.sample_search` forbids them before every draw, whatever
# the method): PAD fills an output after its EOS and BOS starts the decoder's input. Neither is
# ever a training target, so what probability a model gives them is noise, yet drawn they were
# fed back to the decoder, counted out of the length penalty and dropped from the printed text.
# UNK stays drawable: it is a training target (a character outside the vocabulary), as greedy
# and beam search may write it, and it is printed (" ⁇ ").
NEVER_DRAWN = (PAD_ID, BOS_ID)


def argmax(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The first index of each row's maximum [B] (jnp.argmax's answer) and the maximum [B].

    Found as the smallest index holding the row's maximum: two vectorised passes, where XLA's
    CPU argmax, a reduction over (value, index) pairs, took 2.4 ms on [64, 8,000], a third of
    a greedy step.
    """
    best = jnp.max(x, axis=-1, keepdims=True)  # [B, 1]
    first = jnp.min(jnp.where(x == best, jnp.arange(x.shape[-1]), x.shape[-1]), axis=-1)
    # A row of NaNs holds no maximum; it gets the last index, not one past the end.
    return jnp.minimum(first, x.shape[-1] - 1).astype(jnp.int32), best[:, 0]


def _largest_threshold(w: jax.Array, goal: jax.Array, mass: bool) -> jax.Array:
    """Per row of weights w [R, V] in [0, 1], the largest float32 tau [R] such that the weights
    >= tau number (mass=False) or sum to (mass=True) at least `goal` [R].

    Found exactly by bisection on the bits of tau: non-negative floats order as their bits do,
    and every tau in [0, 1] is one of 2^30 bit patterns, so 31 halvings find it. Each is one
    pass over the row, where a sort of the vocabulary (XLA's CPU sort and top-k) took 1.1-1.3 s
    on [1,024, 8,000] on 2 cores.
    """
    lo = jnp.zeros(w.shape[:1], jnp.int32)  # tau = 0 keeps every weight: always enough
    hi = jnp.full(w.shape[:1], jax.lax.bitcast_convert_type(jnp.float32(1.0), jnp.int32) + 1)

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        kept = w >= jax.lax.bitcast_convert_type(mid, jnp.float32)[:, None]  # [R, V]
        measure = jnp.sum(jnp.where(kept, w, 0.0), -1) if mass else jnp.sum(kept, -1)
        enough = measure >= goal
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 31, halve, (lo, hi))
    return jax.lax.bitcast_convert_type(lo, jnp.float32)


def _kth_largest(w: jax.Array, k: int) -> jax.Array:
    """Per row of weights w [R, V] >= 0, the k-th largest [R] (ties counted: the largest tau
    with at least k weights >= tau), by stepping down the distinct values from the largest:
    k - 1 passes over the row, fewer than `_largest_threshold`'s 31 for k <= 31."""
    if k - 1 > 31:
        return _largest_threshold(w, k, False)

    def step_down(_, tau):
        count = jnp.sum(w >= tau[:, None], axis=-1)
        below = jnp.max(jnp.where(w < tau[:, None], w, -1.0), axis=-1)  # the next value down
        return jnp.where((count < k) & (below >= 0.0), below, tau)

    return jax.lax.fori_loop(0, k - 1, step_down, jnp.max(w, axis=-1))


def draw(
    log_probs: jax.Array,
    uniform: jax.Array,
    method: str,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    epsilon: float = 0.0,
) -> jax.Array:
    """One token per row of log-probabilities [R, V], drawn with `uniform` [R] in (0, 1].

    The distribution is the model's at `temperature` (log-probabilities divided by it), cut as
    `method` says, then renormalised:
      ancestral: the whole vocabulary;
      topk: the pieces at least as likely as the k-th likeliest (ties at the k-th all kept, as
        in Hugging Face's top-k); k = 1 is arg-max, greedy decoding's token;
      topp: the nucleus (Holtzman et al. 2020), the fewest likeliest pieces whose probability
        reaches top_p (with the pieces as likely as its least likely one);
      epsilon: the pieces of probability >= epsilon (Hewitt et al. 2022), the likeliest
        always kept.
    The draw is by inversion: the first piece whose cumulative weight reaches uniform x total,
    one random number per row and step. A piece of weight 0 (cut, or forced away) is never
    drawn, since uniform > 0. A piece forbidden at -inf has weight 0 at any temperature (the
    search's masks; a finite mask divided by a temperature of 1e8 or more is a likely piece), so
    a row must leave one piece finite.
    """
    if method == "topk" and top_k == 1:
        return argmax(log_probs)[0]
    # The masks are chosen on the log-probabilities, not on their quotients: XLA divides by a
    # constant as a product with its reciprocal, which from a temperature of about 8.5e37 is
    # below float32's smallest normal number and flushed to 0, and -inf x 0 is NaN (every row
    # then drew piece 0, PAD). A finite piece's quotient is then 0, and the draw flat.
    allowed = log_probs > -jnp.inf  # [R, V]
    x = jnp.where(allowed, log_probs / temperature, -jnp.inf)
    w = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))  # [R, V], the likeliest 1.0
    if method == "topk" and top_k:
        w = jnp.where(w >= _kth_largest(w, top_k)[:, None], w, 0.0)
    elif method == "topp":
        goal = top_p * jnp.sum(w, axis=-1)
        w = jnp.where(w >= _largest_threshold(w, goal, True)[:, None], w, 0.0)
    elif method == "epsilon":
        w = jnp.where((w >= epsilon * jnp.sum(w, axis=-1, keepdims=True)) | (w == 1.0), w, 0.0)
    cumulative = jnp.cumsum(w, axis=-1)  # [R, V]
    target = uniform * cumulative[:, -1]  # [R]
    index = jnp.sum(cumulative < target[:, None], axis=-1)
    return jnp.minimum(index, w.shape[-1] - 1).astype(jnp.int32)


def stream_keys(stream: jax.Array, width: int) -> jax.Array:
    """The random keys [B, N] of N candidates of each sentence from its stream [B, 2]: the seed
    and the sentence's line in the input. A candidate's random numbers depend on these alone,
    never on the batch, its size or the other sentences in it (its log-probabilities may, in
    their last bits: `search.sample_search`)."""

    def keys(seed_and_line):
        base = jax.random.fold_in(jax.random.key(seed_and_line[0]), seed_and_line[1])
        return jax.vmap(lambda n: jax.random.fold_in(base, n))(jnp.arange(width))

    return jax.vmap(keys)(stream)
