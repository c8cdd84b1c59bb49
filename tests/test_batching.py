"""The batch and length-grouped packing: translate/data/batching.py."""

import numpy as np
import pytest

from translate.data import batching, synthetic
from translate.data.batching import (
    Batch,
    BatchLayout,
    DataPosition,
    Mixture,
    decode_width,
    iterate_batches,
    make_batch,
    plan_epoch,
    source_batches,
)
from translate.data.corpus import TokenizedCorpus
from translate.data.tokenizer import BOS_ID, EOS_ID


def random_corpus(n=300, seed=0):
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, 50, rng.integers(1, 20))) for _ in range(n)]
    tgt = [list(rng.integers(4, 50, rng.integers(1, 20))) for _ in range(n)]
    return TokenizedCorpus.from_lists(src, tgt)


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
    assert batch.src.shape == (1, 8, 64)
    real = (batch.tgt_segments > 0).sum() + (batch.src_segments > 0).sum()
    assert real / (2 * batch.src.size) > 0.8, "sorted packing leaves little padding"


def test_batch_shifts_target_and_marks_segments():
    corpus = TokenizedCorpus.from_lists([[10, 11], [12]], [[20, 21, 22], [23]])
    layout = BatchLayout(row_len=8, rows=1, num_micro=1)
    batch = make_batch(corpus, [[0, 1]], layout)
    np.testing.assert_array_equal(batch.src[0, 0], [10, 11, EOS_ID, 12, EOS_ID, 0, 0, 0])
    np.testing.assert_array_equal(batch.tgt_in[0, 0], [BOS_ID, 20, 21, 22, BOS_ID, 23, 0, 0])
    np.testing.assert_array_equal(batch.tgt_out[0, 0], [20, 21, 22, EOS_ID, 23, EOS_ID, 0, 0])
    np.testing.assert_array_equal(batch.tgt_segments[0, 0], [1, 1, 1, 1, 2, 2, 0, 0])
    np.testing.assert_array_equal(batch.tgt_positions[0, 0], [0, 1, 2, 3, 0, 1, 0, 0])


def test_iteration_resumes_from_a_saved_position():
    corpus = random_corpus()
    layout = BatchLayout.from_config(32 * 4, 32, 1, 1)
    stream = iterate_batches(corpus, layout, 0, start=DataPosition())
    first = [next(stream) for _ in range(30)]  # crosses an epoch boundary
    resumed = iterate_batches(corpus, layout, 0, start=first[11][1])
    for (expected, _), (got, _) in zip(first[12:], resumed):
        np.testing.assert_array_equal(expected.src, got.src)


def test_a_mixture_draws_each_corpus_by_its_weight_every_epoch():
    corpus = random_corpus(n=500)
    mixture = Mixture(sizes=(300, 200), weights=(2.0, 0.25))
    layout = BatchLayout.from_config(32 * 8, 32, 1, 1)
    halves = []
    for epoch in range(3):
        drawn = np.array(
            [
                i
                for batch in plan_epoch(corpus, layout, 0, epoch, mixture)
                for row in batch
                for i in row
            ]
        )
        first, second = drawn[drawn < 300], drawn[drawn >= 300]
        np.testing.assert_array_equal(np.bincount(first, minlength=300), 2)  # each twice
        assert len(second) == 50 and len(set(second.tolist())) == 50  # a quarter, once each
        halves.append(set(second.tolist()))
    assert halves[0] != halves[1], "each epoch draws another share"


def test_one_corpus_at_weight_1_plans_the_epochs_of_the_corpus_alone():
    corpus = random_corpus()
    layout = BatchLayout.from_config(32 * 8, 32, 1, 1)
    mixture = Mixture(sizes=(len(corpus),), weights=(1.0,))
    for seed, epoch in ((0, 0), (0, 1), (5, 3)):
        expected = plan_epoch(corpus, layout, seed, epoch)
        assert plan_epoch(corpus, layout, seed, epoch, mixture) == expected


