"""Seeded generator of a tiny English-to-German corpus whose translation needs real grammar.

Every English sentence is rendered from a structured `Sentence`, and its German side is a
deterministic function of that structure, so a perfect model can reach 100 BLEU. The German side
exercises gender and case agreement of articles and adjectives, dative recipients and dative
verbs, verb-second order after a fronted adverb or clause, verb-final subordinate clauses,
separable verbs and preposition-article contractions; the English side keeps a fixed, simpler
word order, so the model has to learn genuine reordering rather than word substitution.
"""

from __future__ import annotations

import os
import pathlib
import random
from dataclasses import dataclass
from typing import TypeVar

from translate import atomic

MASCULINE, FEMININE, NEUTER = "m", "f", "n"
NOMINATIVE, ACCUSATIVE, DATIVE = "nom", "acc", "dat"
PERSON, ANIMAL, THING, PLACE = "person", "animal", "thing", "place"
ANIMATE = (PERSON, ANIMAL)

INTRANSITIVE = "intransitive"
ACCUSATIVE_OBJECT = "accusative"
DATIVE_OBJECT = "dative"
DITRANSITIVE = "ditransitive"
CLAUSAL = "clausal"

MAX_WORDS = 20
"""No generated sentence has more words than this on either side."""

SPLITS = ("train", "dev", "test")

_T = TypeVar("_T")


@dataclass(frozen=True)
class Noun:
    """A German noun with the gender that drives article and adjective agreement.

    Attributes:
        german: Capitalised singular form; none of the nouns is a weak masculine, so the form
            is the same in every case.
        gender: One of MASCULINE, FEMININE, NEUTER.
        category: PERSON, ANIMAL, THING or PLACE; used only to keep sampled sentences sensible.
    """

    german: str
    gender: str
    category: str


@dataclass(frozen=True)
class Adjective:
    """A German adjective stem plus the noun categories it is sampled with.

    Attributes:
        stem: Form that takes the inflectional ending ("müd" for "müde").
        categories: Noun categories the sampler may combine it with.
    """

    stem: str
    categories: tuple[str, ...]


@dataclass(frozen=True)
class Verb:
    """A verb in third person singular present with its valency.

    Attributes:
        german: Finite German form without the separable particle ("macht" for "aufmachen").
        frame: INTRANSITIVE, ACCUSATIVE_OBJECT, DATIVE_OBJECT, DITRANSITIVE or CLAUSAL.
        subjects: English nouns the sampler may use as subject.
        objects: English nouns the sampler may use as (direct) object.
        recipients: English nouns the sampler may use as dative recipient of a ditransitive.
        particle: Separable prefix, sent to the clause end in main clauses ("" if none).
        recipient_with_to: English expresses the recipient as "to X" after the object instead
            of the double-object order.
    """

    german: str
    frame: str
    subjects: tuple[str, ...]
    objects: tuple[str, ...] = ()
    recipients: tuple[str, ...] = ()
    particle: str = ""
    recipient_with_to: bool = False


@dataclass(frozen=True)
class Preposition:
    """A preposition that governs the dative in every use the grammar makes of it.

    Attributes:
        german: German preposition.
        objects: English nouns the sampler may use as its object.
    """

    german: str
    objects: tuple[str, ...]


@dataclass(frozen=True)
class NounPhrase:
    """A determiner, an optional adjective and a noun, all named by their English keys.

    Attributes:
        noun: Key of NOUNS, e.g. "man".
        definite: "the"/"der" if true, "a"/"ein" otherwise.
        adjective: Key of ADJECTIVES or None.
    """

    noun: str
    definite: bool = True
    adjective: str | None = None


@dataclass(frozen=True)
class PrepPhrase:
    """A prepositional adjunct such as "in the old house".

    Attributes:
        preposition: Key of PREPOSITIONS, e.g. "in front of".
        object: The governed noun phrase, always dative in German.
    """

    preposition: str
    object: NounPhrase


@dataclass(frozen=True)
class Clause:
    """One clause: subject, verb, the verb's objects and optional adjuncts.

    Attributes:
        subject: Subject noun phrase.
        verb: Key of VERBS, i.e. the English third person singular form ("opens").
        obj: Direct object (accusative), or the dative object of a dative verb.
        indirect: Dative recipient of a ditransitive verb.
        prep: Optional prepositional adjunct.
        adverb: Optional key of ADVERBS.
        adverb_first: Put the adverb in front of the clause (main clauses only), which makes
            German invert subject and verb.
    """

    subject: NounPhrase
    verb: str
    obj: NounPhrase | None = None
    indirect: NounPhrase | None = None
    prep: PrepPhrase | None = None
    adverb: str | None = None
    adverb_first: bool = False


