"""Tokenize once into a memory-mapped cache: translate/data/corpus.py."""

import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from translate.data import corpus, synthetic
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.corpus import tokenize_once, tokenize_parallel
from translate.data.text import ParallelText
from translate.data.tokenizer import train_tokenizer

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_pairs_longer_than_max_len_are_dropped_and_counted(tokenizer):
    src = ["The man sees the dog.", " ".join(["The old man sees the dog"] * 10) + "."]
    tgt = ["Der Mann sieht den Hund.", "Der Mann."]
    corpus, dropped = tokenize_parallel(tokenizer, src, tgt, max_len=16)
    assert len(corpus) == 1 and dropped == 1


def pairs_text(n=300, seed=3):
    src, tgt = zip(*synthetic.generate_pairs(n, seed=seed))
    return list(src), list(tgt)


def unreadable(indices):
    raise AssertionError("the cached tokens should have been reused")


def test_concatenated_corpora_hold_each_corpus_pairs_in_order():
    a = corpus.TokenizedCorpus.from_lists([[5, 6], [7]], [[8], [9, 10]])
    b = corpus.TokenizedCorpus.from_lists([[11, 12, 13]], [[14]])
    joined = corpus.concatenate([a, b])
    assert len(joined) == 3
    pairs = [(joined.src(i).tolist(), joined.tgt(i).tolist()) for i in range(3)]
    assert pairs == [([5, 6], [8]), ([7], [9, 10]), ([11, 12, 13], [14])]


def test_a_source_prefix_opens_every_source_and_keys_the_cache(tokenizer, tmp_path):
    src, tgt = pairs_text(50)
    text = ParallelText.from_lists(src, tgt, "a")
    plain, _ = tokenize_once(text, tokenizer, 64, tmp_path / "plain")
    tagged, _ = tokenize_once(text, tokenizer, 64, tmp_path / "tagged", src_prefix=[4])
    for i in range(len(plain)):
        assert tagged.src(i).tolist() == [4] + plain.src(i).tolist()
        assert tagged.tgt(i).tolist() == plain.tgt(i).tolist()
    # The same directory without the prefix is rebuilt, not read back with it.
    again, _ = tokenize_once(text, tokenizer, 64, tmp_path / "tagged")
    np.testing.assert_array_equal(again.src_tokens, plain.src_tokens)


def test_token_cache_is_reused_on_a_second_load(tokenizer, tmp_path):
    src, tgt = pairs_text()
    first, _ = tokenize_once(ParallelText.from_lists(src, tgt, "a"), tokenizer, 64, tmp_path)
    manifest = (tmp_path / "manifest.json").read_text()
    again, _ = tokenize_once(ParallelText(len(src), unreadable, "a"), tokenizer, 64, tmp_path)
    assert isinstance(again.src_tokens, np.memmap) and again.src_tokens.dtype == np.uint16
    np.testing.assert_array_equal(again.tgt_tokens, first.tgt_tokens)
    np.testing.assert_array_equal(again.src_offsets, first.src_offsets)
    assert (tmp_path / "manifest.json").read_text() == manifest


def test_worker_processes_tokenize_like_one_process(tokenizer, tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "ENCODE_CHUNK", 64)  # 300 pairs: five jobs over two workers
    src, tgt = pairs_text()
    text = ParallelText.from_lists(src, tgt, "a")
    one, one_dropped = tokenize_once(text, tokenizer, 48, tmp_path / "one", num_workers=1)
    two, two_dropped = tokenize_once(text, tokenizer, 48, tmp_path / "two", num_workers=2)
    assert one_dropped == two_dropped > 0
    for name in ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets"):
        np.testing.assert_array_equal(getattr(two, name), getattr(one, name), err_msg=name)


def test_token_cache_is_rebuilt_when_the_vocabulary_changes(tokenizer, tmp_path):
    src, tgt = pairs_text()
    text = ParallelText.from_lists(src, tgt, "a")
    tokenize_once(text, tokenizer, 256, tmp_path / "cache")
    other = train_tokenizer(src + tgt, 120, tmp_path / "other.model")
    corpus, _ = tokenize_once(text, other, 256, tmp_path / "cache")
    assert corpus.src(0).tolist() == other.encode([src[0]])[0] != tokenizer.encode([src[0]])[0]
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    assert manifest["vocab_sha256"] == other.sha256
    assert manifest["num_pairs"] == len(corpus) == len(src)


def test_token_cache_is_rebuilt_when_the_training_files_change(tokenizer, tmp_path):
    (tmp_path / "t.en").write_text("The dog sees the man.\n")
    (tmp_path / "t.de").write_text("Der Hund sieht den Mann.\n")
    text = ParallelText.from_files(tmp_path / "t.en", tmp_path / "t.de")
    assert len(tokenize_once(text, tokenizer, 64, tmp_path / "cache")[0]) == 1
    (tmp_path / "t.en").write_text("The dog sees the man.\nThe man.\n")
    (tmp_path / "t.de").write_text("Der Hund sieht den Mann.\nDer Mann.\n")
    text = ParallelText.from_files(tmp_path / "t.en", tmp_path / "t.de")
    assert len(tokenize_once(text, tokenizer, 64, tmp_path / "cache")[0]) == 2


def test_memmapped_corpus_batches_equal_in_memory_ones(tokenizer, tmp_path):
    src, tgt = pairs_text(n=400)
    src[5] = " ".join(["the old man sees the dog"] * 20)  # too long: dropped by both paths
    in_memory, dropped = tokenize_parallel(tokenizer, src, tgt, max_len=64)
    mapped, mapped_dropped = tokenize_once(
        ParallelText.from_lists(src, tgt, "a"), tokenizer, 64, tmp_path
    )
    assert dropped == mapped_dropped >= 1
    layout = BatchLayout.from_config(64 * 8, 64, grad_accum_steps=2, num_devices=2)
    plan = plan_epoch(in_memory, layout, seed=1, epoch=0)
    assert plan == plan_epoch(mapped, layout, seed=1, epoch=0)
    for rows in plan:
        expected, got = make_batch(in_memory, rows, layout), make_batch(mapped, rows, layout)
        for key in expected._fields:
            np.testing.assert_array_equal(getattr(got, key), getattr(expected, key), err_msg=key)


# A parent that starts two workers as `encode_in_order` does, gives each a long job, and waits.
PARENT = """
import concurrent.futures, multiprocessing, os, time
from translate.data.corpus import end_with_parent
context = multiprocessing.get_context("spawn")
pool = concurrent.futures.ProcessPoolExecutor(
    2, mp_context=context, initializer=end_with_parent, initargs=(os.getpid(),)
)
started = [pool.submit(os.getpid).result() for _ in range(2)]
jobs = [pool.submit(time.sleep, 600) for _ in range(2)]
print(*pool._processes, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_tokenizing_workers_end_when_their_parent_is_killed():
    """After a kill -9 while the corpus is tokenized, no worker stays alive (two once did for
    25 minutes)."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2 and all(alive(pid) for pid in workers)
    parent.kill()  # SIGKILL: nothing of the parent's runs
    parent.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not any(alive(pid) for pid in workers)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended; its parent reaps it
        return f.read().split(")")[-1].split()[0] != "Z"
