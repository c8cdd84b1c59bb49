"""Subword regularisation: each epoch's training pairs segmented anew (`data.*_subword_alpha`).

A BPE vocabulary segments a word one way; BPE-dropout (Provilkov et al. 2020, after Kudo
2018's sampling for unigram models) drops each merge with probability alpha while encoding, so
the model sees a word in many segmentations and learns its pieces' composition.

The encoder here is SentencePiece's BPE encoding written again over the vocabulary's pieces and
scores, with the dropping drawn from our own generator: start from the characters, and while a
pair of neighbouring symbols concatenates to a piece, take the pair whose piece scores highest
(the leftmost of equals); with probability alpha drop that pair (it is not offered again until
a neighbour changes), else merge it. At alpha 0 this is SentencePiece's encoding: it is checked
equal on the tests' vocabularies and on all 58,000 Multi30k training sentences. SentencePiece's
own sampler (`enable_sampling=True`) is not used: it draws from a per-thread generator that gave
another segmentation for the same seed in another process (measured with 0.2.3), so a resumed
run would not see the pieces of an uninterrupted one.

Each side of each epoch draws from a generator seeded with (train.seed, epoch, side), one
sentence after another, so an epoch's pieces are a function of the seed, the epoch and the
cached pieces, in any process: a run stopped and resumed sees the pieces an uninterrupted run
sees. No piece contains the word boundary "▁" but at its start, so merges never cross a word and
words are encoded one at a time from the cached deterministic pieces (their characters are the
pieces' characters; an unknown piece stays one symbol that nothing merges with): no training
text is read at resume and the token cache is unchanged. A pair whose sampled segmentation is
longer than `data.max_len` on a side keeps its deterministic pieces that epoch: every epoch holds
the same pairs.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from translate.data.corpus import TokenizedCorpus, fits
from translate.data.tokenizer import Tokenizer

log = logging.getLogger("translate")

WORD_START = "\u2581"  # SentencePiece's whitespace symbol, which begins a word's first piece
# Uniform draws made at a time: any chunk size gives the same stream (one 64-bit draw each).
_CHUNK = 1 << 16
# Words whose first candidate merges are kept (Multi30k has about 20,000 words; WMT14 millions).
_FIRST_CACHED = 1 << 18


def epoch_generator(seed: int, epoch: int, side: int) -> np.random.Generator:
    """The generator of one side (0 source, 1 target) of one epoch's segmentation."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, side])))


def uniforms(rng: np.random.Generator) -> Callable[[], float]:
    """A function returning the generator's next uniform draw in [0, 1)."""

    def draws() -> Iterator[float]:
        while True:
            yield from rng.random(_CHUNK).tolist()

    return draws().__next__


class BPEDropout:
    """A SentencePiece BPE model's encoding with each merge dropped with probability alpha.

    Works on the model's deterministic pieces: `words` splits a sentence's pieces into words,
    `encode_word` segments one word's characters again. Written for the vocabularies
    `train_tokenizer` makes (BPE, no user-defined or unused pieces).
    """

    def __init__(self, tokenizer: Tokenizer):
        proc = tokenizer.processor
        self.pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
        # Kept whole, as ids: <unk>, and the control pieces a tagged corpus puts in its sources.
        self.whole = [
            bool(proc.is_unknown(i) or proc.is_control(i)) for i in range(len(self.pieces))
        ]
        # Ordinary pieces only: control pieces (<pad>, <s>, </s>) and <unk> never come out of a
        # merge (SentencePiece matches them as whole strings, never as characters' concatenation).
        self.ids: dict[str, int] = {}
        self.scores: dict[str, float] = {}
        for i, piece in enumerate(self.pieces):
            if not (proc.is_control(i) or proc.is_unknown(i) or proc.is_unused(i)):
                self.ids[piece] = i
                self.scores[piece] = proc.get_score(i)
        self._first: dict[str, list[tuple[float, int, int, int]]] = {}

    def words(self, ids: Sequence[int]) -> list[str | int]:
        """A sentence's deterministic pieces as its words' characters (strings), and unknown and
        control pieces (a tag) as their ids, kept as they are."""
        out: list[str | int] = []
        word = ""
        for i in ids:
            i = int(i)
            if self.whole[i]:
                if word:
                    out.append(word)
                out.append(i)
                word = ""
                continue
            piece = self.pieces[i]
            if piece.startswith(WORD_START) and word:
                out.append(word)
                word = ""
            word += piece
        if word:
            out.append(word)
        return out

    def encode_word(self, word: str, alpha: float, uniform: Callable[[], float]) -> list[int]:
        """One word's pieces: SentencePiece's merge order (highest score first, leftmost of
        equals), each merge taken dropped when `uniform()` < alpha (drawn only when alpha > 0)."""
        scores = self.scores
        symbols = list(word)
        n = len(symbols)
        after = list(range(1, n + 1))  # the start of the symbol after the one starting at i
        before = list(range(-1, n - 1))  # the start of the symbol before it
        alive = [True] * n
        # Candidate merges (-score, left start, right start, right end): stale once either
        # symbol changes, which the pop checks. A word's first candidates are made once.
        first = self._first.get(word)
        if first is None:
            first = []
            for i in range(n - 1):
                score = scores.get(symbols[i] + symbols[i + 1])
                if score is not None:
                    first.append((-score, i, i + 1, i + 2))
            heapq.heapify(first)
            if len(self._first) < _FIRST_CACHED:
                self._first[word] = first
        agenda = first.copy()
        while agenda:
            _, left, right, end = heapq.heappop(agenda)
            if not (alive[left] and alive[right] and after[left] == right and after[right] == end):
                continue
            if alpha and uniform() < alpha:
                continue  # dropped: this pair is not offered again while both symbols stand
            symbols[left] += symbols[right]
            alive[right] = False
            after[left] = end
            if end < n:
                before[end] = left
                score = scores.get(symbols[left] + symbols[end])
                if score is not None:
                    heapq.heappush(agenda, (-score, left, end, after[end]))
            prev = before[left]
            if prev >= 0:
                score = scores.get(symbols[prev] + symbols[left])
                if score is not None:
                    heapq.heappush(agenda, (-score, prev, left, end))
        out, i = [], 0
        while i < n:
            out.append(self.ids[symbols[i]])
            i = after[i]
        return out

    def encode(
        self, words: Sequence[str | int], alpha: float, uniform: Callable[[], float]
    ) -> list[int]:
        """A sentence's pieces from its `words` (see `words`)."""
        out: list[int] = []
        for word in words:
            if isinstance(word, int):
                out.append(word)
            else:
                out += self.encode_word(word, alpha, uniform)
        return out