@dataclass(frozen=True)
class Sentence:
    """A main clause, optionally joined to one subordinate clause.

    Attributes:
        main: The main clause; its verb must be CLAUSAL exactly when conjunction is "that".
        conjunction: Key of CONJUNCTIONS, present exactly when subordinate is.
        subordinate: The subordinate clause (never CLAUSAL, never adverb-first).
        subordinate_first: Put an adverbial subordinate clause before the main clause.
    """

    main: Clause
    conjunction: str | None = None
    subordinate: Clause | None = None
    subordinate_first: bool = False


NOUNS: dict[str, Noun] = {
    "man": Noun("Mann", MASCULINE, PERSON),
    "woman": Noun("Frau", FEMININE, PERSON),
    "child": Noun("Kind", NEUTER, PERSON),
    "girl": Noun("Mädchen", NEUTER, PERSON),
    "father": Noun("Vater", MASCULINE, PERSON),
    "mother": Noun("Mutter", FEMININE, PERSON),
    "son": Noun("Sohn", MASCULINE, PERSON),
    "daughter": Noun("Tochter", FEMININE, PERSON),
    "teacher": Noun("Lehrer", MASCULINE, PERSON),
    "doctor": Noun("Arzt", MASCULINE, PERSON),
    "friend": Noun("Freund", MASCULINE, PERSON),
    "sister": Noun("Schwester", FEMININE, PERSON),
    "uncle": Noun("Onkel", MASCULINE, PERSON),
    "aunt": Noun("Tante", FEMININE, PERSON),
    "dog": Noun("Hund", MASCULINE, ANIMAL),
    "cat": Noun("Katze", FEMININE, ANIMAL),
    "horse": Noun("Pferd", NEUTER, ANIMAL),
    "bird": Noun("Vogel", MASCULINE, ANIMAL),
    "mouse": Noun("Maus", FEMININE, ANIMAL),
    "owl": Noun("Eule", FEMININE, ANIMAL),
    "book": Noun("Buch", NEUTER, THING),
    "apple": Noun("Apfel", MASCULINE, THING),
    "door": Noun("Tür", FEMININE, THING),
    "window": Noun("Fenster", NEUTER, THING),
    "letter": Noun("Brief", MASCULINE, THING),
    "ball": Noun("Ball", MASCULINE, THING),
    "key": Noun("Schlüssel", MASCULINE, THING),
    "bag": Noun("Tasche", FEMININE, THING),
    "bottle": Noun("Flasche", FEMININE, THING),
    "flower": Noun("Blume", FEMININE, THING),
    "picture": Noun("Bild", NEUTER, THING),
    "cake": Noun("Kuchen", MASCULINE, THING),
    "egg": Noun("Ei", NEUTER, THING),
    "umbrella": Noun("Regenschirm", MASCULINE, THING),
    "box": Noun("Kiste", FEMININE, THING),
    "cup": Noun("Tasse", FEMININE, THING),
    "house": Noun("Haus", NEUTER, PLACE),
    "garden": Noun("Garten", MASCULINE, PLACE),
    "kitchen": Noun("Küche", FEMININE, PLACE),
    "school": Noun("Schule", FEMININE, PLACE),
    "park": Noun("Park", MASCULINE, PLACE),
    "station": Noun("Bahnhof", MASCULINE, PLACE),
    "church": Noun("Kirche", FEMININE, PLACE),
    "office": Noun("Büro", NEUTER, PLACE),
}

_ALL_CATEGORIES = (PERSON, ANIMAL, THING, PLACE)

