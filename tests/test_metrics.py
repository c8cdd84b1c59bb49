"""translate/decoding/metrics.py: sacreBLEU, the paper's tokenized BLEU, the bootstrap."""

import pytest

from translate.data.text import read_lines
from translate.decoding.metrics import (
    paired_bootstrap,
    score,
    split_compounds,
    tokenize_for_bleu,
    tokenized_bleu,
)


def test_split_compounds_marks_hyphens_between_words_like_get_ende_bleu():
    assert split_compounds("rich-text format") == "rich ##AT##-##AT## text format"
    assert split_compounds("Nord-Süd") == "Nord ##AT##-##AT## Süd"
    # A free-standing dash is no compound.
    assert split_compounds("ja - nein") == "ja - nein"
    # perl's s///g does not re-scan what a match consumed: only the first hyphen of a-b-c.
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"


def test_tokenize_for_bleu_applies_moses_escaping_then_compound_splitting():
    assert tokenize_for_bleu(['Sie sagte: "E-Mail & Co."'], "de") == [
        # "Co." is on Moses's German list of non-breaking prefixes, so its period stays.
        "Sie sagte : &quot; E ##AT##-##AT## Mail &amp; Co. &quot;"
    ]


def test_tokenized_bleu_matches_hand_computed_value():
    hypothesis = ["Wir hören gern Pop-Musik am Abend."]
    reference = ["Wir hören gern Rock-Musik am Abend."]
    # Tokens: Wir hören gern {Pop|Rock} ##AT##-##AT## Musik am Abend .  (9 each, BP = 1).
    # Matches: 1-grams 8/9, 2-grams 6/8, 3-grams 4/7, 4-grams 2/6; their product is 8/63.
    expected = 100 * (8 / 9 * 6 / 8 * 4 / 7 * 2 / 6) ** 0.25  # 59.69
    assert tokenized_bleu(hypothesis, reference, "de") == pytest.approx(expected, rel=1e-9)


def test_tokenized_bleu_is_zero_when_an_ngram_order_has_no_match_like_multi_bleu():
    assert tokenized_bleu(["ein zwei drei"], ["ein zwei vier"], "de") == 0.0


def test_report_keeps_sacrebleu_and_tokenized_bleu_apart():
    report = score(
        ["Wir hören gern Pop-Musik am Abend."], ["Wir hören gern Rock-Musik am Abend."], "de"
    )
    # sacreBLEU's 13a keeps Pop-Musik one token: 7 tokens, matches 6/7, 4/6, 2/5 and 0/4, which
    # its default exponential smoothing counts as 1/(2 * 4).
    expected = 100 * (6 / 7 * 4 / 6 * 2 / 5 * 1 / 8) ** 0.25  # 41.11
    assert report["bleu"] == pytest.approx(expected, abs=0.005)
    assert report["tokenized_bleu"] == pytest.approx(59.69, abs=0.01)
    assert report["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert "##AT##" in report["tokenized_bleu_recipe"]


REFERENCES = [f"der Hund {i} sieht die Katze im Garten ." for i in range(40)]


def test_lowercase_adds_the_case_insensitive_score_beside_the_cased_one():
    hypotheses = [line.upper() for line in REFERENCES]
    cased = score(hypotheses, REFERENCES, "de")
    both = score(hypotheses, REFERENCES, "de", lowercase=True)
    assert "bleu_lowercase" not in cased
    assert both["bleu"] == cased["bleu"] < 5.0  # the cased score stays as it was
    assert both["bleu_lowercase"] == 100.0
    assert "case:lc" in both["signature_lowercase"] and "case:mixed" in both["signature"]


def test_sacrebleu_tokenizes_by_the_target_language():
    assert "tok:13a" in score(["ein Test ."], ["ein Test ."], "de")["signature"]
    assert "tok:zh" in score(["这是一个测试。"], ["这是一个测试。"], "zh")["signature"]


def test_paired_bootstrap_tells_a_real_difference_from_none(tmp_path):
    """Two hypothesis files, as `translate-evaluate --compare` reads them."""
    good = [line.replace("Garten", "Park") for line in REFERENCES]
    bad = [" ".join(line.split()[:3]) for line in REFERENCES]
    for name, lines in (("good.txt", good), ("bad.txt", bad)):
        (tmp_path / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    good, bad = (read_lines(tmp_path / n) for n in ("good.txt", "bad.txt"))
    better = paired_bootstrap(good, bad, REFERENCES, "de")
    assert better["significant"] and better["p_value"] < 0.05
    assert better["bleu"] > better["other_bleu"]
    assert "bs:1000" in better["signature"]
    # One different sentence broken in each: equal BLEU, a difference that chance explains.
    one, other = list(good), list(good)
    one[3] = other[7] = "der Hund sieht"
    alike = paired_bootstrap(one, other, REFERENCES, "de")
    assert alike["bleu"] == alike["other_bleu"]
    assert not alike["significant"] and alike["p_value"] > 0.05
    # sacreBLEU gives identical systems p = 1/1001 ("zero difference is not chance"): say so.
    same = paired_bootstrap(good, good, REFERENCES, "de")
    assert same["identical"] and not same["significant"] and same["p_value"] is None


def test_the_literature_bleu_scores_lowercased_normalised_moses_tokens():
    """Multi30k's lc.norm.tok form (its task1-tokenize.sh): case, punctuation and spacing that
    differ only in ways the form removes score 100, where sacreBLEU's cased 13a does not."""
    from translate.decoding import metrics

    hypotheses = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen  „Fußball“."]
    references = ["ein hund läuft über die wiese .", 'zwei männer spielen "fußball" .']
    assert metrics.normalise_for_literature(["Ein Hund, „groß“."], "de") == [
        "ein hund , &quot; groß &quot; ."
    ]
    assert metrics.literature_bleu(hypotheses, references, "de") == pytest.approx(100.0)
    assert metrics.score(hypotheses, references, "de")["bleu"] < 100.0
    report = metrics.score(hypotheses, references, "de")
    assert (
        report["literature_bleu"] == pytest.approx(100.0)
        and "lc.norm.tok" in report["literature_bleu_recipe"]
    )
