"""Scores of a translated test set: sacreBLEU, chrF, the paper's tokenized BLEU, significance.

`score` gives sacreBLEU (cased, 13a, on detokenized output against raw references) and chrF,
each with its signature, and the recipe behind the paper's Table 2 numbers (Moses-tokenized,
compound-split BLEU; not comparable with sacreBLEU). `paired_bootstrap` tests whether two
systems' BLEU differ significantly. Used by the trainer's dev and test evaluations, by
`translate-evaluate` and by the scripts.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
from collections.abc import Sequence
from typing import Any

import sacrebleu
from sacrebleu.significance import PairedTest
from sacremoses import MosesPunctNormalizer, MosesTokenizer


def split_compounds(text: str) -> str:
    """Splits hyphenated compounds as get_ende_bleu.sh does: `a-b` -> `a ##AT##-##AT## b`.

    This is the script's `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`. Its matches do
    not overlap, so in `a-b-c` only the first hyphen is split; we keep that quirk, since the
    point is to match the paper's numbers. ASCII whitespace, like perl on bytes.
    """
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", text, flags=re.ASCII)


def tokenize_for_bleu(lines: Sequence[str], lang: str) -> list[str]:
    """Moses tokenization (tokenizer.perl -l lang, escaping on) and compound splitting."""
    moses = MosesTokenizer(lang=lang)
    return [split_compounds(moses.tokenize(line, return_str=True, escape=True)) for line in lines]


def tokenized_bleu_recipe(lang: str) -> str:
    return (
        f"Moses tokenizer -l {lang} (sacremoses {importlib.metadata.version('sacremoses')}) on "
        "hypotheses and references, compounds split a-b -> a ##AT##-##AT## b, BLEU on the tokens "
        "(sacreBLEU tokenize=none, no smoothing, as multi-bleu.perl): tensor2tensor's "
        "get_ende_bleu.sh, the paper's Table 2 metric; not comparable with sacreBLEU"
    )


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> float:
    """Corpus BLEU on Moses-tokenized, compound-split text: the recipe of the paper's numbers."""
    # No smoothing: multi-bleu.perl scores 0 when an n-gram order has no match, and so does this.
    return tokens_bleu(tokenize_for_bleu(hypotheses, lang), tokenize_for_bleu(references, lang))


def normalise_for_literature(lines: Sequence[str], lang: str) -> list[str]:
    """Multi30k's `lc.norm.tok` form: lowercased, Moses punctuation normalisation -l lang, Moses
    tokenizer -l lang (escaping on), in that order, as the dataset's scripts/task1-tokenize.sh."""
    normaliser, moses = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [
        moses.tokenize(normaliser.normalize(line.lower()), return_str=True, escape=True)
        for line in lines
    ]


def literature_bleu_recipe(lang: str) -> str:
    return (
        f"lowercased, Moses normalize-punctuation and tokenizer -l {lang} (sacremoses "
        f"{importlib.metadata.version('sacremoses')}) on hypotheses and references, BLEU on the "
        "tokens (sacreBLEU tokenize=none, no smoothing, as multi-bleu.perl): Multi30k's "
        "lc.norm.tok references (scripts/task1-tokenize.sh), the Multi30k papers' metric"
    )


def literature_bleu(hypotheses: Sequence[str], references: Sequence[str], lang: str) -> float:
    """Corpus BLEU as the Multi30k literature scores it: on lowercased, normalised, Moses-
    tokenized text (`normalise_for_literature`), with multi-bleu.perl's arithmetic."""
    return tokens_bleu(
        normalise_for_literature(hypotheses, lang), normalise_for_literature(references, lang)
    )


