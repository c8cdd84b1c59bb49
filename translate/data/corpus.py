"""Tokenize once: parallel text -> flat token arrays on disk, memory-mapped afterwards.

The training set is tokenized once into flat token arrays in the workdir, beside the
vocabulary (`tokenize_once`), so a resumed run neither re-reads nor re-tokenizes the text. The
cache is rebuilt beside the old one and swapped in whole. Pairs longer than `max_len` tokens on
either side (EOS included) are dropped, by one rule (`fits`) for cached and in-memory corpora.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import functools
import itertools
import json
import multiprocessing
import os
import pathlib
import signal
import sys
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import sentencepiece as spm

from translate import atomic
from translate.data.text import ParallelText
from translate.data.tokenizer import PairTokenizer, Tokenizer

# Pairs per encoding job of `tokenize_once`; each worker process holds a few jobs at a time.
ENCODE_CHUNK = 10_000


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


def concatenate(corpora: Sequence[TokenizedCorpus]) -> TokenizedCorpus:
    """The pairs of `corpora` one corpus after another, in memory (several training corpora)."""
    arrays = []
    for side in ("src", "tgt"):
        tokens = [getattr(c, f"{side}_tokens") for c in corpora]
        offsets = [np.asarray(getattr(c, f"{side}_offsets")) for c in corpora]
        starts = np.cumsum([0] + [len(t) for t in tokens[:-1]])
        joined = [offsets[0][:1]] + [o[1:] + start for o, start in zip(offsets, starts)]
        arrays += [np.concatenate(tokens), np.concatenate(joined).astype(np.int64)]
    return TokenizedCorpus(*arrays)


def fits(src_len: np.ndarray, tgt_len: np.ndarray, max_len: int) -> np.ndarray:
    """Which pairs of these token counts (no EOS) are kept: both sides + EOS <= `max_len`."""
    return (src_len + 1 <= max_len) & (tgt_len + 1 <= max_len)


def tokenize_parallel(
    tokenizer: Tokenizer, src: Sequence[str], tgt: Sequence[str], max_len: int
) -> tuple[TokenizedCorpus, int]:
    """Encodes pairs, dropping those longer than `max_len` tokens (EOS included) on either side.

    Returns:
      The kept pairs and the number dropped.
    """
    src_ids, tgt_ids = tokenizer.encode_source(src), tokenizer.encode_target(tgt)
    src_len = np.fromiter(map(len, src_ids), np.int64, len(src_ids))
    tgt_len = np.fromiter(map(len, tgt_ids), np.int64, len(tgt_ids))
    keep = np.flatnonzero(fits(src_len, tgt_len, max_len)).tolist()
    corpus = TokenizedCorpus.from_lists([src_ids[i] for i in keep], [tgt_ids[i] for i in keep])
    return corpus, len(src_ids) - len(keep)


def tokenize_once(
    text: ParallelText,
    tokenizer: Tokenizer,
    max_len: int,
    cache_dir: str | os.PathLike,
    num_workers: int | None = None,
    files: Sequence[str | os.PathLike] = (),
    src_prefix: Sequence[int] = (),
) -> tuple[TokenizedCorpus, int]:
    """Tokenizes `text` into `cache_dir` once, then memory-maps the stored tokens.

    The cache holds `{src,tgt}.tokens` (flat token ids, uint16 when the vocabulary fits, else
    int32), `{src,tgt}.offsets.npy` (int64, N + 1) and `manifest.json`. The manifest records the
    vocabulary's sha256, the text's identity, `max_len` and the sources' prefix; if any differs,
    the cache is rebuilt. Pairs longer than `max_len` tokens (EOS included) on either side are
    dropped.

    Args:
      text: the pairs to tokenize.
      tokenizer: the shared vocabulary.
      max_len: longest kept side, EOS included.
      cache_dir: where the cache lives (created if needed).
      num_workers: encoding processes; default one per CPU core (one, in-process, for a
        corpus of a single job).
      files: the files `text` is read from, when it is: their inode and change time are part
        of the cache's key (`file_stamps`).
      src_prefix: ids put before every source's pieces (a corpus's tag); they count towards
        `max_len`.

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
    if files:
        expected["files"] = file_stamps(files)
    # None when there is none: the manifests written before prefixes existed hold no key.
    expected["src_prefix"] = [int(i) for i in src_prefix] or None
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    if {k: manifest.get(k) for k in expected} != expected:
        # Built beside the old cache and swapped in only when complete, so bad input or a
        # kill mid-way leaves the old cache (or none) but never a mixture.
        cache_dir.parent.mkdir(parents=True, exist_ok=True)
        with atomic.directory(cache_dir) as building:
            counts = write_token_cache(text, tokenizer, max_len, building, num_workers, src_prefix)
            manifest = {**expected, **counts}
            (building / "manifest.json").write_text(json.dumps(manifest, indent=2))
    arrays = []
    for side in ("src", "tgt"):
        offsets = np.load(cache_dir / f"{side}.offsets.npy", mmap_mode="r")
        path = cache_dir / f"{side}.tokens"
        dtype = manifest["dtype"]
        # np.memmap cannot map an empty file.
        tokens = np.memmap(path, dtype, "r") if path.stat().st_size else np.zeros(0, dtype)
        arrays += [tokens, offsets]
    return TokenizedCorpus(*arrays), manifest["num_dropped"]


