"""Batches: the one typed batch structure and length-grouped packing of a fixed token budget.

A batch has a fixed shape [A, R, row_len] (A accumulation micro-batches of R rows), so the
train step compiles once. Sentence pairs are sorted by length and packed next-fit into rows, so
each row holds sentences of similar length and padding stays small (the paper's batching by
approximate length, Sec. 5.1). Several training corpora are drawn each epoch by their weights
(`Mixture`). Which pairs form which batch is a pure function of (seed, epoch); the data position
saved in checkpoints is (epoch, batch index). Decoding's source batches are padded to a few
widths, so the searches compile a handful of times.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np

from translate.data.corpus import TokenizedCorpus
from translate.data.tokenizer import BOS_ID, EOS_ID, Tokenizer


class Batch(NamedTuple):
    """One batch of packed sentence pairs; every field has the same shape, [A, R, row_len] from
    the data pipeline ([B, L] in a single forward pass).

    Rows hold several pairs one after another; segment ids (1-based within a row, 0 = padding)
    keep their attention apart and positions restart at 0 for each sentence.
    """

    src: Any  # source tokens + EOS
    src_segments: Any
    src_positions: Any
    tgt_in: Any  # BOS + target tokens: the decoder's input
    tgt_segments: Any
    tgt_positions: Any
    tgt_out: Any = None  # target tokens + EOS: what the loss scores; not needed to run the model


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """Fixed batch geometry: global rows split into `num_micro` micro-batches of `rows` each."""

    row_len: int
    rows: int  # rows per micro-batch over all hosts and devices
    num_micro: int

    @classmethod
    def from_config(
        cls, tokens_per_batch: int, row_len: int, grad_accum_steps: int, num_devices: int
    ) -> BatchLayout:
        multiple = grad_accum_steps * num_devices
        total_rows = (tokens_per_batch // row_len) // multiple * multiple
        if total_rows == 0:
            raise ValueError(
                f"data.tokens_per_batch={tokens_per_batch} gives {tokens_per_batch // row_len} "
                f"rows of data.row_len={row_len}, fewer than train.grad_accum_steps "
                f"({grad_accum_steps}) x devices ({num_devices}); raise tokens_per_batch"
            )
        return cls(row_len, total_rows // grad_accum_steps, grad_accum_steps)


def pack_rows(corpus: TokenizedCorpus, order: np.ndarray, row_len: int) -> list[list[int]]:
    """Packs pairs into rows where both sides fit in `row_len`; `order` is shortest first.

    Each row takes the longest pairs left while they fit, then fills its gap with the shortest
    pairs left: rows of similar long sentences would otherwise waste up to a sentence's length
    each. Two pointers walk `order` from both ends, so every pair is packed exactly once.
    """
    # Python ints from lists: the loop runs once per pair per epoch, and numpy scalars are slow.
    src_len = (np.diff(corpus.src_offsets)[order] + 1).tolist()  # + EOS
    tgt_len = (np.diff(corpus.tgt_offsets)[order] + 1).tolist()  # + BOS (input) / EOS (output)
    pairs = order.tolist()
    rows, lo, hi = [], 0, len(pairs) - 1
    while lo <= hi:
        row, used_src, used_tgt = [pairs[hi]], src_len[hi], tgt_len[hi]
        hi -= 1
        while lo <= hi and used_src + src_len[hi] <= row_len and used_tgt + tgt_len[hi] <= row_len:
            row.append(pairs[hi])
            used_src += src_len[hi]
            used_tgt += tgt_len[hi]
            hi -= 1
        while lo <= hi and used_src + src_len[lo] <= row_len and used_tgt + tgt_len[lo] <= row_len:
            row.append(pairs[lo])
            used_src += src_len[lo]
            used_tgt += tgt_len[lo]
            lo += 1
        rows.append(row)
    return rows


# Set apart the streams of a mixture's draws from those of the plan and of BPE-dropout.
MIXTURE_STREAM = 2**20


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Several training corpora, one after another in one `TokenizedCorpus`, each drawn by an
    upsampling factor every epoch.

    Corpus i's `sizes[i]` pairs follow those of the corpora before it. An epoch holds
    max(1, round(weights[i] * sizes[i])) of its pairs: each pair floor(weight) times, and a
    share of them, drawn without replacement from (seed, epoch, i), once more. One corpus at
    weight 1 is every pair once, in order: the epoch of the corpus alone.
    """

    sizes: tuple[int, ...]
    weights: tuple[float, ...]

    def counts(self) -> list[int]:
        """The pairs of each corpus in an epoch."""
        return [max(1, round(w * n)) for n, w in zip(self.sizes, self.weights)]

    def pairs(self, seed: int, epoch: int) -> np.ndarray:
        """[P] the epoch's pairs: indices into the corpora's concatenation, corpus after corpus."""
        parts, start = [], 0
        for i, (n, count) in enumerate(zip(self.sizes, self.counts())):
            whole, rest = divmod(count, n)
            parts += [np.arange(start, start + n)] * whole
            if rest:
                rng = np.random.default_rng([seed, epoch, MIXTURE_STREAM, i])
                parts.append(start + np.sort(rng.choice(n, rest, replace=False)))
            start += n
        return np.concatenate(parts)