def tokens_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU of text tokenized already, as multi-bleu.perl computes it (no smoothing)."""
    bleu = sacrebleu.BLEU(tokenize="none", smooth_method="none")
    # sacreBLEU warns that the input looks tokenized: here that is the point.
    sacrebleu_log = logging.getLogger("sacrebleu")
    level = sacrebleu_log.level
    sacrebleu_log.setLevel(logging.ERROR)
    try:
        return bleu.corpus_score(list(hypotheses), [list(references)]).score
    finally:
        sacrebleu_log.setLevel(level)


def score(
    hypotheses: Sequence[str], references: Sequence[str], lang: str, lowercase: bool = False
) -> dict[str, Any]:
    """sacreBLEU (cased) and chrF with their signatures, and the paper's tokenized BLEU.

    Args:
      hypotheses: detokenized system output, one sentence each.
      references: the raw references, aligned with `hypotheses`.
      lang: the target language: sacreBLEU's `trg_lang` (13a tokenization, except Chinese,
        Japanese and Korean get their own) and the Moses tokenizer of the tokenized BLEU.
      lowercase: also score case-insensitively, as `bleu_lowercase` beside the cased `bleu`.
    """
    bleu = sacrebleu.BLEU(trg_lang=lang)
    chrf = sacrebleu.CHRF()
    bleu_score = bleu.corpus_score(list(hypotheses), [list(references)])
    chrf_score = chrf.corpus_score(list(hypotheses), [list(references)])
    scores = {
        "bleu": round(bleu_score.score, 2),
        "signature": str(bleu.get_signature()),
        "bleu_detail": str(bleu_score),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "tokenized_bleu": round(tokenized_bleu(hypotheses, references, lang), 2),
        "tokenized_bleu_recipe": tokenized_bleu_recipe(lang),
        "literature_bleu": round(literature_bleu(hypotheses, references, lang), 2),
        "literature_bleu_recipe": literature_bleu_recipe(lang),
    }
    if lowercase:
        uncased = sacrebleu.BLEU(trg_lang=lang, lowercase=True)
        uncased_score = uncased.corpus_score(list(hypotheses), [list(references)])
        scores["bleu_lowercase"] = round(uncased_score.score, 2)
        scores["signature_lowercase"] = str(uncased.get_signature())
    return scores


def paired_bootstrap(
    hypotheses: Sequence[str],
    other: Sequence[str],
    references: Sequence[str],
    lang: str,
    num_samples: int = 1000,
) -> dict[str, Any]:
    """sacreBLEU's paired bootstrap resampling test of `hypotheses` against `other`'s BLEU.

    `other` is the baseline; the p-value is the chance of a difference this large when the two
    systems are equally good (Koehn 2004, as `sacrebleu --paired-bs`, seeded by SACREBLEU_SEED,
    12345 by default, so the result repeats).

    Returns:
      Both BLEU scores with their bootstrap means and 95% confidence intervals, the p-value,
      whether it is below 0.05, and the test's signature. Identical hypotheses are reported
      as such (`identical`, no p-value): sacreBLEU's test, after multeval, gives them the
      smallest p-value, since it never attributes a zero difference to chance.
    """
    if list(hypotheses) == list(other):
        bleu = sacrebleu.BLEU(trg_lang=lang)
        value = round(bleu.corpus_score(list(hypotheses), [list(references)]).score, 2)
        return {
            "bleu": value,
            "other_bleu": value,
            "identical": True,
            "p_value": None,
            "significant": False,
            "signature": str(bleu.get_signature()),
        }
    test = PairedTest(
        [("other", list(other)), ("this", list(hypotheses))],
        {"BLEU": sacrebleu.BLEU(trg_lang=lang)},
        [list(references)],
        test_type="bs",
        n_samples=num_samples,
    )
    signatures, results = test()
    baseline, system = results["BLEU"]
    return {
        "bleu": round(system.score, 2),
        "bleu_mean": round(float(system.mean), 2),
        "bleu_ci95": round(float(system.ci), 2),
        "other_bleu": round(baseline.score, 2),
        "other_bleu_mean": round(float(baseline.mean), 2),
        "other_bleu_ci95": round(float(baseline.ci), 2),
        "identical": False,
        "p_value": round(float(system.p_value), 4),
        "significant": bool(system.p_value < 0.05),
        "signature": str(signatures["BLEU"]),
    }
