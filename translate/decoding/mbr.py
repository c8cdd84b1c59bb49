"""Minimum-Bayes-risk choice among a sentence's candidates, by sacreBLEU's sentence chrF or BLEU.

MBR decoding (Kumar and Byrne 2004; Freitag et al. 2022) picks, among the candidates of one
source sentence (samples, or the beam's n-best), the one that agrees most with the others: the
highest mean utility u(candidate, other) over the other candidates, which stand in for
references drawn from the model. Here u is sacreBLEU's sentence chrF (`CHRF()`, chrF2 over
character 6-grams) or sentence BLEU (`BLEU(effective_order=True)`, 13a tokens, exponential
smoothing), the scores `sacrebleu.sentence_chrf` and `sacrebleu.sentence_bleu` give.

The pairwise utilities come without a Python loop over pairs: each candidate's n-grams are
counted once, by sacreBLEU's own extraction functions, into sparse counts per n-gram order (C[i, g]
of the G distinct n-grams of the N candidates); the clipped matches of every pair,
sum_g min(C[i, g], C[j, g]), are summed over blocks of columns of C (for many candidates as
sum_k B_k B_k^T, B_k = [C >= k], matrix products of 0/1 columns, exact), and the score formulas
are sacreBLEU's, applied to the pairwise statistics order by order in the order sacreBLEU sums
them. Each array is at most `BLOCK_ELEMENTS` elements, a block of rows of the [N, N] statistics
or of columns of C, so memory grows with N (N^2 only for `utility_matrix`'s answer), never with
N^2 G: min(C[i, g], C[j, g]) as one [N, N, G] array took 38 GiB for 1,000 candidates.
tests/test_mbr.py checks every pair against sacreBLEU's sentence scores, and the choices against
the `mbrs` package's MBR decoder.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

METRICS = ("chrf", "bleu")
# sacreBLEU's defaults for the two sentence scores.
CHRF_ORDER, CHRF_BETA = 6, 2
BLEU_ORDER = 4
# sacreBLEU's floor for log(0) in BLEU (sacrebleu.metrics.bleu.my_log).
LOG_ZERO = -9999999999.0


# The most elements of one block of the pairwise statistics (4 MiB of float64): a block of rows
# of an [N, N] statistic, or of columns of the counts.
BLOCK_ELEMENTS = 2**19
# The fewest columns of the counts a block of [R, N, columns] minima may hold; more pairs take
# matrix products instead (`_matches`). 64 keeps the minima up to about 90 candidates, where
# they ran faster than the products on 2 cores (64 candidates' chrF: 25 ms against 140).
MIN_COLUMNS = 64


class _Counts(NamedTuple):
    """One n-gram order's counts of N candidates, sparse: candidate `row[e]` holds `count[e]` of
    n-gram `column[e]`, the entries sorted by column."""

    row: np.ndarray
    column: np.ndarray
    count: np.ndarray
    totals: np.ndarray  # [N], each candidate's n-grams


def _counts(counters: Sequence[Counter]) -> _Counts:
    """The counts of `counters` (one per candidate), each n-gram a column."""
    ids: dict = {}
    row, column, count = [], [], []
    for i, counter in enumerate(counters):
        for gram, c in counter.items():
            row.append(i)
            column.append(ids.setdefault(gram, len(ids)))
            count.append(c)
    row, column, count = (np.asarray(a, np.int64) for a in (row, column, count))
    order = np.argsort(column, kind="stable")
    totals = np.zeros(len(counters), np.int64)
    np.add.at(totals, row, count)
    return _Counts(row[order], column[order], count[order], totals)


def _matches(counts: _Counts, rows: slice) -> np.ndarray:
    """The clipped matches [R, N] of candidates `rows` with every candidate,
    sum_g min(C[i, g], C[j, g]), one block of columns of C at a time.

    Few pairs take the minima of a block of columns at once, [R, N, columns]; more take
    sum_k B_k[i] . B_k[j] with B_k = [C >= k], matrix products of 0/1 columns (integers, exact in
    float64), where [R, N, columns] would leave a block a handful of columns.
    """
    n, pairs = len(counts.totals), (rows.stop - rows.start) * len(counts.totals)
    grams = int(counts.column[-1]) + 1 if len(counts.column) else 0
    direct = pairs * MIN_COLUMNS <= BLOCK_ELEMENTS
    width = min(max(1, BLOCK_ELEMENTS // (pairs if direct else n)), max(grams, 1))
    matches = np.zeros((rows.stop - rows.start, n), np.int64 if direct else np.float64)
    for first in range(0, grams, width):
        lo, hi = np.searchsorted(counts.column, [first, first + width])
        block = np.zeros((n, width), np.int64)
        block[counts.row[lo:hi], counts.column[lo:hi] - first] = counts.count[lo:hi]
        if direct:
            matches += np.minimum(block[rows, None, :], block[None, :, :]).sum(-1)
            continue
        most = block.max(axis=0)  # [width], each column's largest count
        for k in range(1, int(most.max()) + 1):
            at_least = (block[:, most >= k] >= k).astype(np.float64)  # [N, columns left]
            matches += at_least[rows] @ at_least.T
    return matches.astype(np.int64)


def _row_blocks(n: int) -> list[slice]:
    """Blocks of rows of an [N, N] statistic, each at most BLOCK_ELEMENTS elements."""
    step = max(1, BLOCK_ELEMENTS // max(n, 1))
    return [slice(i, min(i + step, n)) for i in range(0, n, step)]


def _chrf_rows(orders: Sequence[_Counts], rows: slice) -> np.ndarray:
    """U[rows, :] of sentence chrF: candidates `rows` against every candidate as reference."""
    n = len(orders[0].totals)
    shape = (rows.stop - rows.start, n)
    factor = CHRF_BETA**2
    avg_prec, avg_rec = np.zeros(shape), np.zeros(shape)
    effective = np.zeros(shape, np.int64)
    for counts in orders:  # CHRF._compute_f_score, over the block's pairs at once
        matches = _matches(counts, rows)
        n_hyp, n_ref = counts.totals[rows, None], counts.totals[None, :]  # hypothesis i, ref j
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


def _chrf_counts(candidates: Sequence[str]) -> list[_Counts]:
    from sacrebleu.metrics.helpers import extract_all_char_ngrams

    grams = [extract_all_char_ngrams(c, CHRF_ORDER, False) for c in candidates]
    return [_counts([g[order] for g in grams]) for order in range(CHRF_ORDER)]


def chrf_matrix(candidates: Sequence[str]) -> np.ndarray:
    """U [N, N]: U[i, j] = sacrebleu.sentence_chrf(candidates[i], [candidates[j]]).score."""
    return utility_matrix(candidates, "chrf")


def _bleu_counts(candidates: Sequence[str]) -> tuple[list[_Counts], np.ndarray]:
    """The word n-gram counts of each order 1..BLEU_ORDER, and the candidates' lengths [N]."""
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.helpers import extract_all_word_ngrams

    tokenize = BLEU(effective_order=True).tokenizer  # 13a, as sentence_bleu's
    extracted = [extract_all_word_ngrams(tokenize(c.rstrip()), 1, BLEU_ORDER) for c in candidates]
    lengths = np.array([length for _, length in extracted], np.float64)  # [N]
    orders = [
        _counts(
            [
                Counter({g: c for g, c in counter.items() if len(g) == order})
                for counter, _ in extracted
            ]
        )
        for order in range(1, BLEU_ORDER + 1)
    ]
    return orders, lengths


