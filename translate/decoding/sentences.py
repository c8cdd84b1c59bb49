"""From sentences to translations: length-sorted batches through the search, in flight at once.

`translate_sentences` is the one loop that evaluation, the dev evaluation and the text command
use: it tokenizes, groups sentences of similar length into batches (translate/data/batching.py),
runs several batches through the search (translate/decoding/search.py) at once in threads, and
gives each sentence its n-best translations back in input order. `DecodeTimes` says how much of
a run went to compiling new batch shapes and how much to decoding. What a batch may take of
the device's memory is translate/decoding/memory.py's arithmetic.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np

from translate.compilation import cache_hits
from translate.data.batching import decode_width, source_batches
from translate.data.tokenizer import Tokenizer
from translate.decoding.mbr import mbr_order
from translate.decoding.search import NEG_INF, search
from translate.decoding.settings import DecodeSettings


@dataclasses.dataclass
class DecodeTimes:
    """Where a decoding run's seconds went: compiling each new batch shape, and decoding."""

    compile_seconds: float = 0.0
    decode_seconds: float = 0.0
    # Batch shapes [B, S] met for the first time in this run, each compiled (or found compiled).
    shapes: set[tuple[int, int]] = dataclasses.field(default_factory=set)
    # Of their programs, how many XLA did not compile but read from JAX's persistent cache.
    from_cache: int = 0


