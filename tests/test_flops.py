"""Model FLOPs counted from shapes (translate/models/flops.py)."""

import numpy as np

from translate.config import ModelConfig
from translate.data.batching import BatchLayout, make_batch
from translate.data.corpus import TokenizedCorpus
from translate.models.flops import batch_lengths, forward_flops, train_flops


def test_forward_flops_match_a_hand_count():
    model = ModelConfig(num_layers=1, d_model=4, num_heads=2, d_ff=8)
    # One pair: 3 source and 2 target tokens, vocabulary 10.
    encoder = 3 * (8 * 16 + 4 * 4 * 8) + 4 * 4 * 9  # projections + FFN, then attention
    decoder = 2 * (12 * 16 + 4 * 4 * 8) + 3 * 4 * 16 + 4 * 4 * 4 + 4 * 4 * 6
    softmax = 2 * 2 * 4 * 10
    assert forward_flops(model, 10, [3], [2]) == encoder + decoder + softmax
    assert train_flops(model, 10, [3], [2]) == 3 * (encoder + decoder + softmax)


def test_batch_lengths_recover_the_packed_pairs():
    src = [[5] * 3, [6] * 7, [7] * 2]
    tgt = [[8] * 4, [9] * 1, [4] * 5]
    corpus = TokenizedCorpus.from_lists(src, tgt)
    layout = BatchLayout(row_len=16, rows=2, num_micro=1)
    batch = make_batch(corpus, [[0, 1], [2]], layout)
    s, t = batch_lengths(batch)
    np.testing.assert_array_equal(s, [4, 8, 3])  # + EOS
    np.testing.assert_array_equal(t, [5, 2, 6])  # + BOS / EOS


def test_decoder_only_forward_flops_match_a_hand_count():
    model = ModelConfig(num_layers=1, d_model=4, num_heads=2, d_ff=8, architecture="decoder_only")
    # One pair of 3 source and 2 target tokens is one sequence of 5; only the target is scored.
    stack = 5 * (8 * 16 + 4 * 4 * 8) + 4 * 4 * 25
    softmax = 2 * 2 * 4 * 10
    assert forward_flops(model, 10, [3], [2]) == stack + softmax
