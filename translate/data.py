"""Parallel text -> token arrays -> length-grouped, packed batches of a fixed token budget.

A batch has a fixed shape [A, R, row_len] (A accumulation micro-batches of R rows), so the
train step compiles once. Sentence pairs are sorted by length and packed next-fit into rows,
so each row holds sentences of similar length and padding stays small (the paper's batching
by approximate length, Sec. 5.1). Which pairs form which batch is a pure function of
(seed, epoch); the data position saved in checkpoints is (epoch, batch index).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Iterator, Sequence

import numpy as np

from translate.tokenizer import BOS_ID, EOS_ID, Tokenizer


def read_lines(path: str | pathlib.Path, allow_empty: bool = False) -> list[str]:
    """Reads one sentence per line, failing with the file and line on bad UTF-8 or empty lines."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid UTF-8 ({e.reason})") from None
            if not allow_empty and not line.strip():
                raise ValueError(f"{path}:{number}: empty line (every line must hold a sentence)")
            lines.append(line)
    return lines


def read_parallel(src_path, tgt_path) -> tuple[list[str], list[str]]:
    """Reads two aligned files; line N of one translates line N of the other."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(
            f"parallel files differ in length: {src_path} has {len(src)} lines, "
            f"{tgt_path} has {len(tgt)}"
        )
    return src, tgt


@dataclasses.dataclass
class TokenizedCorpus:
    """Sentence pairs as flat token arrays with offsets (no BOS/EOS stored)."""

    src_tokens: np.ndarray  # [total source tokens] int32
    src_offsets: np.ndarray  # [N + 1] int64
    tgt_tokens: np.ndarray
    tgt_offsets: np.ndarray

    @classmethod
    def from_lists(cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]):
        def flatten(seqs):
            offsets = np.zeros(len(seqs) + 1, np.int64)
            offsets[1:] = np.cumsum([len(s) for s in seqs])
            flat = np.fromiter((t for s in seqs for t in s), np.int32, count=int(offsets[-1]))
            return flat, offsets

        return cls(*flatten(src), *flatten(tgt))

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src(self, i: int) -> np.ndarray:
        return self.src_tokens[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_tokens[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]


def tokenize_parallel(
    tokenizer: Tokenizer, src: Sequence[str], tgt: Sequence[str], max_len: int
) -> tuple[TokenizedCorpus, int]:
    """Encodes pairs, dropping those longer than `max_len` tokens (EOS included) on either side.

    Returns:
      The kept pairs and the number dropped.
    """
    src_ids, tgt_ids = tokenizer.encode(src), tokenizer.encode(tgt)
    keep = [
        i
        for i in range(len(src_ids))
        if len(src_ids[i]) + 1 <= max_len and len(tgt_ids[i]) + 1 <= max_len
    ]
    corpus = TokenizedCorpus.from_lists([src_ids[i] for i in keep], [tgt_ids[i] for i in keep])
    return corpus, len(src_ids) - len(keep)


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
    """Next-fit packing of pairs (in `order`) into rows where both sides fit in `row_len`."""
    src_len = np.diff(corpus.src_offsets) + 1  # + EOS
    tgt_len = np.diff(corpus.tgt_offsets) + 1  # + BOS (input) / EOS (output)
    rows, row, used_src, used_tgt = [], [], 0, 0
    for i in order:
        if row and (used_src + src_len[i] > row_len or used_tgt + tgt_len[i] > row_len):
            rows.append(row)
            row, used_src, used_tgt = [], 0, 0
        row.append(int(i))
        used_src += src_len[i]
        used_tgt += tgt_len[i]
    if row:
        rows.append(row)
    return rows


def plan_epoch(
    corpus: TokenizedCorpus, layout: BatchLayout, seed: int, epoch: int
) -> list[list[list[int]]]:
    """The epoch's batches: each a list of rows (R * A of them, padded with empty rows)."""
    rng = np.random.default_rng([seed, epoch])
    lengths = np.maximum(np.diff(corpus.src_offsets), np.diff(corpus.tgt_offsets))
    # Sort by length with random tie-breaks, so equal-length pairs meet in a new order each epoch.
    order = np.lexsort((rng.random(len(corpus)), lengths))
    rows = pack_rows(corpus, order, layout.row_len)
    per_batch = layout.rows * layout.num_micro
    batches = [rows[i : i + per_batch] for i in range(0, len(rows), per_batch)]
    batches[-1] = batches[-1] + [[] for _ in range(per_batch - len(batches[-1]))]
    return [batches[i] for i in rng.permutation(len(batches))]


