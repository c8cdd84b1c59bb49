"""Reading, tokenizing and batching parallel text (translate/data.py, translate/tokenizer.py)."""

import json

import numpy as np
import pytest

from translate import data, synthetic
from translate.data import (
    BatchLayout,
    DataPosition,
    ParallelText,
    TokenizedCorpus,
    decode_width,
    iterate_batches,
    make_batch,
    plan_epoch,
    read_parallel,
    sample_sentences,
    source_batches,
    tokenize_once,
    tokenize_parallel,
)
from translate.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    pairs = synthetic.generate_pairs(400, seed=1)
    texts = [s for pair in pairs for s in pair]
    return train_tokenizer(texts, 200, tmp_path_factory.mktemp("vocab") / "vocab.model")


def random_corpus(n=300, seed=0):
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, 50, rng.integers(1, 20))) for _ in range(n)]
    tgt = [list(rng.integers(4, 50, rng.integers(1, 20))) for _ in range(n)]
    return TokenizedCorpus.from_lists(src, tgt)


def test_special_ids_are_distinct_and_round_trip(tokenizer):
    assert len({PAD_ID, UNK_ID, BOS_ID, EOS_ID}) == 4
    text = "Der alte Mann sieht den Hund."
    ids = tokenizer.encode([text])[0]
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(ids)
    assert tokenizer.decode(ids + [EOS_ID, 7, 8]) == text


def test_pairs_longer_than_max_len_are_dropped_and_counted(tokenizer):
    src = ["The man sees the dog.", " ".join(["The old man sees the dog"] * 10) + "."]
    tgt = ["Der Mann sieht den Hund.", "Der Mann."]
    corpus, dropped = tokenize_parallel(tokenizer, src, tgt, max_len=16)
    assert len(corpus) == 1 and dropped == 1


def test_every_pair_appears_once_per_epoch():
    corpus = random_corpus()
    layout = BatchLayout.from_config(32 * 8, 32, grad_accum_steps=2, num_devices=2)
    plan = plan_epoch(corpus, layout, seed=0, epoch=0)
    seen = sorted(i for batch in plan for row in batch for i in row)
    assert seen == list(range(len(corpus)))


def test_batch_order_is_deterministic_given_seed():
    corpus = random_corpus()
    layout = BatchLayout.from_config(32 * 8, 32, 1, 1)
    assert plan_epoch(corpus, layout, 3, 1) == plan_epoch(corpus, layout, 3, 1)
    assert plan_epoch(corpus, layout, 3, 1) != plan_epoch(corpus, layout, 4, 1)
    assert plan_epoch(corpus, layout, 3, 1) != plan_epoch(corpus, layout, 3, 2)


def test_packed_rows_respect_row_len_and_group_similar_lengths():
    corpus = random_corpus(n=2000)
    layout = BatchLayout.from_config(64 * 8, 64, 1, 1)
    batch = make_batch(corpus, plan_epoch(corpus, layout, 0, 0)[0], layout)
    assert batch["src"].shape == (1, 8, 64)
    real = (batch["tgt_segments"] > 0).sum() + (batch["src_segments"] > 0).sum()
    assert real / (2 * batch["src"].size) > 0.8, "sorted packing leaves little padding"


def test_batch_shifts_target_and_marks_segments():
    corpus = TokenizedCorpus.from_lists([[10, 11], [12]], [[20, 21, 22], [23]])
    layout = BatchLayout(row_len=8, rows=1, num_micro=1)
    batch = make_batch(corpus, [[0, 1]], layout)
    np.testing.assert_array_equal(batch["src"][0, 0], [10, 11, EOS_ID, 12, EOS_ID, 0, 0, 0])
    np.testing.assert_array_equal(batch["tgt_in"][0, 0], [BOS_ID, 20, 21, 22, BOS_ID, 23, 0, 0])
    np.testing.assert_array_equal(batch["tgt_out"][0, 0], [20, 21, 22, EOS_ID, 23, EOS_ID, 0, 0])
    np.testing.assert_array_equal(batch["tgt_segments"][0, 0], [1, 1, 1, 1, 2, 2, 0, 0])
    np.testing.assert_array_equal(batch["tgt_positions"][0, 0], [0, 1, 2, 3, 0, 1, 0, 0])


def test_iteration_resumes_from_a_saved_position():
    corpus = random_corpus()
    layout = BatchLayout.from_config(32 * 4, 32, 1, 1)
    stream = iterate_batches(corpus, layout, 0, start=DataPosition())
    first = [next(stream) for _ in range(30)]  # crosses an epoch boundary
    resumed = iterate_batches(corpus, layout, 0, start=first[11][1])
    for (expected, _), (got, _) in zip(first[12:], resumed):
        np.testing.assert_array_equal(expected["src"], got["src"])


