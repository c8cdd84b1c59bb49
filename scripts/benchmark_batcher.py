r"""Measure the batcher (planning an epoch + `make_batch`) on one CPU core in real tokens/s.

    python -m scripts.benchmark_batcher [--data_dir=data/wmt_sample] \
        [--num_pairs=1000000] [--num_batches=500]

The corpus: `data_dir`'s train.en and train.de (else synthetic pairs), BPE-tokenized,
replicated to `num_pairs` pairs and memory-mapped from uint16 files as the token cache is.
Batches have configs/wmt14_base.py's shape on 8 devices (96 rows of 256 slots a side); a batch's
real tokens are its non-padding slots, and each is charged its share of the epoch's planning.
The median over `num_batches` batches: the trainer needs about 50,000 a step, so 1M tokens/s
keeps a step under 50 ms.
"""

from __future__ import annotations

import os
import pathlib
import platform
import tempfile
import time

import numpy as np

from translate import cli, provenance
from translate.config import load_config
from translate.data import synthetic
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.corpus import TokenizedCorpus, tokenize_parallel
from translate.data.text import read_parallel
from translate.data.tokenizer import train_tokenizer
from translate.flags import Flag, parse_flags

ROOT = pathlib.Path(__file__).resolve().parent.parent


def build_corpus(data_dir: pathlib.Path, num_pairs: int, workdir: pathlib.Path) -> TokenizedCorpus:
    """Tokenized pairs from `data_dir` (or synthetic), replicated and memory-mapped."""
    if (data_dir / "train.en").is_file():
        src, tgt = read_parallel(data_dir / "train.en", data_dir / "train.de")
        origin = str(data_dir)
    else:
        start = time.perf_counter()
        src, tgt = map(list, zip(*synthetic.generate_pairs(20_000, seed=0)))
        origin = f"synthetic pairs (generated in {time.perf_counter() - start:.2f} s)"
    tokenizer = train_tokenizer(src + tgt, 8000, workdir / "vocab.model")
    corpus, _ = tokenize_parallel(tokenizer, src, tgt, max_len=256)
    print(f"corpus: {len(corpus)} pairs from {origin}, replicated to {num_pairs}")
    arrays = []
    for tokens, offsets, side in (
        (corpus.src_tokens, corpus.src_offsets, "src"),
        (corpus.tgt_tokens, corpus.tgt_offsets, "tgt"),
    ):
        copies = -(-num_pairs // len(corpus))
        lengths = np.tile(np.diff(offsets), copies)[:num_pairs]
        new_offsets = np.zeros(num_pairs + 1, np.int64)
        np.cumsum(lengths, out=new_offsets[1:])
        path = workdir / f"{side}.tokens"
        np.tile(tokens.astype(np.uint16), copies)[: new_offsets[-1]].tofile(path)
        arrays += [np.memmap(path, np.uint16, "r"), new_offsets]
    return TokenizedCorpus(*arrays)


FLAGS = {
    "data_dir": Flag(str(ROOT / "data" / "wmt_sample"), "train.en and train.de (else synthetic)."),
    "num_pairs": Flag(1_000_000, "Pairs in the corpus (the text replicated to this many)."),
    "num_batches": Flag(500, "Batches timed; the result is their median."),
}


def main(argv: list[str]) -> None:
    flags, _ = parse_flags(argv, FLAGS, doc=__doc__, sections=())
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core, as promised
    config = load_config(ROOT / "configs" / "wmt14_base.py")
    d = config.data
    layout = BatchLayout.from_config(d.tokens_per_batch, d.row_len, 1, num_devices=8)
    with tempfile.TemporaryDirectory() as workdir:
        data_dir, workdir = pathlib.Path(flags["data_dir"]), pathlib.Path(workdir)
        corpus = build_corpus(data_dir, flags["num_pairs"], workdir)
        start = time.perf_counter()
        plan = plan_epoch(corpus, layout, seed=0, epoch=0)
        plan_seconds = time.perf_counter() - start
        per_batch_plan = plan_seconds / len(plan)
        rates, seconds, tokens = [], [], []
        for rows in plan[: flags["num_batches"]]:
            start = time.perf_counter()
            batch = make_batch(corpus, rows, layout)
            elapsed = time.perf_counter() - start
            real = int((batch.src_segments > 0).sum() + (batch.tgt_segments > 0).sum())
            rates.append(real / (elapsed + per_batch_plan))
            seconds.append(elapsed)
            tokens.append(real)
    rows = f"{layout.num_micro} x {layout.rows} rows x {layout.row_len} slots per side"
    print(f"layout: {rows}; {len(plan)} batches per epoch")
    print(f"plan_epoch: {plan_seconds:.2f} s ({1e3 * per_batch_plan:.3f} ms per batch)")
    print(
        f"make_batch: median {1e3 * np.median(seconds):.3f} ms, "
        f"median {np.median(tokens):.0f} real tokens (source + target) per batch"
    )
    print(
        f"machine: {provenance.host()['cpu']} ({platform.machine()}), {os.cpu_count()} CPUs "
        f"(pinned to one), Python {platform.python_version()}, numpy {np.__version__}"
    )
    print(f"batcher: {np.median(rates) / 1e6:.2f}M real tokens/s on one core (median)")


if __name__ == "__main__":
    cli.run(main)