def fill_row(segments: list[np.ndarray], row_len: int, prefix: int | None, suffix: int | None):
    """Concatenates token segments into one row: (tokens, segment ids, positions)."""
    tokens = np.zeros(row_len, np.int32)
    seg_ids = np.zeros(row_len, np.int32)
    positions = np.zeros(row_len, np.int32)
    start = 0
    for n, seq in enumerate(segments, start=1):
        parts = ([prefix] if prefix is not None else []) + list(seq)
        parts += [suffix] if suffix is not None else []
        end = start + len(parts)
        tokens[start:end] = parts
        seg_ids[start:end] = n
        positions[start:end] = np.arange(len(parts))
        start = end
    return tokens, seg_ids, positions


def make_batch(
    corpus: TokenizedCorpus,
    rows: list[list[int]],
    layout: BatchLayout,
    row_slice: slice = slice(None),
) -> dict[str, np.ndarray]:
    """Materialises planned rows as arrays [A, R', row_len]; `row_slice` picks this host's rows.

    Keys: src (tokens + EOS), tgt_in (BOS + tokens), tgt_out (tokens + EOS), and for each side
    `*_segments` (0 = padding) and `*_positions`.
    """
    keys = (
        "src",
        "src_segments",
        "src_positions",
        "tgt_in",
        "tgt_out",
        "tgt_segments",
        "tgt_positions",
    )
    micro_batches = [
        rows[m * layout.rows : (m + 1) * layout.rows][row_slice] for m in range(layout.num_micro)
    ]
    out = {
        k: np.zeros((layout.num_micro, len(micro_batches[0]), layout.row_len), np.int32)
        for k in keys
    }
    for m, micro in enumerate(micro_batches):
        for r, row in enumerate(micro):
            src = fill_row([corpus.src(i) for i in row], layout.row_len, None, EOS_ID)
            tgt_in = fill_row([corpus.tgt(i) for i in row], layout.row_len, BOS_ID, None)
            tgt_out = fill_row([corpus.tgt(i) for i in row], layout.row_len, None, EOS_ID)
            out["src"][m, r], out["src_segments"][m, r], out["src_positions"][m, r] = src
            out["tgt_in"][m, r], out["tgt_segments"][m, r], out["tgt_positions"][m, r] = tgt_in
            out["tgt_out"][m, r] = tgt_out[0]
    return out


@dataclasses.dataclass
class DataPosition:
    """Where training is in the data: the next batch is batch `index` of epoch `epoch`."""

    epoch: int = 0
    index: int = 0


def iterate_batches(
    corpus: TokenizedCorpus,
    layout: BatchLayout,
    seed: int,
    start: DataPosition,
    row_slice: slice = slice(None),
) -> Iterator[tuple[dict[str, np.ndarray], DataPosition]]:
    """Yields (batch, position after it) forever, starting at `start`."""
    epoch, index = start.epoch, start.index
    while True:
        plan = plan_epoch(corpus, layout, seed, epoch)
        for i in range(index, len(plan)):
            after = DataPosition(epoch, i + 1) if i + 1 < len(plan) else DataPosition(epoch + 1)
            yield make_batch(corpus, plan[i], layout, row_slice), after
        epoch, index = epoch + 1, 0


def source_batches(
    tokenizer: Tokenizer, sentences: Sequence[str], batch_size: int, max_len: int | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Source sentences for decoding, sorted by length: yields (indices, tokens [B, S]).

    S is rounded up to a multiple of 8 and the last batch is padded to `batch_size` rows (with
    index -1), so a handful of shapes is compiled. Sentences longer than `max_len` tokens are
    truncated to it.
    """
    encoded = [ids[: max_len - 1] if max_len else ids for ids in tokenizer.encode(sentences)]
    order = np.argsort([len(ids) for ids in encoded], kind="stable")
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = -(-(max(len(encoded[i]) for i in chunk) + 1) // 8) * 8
        tokens = np.zeros((batch_size, width), np.int32)
        for r, i in enumerate(chunk):
            tokens[r, : len(encoded[i]) + 1] = list(encoded[i]) + [EOS_ID]
        indices = np.full(batch_size, -1, np.int64)
        indices[: len(chunk)] = chunk
        yield indices, tokens
