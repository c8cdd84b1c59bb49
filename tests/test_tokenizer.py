"""The shared vocabulary: translate/data/tokenizer.py."""

import pytest

from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def test_special_ids_are_distinct_and_round_trip(tokenizer):
    assert len({PAD_ID, UNK_ID, BOS_ID, EOS_ID}) == 4
    text = "Der alte Mann sieht den Hund."
    ids = tokenizer.encode([text])[0]
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(ids)
    assert tokenizer.decode(ids + [EOS_ID, 7, 8]) == text


def test_a_vocabulary_smaller_than_the_characters_is_a_one_line_error(tmp_path):
    """Not SentencePiece's 12-frame traceback: the flag and the size to give."""
    from translate.data.tokenizer import train_tokenizer

    texts = ["abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789"] * 20
    with pytest.raises(ValueError, match=r"--config.data.vocab_size=30: .* give at least \d+"):
        train_tokenizer(texts, 30, tmp_path / "vocab.model")
    assert not (tmp_path / "vocab.model").exists()
