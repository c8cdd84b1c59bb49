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


def synthetic_texts(n=200, seed=1):
    from translate.data import synthetic

    return [s for pair in synthetic.generate_pairs(n, seed=seed) for s in pair]


def test_reserved_pieces_are_control_pieces_after_the_text_pieces_left_as_they_were(tmp_path):
    from translate.data.tokenizer import reserved_ids, train_tokenizer

    texts = synthetic_texts()
    plain = train_tokenizer(texts, 99, tmp_path / "plain.model")
    tagged = train_tokenizer(texts, 100, tmp_path / "tagged.model", reserved=["<BT>"])
    assert tagged.vocab_size == plain.vocab_size + 1
    [tag] = reserved_ids(tagged, ["<BT>"])
    assert tag == plain.vocab_size and tagged.processor.is_control(tag)
    assert tagged.encode(texts[:20]) == plain.encode(texts[:20])
    assert tag not in tagged.encode(["<BT> Der Hund"])[0]  # text never makes the tag
    assert tagged.decode([tag, *tagged.encode(["Der Hund"])[0]]) == "Der Hund"


def test_a_reserved_piece_that_the_text_holds_is_refused_and_nothing_is_written(tmp_path):
    from translate.data.tokenizer import train_tokenizer

    with pytest.raises(ValueError, match="already a piece"):
        train_tokenizer(synthetic_texts(), 100, tmp_path / "vocab.model", reserved=["e"])
    assert not (tmp_path / "vocab.model").exists()