def file_stamps(files: Sequence[str | os.PathLike]) -> list[str]:
    """Each file's path, inode and change time (st_ctime_ns), for the token cache's key.

    The text's identity holds a file's size and modification time, which an edit of the same
    size can keep (`touch -d`, `os.utime`, a tool that restores times): the cache would hold the
    old text's tokens. The change time is the kernel's, set on every write and every change of
    the times, and cannot be set back; a copy or a move (another inode) also rebuilds the
    cache. Hashing the text instead would read it all at every start (1.4 GB for WMT14
    English-German) to find what these numbers tell at once.
    """
    stamps = []
    for path in files:
        stat = os.stat(path)
        stamps.append(f"{pathlib.Path(path).resolve()}:{stat.st_ino}:{stat.st_ctime_ns}")
    return stamps


@functools.cache
def load_encoders(files: tuple[str, ...]) -> tuple[Callable, Callable]:
    """The tokenizer of `files` (its `files`: our vocab.model, or OPUS-MT's three) as (source
    encoder, target encoder), texts -> ids, once per (worker) process."""
    if len(files) == 1:
        processor = spm.SentencePieceProcessor(model_file=files[0])
        encode = functools.partial(processor.encode, out_type=int)
        return encode, encode
    pair = PairTokenizer(*map(pathlib.Path, files))
    return pair.encode_source, pair.encode_target


def encode_job(
    job: tuple[tuple[str, ...], list[str], list[str], str, tuple[int, ...]],
) -> tuple[np.ndarray, ...]:
    """(the tokenizer's files, sources, targets, dtype, sources' prefix) -> flat tokens and
    lengths, source then target.

    Runs in a worker process, so turning SentencePiece's lists into arrays is parallel too.
    """
    files, src, tgt, dtype, src_prefix = job
    encode_source, encode_target = load_encoders(files)
    out = []
    for ids, prefix in ((encode_source(src), list(src_prefix)), (encode_target(tgt), [])):
        if prefix:
            ids = [prefix + sentence for sentence in ids]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        out += [np.fromiter(itertools.chain.from_iterable(ids), dtype, int(lengths.sum())), lengths]
    return tuple(out)


# prctl(2): the signal a process gets when its parent dies.
PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int) -> None:
    """A worker's initializer: the worker ends when the process that started it ends, however
    it ends. A `kill -9` of the trainer runs no cleanup, and left its tokenizing workers alive
    (and their memory held) for as long as their jobs took; on Linux the kernel now sends them
    SIGKILL (the parent-death signal), and a worker whose parent is gone already exits."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # died before the signal was asked for
        os._exit(1)


def encode_in_order(jobs: Iterator[tuple], num_workers: int) -> Iterator[tuple[np.ndarray, ...]]:
    """`encode_job` over `jobs`, in order, on `num_workers` processes.

    At most two jobs per worker are in flight, so the text read ahead stays small.
    """
    if num_workers <= 1:
        yield from map(encode_job, jobs)
        return
    # "spawn": forking a process that has started JAX's threads can deadlock.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(
        num_workers, mp_context=context, initializer=end_with_parent, initargs=(os.getpid(),)
    ) as pool:
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
    src_prefix: Sequence[int] = (),
) -> dict:
    """Encodes `text` in jobs over worker processes into the cache files; returns counts.

    The files are written in place: `cache_dir` is a new directory that `tokenize_once` swaps
    in only once it is whole.
    """
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    dtype_name = np.dtype(dtype).name
    num_jobs = -(-text.num_pairs // ENCODE_CHUNK)
    num_workers = min(num_workers or os.cpu_count() or 1, num_jobs)

    def jobs():  # read lazily, while the workers encode the jobs before
        for start in range(0, text.num_pairs, ENCODE_CHUNK):
            src, tgt = text.read(range(start, min(start + ENCODE_CHUNK, text.num_pairs)))
            files = tuple(str(path) for path in tokenizer.files)
            yield files, src, tgt, dtype_name, tuple(src_prefix)

    lengths = {"src": [], "tgt": []}
    tokens = {side: cache_dir / f"{side}.tokens" for side in lengths}
    num_dropped = 0
    with open(tokens["src"], "wb") as src_file, open(tokens["tgt"], "wb") as tgt_file:
        files = {"src": src_file, "tgt": tgt_file}
        for src_flat, src_len, tgt_flat, tgt_len in encode_in_order(jobs(), num_workers):
            keep = fits(src_len, tgt_len, max_len)
            num_dropped += int((~keep).sum())
            for side, flat, n in (("src", src_flat, src_len), ("tgt", tgt_flat, tgt_len)):
                files[side].write(flat[np.repeat(keep, n)].tobytes())
                lengths[side].append(n[keep])
    if text.num_pairs == num_dropped:
        raise ValueError(f"{text.identity}: no pair is at most {max_len} tokens long")
    for side in lengths:
        offsets = np.zeros(text.num_pairs - num_dropped + 1, np.int64)
        np.cumsum(np.concatenate(lengths[side]), out=offsets[1:])
        with open(cache_dir / f"{side}.offsets.npy", "wb") as f:
            np.save(f, offsets)
    num_pairs = text.num_pairs - num_dropped
    return {"dtype": dtype_name, "num_pairs": num_pairs, "num_dropped": num_dropped}
