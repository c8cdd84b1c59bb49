"""Subword regularisation: each epoch's training pairs segmented anew (`data.*_subword_alpha`).

A BPE vocabulary segments a word one way; BPE-dropout (Provilkov et al. 2020, after Kudo
2018's sampling for unigram models) drops each merge with probability alpha while encoding, so
the model sees a word in many segmentations and learns its pieces' composition. SentencePiece
does the dropping (`enable_sampling=True, alpha=...` on a BPE model).

Each side of each epoch is sampled with a seed made from (train.seed, epoch, side).
SentencePiece samples from a generator per thread, seeded from a process-wide seed when that
thread first samples (a later `set_random_generator_seed` does not reseed it); so each side of
each epoch is encoded in a new thread started after the seed is set, one sentence after
another (`num_threads=1`). Within one process that makes an epoch's pieces a function of the
seed and the epoch. **Across processes it does not**: SentencePiece 0.2.x gives another
segmentation for the same seed in another process (measured on 2026-11-25, cause not found),
so a run stopped and resumed with sampling on sees other pieces from the resumed epoch on than
an uninterrupted run, and is not bit for bit the same run (`SampledEpochs` says so once). The
data position (epoch, batch) is still exact when the pieces are the same; a reproducible
sampler (BPE-dropout on our own generator) is what would make the resume exact.

The text sampled is the cached deterministic pieces decoded (SentencePiece's normalized text,
which encodes back to the same pieces), so a resumed run needs no training text. A pair whose
sampled segmentation is longer than `data.max_len` on a side keeps its deterministic pieces
that epoch: every epoch holds the same pairs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import numpy as np

from translate.data.corpus import TokenizedCorpus, fits
from translate.data.tokenizer import Tokenizer

log = logging.getLogger("translate")

# SentencePiece's process-wide seed is read by the thread that samples: one sampler at a time.
_SEED_LOCK = threading.Lock()


def sample_seed(seed: int, epoch: int, side: int) -> int:
    """SentencePiece's 32-bit seed for one side (0 source, 1 target) of one epoch."""
    return int(np.random.SeedSequence([seed, epoch, side]).generate_state(1)[0])


def sample_pieces(tokenizer: Tokenizer, texts: Sequence[str], alpha: float, seed: int):
    """`texts` encoded with each BPE merge dropped with probability `alpha`: a list of id lists,
    the same for the same (texts, alpha, seed) in any process."""
    import sentencepiece as spm

    out: list[list[list[int]]] = []
    errors: list[BaseException] = []

    def encode() -> None:
        try:
            out.append(
                tokenizer.processor.encode(
                    list(texts), out_type=int, enable_sampling=True, alpha=alpha, num_threads=1
                )
            )
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            errors.append(e)

    with _SEED_LOCK:
        spm.set_random_generator_seed(seed)
        thread = threading.Thread(target=encode, name="subword-sampling")
        thread.start()
        thread.join()
    if errors:
        raise errors[0]
    return out[0]


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
        self.corpus, self.tokenizer = corpus, tokenizer
        self.alphas, self.max_len, self.seed = tuple(alphas), max_len, seed
        self._texts: dict[int, list[str]] = {}
        self._epoch: tuple[int, TokenizedCorpus] | None = None
        log.warning(
            "WARNING: data.src_subword_alpha=%g, tgt_subword_alpha=%g: SentencePiece samples "
            "another segmentation for the same seed in another process, so a run stopped and "
            "resumed is not bit for bit an uninterrupted one (translate/data/sampling.py)",
            *self.alphas,
        )

    def side(self, index: int):
        """The corpus's accessor of one side's pieces: 0 sources, 1 targets."""
        return (self.corpus.src, self.corpus.tgt)[index]

    def texts(self, index: int) -> list[str]:
        """One side's text, decoded once from the deterministic pieces."""
        if index not in self._texts:
            pieces, decode = self.side(index), self.tokenizer.processor.decode
            self._texts[index] = [decode(pieces(i).tolist()) for i in range(len(self.corpus))]
        return self._texts[index]

    def pieces(self, index: int, epoch: int) -> list[list[int]]:
        """One side's pieces in epoch `epoch`: sampled, or the deterministic ones at alpha 0."""
        alpha = self.alphas[index]
        if not alpha:
            pieces = self.side(index)
            return [pieces(i).tolist() for i in range(len(self.corpus))]
        seed = sample_seed(self.seed, epoch, index)
        return sample_pieces(self.tokenizer, self.texts(index), alpha, seed)

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
