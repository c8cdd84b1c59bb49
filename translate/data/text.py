"""Parallel text: aligned files read and checked (file and line in every error), pairs by index.

A corpus is a `ParallelText`: a number of pairs and a function that reads pairs by index, so a
4.5M-pair corpus (files, or a TFDS split through translate/data/wmt.py) never sits in memory
as text.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Callable, Sequence

import numpy as np

# Pairs read at once when sampling the vocabulary's sentences.
READ_CHUNK = 100_000


def read_lines(path: str | pathlib.Path, allow_empty: bool = False) -> list[str]:
    """Reads one sentence per line; bad UTF-8, a NUL byte or an empty line names file and line."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path}: a directory, not a file of sentences")
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file")
    # Not only a regular file: a pipe (`--src=<(zcat test.en.gz)`, a FIFO) is read once, whole.
    lines = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}:{number}: not valid UTF-8 ({e.reason})") from None
            if "\0" in line:
                raise ValueError(f"{path}:{number}: NUL byte (is this a text file?)")
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

    @classmethod
    def concatenated(cls, texts: Sequence[ParallelText]) -> ParallelText:
        """The pairs of `texts` one after another (several training corpora)."""
        starts = np.cumsum([0] + [t.num_pairs for t in texts])

        def read(indices):
            indices = np.asarray(indices, np.int64)
            parts = np.searchsorted(starts, indices, side="right") - 1
            src, tgt = [""] * len(indices), [""] * len(indices)
            for part in np.unique(parts).tolist():  # each text read once, in one call
                where = np.flatnonzero(parts == part).tolist()
                got = texts[part].read((indices[where] - starts[part]).tolist())
                for w, s, t in zip(where, *got):
                    src[w], tgt[w] = s, t
            return src, tgt

        identity = "+".join(t.identity for t in texts)
        return cls(int(starts[-1]), read, identity)

    @classmethod
    def monolingual(cls, path: pathlib.Path) -> ParallelText:
        """One language's text as pairs with an empty source, for a language model.

        A decoder-only model reads each pair as `EOS BOS sentence` and is scored on every token
        of the sentence and its EOS (translate/models/decoder_only.py).
        """
        load = functools.cache(lambda: read_lines(path))

        def read(indices):
            lines = load()
            return ["" for _ in indices], [lines[i] for i in indices]

        path = pathlib.Path(path).resolve()
        with open(path, "rb") as f:
            num_lines = sum(1 for _ in f)
        identity = f"monolingual:{path}:{path.stat().st_size}:{path.stat().st_mtime_ns}"
        return cls(num_lines, read, identity)


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
