"""The shared vocabulary: translate/data/tokenizer.py."""

from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID


def test_special_ids_are_distinct_and_round_trip(tokenizer):
    assert len({PAD_ID, UNK_ID, BOS_ID, EOS_ID}) == 4
    text = "Der alte Mann sieht den Hund."
    ids = tokenizer.encode([text])[0]
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(ids)
    assert tokenizer.decode(ids + [EOS_ID, 7, 8]) == text