ADJECTIVES: dict[str, Adjective] = {
    "old": Adjective("alt", _ALL_CATEGORIES),
    "young": Adjective("jung", ANIMATE),
    "small": Adjective("klein", _ALL_CATEGORIES),
    "big": Adjective("groß", (ANIMAL, THING, PLACE)),
    "tall": Adjective("groß", (PERSON,)),
    "new": Adjective("neu", (THING, PLACE)),
    "red": Adjective("rot", (THING,)),
    "blue": Adjective("blau", (THING,)),
    "green": Adjective("grün", (THING,)),
    "beautiful": Adjective("schön", _ALL_CATEGORIES),
    "friendly": Adjective("freundlich", ANIMATE),
    "tired": Adjective("müd", ANIMATE),
    "happy": Adjective("glücklich", ANIMATE),
    "clever": Adjective("klug", ANIMATE),
    "rich": Adjective("reich", (PERSON,)),
    "poor": Adjective("arm", ANIMATE),
    "hungry": Adjective("hungrig", ANIMATE),
    "lazy": Adjective("faul", ANIMATE),
    "quiet": Adjective("ruhig", (PERSON, ANIMAL, PLACE)),
    "heavy": Adjective("schwer", (THING,)),
    "cheap": Adjective("billig", (THING,)),
    "empty": Adjective("leer", (THING, PLACE)),
    "cold": Adjective("kalt", (THING, PLACE)),
}