def _bleu_rows(orders: Sequence[_Counts], lengths: np.ndarray, rows: slice) -> np.ndarray:
    """U[rows, :] of sentence BLEU: candidates `rows` against every candidate as reference."""
    n = len(lengths)
    shape = (rows.stop - rows.start, n)
    correct, total = [], []
    for counts in orders:
        correct.append(_matches(counts, rows).astype(np.float64))  # hypothesis i, reference j
        total.append(np.broadcast_to(counts.totals[rows, None], shape).astype(np.float64))
    sys_len, ref_len = lengths[rows, None], lengths[None, :]
    # BLEU.compute_bleu with smooth_method="exp", effective_order=True, over the block at once.
    with np.errstate(divide="ignore", invalid="ignore"):
        bp = np.where(
            sys_len < ref_len,
            np.where(sys_len > 0, np.exp(1 - ref_len / np.maximum(sys_len, 1)), 0.0),
            1.0,
        )
    smooth = np.ones(shape)
    log_sum, eff_order = np.zeros(shape), np.zeros(shape)
    going = np.ones(shape, bool)  # the loop has not met an order without n-grams
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


def bleu_matrix(candidates: Sequence[str]) -> np.ndarray:
    """U [N, N]: U[i, j] = sacrebleu.sentence_bleu(candidates[i], [candidates[j]]).score."""
    return utility_matrix(candidates, "bleu")


def _utility_rows(candidates: Sequence[str], metric: str):
    """(rows, U[rows, :]) block by block (`_row_blocks`), U as `utility_matrix` gives it."""
    if metric == "chrf":
        orders = _chrf_counts(candidates)
        return ((rows, _chrf_rows(orders, rows)) for rows in _row_blocks(len(candidates)))
    if metric == "bleu":
        orders, lengths = _bleu_counts(candidates)
        return ((rows, _bleu_rows(orders, lengths, rows)) for rows in _row_blocks(len(candidates)))
    raise ValueError(f"--mbr={metric}: must be one of {', '.join(METRICS)}")


def utility_matrix(candidates: Sequence[str], metric: str) -> np.ndarray:
    """U [N, N], U[i, j] = the sentence `metric` of candidate i with candidate j as reference."""
    blocks = [u for _, u in _utility_rows(candidates, metric)]
    return np.concatenate(blocks) if blocks else np.zeros((0, 0))


def expected_utilities(candidates: Sequence[str], metric: str) -> np.ndarray:
    """Each candidate's mean utility [N] against the other candidates (itself left out).

    Duplicates count as often as they were drawn: a text the model samples twice is twice the
    evidence. With one candidate the mean is over nothing and is 0.
    """
    n = len(candidates)
    if n < 2:
        return np.zeros(n)
    # Row block by row block: the [N, N] utilities are never held whole.
    utility = np.zeros(n)
    for rows, u in _utility_rows(candidates, metric):
        own = u[np.arange(len(u)), np.arange(rows.start, rows.stop)]  # U[i, i]
        utility[rows] = (u.sum(1) - own) / (n - 1)
    return utility


def mbr_order(
    candidates: Sequence[str], scores: Sequence[float], metric: str
) -> tuple[list[int], np.ndarray]:
    """Candidate indices from the highest expected utility down, ties by the higher model
    score, then by the earlier index; and the utilities [N]."""
    utility = expected_utilities(candidates, metric)
    order = sorted(range(len(candidates)), key=lambda i: (-utility[i], -scores[i], i))
    return order, utility
