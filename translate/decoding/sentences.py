"""From sentences to translations: length-sorted batches through the search, in flight at once.

`translate_sentences` is the one loop that evaluation, the dev evaluation and the text command
use: it tokenizes, groups sentences of similar length into batches (translate/data/batching.py),
runs several batches through the search (translate/decoding/search.py) at once in threads, and
gives each sentence its n-best translations back in input order. `DecodeTimes` says how much of
a run went to compiling new batch shapes and how much to decoding.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence

import jax
import numpy as np

from translate.data.batching import source_batches
from translate.data.tokenizer import Tokenizer
from translate.decoding.search import NEG_INF, search
from translate.decoding.settings import DecodeSettings


@dataclasses.dataclass
class DecodeTimes:
    """Where a decoding run's seconds went: compiling each new batch shape, and decoding."""

    compile_seconds: float = 0.0
    decode_seconds: float = 0.0
    # Batch shapes [B, S] met for the first time in this run, each compiled (or found compiled).
    shapes: set[tuple[int, int]] = dataclasses.field(default_factory=set)


class Searches:
    """`search` at one decoding setting for one ensemble, as `translate_sentences` calls it.

    `compile(shape)` makes the program for source batches of that shape ready; a call takes a
    batch [B, S] and gives `search`'s (tokens [B, W, L], scores [B, W]). This one traces and
    compiles in the process (JAX's persistent cache may hold the compiled program);
    translate/decoding/programs.py's `SavedSearches` keeps programs compiled on disk.
    """

    def __init__(self, graphdefs, params, settings: DecodeSettings):
        self.graphdefs, self.params, self.settings = graphdefs, params, settings

    def compile(self, shape: tuple[int, int]) -> None:
        # A search over a batch of padding: padding rows stop after one step, so the call's
        # time is the compile (or the cache lookup, when another run compiled it).
        src = np.zeros(shape, np.int32)
        jax.block_until_ready(search(self.graphdefs, self.params, src, self.settings))

    def __call__(self, src: np.ndarray):
        return search(self.graphdefs, self.params, src, self.settings)


def compile_searches(searches, shapes: Sequence[tuple[int, int]], times: DecodeTimes) -> None:
    """Makes `searches` ready for each batch shape not yet in `times`, adding the seconds."""
    for shape in shapes:
        if shape not in times.shapes:
            start = time.perf_counter()
            searches.compile(shape)
            times.compile_seconds += time.perf_counter() - start
            times.shapes.add(shape)


def search_batches(
    searches,
    batches: Sequence[np.ndarray],
    times: DecodeTimes,
    parallel: int = 1,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """`searches` over source batches [B, S] on the host, yielding (tokens, scores) in order.

    Every batch shape is compiled first (`compile_searches`); then `parallel` batches at most are
    searched at once, each in a thread of its own. A search is one XLA program of hundreds of
    small ops per step, most of them running on one core, so a second batch keeps a second core
    busy; each batch computes what it computes alone. `times.decode_seconds` receives the
    seconds from the first search's start to the last one's end, the caller's work between
    yields included (it overlaps the searches).
    """
    compile_searches(searches, list(dict.fromkeys(b.shape for b in batches)), times)

    def run(src):
        return jax.device_get(searches(src))

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


def translate_sentences(
    graphdefs: tuple,
    params: tuple,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    settings: DecodeSettings,
    max_len: int,
    times: DecodeTimes | None = None,
    on_batch: Callable[[int], None] | None = None,
    searches: Searches | None = None,
) -> list[list[tuple[float, str]]]:
    """Translations of each sentence as (score, text), best first, in input order.

    Sentences are decoded in length-sorted batches (batching.source_batches) of
    `settings.batch_size`, `settings.parallel_batches` at once. Without `settings.nbest` each
    gets its best translation with score 0 (greedy or beam search, as `settings.beam_size`
    says); with it, the distinct translations among beam search's finished hypotheses, at most
    `nbest`, with their length-normalised scores. A blank sentence gets [(0.0, "")].

    Args:
      graphdefs, params: an ensemble's tuples (module docstring); None with `searches`.
      times: receives the seconds spent compiling and decoding.
      on_batch: called with the number of sentences done after every batch.
      searches: runs the search (`Searches` or programs.SavedSearches, made for `settings`);
        by default `Searches(graphdefs, params, settings)`.
    """
    times = DecodeTimes() if times is None else times
    nbest = settings.nbest
    results = [[(0.0, "")] for _ in sentences]
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    batches = list(
        source_batches(tokenizer, [sentences[i] for i in todo], settings.batch_size, max_len)
    )
    if searches is None:
        searches = Searches(graphdefs, params, settings)
    sources = [src for _, src in batches]
    searched = search_batches(searches, sources, times, settings.parallel_batches)
    for (indices, _), (tokens, scores) in zip(batches, searched, strict=True):
        # tokens [B, W, L], scores [B, W]
        for row, i in enumerate(indices):
            if i < 0:
                continue
            if nbest:
                found = distinct_translations(tokenizer, tokens[row], scores[row])[:nbest]
            else:
                found = [(0.0, tokenizer.decode(tokens[row, 0]))]
            results[todo[i]] = found
        if on_batch is not None:
            on_batch(int(np.sum(indices >= 0)))
    if on_batch is not None and len(todo) < len(sentences):
        on_batch(len(sentences) - len(todo))  # the blank sentences
    return results
