"""Reading, tokenizing and batching parallel text (translate/data.py, translate/tokenizer.py)."""

import numpy as np
import pytest

from translate import synthetic
from translate.data import (
    BatchLayout,
    DataPosition,
    TokenizedCorpus,
    iterate_batches,
    make_batch,
    plan_epoch,
    read_parallel,
    source_batches,
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
        assert tokens.shape[0] == 8 and tokens.shape[1] % 8 == 0
        seen += [int(i) for i in indices if i >= 0]
        widths.append(tokens.shape[1])
    assert sorted(seen) == list(range(21)) and widths == sorted(widths)