def _nouns(*selectors: str, excluding: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Expands categories and noun keys into noun keys, in NOUNS order.

    A tuple in a fixed order (never a set) keeps sampling independent of string hashing, so a
    seed gives the same corpus in every process.
    """
    return tuple(
        key
        for key, noun in NOUNS.items()
        if (key in selectors or noun.category in selectors) and key not in excluding
    )


_PORTABLE = _nouns(THING, excluding=("door", "window"))
_OPENABLE = _nouns("door", "window", "box", "bag", "bottle", "book", "letter", "umbrella")

VERBS: dict[str, Verb] = {
    "sees": Verb("sieht", ACCUSATIVE_OBJECT, _nouns(*ANIMATE), _nouns(*_ALL_CATEGORIES)),
    "finds": Verb("findet", ACCUSATIVE_OBJECT, _nouns(*ANIMATE), _nouns(*ANIMATE, THING)),
    "buys": Verb("kauft", ACCUSATIVE_OBJECT, _nouns(PERSON), _PORTABLE),
    "visits": Verb("besucht", ACCUSATIVE_OBJECT, _nouns(PERSON), _nouns(PERSON, PLACE)),
    "loves": Verb("liebt", ACCUSATIVE_OBJECT, _nouns(*ANIMATE), _nouns(*ANIMATE)),
    "looks for": Verb("sucht", ACCUSATIVE_OBJECT, _nouns(*ANIMATE), _nouns(*ANIMATE, THING)),
    "paints": Verb("malt", ACCUSATIVE_OBJECT, _nouns(PERSON), _nouns(*_ALL_CATEGORIES)),
    "helps": Verb("hilft", DATIVE_OBJECT, _nouns(PERSON), _nouns(*ANIMATE)),
    "thanks": Verb("dankt", DATIVE_OBJECT, _nouns(PERSON), _nouns(PERSON)),
    "opens": Verb("macht", ACCUSATIVE_OBJECT, _nouns(PERSON), _OPENABLE, particle="auf"),
    "closes": Verb("macht", ACCUSATIVE_OBJECT, _nouns(PERSON), _OPENABLE, particle="zu"),
    "calls": Verb("ruft", ACCUSATIVE_OBJECT, _nouns(PERSON), _nouns(PERSON), particle="an"),
    "invites": Verb("lädt", ACCUSATIVE_OBJECT, _nouns(PERSON), _nouns(PERSON), particle="ein"),
    "picks up": Verb(
        "holt", ACCUSATIVE_OBJECT, _nouns(PERSON), _nouns(*ANIMATE, THING), particle="ab"
    ),
    "sleeps": Verb("schläft", INTRANSITIVE, _nouns(*ANIMATE)),
    "plays": Verb("spielt", INTRANSITIVE, _nouns(*ANIMATE)),
    "laughs": Verb("lacht", INTRANSITIVE, _nouns(PERSON)),
    "gets up": Verb("steht", INTRANSITIVE, _nouns(*ANIMATE), particle="auf"),
    "falls asleep": Verb("schläft", INTRANSITIVE, _nouns(*ANIMATE), particle="ein"),
    "gives": Verb("gibt", DITRANSITIVE, _nouns(PERSON), _PORTABLE, _nouns(*ANIMATE)),
    "shows": Verb("zeigt", DITRANSITIVE, _nouns(PERSON), _PORTABLE, _nouns(PERSON)),
    "sends": Verb("schickt", DITRANSITIVE, _nouns(PERSON), _PORTABLE, _nouns(PERSON)),
    "brings": Verb("bringt", DITRANSITIVE, _nouns(PERSON), _PORTABLE, _nouns(*ANIMATE)),
    "returns": Verb(
        "gibt",
        DITRANSITIVE,
        _nouns(PERSON),
        _PORTABLE,
        _nouns(PERSON),
        particle="zurück",
        recipient_with_to=True,
    ),
    "knows": Verb("weiß", CLAUSAL, _nouns(PERSON)),
    "says": Verb("sagt", CLAUSAL, _nouns(PERSON)),
    "thinks": Verb("denkt", CLAUSAL, _nouns(PERSON)),
    "believes": Verb("glaubt", CLAUSAL, _nouns(PERSON)),
}

# Every use here is locative or comitative, so even the two-way prepositions take the dative.
PREPOSITIONS: dict[str, Preposition] = {
    "with": Preposition("mit", _nouns(*ANIMATE)),
    "in": Preposition("in", _nouns(PLACE)),
    "near": Preposition("bei", _nouns(PLACE)),
    "behind": Preposition("hinter", _nouns(PLACE)),
    "next to": Preposition("neben", _nouns(PLACE)),
    "in front of": Preposition("vor", _nouns(PLACE)),
}

ADVERBS: dict[str, str] = {
    "today": "heute",
    "tomorrow": "morgen",
    "now": "jetzt",
    "sometimes": "manchmal",
    "often": "oft",
}

CONJUNCTIONS: dict[str, str] = {
    "because": "weil",
    "although": "obwohl",
    "when": "wenn",
    "while": "während",
    "that": "dass",
}

_DEFINITE_ARTICLES = {
    (MASCULINE, NOMINATIVE): "der",
    (MASCULINE, ACCUSATIVE): "den",
    (MASCULINE, DATIVE): "dem",
    (FEMININE, NOMINATIVE): "die",
    (FEMININE, ACCUSATIVE): "die",
    (FEMININE, DATIVE): "der",
    (NEUTER, NOMINATIVE): "das",
    (NEUTER, ACCUSATIVE): "das",
    (NEUTER, DATIVE): "dem",
}

_INDEFINITE_ARTICLES = {
    (MASCULINE, NOMINATIVE): "ein",
    (MASCULINE, ACCUSATIVE): "einen",
    (MASCULINE, DATIVE): "einem",
    (FEMININE, NOMINATIVE): "eine",
    (FEMININE, ACCUSATIVE): "eine",
    (FEMININE, DATIVE): "einer",
    (NEUTER, NOMINATIVE): "ein",
    (NEUTER, ACCUSATIVE): "ein",
    (NEUTER, DATIVE): "einem",
}

# After "der/die/das" the article already shows gender and case, so the adjective takes the
# weak ending; after an ending-less "ein" the adjective has to show them itself (-er, -es).
_WEAK_ENDINGS = {
    (MASCULINE, NOMINATIVE): "e",
    (MASCULINE, ACCUSATIVE): "en",
    (MASCULINE, DATIVE): "en",
    (FEMININE, NOMINATIVE): "e",
    (FEMININE, ACCUSATIVE): "e",
    (FEMININE, DATIVE): "en",
    (NEUTER, NOMINATIVE): "e",
    (NEUTER, ACCUSATIVE): "e",
    (NEUTER, DATIVE): "en",
}

_MIXED_ENDINGS = {
    (MASCULINE, NOMINATIVE): "er",
    (MASCULINE, ACCUSATIVE): "en",
    (MASCULINE, DATIVE): "en",
    (FEMININE, NOMINATIVE): "e",
    (FEMININE, ACCUSATIVE): "e",
    (FEMININE, DATIVE): "en",
    (NEUTER, NOMINATIVE): "es",
    (NEUTER, ACCUSATIVE): "es",
    (NEUTER, DATIVE): "en",
}

# Standard German fuses these preposition-article pairs; leaving them apart reads as emphatic.
_CONTRACTIONS = {
    ("in", "dem"): "im",
    ("bei", "dem"): "beim",
    ("von", "dem"): "vom",
    ("zu", "dem"): "zum",
    ("zu", "der"): "zur",
    ("an", "dem"): "am",
}


def _lookup(table: dict[str, _T], key: str | None, kind: str) -> _T:
    """Returns table[key], turning a miss into a ValueError that names the bad word."""
    try:
        return table[key]
    except KeyError:
        raise ValueError(f"unknown {kind} {key!r}") from None


def english_noun_phrase(phrase: NounPhrase) -> str:
    """Renders a noun phrase in English, choosing "a" or "an" by the following word.

    Args:
        phrase: The noun phrase.

    Returns:
        E.g. "an old man" or "the dog".

    Raises:
        ValueError: If the noun or adjective is not in the lexicon.
    """
    _lookup(NOUNS, phrase.noun, "noun")
    words = [phrase.noun]
    if phrase.adjective is not None:
        _lookup(ADJECTIVES, phrase.adjective, "adjective")
        words.insert(0, phrase.adjective)
    # Spelling stands in for pronunciation; the lexicon has no "uni-" or silent-"h" words.
    if phrase.definite:
        article = "the"
    else:
        article = "an" if words[0][0] in "aeiou" else "a"
    return " ".join([article, *words])


def _german_noun_phrase_words(phrase: NounPhrase, case: str) -> list[str]:
    """Returns the article, the inflected adjective if any, and the noun as separate words."""
    noun = _lookup(NOUNS, phrase.noun, "noun")
    if case not in (NOMINATIVE, ACCUSATIVE, DATIVE):
        raise ValueError(f"unknown case {case!r}")
    articles = _DEFINITE_ARTICLES if phrase.definite else _INDEFINITE_ARTICLES
    words = [articles[noun.gender, case]]
    if phrase.adjective is not None:
        adjective = _lookup(ADJECTIVES, phrase.adjective, "adjective")
        endings = _WEAK_ENDINGS if phrase.definite else _MIXED_ENDINGS
        words.append(adjective.stem + endings[noun.gender, case])
    words.append(noun.german)
    return words


def german_noun_phrase(phrase: NounPhrase, case: str) -> str:
    """Renders a noun phrase in German with article and adjective agreeing in gender and case.

    Args:
        phrase: The noun phrase.
        case: NOMINATIVE, ACCUSATIVE or DATIVE.

    Returns:
        E.g. "einen alten Mann" for an indefinite masculine accusative.

    Raises:
        ValueError: If a word or the case is unknown.
    """
    return " ".join(_german_noun_phrase_words(phrase, case))


def _english_prep_phrase(phrase: PrepPhrase) -> str:
    """Renders a prepositional adjunct in English, e.g. "in front of the house"."""
    _lookup(PREPOSITIONS, phrase.preposition, "preposition")
    return f"{phrase.preposition} {english_noun_phrase(phrase.object)}"


def _german_prep_phrase(phrase: PrepPhrase) -> str:
    """Renders a prepositional adjunct in German, e.g. "im alten Haus"."""
    preposition = _lookup(PREPOSITIONS, phrase.preposition, "preposition").german
    words = _german_noun_phrase_words(phrase.object, DATIVE)
    fused = _CONTRACTIONS.get((preposition, words[0]))
    if fused is not None and phrase.object.definite:
        return " ".join([fused, *words[1:]])
    return " ".join([preposition, *words])


def _check_clause(clause: Clause, *, subordinate: bool) -> Verb:
    """Validates a clause against its verb's valency and returns the verb."""
    verb = _lookup(VERBS, clause.verb, "verb")
    needs_object = verb.frame in (ACCUSATIVE_OBJECT, DATIVE_OBJECT, DITRANSITIVE)
    if needs_object != (clause.obj is not None):
        requirement = "needs" if needs_object else "takes no"
        raise ValueError(f"verb {clause.verb!r} {requirement} object")
    if (verb.frame == DITRANSITIVE) != (clause.indirect is not None):
        requirement = "needs" if verb.frame == DITRANSITIVE else "takes no"
        raise ValueError(f"verb {clause.verb!r} {requirement} indirect object")
    if clause.adverb is not None:
        _lookup(ADVERBS, clause.adverb, "adverb")
    elif clause.adverb_first:
        raise ValueError("adverb_first is set but the clause has no adverb")
    if subordinate and clause.adverb_first:
        raise ValueError("a subordinate clause cannot front its adverb")
    if subordinate and verb.frame == CLAUSAL:
        raise ValueError(f"verb {clause.verb!r} needs a clause and cannot be subordinate")
    return verb


def _check_sentence(sentence: Sentence) -> None:
    """Raises ValueError unless the sentence is one the grammar can render."""
    main_verb = _check_clause(sentence.main, subordinate=False)
    if (sentence.conjunction is None) != (sentence.subordinate is None):
        raise ValueError("conjunction and subordinate clause must be given together")
    if sentence.subordinate is None:
        if main_verb.frame == CLAUSAL:
            raise ValueError(f"verb {sentence.main.verb!r} needs a 'that' clause")
        if sentence.subordinate_first:
            raise ValueError("subordinate_first is set but there is no subordinate clause")
        return
    _lookup(CONJUNCTIONS, sentence.conjunction, "conjunction")
    _check_clause(sentence.subordinate, subordinate=True)
    if (main_verb.frame == CLAUSAL) != (sentence.conjunction == "that"):
        raise ValueError("'that' clauses go exactly with the verbs that take a clause")
    if sentence.subordinate_first and sentence.conjunction == "that":
        raise ValueError("a 'that' clause cannot be put first")
    if sentence.subordinate_first and sentence.main.adverb_first:
        raise ValueError("the main clause cannot front both a clause and an adverb")


def _english_clause(clause: Clause) -> str:
    """Renders a validated clause in English, whose order is the same in every clause type."""
    verb = VERBS[clause.verb]
    parts = []
    if clause.adverb is not None and clause.adverb_first:
        parts.append(clause.adverb)
    parts += [english_noun_phrase(clause.subject), clause.verb]
    if verb.frame == DITRANSITIVE and verb.recipient_with_to:
        parts += [english_noun_phrase(clause.obj), "to", english_noun_phrase(clause.indirect)]
    elif verb.frame == DITRANSITIVE:
        parts += [english_noun_phrase(clause.indirect), english_noun_phrase(clause.obj)]
    elif clause.obj is not None:
        parts.append(english_noun_phrase(clause.obj))
    if clause.prep is not None:
        parts.append(_english_prep_phrase(clause.prep))
    if clause.adverb is not None and not clause.adverb_first:
        parts.append(clause.adverb)
    return " ".join(parts)


def _german_clause(clause: Clause, *, verb_final: bool, prefield: str | None = None) -> str:
    """Renders a clause in German topological order.

    Args:
        clause: A validated clause.
        verb_final: Render as a subordinate clause, with the whole verb at the end.
        prefield: What stands before the finite verb of a main clause, e.g. a fronted
            subordinate clause; if None, the fronted adverb or else the subject stands there.
    """
    verb = VERBS[clause.verb]
    subject: str | None = german_noun_phrase(clause.subject, NOMINATIVE)
    adverb = ADVERBS[clause.adverb] if clause.adverb is not None else None
    middle = []
    if clause.indirect is not None:
        middle.append(german_noun_phrase(clause.indirect, DATIVE))
    if clause.obj is not None:
        case = DATIVE if verb.frame == DATIVE_OBJECT else ACCUSATIVE
        middle.append(german_noun_phrase(clause.obj, case))
    if clause.prep is not None:
        middle.append(_german_prep_phrase(clause.prep))

    if verb_final:
        parts = [subject, adverb, *middle, verb.particle + verb.german]
    else:
        if prefield is None and clause.adverb_first:
            prefield, adverb = adverb, None
        elif prefield is None:
            prefield, subject = subject, None
        parts = [prefield, verb.german, subject, adverb, *middle, verb.particle or None]
    return " ".join(part for part in parts if part is not None)


def _capitalise(text: str) -> str:
    """Upper-cases only the first character, unlike str.capitalize, to keep German nouns."""
    return text[0].upper() + text[1:]


def render_english(sentence: Sentence) -> str:
    """Renders a sentence in English, capitalised and with a final period.

    Args:
        sentence: The structured sentence.

    Returns:
        E.g. "Because the woman sees the child, the man opens the door."

    Raises:
        ValueError: If the sentence is not well formed for the grammar.
    """
    _check_sentence(sentence)
    main = _english_clause(sentence.main)
    if sentence.subordinate is None:
        body = main
    else:
        subordinate = f"{sentence.conjunction} {_english_clause(sentence.subordinate)}"
        body = f"{subordinate}, {main}" if sentence.subordinate_first else f"{main} {subordinate}"
    return _capitalise(body) + "."


def translate_sentence(sentence: Sentence) -> str:
    """Renders a sentence in German; this is the reference translation of render_english.

    Args:
        sentence: The structured sentence.

    Returns:
        E.g. "Weil die Frau das Kind sieht, macht der Mann die Tür auf."

    Raises:
        ValueError: If the sentence is not well formed for the grammar.
    """
    _check_sentence(sentence)
    if sentence.subordinate is None:
        body = _german_clause(sentence.main, verb_final=False)
    else:
        conjunction = CONJUNCTIONS[sentence.conjunction]
        subordinate = f"{conjunction} {_german_clause(sentence.subordinate, verb_final=True)}"
        if sentence.subordinate_first:
            body = _german_clause(sentence.main, verb_final=False, prefield=subordinate + ",")
        else:
            body = f"{_german_clause(sentence.main, verb_final=False)}, {subordinate}"
    return _capitalise(body) + "."


_ADJECTIVES_BY_CATEGORY = {
    category: tuple(key for key, adj in ADJECTIVES.items() if category in adj.categories)
    for category in _ALL_CATEGORIES
}
_CONTENT_VERBS = tuple(key for key, verb in VERBS.items() if verb.frame != CLAUSAL)
_CLAUSAL_VERBS = tuple(key for key, verb in VERBS.items() if verb.frame == CLAUSAL)
_ADVERBIAL_CONJUNCTIONS = tuple(key for key in CONJUNCTIONS if key != "that")
_ADVERB_KEYS = tuple(ADVERBS)
_PREPOSITION_KEYS = tuple(PREPOSITIONS)


def _random_noun_phrase(
    rng: random.Random, candidates: tuple[str, ...], used: set[str]
) -> NounPhrase:
    """Samples a noun phrase over candidates not yet in used, and marks its noun used."""
    # Excluding nouns already in the sentence avoids "the man sees the man".
    noun = rng.choice([key for key in candidates if key not in used])
    used.add(noun)
    definite = rng.random() < 0.6
    adjective = None
    if rng.random() < 0.35:
        adjective = rng.choice(_ADJECTIVES_BY_CATEGORY[NOUNS[noun].category])
    return NounPhrase(noun, definite, adjective)


def _random_clause(
    rng: random.Random,
    verb_key: str,
    *,
    used: set[str],
    prep_probability: float,
    adverb: str | None = None,
    adverb_first: bool = False,
) -> Clause:
    """Samples the arguments and, with prep_probability, an adjunct for verb_key."""
    verb = VERBS[verb_key]
    subject = _random_noun_phrase(rng, verb.subjects, used)
    indirect = obj = prep = None
    if verb.frame == DITRANSITIVE:
        indirect = _random_noun_phrase(rng, verb.recipients, used)
    if verb.frame in (ACCUSATIVE_OBJECT, DATIVE_OBJECT, DITRANSITIVE):
        obj = _random_noun_phrase(rng, verb.objects, used)
    if rng.random() < prep_probability:
        preposition = rng.choice(_PREPOSITION_KEYS)
        prep = PrepPhrase(
            preposition, _random_noun_phrase(rng, PREPOSITIONS[preposition].objects, used)
        )
    return Clause(subject, verb_key, obj, indirect, prep, adverb, adverb_first)


def random_sentence(rng: random.Random) -> Sentence:
    """Samples one well-formed sentence; all randomness comes from rng.

    About half the sentences are single clauses, a third carry an adverbial subordinate
    clause (before or after the main clause) and the rest are "X says that ..." sentences.
    A sentence has at most one adverb, which keeps its attachment unambiguous in English.

    Args:
        rng: Source of randomness.

    Returns:
        A sentence that render_english and translate_sentence accept.
    """
    used: set[str] = set()
    kind = rng.random()
    adverb = rng.choice(_ADVERB_KEYS) if rng.random() < 0.3 else None
    if kind < 0.55:
        fronted = adverb is not None and rng.random() < 0.5
        main = _random_clause(
            rng,
            rng.choice(_CONTENT_VERBS),
            used=used,
            prep_probability=0.3,
            adverb=adverb,
            adverb_first=fronted,
        )
        return Sentence(main)

    adverb_in_subordinate = adverb is not None and rng.random() < 0.5
    main_adverb = None if adverb_in_subordinate else adverb
    subordinate = _random_clause(
        rng,
        rng.choice(_CONTENT_VERBS),
        used=used,
        prep_probability=0.1,
        adverb=adverb if adverb_in_subordinate else None,
    )
    if kind < 0.85:
        subordinate_first = rng.random() < 0.35
        fronted = main_adverb is not None and not subordinate_first and rng.random() < 0.5
        main = _random_clause(
            rng,
            rng.choice(_CONTENT_VERBS),
            used=used,
            prep_probability=0.1,
            adverb=main_adverb,
            adverb_first=fronted,
        )
        return Sentence(main, rng.choice(_ADVERBIAL_CONJUNCTIONS), subordinate, subordinate_first)

    # A clause-taking verb's adverb is always fronted: "says today that" reads badly in English.
    main = _random_clause(
        rng,
        rng.choice(_CLAUSAL_VERBS),
        used=used,
        prep_probability=0.0,
        adverb=main_adverb,
        adverb_first=main_adverb is not None,
    )
    return Sentence(main, "that", subordinate)


def _check_count(name: str, value: int) -> None:
    """Raises ValueError unless value is a usable count (bool is excluded on purpose)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def generate_pairs(num_pairs: int, seed: int) -> list[tuple[str, str]]:
    """Samples distinct (english, german) sentence pairs.

    No two pairs share their English sentence or their German sentence, and no side has more
    than MAX_WORDS words. Pairs come in sampling order, so the first k pairs for a seed do not
    depend on how many pairs are requested.

    Args:
        num_pairs: Number of pairs to return.
        seed: Seed of the private random.Random that drives sampling.

    Returns:
        num_pairs pairs, identical for the same seed in every process.

    Raises:
        ValueError: If num_pairs is negative, or if that many distinct pairs were not found
            within a bounded number of attempts (the grammar is exhausted).
    """
    _check_count("num_pairs", num_pairs)
    rng = random.Random(seed)
    # Generous for a grammar with millions of sentences, yet it stops a drained one quickly.
    max_attempts = 20 * num_pairs + 1000
    pairs: list[tuple[str, str]] = []
    seen_english: set[str] = set()
    seen_german: set[str] = set()
    attempts = 0
    while len(pairs) < num_pairs:
        if attempts == max_attempts:
            raise ValueError(
                f"asked for {num_pairs} distinct pairs but found only {len(pairs)} in "
                f"{max_attempts} attempts; the grammar cannot supply that many"
            )
        attempts += 1
        sentence = random_sentence(rng)
        english = render_english(sentence)
        german = translate_sentence(sentence)
        if english in seen_english or german in seen_german:
            continue
        if len(english.split()) > MAX_WORDS or len(german.split()) > MAX_WORDS:
            continue
        seen_english.add(english)
        seen_german.add(german)
        pairs.append((english, german))
    return pairs


def generate_splits(
    num_train: int, num_dev: int, num_test: int, seed: int
) -> dict[str, list[tuple[str, str]]]:
    """Samples train, dev and test splits that share no sentence on either side.

    Dev and test are drawn first, so they stay the same for a seed when only num_train
    changes, which keeps evaluations comparable across training-set sizes.

    Args:
        num_train: Number of training pairs.
        num_dev: Number of development pairs.
        num_test: Number of test pairs.
        seed: Seed of the sampler.

    Returns:
        {"train": [...], "dev": [...], "test": [...]} of (english, german) pairs.

    Raises:
        ValueError: If a count is negative or the grammar cannot supply the total.
    """
    for name, value in (("num_train", num_train), ("num_dev", num_dev), ("num_test", num_test)):
        _check_count(name, value)
    pairs = generate_pairs(num_train + num_dev + num_test, seed)
    return {
        "dev": pairs[:num_dev],
        "test": pairs[num_dev : num_dev + num_test],
        "train": pairs[num_dev + num_test :],
    }


def write_splits(
    out_dir: str | os.PathLike[str], num_train: int, num_dev: int, num_test: int, seed: int
) -> dict[str, tuple[pathlib.Path, pathlib.Path]]:
    """Generates the splits and writes {split}.en and {split}.de files.

    Files are UTF-8 with one sentence per line and a trailing newline; each one is written
    atomically (translate/atomic.py), so a killed process never leaves a partial file.

    Args:
        out_dir: Directory for the files; created if missing.
        num_train: Number of training pairs.
        num_dev: Number of development pairs.
        num_test: Number of test pairs.
        seed: Seed of the sampler.

    Returns:
        {split: (english_path, german_path)} for "train", "dev" and "test".

    Raises:
        ValueError: If a count is negative or the grammar cannot supply the total.
    """
    splits = generate_splits(num_train, num_dev, num_test, seed)
    directory = pathlib.Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in SPLITS:
        english_path = directory / f"{split}.en"
        german_path = directory / f"{split}.de"
        english_text = "".join(english + "\n" for english, _ in splits[split])
        german_text = "".join(german + "\n" for _, german in splits[split])
        atomic.write_text(english_path, english_text, fsync=True)
        atomic.write_text(german_path, german_text, fsync=True)
        paths[split] = (english_path, german_path)
    return paths