def plan_epoch(
    corpus: TokenizedCorpus,
    layout: BatchLayout,
    seed: int,
    epoch: int,
    mixture: Mixture | None = None,
) -> list[list[list[int]]]:
    """The epoch's batches: each a list of rows (R * A of them, padded with empty rows).

    Every pair of `corpus` once; with a `mixture`, the pairs it draws for the epoch.
    """
    rng = np.random.default_rng([seed, epoch])
    lengths = np.maximum(np.diff(corpus.src_offsets), np.diff(corpus.tgt_offsets))
    # Sort by length with random tie-breaks, so equal-length pairs meet in a new order each epoch.
    if mixture is None:
        order = np.lexsort((rng.random(len(corpus)), lengths))
    else:
        pairs = mixture.pairs(seed, epoch)
        order = pairs[np.lexsort((rng.random(len(pairs)), lengths[pairs]))]
    rows = pack_rows(corpus, order, layout.row_len)
    per_batch = layout.rows * layout.num_micro
    batches = [rows[i : i + per_batch] for i in range(0, len(rows), per_batch)]
    batches[-1] = batches[-1] + [[] for _ in range(per_batch - len(batches[-1]))]
    return [batches[i] for i in rng.permutation(len(batches))]


def fill_rows(
    tokens: np.ndarray,
    offsets: np.ndarray,
    pairs: np.ndarray,
    counts: np.ndarray,
    row_len: int,
) -> tuple[np.ndarray, ...]:
    """Lays out one side of packed rows, each sentence followed by one special slot.

    Args:
      tokens, offsets: one side of a `TokenizedCorpus`.
      pairs: [P] the rows' pair indices, row after row.
      counts: [num_rows] pairs per row.
      row_len: slots per row.

    Returns:
      (flat, after, before, segments, positions): for every used slot, its index into a
      [num_rows * row_len] array and the token it holds with EOS after each sentence ("after")
      or with BOS before it ("before"); then [num_rows, row_len] segment ids (1-based within a
      row, 0 = padding) and positions within each sentence.
    """
    num_rows = len(counts)
    starts = offsets[pairs]
    lengths = offsets[pairs + 1] - starts
    seg_len = lengths + 1
    seg_end = np.cumsum(seg_len)
    seg_start = seg_end - seg_len  # in slots, counted over all rows
    first_seg = np.cumsum(counts) - counts  # [num_rows] index of each row's first pair
    row = np.repeat(np.arange(num_rows), counts)  # [P]
    col0 = seg_start - seg_start[first_seg[row]]  # [P] first slot of each pair in its row
    seg = np.repeat(np.arange(len(pairs)), seg_len)  # [slots] the pair each slot belongs to
    position = np.arange(int(seg_end[-1]) if len(pairs) else 0) - seg_start[seg]
    col = col0[seg] + position
    if len(col) and col.max() >= row_len:
        raise ValueError(f"a packed row holds more than row_len={row_len} tokens")
    flat = row[seg] * row_len + col
    last = position == lengths[seg]
    after = np.full(len(flat), EOS_ID, np.int32)  # sentence + EOS
    after[~last] = tokens[(starts[seg] + position)[~last]]
    before = np.full(len(flat), BOS_ID, np.int32)  # BOS + sentence
    first = position == 0
    before[~first] = tokens[(starts[seg] + position - 1)[~first]]
    segments = np.zeros(num_rows * row_len, np.int32)
    segments[flat] = (np.arange(len(pairs)) - first_seg[row] + 1)[seg]
    positions = np.zeros(num_rows * row_len, np.int32)
    positions[flat] = position
    shape = (num_rows, row_len)
    return flat, after, before, segments.reshape(shape), positions.reshape(shape)