def test_mismatched_parallel_files_name_both_files(tmp_path):
    (tmp_path / "a.en").write_text("one\ntwo\n")
    (tmp_path / "a.de").write_text("eins\n")
    with pytest.raises(ValueError, match=r"a\.en has 2 lines.*a\.de has 1"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_empty_line_is_an_error_naming_file_and_line(tmp_path):
    (tmp_path / "a.en").write_text("one\n\nthree\n")
    (tmp_path / "a.de").write_text("eins\nzwei\ndrei\n")
    with pytest.raises(ValueError, match=r"a\.en:2: empty line"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_invalid_utf8_is_an_error_naming_file_and_line(tmp_path):
    (tmp_path / "a.en").write_bytes(b"one\ntwo\n")
    (tmp_path / "a.de").write_bytes(b"eins\nzw\xffei\n")
    with pytest.raises(ValueError, match=r"a\.de:2: not valid UTF-8"):
        read_parallel(tmp_path / "a.en", tmp_path / "a.de")


def test_source_batches_cover_every_sentence_sorted_by_length(tokenizer):
    sentences = [p[0] for p in synthetic.generate_pairs(21, seed=2)]
    seen, widths = [], []
    for indices, tokens in source_batches(tokenizer, sentences, batch_size=8):
        assert tokens.shape[0] == 8 and tokens.shape[1] == decode_width(tokens.shape[1])
        seen += [int(i) for i in indices if i >= 0]
        widths.append(tokens.shape[1])
    assert sorted(seen) == list(range(21)) and widths == sorted(widths)


def test_decode_widths_are_a_dozen_sizes_that_hold_every_length_with_little_padding():
    lengths = range(1, 1001)
    widths = [decode_width(n) for n in lengths]
    assert all(w >= n and w % 8 == 0 for n, w in zip(lengths, widths))
    assert len(set(widths)) <= 14  # 8, 16, 24, 32, 48, ... 1024
    # Past 16 tokens, padding is at most a third of the width (steps of x1.5 and x4/3).
    assert all(w <= max(16, 1.5 * n) for n, w in zip(lengths, widths))
    # Never wider than the longest source after truncation to max_len (rounded up to 8).
    assert decode_width(70, max_len=64) == 64 and decode_width(99, max_len=100) == 104


def pairs_text(n=300, seed=3):
    src, tgt = zip(*synthetic.generate_pairs(n, seed=seed))
    return list(src), list(tgt)


def unreadable(indices):
    raise AssertionError("the cached tokens should have been reused")


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
    monkeypatch.setattr(data, "ENCODE_CHUNK", 64)  # 300 pairs: five jobs over two workers
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
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def reference_batch(corpus, rows, layout, row_slice):
    """make_batch written row by row, sentence by sentence."""
    micro = [rows[m * layout.rows : (m + 1) * layout.rows][row_slice] for m in range(2)]
    shape = (layout.num_micro, len(micro[0]), layout.row_len)
    out = {k: np.zeros(shape, np.int32) for k in ("src", "tgt_in", "tgt_out")}
    for k in ("src_segments", "src_positions", "tgt_segments", "tgt_positions"):
        out[k] = np.zeros(shape, np.int32)
    for m, micro_rows in enumerate(micro):
        for r, row in enumerate(micro_rows):
            s = t = 0
            for n, i in enumerate(row, start=1):
                src = list(corpus.src(i)) + [EOS_ID]
                tgt = list(corpus.tgt(i))
                out["src"][m, r, s : s + len(src)] = src
                out["src_segments"][m, r, s : s + len(src)] = n
                out["src_positions"][m, r, s : s + len(src)] = range(len(src))
                out["tgt_in"][m, r, t : t + len(tgt) + 1] = [BOS_ID] + tgt
                out["tgt_out"][m, r, t : t + len(tgt) + 1] = tgt + [EOS_ID]
                out["tgt_segments"][m, r, t : t + len(tgt) + 1] = n
                out["tgt_positions"][m, r, t : t + len(tgt) + 1] = range(len(tgt) + 1)
                s, t = s + len(src), t + len(tgt) + 1
    return out


@pytest.mark.parametrize("row_slice", [slice(None), slice(2, 4)])
def test_vectorised_batch_matches_a_row_by_row_reference(row_slice):
    corpus = random_corpus(n=500, seed=4)
    layout = BatchLayout.from_config(32 * 16, 32, grad_accum_steps=2, num_devices=4)
    for rows in plan_epoch(corpus, layout, seed=0, epoch=0):  # the last batch has empty rows
        expected = reference_batch(corpus, rows, layout, row_slice)
        got = make_batch(corpus, rows, layout, row_slice)
        assert got.keys() == expected.keys()
        for key in expected:
            np.testing.assert_array_equal(got[key], expected[key], err_msg=key)


def test_vocab_sample_is_seeded_and_drawn_from_both_languages():
    src = [f"en {i}" for i in range(1000)]
    tgt = [f"de {i}" for i in range(1000)]
    text = ParallelText.from_lists(src, tgt, "a")
    sample = sample_sentences(text, 300, seed=0)
    assert sample == sample_sentences(text, 300, seed=0) != sample_sentences(text, 300, seed=1)
    assert len(set(sample)) == 300
    assert 100 < sum(s.startswith("en") for s in sample) < 200
    assert sorted(sample_sentences(text, 5000, seed=0)) == sorted(src + tgt)


def test_packing_fills_gaps_with_short_pairs():
    # Pairs of 40 tokens (+ EOS) fill a 64-slot row only once; packing puts short pairs in
    # the gap instead of wasting 23 slots per row.
    src = [[5] * 40] * 10 + [[6] * 10] * 20
    corpus = TokenizedCorpus.from_lists(src, src)
    rows = data.pack_rows(corpus, np.argsort([len(s) for s in src], kind="stable"), 64)
    assert sorted(i for row in rows for i in row) == list(range(30))
    for row in rows:
        assert sum(len(src[i]) + 1 for i in row) <= 64
    assert len(rows) == 10  # each long pair with two short ones: 41 + 11 + 11 = 63