class SampledEpochs:
    """The training pairs of each epoch in a segmentation sampled from (seed, epoch).

    `alphas` are the sources' and the targets' merge-dropping probabilities; a side at 0 keeps
    its deterministic pieces. Called with an epoch, returns that epoch's `TokenizedCorpus` (the
    pairs of `corpus`, in its order); the last epoch asked for is kept, as the batcher asks
    once per epoch.
    """

    def __init__(
        self,
        corpus: TokenizedCorpus,
        tokenizer: Tokenizer,
        alphas: tuple[float, float],
        max_len: int,
        seed: int,
    ):
        self.corpus, self.dropout = corpus, BPEDropout(tokenizer)
        self.alphas, self.max_len, self.seed = tuple(alphas), max_len, seed
        self._words: dict[int, list[list[str | int]]] = {}
        self._epoch: tuple[int, TokenizedCorpus] | None = None

    def side(self, index: int):
        """The corpus's accessor of one side's pieces: 0 sources, 1 targets."""
        return (self.corpus.src, self.corpus.tgt)[index]

    def words(self, index: int) -> list[list[str | int]]:
        """One side's sentences as words, split once from the deterministic pieces."""
        if index not in self._words:
            pieces, split = self.side(index), self.dropout.words
            self._words[index] = [split(pieces(i).tolist()) for i in range(len(self.corpus))]
        return self._words[index]

    def pieces(self, index: int, epoch: int) -> list[list[int]]:
        """One side's pieces in epoch `epoch`: sampled, or the deterministic ones at alpha 0."""
        alpha = self.alphas[index]
        if not alpha:
            pieces = self.side(index)
            return [pieces(i).tolist() for i in range(len(self.corpus))]
        uniform = uniforms(epoch_generator(self.seed, epoch, index))
        encode = self.dropout.encode
        return [encode(words, alpha, uniform) for words in self.words(index)]

    def __call__(self, epoch: int) -> TokenizedCorpus:
        if self._epoch is not None and self._epoch[0] == epoch:
            return self._epoch[1]
        start = time.perf_counter()
        src, tgt = self.pieces(0, epoch), self.pieces(1, epoch)
        src_len = np.fromiter(map(len, src), np.int64, len(src))
        tgt_len = np.fromiter(map(len, tgt), np.int64, len(tgt))
        for i in np.flatnonzero(~fits(src_len, tgt_len, self.max_len)).tolist():
            src[i], tgt[i] = self.corpus.src(i).tolist(), self.corpus.tgt(i).tolist()
        sampled = TokenizedCorpus.from_lists(src, tgt)
        before = len(self.corpus.src_tokens) + len(self.corpus.tgt_tokens)
        after = len(sampled.src_tokens) + len(sampled.tgt_tokens)
        log.info(
            "epoch %d: sampled the segmentation of %d pairs (data.src_subword_alpha=%g, "
            "tgt_subword_alpha=%g) in %.1f s: %.1f%% more tokens than the deterministic one",
            epoch,
            len(sampled),
            *self.alphas,
            time.perf_counter() - start,
            100.0 * (after / max(before, 1) - 1.0),
        )
        self._epoch = (epoch, sampled)
        return sampled