def make_batch(
    corpus: TokenizedCorpus,
    rows: list[list[int]],
    layout: BatchLayout,
    row_slice: slice = slice(None),
) -> Batch:
    """Materialises planned rows as arrays [A, R', row_len]; `row_slice` picks this host's rows."""
    micro_batches = [
        rows[m * layout.rows : (m + 1) * layout.rows][row_slice] for m in range(layout.num_micro)
    ]
    picked = [row for micro in micro_batches for row in micro]
    counts = np.fromiter(map(len, picked), np.int64, len(picked))
    pairs = np.fromiter(itertools.chain.from_iterable(picked), np.int64, int(counts.sum()))
    shape = (layout.num_micro, len(micro_batches[0]), layout.row_len)

    def scatter(flat: np.ndarray, values: np.ndarray) -> np.ndarray:
        out = np.zeros(len(picked) * layout.row_len, np.int32)
        out[flat] = values
        return out.reshape(shape)

    flat, src, _, src_segments, src_positions = fill_rows(
        corpus.src_tokens, corpus.src_offsets, pairs, counts, layout.row_len
    )
    flat_tgt, tgt_out, tgt_in, tgt_segments, tgt_positions = fill_rows(
        corpus.tgt_tokens, corpus.tgt_offsets, pairs, counts, layout.row_len
    )
    return Batch(
        src=scatter(flat, src),
        src_segments=src_segments.reshape(shape),
        src_positions=src_positions.reshape(shape),
        tgt_in=scatter(flat_tgt, tgt_in),
        tgt_segments=tgt_segments.reshape(shape),
        tgt_positions=tgt_positions.reshape(shape),
        tgt_out=scatter(flat_tgt, tgt_out),
    )


@dataclasses.dataclass
class DataPosition:
    """Where training is in the data: the next batch is batch `index` of epoch `epoch`."""

    epoch: int = 0
    index: int = 0


def iterate_batches(
    corpus: TokenizedCorpus | Callable[[int], TokenizedCorpus],
    layout: BatchLayout,
    seed: int,
    start: DataPosition,
    row_slice: slice = slice(None),
    mixture: Mixture | None = None,
) -> Iterator[tuple[Batch, DataPosition]]:
    """Yields (batch, position after it) forever, starting at `start`.

    `corpus` is the training pairs, or a function of the epoch that returns them (a
    segmentation sampled anew each epoch: translate/data/bpe_dropout.py); `mixture` draws each
    epoch's pairs from several corpora.
    """
    epoch, index = start.epoch, start.index
    while True:
        corpus_of_epoch = corpus(epoch) if callable(corpus) else corpus
        plan = plan_epoch(corpus_of_epoch, layout, seed, epoch, mixture)
        for i in range(index, len(plan)):
            after = DataPosition(epoch, i + 1) if i + 1 < len(plan) else DataPosition(epoch + 1)
            yield make_batch(corpus_of_epoch, plan[i], layout, row_slice), after
        epoch, index = epoch + 1, 0


def decode_width(length: int, max_len: int | None = None) -> int:
    """The padded source width that decoding compiles for `length` tokens.

    The smallest of 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, ... (8, then 16 * 2^k and
    24 * 2^k) that holds them. Every width is a separate compile of the searches; this set keeps
    a test set of any size to about ten, at the cost of at most a third of a batch's width in
    padding past 16 tokens. Widths stop at `max_len` rounded up to a multiple of 8, the longest
    a truncated source can be.
    """
    widths = sorted([8] + [base << k for k in range(16) for base in (16, 24)])
    width = next(w for w in widths if w >= length)
    if max_len:
        width = min(width, -(-max_len // 8) * 8)
    return width


def source_batches(
    tokenizer: Tokenizer, sentences: Sequence[str], batch_size: int, max_len: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Source sentences for decoding, sorted by length: yields (indices, tokens [B, S]).

    S is one of a few widths (`decode_width`) and the last batch is padded to `batch_size` rows
    (with index -1), so a handful of shapes is compiled; fewer sentences than `batch_size` in
    all (a line typed at the text command) are padded to the next power of two rows only, since
    a search's steps cost in proportion to its rows. Sentences longer than `max_len` tokens are
    truncated to it.
    """
    encoded = [ids[: max_len - 1] if max_len else ids for ids in tokenizer.encode_source(sentences)]
    order = np.argsort([len(ids) for ids in encoded], kind="stable")
    rows = min(batch_size, 1 << max(len(order) - 1, 0).bit_length())
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = decode_width(max(len(encoded[i]) for i in chunk) + 1, max_len)
        tokens = np.zeros((rows, width), np.int32)
        for r, i in enumerate(chunk):
            tokens[r, : len(encoded[i]) + 1] = list(encoded[i]) + [EOS_ID]
        indices = np.full(rows, -1, np.int64)
        indices[: len(chunk)] = chunk
        yield indices, tokens
