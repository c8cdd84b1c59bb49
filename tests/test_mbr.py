"""Minimum-Bayes-risk choice (translate/decoding/mbr.py) against sacreBLEU and the mbrs package."""

import importlib.util
import json
import os
import pathlib
import random
import subprocess
import sys

import numpy as np
import pytest
import sacrebleu

from translate.decoding.mbr import bleu_matrix, chrf_matrix, expected_utilities, mbr_order

ROOT = pathlib.Path(__file__).resolve().parent.parent
WORDS = "Ein Hund läuft über die Wiese . Zwei Männer , eine Frau spielen Fußball im Park ! ( ja )"


def candidate_sets(count: int, seed: int = 0) -> list[list[str]]:
    """Sets of 2-12 related candidates: one sentence with words dropped, swapped, replaced,
    repeated; some sets with an empty candidate, a one-word one and duplicates."""
    rng = random.Random(seed)
    words = WORDS.split()
    sets = []
    for n in range(count):
        base = rng.sample(words, rng.randint(3, 12))
        candidates = []
        for _ in range(rng.randint(2, 12)):
            c = list(base)
            for _ in range(rng.randint(0, 3)):
                i = rng.randrange(len(c))
                action = rng.choice(["drop", "swap", "replace", "repeat"])
                if action == "drop" and len(c) > 1:
                    del c[i]
                elif action == "swap":
                    j = rng.randrange(len(c))
                    c[i], c[j] = c[j], c[i]
                elif action == "replace":
                    c[i] = rng.choice(words)
                else:
                    c.insert(i, c[i])
            candidates.append(" ".join(c))
        if n % 5 == 0:
            candidates[-1] = ""
        if n % 7 == 0:
            candidates.append(rng.choice(words))
        sets.append(candidates)
    return sets


def test_pairwise_utilities_are_sacrebleus_sentence_scores():
    pairs = 0
    for candidates in candidate_sets(40):
        chrf, bleu = chrf_matrix(candidates), bleu_matrix(candidates)
        for i, hypothesis in enumerate(candidates):
            for j, reference in enumerate(candidates):
                expected_chrf = sacrebleu.sentence_chrf(hypothesis, [reference]).score
                expected_bleu = sacrebleu.sentence_bleu(hypothesis, [reference]).score
                # The same formulas on the same counts: equal to the last bits of log and exp.
                assert chrf[i, j] == pytest.approx(expected_chrf, rel=1e-12, abs=1e-12)
                assert bleu[i, j] == pytest.approx(expected_bleu, rel=1e-12, abs=1e-12)
                pairs += 1
    assert pairs > 1000


def test_mbr_picks_the_candidate_that_agrees_most_with_the_others():
    candidates = [
        "a man rides a red bike down the street",  # the consensus: the others are its variants
        "a man rides a bike down the street",
        "a man rides a red bike on the street",
        "the man rides a red bike down a street",
        "two dogs play in the snow",  # an outlier the model happened to score best
    ]
    scores = [-2.0, -2.5, -2.6, -2.7, -0.5]
    for metric in ("chrf", "bleu"):
        order, utility = mbr_order(candidates, scores, metric)
        assert order[0] == 0 and order[-1] == 4
        assert utility[0] == max(utility)


def test_ties_go_to_the_higher_model_score_and_duplicates_count_as_draws():
    order, utility = mbr_order(["b", "a", "a"], [-1.0, -3.0, -2.0], "chrf")
    assert order[0] == 2  # "a" twice: each agrees fully with the other; the better-scored first
    order, utility = mbr_order(["x y", "x y"], [-3.0, -1.0], "chrf")
    assert order == [1, 0] and utility[0] == utility[1]
    assert expected_utilities(["only one"], "chrf").tolist() == [0.0]


def mbrs_choices(sets: list[list[str]], metric: str) -> list[str] | None:
    """The texts the mbrs package's MBR decoder picks: in this process when mbrs imports,
    else through `MBRS_PYTHON` (an interpreter with mbrs: its COMET pins numpy < 2); None
    when neither is there."""
    lines = "".join(json.dumps(c) + "\n" for c in sets)
    if importlib.util.find_spec("mbrs") is not None:
        python = sys.executable
    elif os.environ.get("MBRS_PYTHON"):
        python = os.environ["MBRS_PYTHON"]
    else:
        return None
    found = subprocess.run(
        [python, str(ROOT / "scripts" / "compare" / "mbrs_choose.py"), f"--metric={metric}"],
        input=lines,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return [json.loads(line)["text"] for line in found.stdout.splitlines()]


@pytest.mark.parametrize("metric", ["chrf", "bleu"])
def test_mbr_chooses_what_the_mbrs_package_chooses(metric):
    sets = [c for c in candidate_sets(60, seed=1) if "" not in c]  # mbrs counts self-utility
    theirs = mbrs_choices(sets, metric)
    if theirs is None:
        pytest.skip("mbrs is not installed (pip install mbrs, or MBRS_PYTHON=its python)")
    compared = 0
    for candidates, chosen in zip(sets, theirs, strict=True):
        utility = expected_utilities(candidates, metric)
        best = np.flatnonzero(utility == utility.max())
        if len({candidates[i] for i in best}) > 1:
            continue  # distinct texts tie: mbrs breaks ties by position, we by model score
        order, _ = mbr_order(candidates, [0.0] * len(candidates), metric)
        assert candidates[order[0]] == chosen
        compared += 1
    assert compared >= 40


@pytest.mark.parametrize("nbest", [0, 2])
def test_mbr_with_no_finished_candidate_chooses_among_all_of_them(tokenizer, nbest):
    """Candidates left at the search's NEG_INF (none reached EOS) are all there is to choose
    from: the choice is MBR's among them as printed (it was an IndexError of an empty list)."""
    from translate.data.tokenizer import PAD_ID
    from translate.decoding.search import NEG_INF
    from translate.decoding.sentences import choose
    from translate.decoding.settings import DecodeSettings

    texts = ["Der Vater kauft eine Blume.", "Der Vater kauft eine Blume.", "Ein Kind weiß."]
    texts += ["Der Vater kauft ein Buch."]
    encoded = tokenizer.encode(texts)
    tokens = np.full((len(texts), max(map(len, encoded))), PAD_ID, np.int32)  # [N, L], no EOS
    for row, ids in enumerate(encoded):
        tokens[row, : len(ids)] = ids
    scores = np.full(len(texts), NEG_INF, np.float32)
    settings = DecodeSettings(sampling="ancestral", num_candidates=4, mbr="chrf", nbest=nbest)
    printed = [tokenizer.decode(row) for row in tokens]
    order, utility = mbr_order(printed, list(scores), "chrf")
    chosen = choose(tokenizer, tokens, scores, settings)
    if not nbest:
        assert chosen == [(0.0, printed[order[0]])] and printed[order[0]] == printed[0]
    else:
        distinct = {}
        for i in order:  # the duplicates once, at their best rank
            distinct.setdefault(printed[i], float(utility[i]))
        assert chosen == [(u, text) for text, u in distinct.items()][:nbest]
