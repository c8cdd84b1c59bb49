"""Minimum-Bayes-risk choice among a sentence's candidates, by sacreBLEU's sentence chrF or BLEU.

MBR decoding (Kumar and Byrne 2004; Freitag et al. 2022) picks, among the candidates of one
source sentence (samples, or the beam's n-best), the one that agrees most with the others: the
highest mean utility u(candidate, other) over the other candidates, which stand in for
references drawn from the model. Here u is sacreBLEU's sentence chrF (`CHRF()`, chrF2 over
character 6-grams) or sentence BLEU (`BLEU(effective_order=True)`, 13a tokens, exponential
smoothing), the scores `sacrebleu.sentence_chrf` and `sacrebleu.sentence_bleu` give.

The pairwise utilities come without a Python loop over pairs: each candidate's n-grams are
counted once, by sacreBLEU's own extraction functions, into one count matrix per n-gram order
[N, G] (G: the distinct n-grams of the N candidates); the clipped matches of every pair are then
sum_g min(C[i, g], C[j, g]), one array operation [N, N, G], and the score formulas are
sacreBLEU's, applied to the [N, N] statistics order by order in the order sacreBLEU sums them.
tests/test_mbr.py checks every pair against sacreBLEU's sentence scores, and the choices against
the `mbrs` package's MBR decoder.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

METRICS = ("chrf", "bleu")
# sacreBLEU's defaults for the two sentence scores.
CHRF_ORDER, CHRF_BETA = 6, 2
BLEU_ORDER = 4
# sacreBLEU's floor for log(0) in BLEU (sacrebleu.metrics.bleu.my_log).
LOG_ZERO = -9999999999.0


def _match_counts(counters: Sequence[Counter]) -> tuple[np.ndarray, np.ndarray]:
    """Totals [N] and clipped matches [N, N] of the n-grams in `counters` (one per candidate)."""
    ids: dict = {}
    for counter in counters:
        for gram in counter:
            ids.setdefault(gram, len(ids))
    counts = np.zeros((len(counters), max(len(ids), 1)), np.int64)  # [N, G]
    for row, counter in enumerate(counters):
        if counter:
            counts[row, [ids[g] for g in counter]] = list(counter.values())
    matches = np.minimum(counts[:, None, :], counts[None, :, :]).sum(-1)  # [N, N]
    return counts.sum(-1), matches


def chrf_matrix(candidates: Sequence[str]) -> np.ndarray:
    """U [N, N]: U[i, j] = sacrebleu.sentence_chrf(candidates[i], [candidates[j]]).score."""
    from sacrebleu.metrics.helpers import extract_all_char_ngrams

    grams = [extract_all_char_ngrams(c, CHRF_ORDER, False) for c in candidates]
    n = len(candidates)
    factor = CHRF_BETA**2
    avg_prec, avg_rec = np.zeros((n, n)), np.zeros((n, n))
    effective = np.zeros((n, n), np.int64)
    for order in range(CHRF_ORDER):  # CHRF._compute_f_score, over all pairs at once
        totals, matches = _match_counts([g[order] for g in grams])
        n_hyp, n_ref = totals[:, None], totals[None, :]  # hypothesis i, reference j
        both = (n_hyp > 0) & (n_ref > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            prec = np.where(both, matches / np.maximum(n_hyp, 1), 0.0)
            rec = np.where(both, matches / np.maximum(n_ref, 1), 0.0)
        avg_prec += prec
        avg_rec += rec
        effective += both
    with np.errstate(divide="ignore", invalid="ignore"):
        avg_prec = np.where(effective > 0, avg_prec / np.maximum(effective, 1), 0.0)
        avg_rec = np.where(effective > 0, avg_rec / np.maximum(effective, 1), 0.0)
        total = avg_prec + avg_rec
        score = (1 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec)
    return np.where(total > 0, 100 * score, 0.0)


def bleu_matrix(candidates: Sequence[str]) -> np.ndarray:
    """U [N, N]: U[i, j] = sacrebleu.sentence_bleu(candidates[i], [candidates[j]]).score."""
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.helpers import extract_all_word_ngrams

    tokenize = BLEU(effective_order=True).tokenizer  # 13a, as sentence_bleu's
    extracted = [extract_all_word_ngrams(tokenize(c.rstrip()), 1, BLEU_ORDER) for c in candidates]
    lengths = np.array([length for _, length in extracted], np.float64)  # [N]
    n = len(candidates)
    correct, total = [], []
    for order in range(1, BLEU_ORDER + 1):
        grams = [
            Counter({g: c for g, c in counter.items() if len(g) == order})
            for counter, _ in extracted
        ]
        totals, matches = _match_counts(grams)
        correct.append(matches.astype(np.float64))  # [N, N]: hypothesis i, reference j
        total.append(np.broadcast_to(totals[:, None], (n, n)).astype(np.float64))
    sys_len, ref_len = lengths[:, None], lengths[None, :]
    # BLEU.compute_bleu with smooth_method="exp", effective_order=True, over all pairs at once.
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(
            sys_len < ref_len,
            np.where(sys_len > 0, np.exp(1 - ref_len / np.maximum(sys_len, 1)), 0.0),
            1.0,
        )
    smooth = np.ones((n, n))
    log_sum, eff_order = np.zeros((n, n)), np.zeros((n, n))
    going = np.ones((n, n), bool)  # the loop has not met an order without n-grams
    for k in range(BLEU_ORDER):
        going &= total[k] > 0
        zero = correct[k] == 0
        smooth = np.where(going & zero, smooth * 2, smooth)
        with np.errstate(divide="ignore", invalid="ignore"):
            precision = np.where(zero, 100.0 / (smooth * total[k]), 100.0 * correct[k] / total[k])
            log_p = np.where(precision == 0.0, LOG_ZERO, np.log(np.where(going, precision, 1.0)))
        log_sum = np.where(going, log_sum + log_p, log_sum)
        eff_order = np.where(going, k + 1, eff_order)
    with np.errstate(divide="ignore", invalid="ignore"):
        score = bp * np.exp(log_sum / np.maximum(eff_order, 1))
    # Without a single match (or with no n-grams at all) sacreBLEU's score is 0.
    any_correct = sum(c > 0 for c in correct) > 0
    return np.where(any_correct & (eff_order > 0), score, 0.0)


def utility_matrix(candidates: Sequence[str], metric: str) -> np.ndarray:
    """U [N, N], U[i, j] = the sentence `metric` of candidate i with candidate j as reference."""
    if metric == "chrf":
        return chrf_matrix(candidates)
    if metric == "bleu":
        return bleu_matrix(candidates)
    raise ValueError(f"--mbr={metric}: must be one of {', '.join(METRICS)}")


def expected_utilities(candidates: Sequence[str], metric: str) -> np.ndarray:
    """Each candidate's mean utility [N] against the other candidates (itself left out).

    Duplicates count as often as they were drawn: a text the model samples twice is twice the
    evidence. With one candidate the mean is over nothing and is 0.
    """
    n = len(candidates)
    if n < 2:
        return np.zeros(n)
    u = utility_matrix(candidates, metric)
    return (u.sum(1) - np.diag(u)) / (n - 1)


def mbr_order(
    candidates: Sequence[str], scores: Sequence[float], metric: str
) -> tuple[list[int], np.ndarray]:
    """Candidate indices from the highest expected utility down, ties by the higher model
    score, then by the earlier index; and the utilities [N]."""
    utility = expected_utilities(candidates, metric)
    order = sorted(range(len(candidates)), key=lambda i: (-utility[i], -scores[i], i))
    return order, utility
