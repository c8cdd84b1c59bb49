"""Parallel text -> token arrays -> length-grouped, packed batches of a fixed token budget.

The training set is tokenized once into flat token arrays on disk beside the vocabulary
(`tokenize_once`) and memory-mapped afterwards, so a resumed run neither re-reads nor
re-tokenizes the text. A batch has a fixed shape [A, R, row_len] (A accumulation micro-batches
of R rows), so the train step compiles once. Sentence pairs are sorted by length and packed
next-fit into rows, so each row holds sentences of similar length and padding stays small (the
paper's batching by approximate length, Sec. 5.1). Which pairs form which batch is a pure
function of (seed, epoch); the data position saved in checkpoints is (epoch, batch index).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import itertools
import json
import multiprocessing
import os
import pathlib
import shutil
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from translate.tokenizer import BOS_ID, EOS_ID, Tokenizer

# Pairs read at once when sampling the vocabulary's sentences.
READ_CHUNK = 100_000
# Pairs per encoding job of `tokenize_once`; each worker process holds a few jobs at a time.
ENCODE_CHUNK = 10_000


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


@dataclasses.dataclass(frozen=True)
class ParallelText:
    """Sentence pairs read by index, so a large corpus never has to sit in memory as text.

    Attributes:
      num_pairs: number of pairs.
      read: pair indices -> (source sentences, target sentences) of those pairs.
      identity: names the data (files with their size and time, or a TFDS dataset, split and
        size), so tokens cached from other data are not reused.
    """

    num_pairs: int
    read: Callable[[Sequence[int]], tuple[list[str], list[str]]]
    identity: str

    @classmethod
    def from_lists(cls, src: Sequence[str], tgt: Sequence[str], identity: str) -> ParallelText:
        if len(src) != len(tgt):
            raise ValueError(f"{identity}: {len(src)} sources but {len(tgt)} targets")
        return cls(len(src), lambda idx: ([src[i] for i in idx], [tgt[i] for i in idx]), identity)

    @classmethod
    def from_files(cls, src_path: pathlib.Path, tgt_path: pathlib.Path) -> ParallelText:
        """Aligned text files, read (and checked) only when a sentence is first needed."""
        load = functools.cache(lambda: read_parallel(src_path, tgt_path))

        def read(indices):
            src, tgt = load()
            return [src[i] for i in indices], [tgt[i] for i in indices]

        paths = [pathlib.Path(p).resolve() for p in (src_path, tgt_path)]
        identity = "files:" + ";".join(
            f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in paths
        )
        with open(src_path, "rb") as f:
            num_pairs = sum(1 for _ in f)
        return cls(num_pairs, read, identity)


def sample_sentences(text: ParallelText, sample_size: int, seed: int) -> list[str]:
    """A seeded random sample of `sample_size` sentences drawn from both sides of `text`.

    Only the sampled pairs are read, a chunk at a time, and only the sampled side of each is
    kept, so a 4.5M-pair corpus is never held as text to train its vocabulary.
    """
    n = text.num_pairs
    if 2 * n <= sample_size:
        picks = np.arange(2 * n)
    else:
        picks = np.random.default_rng(seed).choice(2 * n, sample_size, replace=False)
    src_pairs, tgt_pairs = picks[picks < n], picks[picks >= n] - n
    needed = np.union1d(src_pairs, tgt_pairs)
    use_src, use_tgt = np.isin(needed, src_pairs), np.isin(needed, tgt_pairs)
    sample = []
    for start in range(0, len(needed), READ_CHUNK):
        chunk = slice(start, start + READ_CHUNK)
        src, tgt = text.read(needed[chunk].tolist())
        sample += [s for s, use in zip(src, use_src[chunk]) if use]
        sample += [t for t, use in zip(tgt, use_tgt[chunk]) if use]
    return sample


@dataclasses.dataclass
class TokenizedCorpus:
    """Sentence pairs as flat token arrays with offsets (no BOS/EOS stored).

    The token arrays may be any integer dtype and memory-mapped (`tokenize_once` stores uint16
    when the vocabulary fits).
    """

    src_tokens: np.ndarray  # [total source tokens] int32, or uint16 from the token cache
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


def write_atomically(path: pathlib.Path, write: Callable[[pathlib.Path], None]) -> None:
    """Calls `write(temporary path)`, then renames, so `path` is either whole or absent."""
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def tokenize_once(
    text: ParallelText,
    tokenizer: Tokenizer,
    max_len: int,
    cache_dir: str | os.PathLike,
    num_workers: int | None = None,
) -> tuple[TokenizedCorpus, int]:
    """Tokenizes `text` into `cache_dir` once, then memory-maps the stored tokens.

    The cache holds `{src,tgt}.tokens` (flat token ids, uint16 when the vocabulary fits, else
    int32), `{src,tgt}.offsets.npy` (int64, N + 1) and `manifest.json`. The manifest records the
    vocabulary's sha256, the text's identity and `max_len`; if any differs, the cache is rebuilt.
    Pairs longer than `max_len` tokens (EOS included) on either side are dropped.

    Args:
      text: the pairs to tokenize.
      tokenizer: the shared vocabulary.
      max_len: longest kept side, EOS included.
      cache_dir: where the cache lives (created if needed).
      num_workers: encoding processes; default one per CPU core (one, in-process, for a
        corpus of a single job).

    Returns:
      The kept pairs (memory-mapped) and the number dropped.
    """
    cache_dir = pathlib.Path(cache_dir)
    manifest_path = cache_dir / "manifest.json"
    expected = {
        "vocab_sha256": tokenizer.sha256,
        "source": text.identity,
        "max_len": max_len,
    }
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    if {k: manifest.get(k) for k in expected} != expected:
        # Build the new cache beside the old one and swap it in only when complete, so bad
        # input or a kill mid-way leaves the old cache (or none) but never a mixture.
        building = cache_dir.with_name(f"{cache_dir.name}.building{os.getpid()}")
        shutil.rmtree(building, ignore_errors=True)
        building.mkdir(parents=True)
        try:
            counts = write_token_cache(text, tokenizer, max_len, building, num_workers)
            manifest = {**expected, **counts}
            (building / "manifest.json").write_text(json.dumps(manifest, indent=2))
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        retired = cache_dir.with_name(f"{cache_dir.name}.retired{os.getpid()}")
        if cache_dir.exists():
            os.replace(cache_dir, retired)
        os.replace(building, cache_dir)
        shutil.rmtree(retired, ignore_errors=True)
    arrays = []
    for side in ("src", "tgt"):
        offsets = np.load(cache_dir / f"{side}.offsets.npy", mmap_mode="r")
        path = cache_dir / f"{side}.tokens"
        dtype = manifest["dtype"]
        # np.memmap cannot map an empty file.
        tokens = np.memmap(path, dtype, "r") if path.stat().st_size else np.zeros(0, dtype)
        arrays += [tokens, offsets]
    return TokenizedCorpus(*arrays), manifest["num_dropped"]


@functools.cache
def load_processor(model_path: str) -> spm.SentencePieceProcessor:
    """One SentencePiece processor per (worker) process."""
    return spm.SentencePieceProcessor(model_file=model_path)


def encode_job(job: tuple[str, list[str], list[str], str]) -> tuple[np.ndarray, ...]:
    """(model path, sources, targets, dtype) -> flat tokens and lengths, source then target.

    Runs in a worker process, so turning SentencePiece's lists into arrays is parallel too.
    """
    model_path, src, tgt, dtype = job
    out = []
    for texts in (src, tgt):
        ids = load_processor(model_path).encode(texts, out_type=int)
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        out += [np.fromiter(itertools.chain.from_iterable(ids), dtype, int(lengths.sum())), lengths]
    return tuple(out)


def encode_in_order(jobs: Iterator[tuple], num_workers: int) -> Iterator[tuple[np.ndarray, ...]]:
    """`encode_job` over `jobs`, in order, on `num_workers` processes.

    At most two jobs per worker are in flight, so the text read ahead stays small.
    """
    if num_workers <= 1:
        yield from map(encode_job, jobs)
        return
    # "spawn": forking a process that has started JAX's threads can deadlock.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(num_workers, mp_context=context) as pool:
        pending = collections.deque()
        for job in jobs:
            pending.append(pool.submit(encode_job, job))
            if len(pending) > 2 * num_workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def write_token_cache(
    text: ParallelText,
    tokenizer: Tokenizer,
    max_len: int,
    cache_dir: pathlib.Path,
    num_workers: int | None,
) -> dict:
    """Encodes `text` in jobs over worker processes into the cache files; returns counts."""
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    dtype_name = np.dtype(dtype).name
    num_jobs = -(-text.num_pairs // ENCODE_CHUNK)
    num_workers = min(num_workers or os.cpu_count() or 1, num_jobs)

    def jobs():  # read lazily, while the workers encode the jobs before
        for start in range(0, text.num_pairs, ENCODE_CHUNK):
            src, tgt = text.read(range(start, min(start + ENCODE_CHUNK, text.num_pairs)))
            yield str(tokenizer.path), src, tgt, dtype_name

    lengths = {"src": [], "tgt": []}
    tmp = {side: cache_dir / f"{side}.tokens.tmp{os.getpid()}" for side in lengths}
    num_dropped = 0
    with open(tmp["src"], "wb") as src_file, open(tmp["tgt"], "wb") as tgt_file:
        files = {"src": src_file, "tgt": tgt_file}
        for src_flat, src_len, tgt_flat, tgt_len in encode_in_order(jobs(), num_workers):
            keep = (src_len < max_len) & (tgt_len < max_len)  # + EOS <= max_len
            num_dropped += int((~keep).sum())
            for side, flat, n in (("src", src_flat, src_len), ("tgt", tgt_flat, tgt_len)):
                files[side].write(flat[np.repeat(keep, n)].tobytes())
                lengths[side].append(n[keep])
    if text.num_pairs == num_dropped:
        raise ValueError(f"{text.identity}: no pair is at most {max_len} tokens long")
    for side in lengths:
        offsets = np.zeros(text.num_pairs - num_dropped + 1, np.int64)
        np.cumsum(np.concatenate(lengths[side]), out=offsets[1:])

        def save(path: pathlib.Path, offsets=offsets) -> None:
            with open(path, "wb") as f:
                np.save(f, offsets)

        write_atomically(cache_dir / f"{side}.offsets.npy", save)
        os.replace(tmp[side], cache_dir / f"{side}.tokens")
    num_pairs = text.num_pairs - num_dropped
    return {"dtype": dtype_name, "num_pairs": num_pairs, "num_dropped": num_dropped}


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
) -> dict[str, np.ndarray]:
    """Materialises planned rows as arrays [A, R', row_len]; `row_slice` picks this host's rows.

    Keys: src (tokens + EOS), tgt_in (BOS + tokens), tgt_out (tokens + EOS), and for each side
    `*_segments` (0 = padding) and `*_positions`.
    """
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

    out = {}
    flat, src, _, out["src_segments"], out["src_positions"] = fill_rows(
        corpus.src_tokens, corpus.src_offsets, pairs, counts, layout.row_len
    )
    out["src"] = scatter(flat, src)
    flat, tgt_out, tgt_in, out["tgt_segments"], out["tgt_positions"] = fill_rows(
        corpus.tgt_tokens, corpus.tgt_offsets, pairs, counts, layout.row_len
    )
    out["tgt_in"], out["tgt_out"] = scatter(flat, tgt_in), scatter(flat, tgt_out)
    for key in ("src_segments", "src_positions", "tgt_segments", "tgt_positions"):
        out[key] = out[key].reshape(shape)
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
    (with index -1), so a handful of shapes is compiled. Sentences longer than `max_len` tokens
    are truncated to it.
    """
    encoded = [ids[: max_len - 1] if max_len else ids for ids in tokenizer.encode(sentences)]
    order = np.argsort([len(ids) for ids in encoded], kind="stable")
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        width = decode_width(max(len(encoded[i]) for i in chunk) + 1, max_len)
        tokens = np.zeros((batch_size, width), np.int32)
        for r, i in enumerate(chunk):
            tokens[r, : len(encoded[i]) + 1] = list(encoded[i]) + [EOS_ID]
        indices = np.full(batch_size, -1, np.int64)
        indices[: len(chunk)] = chunk
        yield indices, tokens