def search_inputs(
    src: np.ndarray, stream: np.ndarray | None = None, prefix: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A search's inputs: sources [B, S], streams [B, 2] (seed, line: what samples draw
    from; zeros by default) and target prefixes [B, P] (PAD after each; P = 0: none)."""
    rows = src.shape[0]
    stream = np.zeros((rows, 2), np.uint32) if stream is None else stream.astype(np.uint32)
    prefix = np.zeros((rows, 0), np.int32) if prefix is None else prefix.astype(np.int32)
    return src, stream, prefix


def inputs_shape(shape: Sequence[int]) -> tuple[int, int, int]:
    """(B, S, P) of a batch shape given as (B, S) (no prefix) or (B, S, P)."""
    return (*shape, 0) if len(shape) == 2 else tuple(shape)


class TracedSearches:
    """`search` at one decoding setting for one ensemble, as `translate_sentences` calls it.

    `compile(shape)` makes the program for batches of that shape, (B, S) or (B, S, P) with
    prefixes, ready; a call takes `search_inputs`' arrays (or sources [B, S] alone) and gives
    `search`'s (tokens [B, W, L], scores [B, W]). This one traces and compiles in the process
    (JAX's persistent cache may hold the compiled program); translate/decoding/saved_searches.py's
    `SavedSearches` keeps programs compiled on disk.
    """

    def __init__(self, graphdefs, params, settings: DecodeSettings):
        self.graphdefs, self.params, self.settings = graphdefs, params, settings

    def compile(self, shape: Sequence[int]) -> None:
        # A search over a batch of padding: padding rows stop after one step, so the call's
        # time is the compile (or the cache lookup, when another run compiled it).
        rows, width, prefix = inputs_shape(shape)
        inputs = search_inputs(
            np.zeros((rows, width), np.int32), None, np.zeros((rows, prefix), np.int32)
        )
        jax.block_until_ready(self(*inputs))

    def __call__(self, src: np.ndarray, stream=None, prefix=None):
        src, stream, prefix = search_inputs(src, stream, prefix)
        return search(self.graphdefs, self.params, src, self.settings, stream=stream, prefix=prefix)


def compile_searches(searches, shapes: Sequence[tuple[int, ...]], times: DecodeTimes) -> None:
    """Makes `searches` ready for each batch shape not yet in `times`, adding the seconds."""
    for shape in shapes:
        if shape not in times.shapes:
            start, hits = time.perf_counter(), cache_hits()
            searches.compile(shape)
            times.compile_seconds += time.perf_counter() - start
            times.from_cache += cache_hits() - hits
            times.shapes.add(shape)


def search_batches(
    searches,
    batches: Sequence[tuple[np.ndarray, ...]],
    times: DecodeTimes,
    parallel: int = 1,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`searches` over batches of `search_inputs` on the host, yielding (tokens, scores) in order.

    Every batch shape is compiled first (`compile_searches`); then `parallel` batches at most are
    searched at once, each in a thread of its own. A search is one XLA program of hundreds of
    small ops per step, most of them running on one core, so a second batch keeps a second core
    busy; each batch computes what it computes alone. `times.decode_seconds` receives the
    seconds from the first search's start to the last one's end, the caller's work between
    yields included (it overlaps the searches).
    """
    shapes = [(*b[0].shape, b[2].shape[1]) if b[2].shape[1] else b[0].shape for b in batches]
    compile_searches(searches, list(dict.fromkeys(shapes)), times)

    def run(inputs):
        return jax.device_get(searches(*inputs))

    mark = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as pool:
        # At most `parallel` batches are submitted ahead: on an error or an interrupt in the
        # caller, leaving this block waits for those alone.
        queue = collections.deque(pool.submit(run, src) for src in batches[:parallel])
        for next_batch in range(parallel, len(batches) + parallel):
            result = queue.popleft().result()
            if next_batch < len(batches):
                queue.append(pool.submit(run, batches[next_batch]))
            now = time.perf_counter()
            times.decode_seconds += now - mark
            mark = now
            yield result


def distinct_translations(
    tokenizer: Tokenizer, tokens: np.ndarray, scores: np.ndarray
) -> list[tuple[float, str]]:
    """(score, text) of hypotheses [W, L] sorted best first, each text once, at its best score.

    Different pieces can spell one text ("▁" then EOS, or EOS alone, both give ""); an n-best
    list of the same sentence twice would tell its reader nothing.
    """
    seen, out = set(), []
    for row, score in zip(tokens, scores):
        text = tokenizer.decode(row)
        # A hypothesis still at NEG_INF was never finished; there is nothing to show.
        if score > NEG_INF / 2 and text not in seen:
            seen.add(text)
            out.append((float(score), text))
    return out


def prefix_array(
    tokenizer: Tokenizer,
    prefixes: Sequence[str],
    src: np.ndarray,
    max_extra_len: int,
    lines: Sequence[int],
) -> np.ndarray:
    """Target prefixes [B, P] of a batch's rows (PAD after each; P = 0 when none has one).

    A prefix is tokenized alone and its pieces forced as they are, as CTranslate2 takes a
    `target_prefix`: one cut inside a word ("Ein Hu") forces that word's first pieces ("▁Hu")
    and the search may go on inside the word ("nd"). P is one of `decode_width`'s widths, so few
    shapes are compiled, and below the search's output length.

    Raises:
      ValueError: a prefix has more pieces than its line's output may have (the source's
        pieces + max_extra_len), naming the line (`lines`: each row's line from 1).
    """
    encoded = [tokenizer.encode_target([p])[0] if p.strip() else [] for p in prefixes]
    longest = max((len(ids) for ids in encoded), default=0)
    if not longest:
        return np.zeros((src.shape[0], 0), np.int32)
    width = min(decode_width(longest), src.shape[1] + max_extra_len)
    prefix = np.zeros((src.shape[0], width), np.int32)
    for row, ids in enumerate(encoded):
        limit = int(np.sum(src[row] != 0)) - 1 + max_extra_len  # output tokens before EOS
        if len(ids) > limit:
            raise ValueError(
                f"--prefix line {lines[row]}: {len(ids)} pieces, more than the output of its "
                f"input line may have ({limit}: its source's pieces + max_extra_len "
                f"{max_extra_len}); shorten it or raise --max_extra_len"
            )
        prefix[row, : len(ids)] = ids
    return prefix


def choose(
    tokenizer: Tokenizer, tokens: np.ndarray, scores: np.ndarray, settings: DecodeSettings
) -> list[tuple[float, str]]:
    """What a sentence's hypotheses [W, L] (best first, scores [W]) give as (score, text):

    without --nbest the best alone (score 0): the search's first, or with --mbr the candidate
    of highest expected utility (mbr.py). With --nbest: the beam's distinct texts with their
    scores; samples as drawn, duplicates kept (each is a draw), best first by score; with
    --mbr the distinct candidates by expected utility, that utility as the score.
    """
    if settings.mbr:
        candidates = [
            (float(score), tokenizer.decode(row))
            for row, score in zip(tokens[: settings.num_candidates], scores)
        ]
        # A candidate left at NEG_INF never reached EOS; the others are chosen among. Where
        # none did, all of them are, as printed: what the search ranks first would be printed
        # without --mbr, unfinished or not.
        finished = [c for c in candidates if c[0] > NEG_INF / 2]
        candidates = finished or candidates
        order, utility = mbr_order(
            [text for _, text in candidates], [score for score, _ in candidates], settings.mbr
        )
        if not settings.nbest:
            return [(0.0, candidates[order[0]][1])]
        ranked, seen = [], set()
        for i in order:
            if candidates[i][1] not in seen:
                seen.add(candidates[i][1])
                ranked.append((float(utility[i]), candidates[i][1]))
        return ranked[: settings.nbest]
    if settings.nbest and settings.sampling:
        return [(float(s), tokenizer.decode(row)) for row, s in zip(tokens, scores)][
            : settings.nbest
        ]
    if settings.nbest:
        return distinct_translations(tokenizer, tokens, scores)[: settings.nbest]
    return [(0.0, tokenizer.decode(tokens[0]))]


def translate_sentences(
    graphdefs: tuple,
    params: tuple,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    settings: DecodeSettings,
    max_len: int,
    times: DecodeTimes | None = None,
    on_batch: Callable[[int], None] | None = None,
    searches: TracedSearches | None = None,
    prefixes: Sequence[str] | None = None,
    first_line: int = 0,
) -> list[list[tuple[float, str]]]:
    """Translations of each sentence as (score, text), best first, in input order.

    Sentences are decoded in length-sorted batches (batching.source_batches) of
    `settings.batch_size`, `settings.parallel_batches` at once. Without `settings.nbest` each
    gets its best translation with score 0 (greedy or beam search, as `settings.beam_size`
    says, or samples, as `settings.sampling` says, and the MBR choice among the candidates with
    `settings.mbr`); with it, the candidates `choose` gives. A blank sentence without a prefix
    gets [(0.0, "")].

    Args:
      graphdefs, params: an ensemble's tuples (module docstring); None with `searches`.
      times: receives the seconds spent compiling and decoding.
      on_batch: called with the number of sentences done after every batch.
      searches: runs the search (`TracedSearches` or saved_searches.SavedSearches, made for
        `settings`); by default `TracedSearches(graphdefs, params, settings)`.
      prefixes: one target prefix per sentence ("": none) its translations start with
        (`prefix_array`).
      first_line: the input line of sentences[0], from 0: sentence i's samples draw from
        (settings.seed, first_line + i), whatever else is decoded with it.
    """
    times = DecodeTimes() if times is None else times
    prefixes = [""] * len(sentences) if prefixes is None else prefixes
    if len(prefixes) != len(sentences):
        raise ValueError(f"{len(prefixes)} prefixes for {len(sentences)} sentences")
    results = [[(0.0, "")] for _ in sentences]
    todo = [i for i, (text, p) in enumerate(zip(sentences, prefixes)) if text.strip() or p.strip()]
    batches = list(
        source_batches(tokenizer, [sentences[i] for i in todo], settings.batch_size, max_len)
    )
    if searches is None:
        searches = TracedSearches(graphdefs, params, settings)
    inputs = []
    for indices, src in batches:
        lines = [first_line + todo[i] if i >= 0 else 0 for i in indices]
        stream = np.stack([np.full(len(lines), settings.seed), lines], axis=1)  # [B, 2]
        prefix = prefix_array(
            tokenizer,
            [prefixes[todo[i]] if i >= 0 else "" for i in indices],
            src,
            settings.max_extra_len,
            [line + 1 for line in lines],
        )
        inputs.append(search_inputs(src, stream, prefix))
    searched = search_batches(searches, inputs, times, settings.parallel_batches)
    for (indices, _), (tokens, scores) in zip(batches, searched, strict=True):
        # tokens [B, W, L], scores [B, W]
        for row, i in enumerate(indices):
            if i >= 0:
                results[todo[i]] = choose(tokenizer, tokens[row], scores[row], settings)
        if on_batch is not None:
            on_batch(int(np.sum(indices >= 0)))
    if on_batch is not None and len(todo) < len(sentences):
        on_batch(len(sentences) - len(todo))  # the blank sentences
    return results
