"""Tests for the synthetic English-German corpus generator in translate/data/synthetic.py."""

import json
import os
import pathlib
import random
import subprocess
import sys

import pytest

from translate.data import synthetic
from translate.data.synthetic import (
    ACCUSATIVE,
    DATIVE,
    MAX_WORDS,
    NOMINATIVE,
    Clause,
    NounPhrase,
    PrepPhrase,
    Sentence,
    english_noun_phrase,
    generate_pairs,
    generate_splits,
    german_noun_phrase,
    random_sentence,
    render_english,
    translate_sentence,
    write_splits,
)

MODULE_PATH = pathlib.Path(synthetic.__file__)


def np_(noun, definite=True, adjective=None):
    """Builds a noun phrase tersely, so expected sentences stay readable."""
    return NounPhrase(noun, definite, adjective)


def both(sentence):
    """Returns the (english, german) rendering of a structured sentence."""
    return render_english(sentence), translate_sentence(sentence)


@pytest.fixture(scope="module")
def many_pairs():
    """One large corpus shared by the tests that only read it, to keep the file fast."""
    return generate_pairs(20_000, seed=0)


def test_generation_is_deterministic_given_seed():
    assert generate_pairs(300, seed=7) == generate_pairs(300, seed=7)


def test_generation_is_identical_across_processes_with_different_hash_seeds():
    # Set iteration order depends on PYTHONHASHSEED, so this catches any sampling from sets.
    script = (
        "import importlib.util, json, sys\n"
        f"spec = importlib.util.spec_from_file_location('synthetic_copy', {str(MODULE_PATH)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['synthetic_copy'] = module\n"
        "spec.loader.exec_module(module)\n"
        "print(json.dumps(module.generate_pairs(200, seed=3)))\n"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        result = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        outputs.append(json.loads(result.stdout))
    assert outputs[0] == outputs[1]
    assert [tuple(pair) for pair in outputs[0]] == generate_pairs(200, seed=3)


def test_different_seeds_give_different_corpora():
    first = set(generate_pairs(300, seed=0))
    second = set(generate_pairs(300, seed=1))
    assert len(first & second) < 30


def test_longer_request_extends_shorter_one_for_same_seed():
    assert generate_pairs(500, seed=4)[:100] == generate_pairs(100, seed=4)


def test_pairs_are_distinct(many_pairs):
    assert len({english for english, _ in many_pairs}) == len(many_pairs)
    assert len({german for _, german in many_pairs}) == len(many_pairs)


def test_grammar_yields_several_thousand_distinct_sentences(many_pairs):
    assert len(many_pairs) == 20_000


def test_sentences_are_single_capitalised_lines_with_final_period(many_pairs):
    for english, german in many_pairs:
        for text in (english, german):
            assert text.strip() == text and text
            assert "\n" not in text and "\t" not in text and "\r" not in text
            assert text[0].isupper() and text.endswith(".")
            assert "  " not in text


def test_sentences_stay_within_word_limit(many_pairs):
    lengths = [len(side.split()) for pair in many_pairs for side in pair]
    assert max(lengths) <= MAX_WORDS
    assert 6 <= sum(lengths) / len(lengths) <= 14


def test_translation_is_a_function_of_the_english_sentence():
    rng = random.Random(11)
    seen = {}
    for _ in range(20_000):
        english, german = both(random_sentence(rng))
        assert seen.setdefault(english, german) == german


def test_grammar_exercises_every_construction(many_pairs):
    german = "\n".join(german for _, german in many_pairs)
    for marker in (", weil ", ", dass ", "Obwohl ", " im ", " beim ", " einem ", " einer "):
        assert marker in german
    for particle in (" auf.", " zu.", " an.", " ein.", " ab.", " zurück."):
        assert particle in german


def test_splits_share_no_sentence():
    splits = generate_splits(2000, 300, 300, seed=0)
    for side in (0, 1):
        sets = {name: {pair[side] for pair in pairs} for name, pairs in splits.items()}
        assert not sets["train"] & sets["dev"]
        assert not sets["train"] & sets["test"]
        assert not sets["dev"] & sets["test"]


def test_split_sizes_match_request_and_are_distinct_within_split():
    splits = generate_splits(50, 20, 10, seed=2)
    assert {name: len(pairs) for name, pairs in splits.items()} == {
        "train": 50,
        "dev": 20,
        "test": 10,
    }
    for pairs in splits.values():
        assert len(set(pairs)) == len(pairs)


def test_dev_and_test_do_not_depend_on_train_size():
    small = generate_splits(100, 40, 40, seed=9)
    large = generate_splits(1000, 40, 40, seed=9)
    assert small["dev"] == large["dev"]
    assert small["test"] == large["test"]


def test_written_files_have_matching_line_counts(tmp_path):
    out_dir = tmp_path / "nested" / "data"
    paths = write_splits(out_dir, 120, 30, 25, seed=1)
    assert set(paths) == {"train", "dev", "test"}
    expected = {"train": 120, "dev": 30, "test": 25}
    splits = generate_splits(120, 30, 25, seed=1)
    for split, (english_path, german_path) in paths.items():
        assert english_path == out_dir / f"{split}.en"
        assert german_path == out_dir / f"{split}.de"
        english_text = english_path.read_text(encoding="utf-8")
        german_text = german_path.read_text(encoding="utf-8")
        assert english_text.endswith("\n") and german_text.endswith("\n")
        english_lines = english_text.splitlines()
        german_lines = german_text.splitlines()
        assert len(english_lines) == len(german_lines) == expected[split]
        assert list(zip(english_lines, german_lines, strict=True)) == splits[split]


def test_write_splits_leaves_no_temporary_files(tmp_path):
    write_splits(tmp_path, 10, 5, 5, seed=0)
    write_splits(tmp_path, 12, 5, 5, seed=0)
    names = sorted(path.name for path in tmp_path.iterdir())
    assert names == sorted(
        f"{split}.{lang}" for split in ("train", "dev", "test") for lang in ("en", "de")
    )
    assert len((tmp_path / "train.en").read_text(encoding="utf-8").splitlines()) == 12


def test_negative_count_raises_value_error():
    with pytest.raises(ValueError, match="num_pairs"):
        generate_pairs(-1, seed=0)
    with pytest.raises(ValueError, match="num_dev"):
        generate_splits(10, -2, 10, seed=0)


def test_exhausted_grammar_raises_value_error(monkeypatch):
    only = Sentence(Clause(np_("dog"), "sleeps"))
    monkeypatch.setattr(synthetic, "random_sentence", lambda rng: only)
    assert generate_pairs(1, seed=0) == [("The dog sleeps.", "Der Hund schläft.")]
    with pytest.raises(ValueError, match="distinct"):
        generate_pairs(2, seed=0)


@pytest.mark.parametrize(
    ("phrase", "case", "expected"),
    [
        (np_("man"), NOMINATIVE, "der Mann"),
        (np_("man"), ACCUSATIVE, "den Mann"),
        (np_("man"), DATIVE, "dem Mann"),
        (np_("woman"), NOMINATIVE, "die Frau"),
        (np_("woman"), ACCUSATIVE, "die Frau"),
        (np_("woman"), DATIVE, "der Frau"),
        (np_("child"), NOMINATIVE, "das Kind"),
        (np_("child"), DATIVE, "dem Kind"),
        (np_("man", False), ACCUSATIVE, "einen Mann"),
        (np_("woman", False), DATIVE, "einer Frau"),
        (np_("book", False), ACCUSATIVE, "ein Buch"),
    ],
)
def test_articles_agree_with_gender_and_case(phrase, case, expected):
    assert german_noun_phrase(phrase, case) == expected


@pytest.mark.parametrize(
    ("phrase", "case", "expected"),
    [
        (np_("man", True, "old"), NOMINATIVE, "der alte Mann"),
        (np_("man", False, "old"), NOMINATIVE, "ein alter Mann"),
        (np_("man", True, "old"), ACCUSATIVE, "den alten Mann"),
        (np_("man", False, "old"), ACCUSATIVE, "einen alten Mann"),
        (np_("man", False, "old"), DATIVE, "einem alten Mann"),
        (np_("woman", True, "young"), NOMINATIVE, "die junge Frau"),
        (np_("woman", False, "young"), ACCUSATIVE, "eine junge Frau"),
        (np_("woman", True, "young"), DATIVE, "der jungen Frau"),
        (np_("woman", False, "young"), DATIVE, "einer jungen Frau"),
        (np_("horse", True, "small"), ACCUSATIVE, "das kleine Pferd"),
        (np_("horse", False, "small"), NOMINATIVE, "ein kleines Pferd"),
        (np_("horse", False, "small"), ACCUSATIVE, "ein kleines Pferd"),
        (np_("horse", True, "small"), DATIVE, "dem kleinen Pferd"),
        (np_("child", False, "tired"), NOMINATIVE, "ein müdes Kind"),
    ],
)
def test_adjective_endings_agree_with_article_gender_and_case(phrase, case, expected):
    assert german_noun_phrase(phrase, case) == expected


def test_adjective_endings_in_whole_sentences():
    sees = Sentence(Clause(np_("man", True, "old"), "sees", np_("man", False, "old")))
    assert translate_sentence(sees) == "Der alte Mann sieht einen alten Mann."
    with_ = Sentence(
        Clause(np_("child", False), "plays", prep=PrepPhrase("with", np_("man", True, "old")))
    )
    assert both(with_) == ("A child plays with the old man.", "Ein Kind spielt mit dem alten Mann.")


def test_english_uses_an_before_vowels():
    assert english_noun_phrase(np_("man", False, "old")) == "an old man"
    assert english_noun_phrase(np_("owl", False)) == "an owl"
    assert english_noun_phrase(np_("owl", False, "young")) == "a young owl"
    assert english_noun_phrase(np_("dog", False)) == "a dog"


def test_ditransitive_puts_dative_recipient_before_accusative_object():
    gives = Sentence(Clause(np_("man"), "gives", np_("book"), indirect=np_("woman")))
    assert both(gives) == ("The man gives the woman the book.", "Der Mann gibt der Frau das Buch.")


def test_dative_verb_takes_dative_object():
    helps = Sentence(Clause(np_("woman"), "helps", np_("man", False, "old")))
    assert both(helps) == ("The woman helps an old man.", "Die Frau hilft einem alten Mann.")


def test_subordinate_clause_puts_verb_last():
    sentence = Sentence(
        Clause(np_("man"), "sleeps"),
        "because",
        Clause(np_("woman"), "sees", np_("child"), adverb="today"),
    )
    assert both(sentence) == (
        "The man sleeps because the woman sees the child today.",
        "Der Mann schläft, weil die Frau heute das Kind sieht.",
    )
    that = Sentence(
        Clause(np_("teacher"), "knows"),
        "that",
        Clause(np_("girl"), "gives", np_("apple", False, "red"), indirect=np_("dog")),
    )
    assert both(that) == (
        "The teacher knows that the girl gives the dog a red apple.",
        "Der Lehrer weiß, dass das Mädchen dem Hund einen roten Apfel gibt.",
    )


def test_separable_verb_prefix_goes_to_clause_end():
    main = Clause(np_("girl"), "opens", np_("door"), prep=PrepPhrase("in", np_("house")))
    assert both(Sentence(main)) == (
        "The girl opens the door in the house.",
        "Das Mädchen macht die Tür im Haus auf.",
    )
    sentence = Sentence(
        Clause(np_("dog"), "plays"), "because", Clause(np_("girl"), "opens", np_("door"))
    )
    assert translate_sentence(sentence) == "Der Hund spielt, weil das Mädchen die Tür aufmacht."
    returns = Sentence(Clause(np_("man"), "returns", np_("book"), indirect=np_("woman")))
    assert both(returns) == (
        "The man returns the book to the woman.",
        "Der Mann gibt der Frau das Buch zurück.",
    )


def test_adverb_fronting_puts_verb_second():
    fronted = Sentence(Clause(np_("man"), "sees", np_("dog"), adverb="today", adverb_first=True))
    assert both(fronted) == ("Today the man sees the dog.", "Heute sieht der Mann den Hund.")
    separable = Sentence(Clause(np_("child"), "gets up", adverb="now", adverb_first=True))
    assert translate_sentence(separable) == "Jetzt steht das Kind auf."
    in_place = Sentence(Clause(np_("man"), "sees", np_("dog"), adverb="today"))
    assert both(in_place) == ("The man sees the dog today.", "Der Mann sieht heute den Hund.")


def test_fronted_subordinate_clause_puts_main_verb_first():
    sentence = Sentence(
        Clause(np_("man"), "opens", np_("door")),
        "because",
        Clause(np_("woman"), "sees", np_("child")),
        subordinate_first=True,
    )
    assert both(sentence) == (
        "Because the woman sees the child, the man opens the door.",
        "Weil die Frau das Kind sieht, macht der Mann die Tür auf.",
    )


def test_preposition_contracts_only_with_definite_dem():
    def german(preposition, phrase):
        clause = Clause(np_("cat"), "sleeps", prep=PrepPhrase(preposition, phrase))
        return translate_sentence(Sentence(clause))

    assert german("in", np_("house")) == "Die Katze schläft im Haus."
    assert german("near", np_("station", True, "old")) == "Die Katze schläft beim alten Bahnhof."
    assert german("in", np_("house", False)) == "Die Katze schläft in einem Haus."
    assert german("in", np_("kitchen")) == "Die Katze schläft in der Küche."
    assert german("in front of", np_("church")) == "Die Katze schläft vor der Kirche."


@pytest.mark.parametrize(
    "sentence",
    [
        Sentence(Clause(np_("man"), "sees")),
        Sentence(Clause(np_("man"), "sleeps", np_("dog"))),
        Sentence(Clause(np_("man"), "gives", np_("book"))),
        Sentence(Clause(np_("unicorn"), "sleeps")),
        Sentence(Clause(np_("man"), "sleeps", adverb_first=True)),
        Sentence(Clause(np_("man"), "knows")),
        Sentence(Clause(np_("man"), "sleeps"), "that", Clause(np_("dog"), "plays")),
        Sentence(
            Clause(np_("man"), "knows"),
            "that",
            Clause(np_("dog"), "plays"),
            subordinate_first=True,
        ),
    ],
)
def test_malformed_sentence_raises_value_error(sentence):
    with pytest.raises(ValueError):
        translate_sentence(sentence)