def test_iteration_over_a_mixture_resumes_from_a_saved_position():
    corpus = random_corpus()
    layout = BatchLayout.from_config(32 * 4, 32, 1, 1)
    mixture = Mixture(sizes=(100, 200), weights=(1.5, 0.5))
    stream = iterate_batches(corpus, layout, 0, DataPosition(), mixture=mixture)
    first = [next(stream) for _ in range(60)]  # crosses an epoch boundary
    assert first[40][1].epoch == 1 and first[40][1].index > 0
    resumed = iterate_batches(corpus, layout, 0, start=first[40][1], mixture=mixture)
    for (expected, _), (got, _) in zip(first[41:], resumed):
        for x, y in zip(expected, got):
            np.testing.assert_array_equal(x, y)


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


def reference_batch(corpus, rows, layout, row_slice):
    """make_batch written row by row, sentence by sentence."""
    micro = [rows[m * layout.rows : (m + 1) * layout.rows][row_slice] for m in range(2)]
    shape = (layout.num_micro, len(micro[0]), layout.row_len)
    out = Batch(*(np.zeros(shape, np.int32) for _ in Batch._fields))
    for m, micro_rows in enumerate(micro):
        for r, row in enumerate(micro_rows):
            s = t = 0
            for n, i in enumerate(row, start=1):
                src = list(corpus.src(i)) + [EOS_ID]
                tgt = list(corpus.tgt(i))
                out.src[m, r, s : s + len(src)] = src
                out.src_segments[m, r, s : s + len(src)] = n
                out.src_positions[m, r, s : s + len(src)] = range(len(src))
                out.tgt_in[m, r, t : t + len(tgt) + 1] = [BOS_ID] + tgt
                out.tgt_out[m, r, t : t + len(tgt) + 1] = tgt + [EOS_ID]
                out.tgt_segments[m, r, t : t + len(tgt) + 1] = n
                out.tgt_positions[m, r, t : t + len(tgt) + 1] = range(len(tgt) + 1)
                s, t = s + len(src), t + len(tgt) + 1
    return out


@pytest.mark.parametrize("row_slice", [slice(None), slice(2, 4)])
def test_vectorised_batch_matches_a_row_by_row_reference(row_slice):
    corpus = random_corpus(n=500, seed=4)
    layout = BatchLayout.from_config(32 * 16, 32, grad_accum_steps=2, num_devices=4)
    for rows in plan_epoch(corpus, layout, seed=0, epoch=0):  # the last batch has empty rows
        expected = reference_batch(corpus, rows, layout, row_slice)
        got = make_batch(corpus, rows, layout, row_slice)
        for key in Batch._fields:
            np.testing.assert_array_equal(getattr(got, key), getattr(expected, key), err_msg=key)


def test_packing_fills_gaps_with_short_pairs():
    # Pairs of 40 tokens (+ EOS) fill a 64-slot row only once; packing puts short pairs in
    # the gap instead of wasting 23 slots per row.
    src = [[5] * 40] * 10 + [[6] * 10] * 20
    corpus = TokenizedCorpus.from_lists(src, src)
    rows = batching.pack_rows(corpus, np.argsort([len(s) for s in src], kind="stable"), 64)
    assert sorted(i for row in rows for i in row) == list(range(30))
    for row in rows:
        assert sum(len(src[i]) + 1 for i in row) <= 64
    assert len(rows) == 10  # each long pair with two short ones: 41 + 11 + 11 = 63


def test_fewer_sentences_than_a_batch_are_padded_to_a_power_of_two_rows(tokenizer):
    for count, rows in ((1, 1), (3, 4), (5, 8), (8, 8), (9, 8)):
        batches = list(source_batches(tokenizer, ["a man reads ."] * count, batch_size=8))
        assert [tokens.shape[0] for _, tokens in batches][0] == rows
        assert sum(int(np.sum(indices >= 0)) for indices, _ in batches) == count
