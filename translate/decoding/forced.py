"""Forced decoding: the model's log-probability of a given target, and word alignments.

A pair (source, target) is scored by one teacher-forced pass, as the dev loss is computed but
without label smoothing: each target piece's log P(y_t | y_<t, x), EOS included, natural log.
An ensemble scores each piece by the mean of its models' log-probabilities, as the search does
(translate/decoding/search.py), so the total of a hypothesis is the search's own score of it
before the length penalty.

Alignments (the Moses/Pharaoh `i-j` pairs of fairseq's --print-alignment, Marian's --alignment)
come from the same pass: the cross-attention of one decoder layer, its heads averaged (and the
models of an ensemble averaged), where the row of target piece t is the query that predicted
it. Each target word (or piece) is linked to the source word (or piece) that receives the most
of its attention; a word's attention is the mean over its pieces (target) of the sum over its
pieces (source). EOS on either side is left out. Words are the whitespace tokens of a line, and
a piece belongs to the word it spells part of (`word_of_pieces`).

Pairs are scored in length-sorted batches of a few padded shapes, so a file of any size
compiles a handful of programs; `score_pairs` gives results back in input order.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from translate.data.batching import Batch, decode_width
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from translate.decoding.search import merge_models

# SentencePiece's mark of a word's start.
WORD_START = "\u2581"


class PairScore(NamedTuple):
    """One pair's forced decoding: per-piece log-probabilities (EOS last) and alignment."""

    pieces: list[str]  # the target's pieces, then "</s>"
    log_probs: list[float]  # natural log, one per piece
    # Alignment links (source index, target index) over words, or over pieces; None if not asked.
    links: list[tuple[int, int]] | None = None
    too_long: bool = False  # longer than data.max_len on a side: scored whole, but said

    @property
    def total(self) -> float:
        return float(sum(self.log_probs))


def word_of_pieces(pieces: Sequence[str]) -> list[int]:
    """The word (0-based) each SentencePiece piece spells part of.

    A piece that starts with "▁" starts a new word; the others continue the word before them
    (punctuation glued to a word, "Haus" "," in "Haus,", belongs to it, as whitespace tokens
    do). A lone "▁" followed by a piece of its own ("▁" "(") starts the word that piece is in.
    """
    words, word = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        words.append(word)
    return words


def hard_links(
    attention: np.ndarray, src_words: Sequence[int], tgt_words: Sequence[int]
) -> list[tuple[int, int]]:
    """(source word, target word) links: each target word to its most attended source word.

    Args:
      attention: [T, S] weights of the target pieces (EOS excluded) over the source pieces
        (EOS excluded).
      src_words, tgt_words: the word of each source and target piece (`word_of_pieces`); for
        links between pieces, `range(S)` and `range(T)`.
    """
    if attention.size == 0:
        return []
    num_src, num_tgt = max(src_words) + 1, max(tgt_words) + 1
    src_onehot = np.zeros((attention.shape[1], num_src))  # [S, I]
    src_onehot[np.arange(len(src_words)), src_words] = 1.0
    tgt_mean = np.zeros((num_tgt, attention.shape[0]))  # [J, T]
    tgt_mean[tgt_words, np.arange(len(tgt_words))] = 1.0
    tgt_mean /= tgt_mean.sum(axis=1, keepdims=True)
    words = tgt_mean @ attention @ src_onehot  # [J, I]
    return [(int(i), j) for j, i in enumerate(np.argmax(words, axis=1))]


def pair_batches(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    batch_size: int,
    max_src_len: int | None = None,
) -> Iterator[tuple[np.ndarray, Batch, np.ndarray]]:
    """Pairs of pieces (no EOS) as teacher-forced batches, sorted by length: (indices [B],
    Batch [B, ...], tgt_out [B, T]); index -1 marks a padding row. Widths are `decode_width`'s
    few, and the last batch is padded to the rows of the others, so a file compiles a handful
    of shapes. With `max_src_len`, sources are cut to it (EOS included), as the search cuts
    them."""
    if max_src_len:
        src_ids = [ids[: max_src_len - 1] for ids in src_ids]
    order = np.argsort([len(s) + len(t) for s, t in zip(src_ids, tgt_ids)], kind="stable")
    rows = min(batch_size, 1 << max(len(order) - 1, 0).bit_length())
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        s_width = decode_width(max(len(src_ids[i]) for i in chunk) + 1)
        t_width = decode_width(max(len(tgt_ids[i]) for i in chunk) + 1)
        src = np.zeros((rows, s_width), np.int32)  # [B, S]
        tgt_in = np.zeros((rows, t_width), np.int32)  # [B, T]
        tgt_out = np.zeros((rows, t_width), np.int32)  # [B, T]
        for r, i in enumerate(chunk):
            s, t = list(src_ids[i]) + [EOS_ID], list(tgt_ids[i])
            src[r, : len(s)] = s
            tgt_in[r, : len(t) + 1] = [BOS_ID] + t
            tgt_out[r, : len(t) + 1] = t + [EOS_ID]
        indices = np.full(rows, -1, np.int64)
        indices[: len(chunk)] = chunk
        yield indices, teacher_forced_batch(src, tgt_in), tgt_out


def teacher_forced_batch(src: np.ndarray, tgt_in: np.ndarray) -> Batch:
    """A model input of one pair per row: segments 1 where there are tokens, positions from 0."""
    src_segments = (src != PAD_ID).astype(np.int32)
    # The decoder input starts with BOS (not PAD), so its segment is where BOS or a token is.
    tgt_segments = np.zeros_like(tgt_in)
    lengths = (tgt_in != PAD_ID).sum(axis=1)
    tgt_segments[np.arange(tgt_in.shape[1])[None, :] < lengths[:, None]] = 1
    positions = lambda x: np.broadcast_to(np.arange(x.shape[1], dtype=np.int32), x.shape)  # noqa: E731
    return Batch(src, src_segments, positions(src), tgt_in, tgt_segments, positions(tgt_in))


@functools.partial(jax.jit, static_argnames=("graphdefs",))
def forced_log_probs(graphdefs, params, batch: Batch, tgt_out: jax.Array) -> jax.Array:
    """log P(tgt_out[b, t] | ...) [B, T] (0 at padding): the mean over the models of their
    log-softmax, as the search scores an ensemble's next token."""
    total = 0.0
    for model in merge_models(graphdefs, params):
        logits = model(batch)  # [B, T, V] float32
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        total = total + jnp.take_along_axis(log_probs, tgt_out[..., None], axis=-1)[..., 0]
    return jnp.where(tgt_out != PAD_ID, total / len(graphdefs), 0.0)  # [B, T]


@functools.partial(jax.jit, static_argnames=("graphdefs", "layer"))
def cross_attention(graphdefs, params, batch: Batch, layer: int) -> jax.Array:
    """The cross-attention weights [B, T, S] of decoder layer `layer`, heads averaged (and
    the models of an ensemble)."""
    total = 0.0
    models = merge_models(graphdefs, params)
    for model in models:
        weights = model.attention_weights(batch)[f"decoder.{layer}.cross_attention"]  # [B,H,T,S]
        total = total + jnp.mean(weights.astype(jnp.float32), axis=1)
    return total / len(models)  # [B, T, S]


def alignment_layer(config, layer: int = -1) -> int:
    """The decoder layer that aligns: `layer` (--alignment_layer), else the config's
    `decode.alignment_layer`, else (-1) the second-to-last layer.

    Raises:
      ValueError: a decoder-only model (no cross-attention), or a layer it does not have.
    """
    if config.model.architecture != "encoder_decoder":
        raise ValueError(
            f"--alignment: a {config.model.architecture} model has no cross-attention to align "
            "with; alignments need an encoder-decoder"
        )
    num = config.model.num_layers
    if layer != -1 and not 0 <= layer < num:
        raise ValueError(f"--alignment_layer={layer}: must be in [0, {num - 1}] or -1")
    if layer == -1:
        layer = config.decode.alignment_layer
    return max(num - 2, 0) if layer == -1 else layer


def score_pairs(
    graphdefs: tuple,
    params: tuple,
    tokenizer: Tokenizer,
    sources: Sequence[str] | Sequence[Sequence[int]],
    targets: Sequence[str] | Sequence[Sequence[int]],
    batch_size: int,
    max_len: int,
    alignment_layer: int | None = None,
    alignment_pieces: bool = False,
    cut_sources: bool = False,
) -> list[PairScore]:
    """Forced decoding of each (source, target) pair, in input order.

    Args:
      graphdefs, params: an ensemble's tuples.
      sources, targets: lines of text, or their pieces' ids (without EOS) as the search gave
        them: text is encoded, and the encoding of a detokenized output may differ from the
        pieces the search chose.
      batch_size: pairs per batch.
      max_len: the model's `data.max_len`; a longer side is scored whole and marked `too_long`.
      alignment_layer: the decoder layer whose cross-attention aligns (0-based); None: no
        alignment.
      alignment_pieces: links between pieces instead of whitespace words.
      cut_sources: cut sources to `max_len` as the search does (to align its outputs).
    """
    results: list[PairScore | None] = [None] * len(sources)
    cut = max_len if cut_sources else None
    src_ids, tgt_ids = (
        tokenizer.encode(lines) if lines and isinstance(lines[0], str) else lines
        for lines in (sources, targets)
    )
    for indices, batch, tgt_out in pair_batches(src_ids, tgt_ids, batch_size, cut):
        log_probs = np.asarray(forced_log_probs(graphdefs, params, batch, tgt_out))  # [B, T]
        attention = None
        if alignment_layer is not None:
            attention = np.asarray(cross_attention(graphdefs, params, batch, alignment_layer))
        for row, i in enumerate(indices):
            if i < 0:
                continue
            src_len = int((batch.src[row] != PAD_ID).sum())  # EOS included
            tgt_len = int((tgt_out[row] != PAD_ID).sum())  # EOS included
            ids = tgt_out[row, :tgt_len]
            pieces = tokenizer.pieces(ids[:-1]) + ["</s>"]
            links = None
            if attention is not None:
                links = links_of(
                    tokenizer,
                    attention[row, : tgt_len - 1, : src_len - 1],
                    batch.src[row, : src_len - 1],
                    ids[:-1],
                    alignment_pieces,
                )
            too_long = max(src_len, tgt_len) > max_len
            results[i] = PairScore(pieces, log_probs[row, :tgt_len].tolist(), links, too_long)
    return results  # type: ignore[return-value]


def links_of(
    tokenizer: Tokenizer,
    attention: np.ndarray,
    src_ids: np.ndarray,
    tgt_ids: np.ndarray,
    pieces: bool,
) -> list[tuple[int, int]]:
    """The alignment links of one pair from its attention [T, S] (EOS rows and columns out)."""
    if pieces:
        return hard_links(attention, range(len(src_ids)), range(len(tgt_ids)))
    src_words = word_of_pieces(tokenizer.pieces(src_ids))
    tgt_words = word_of_pieces(tokenizer.pieces(tgt_ids))
    return hard_links(attention, src_words, tgt_words)


def format_links(links: Sequence[tuple[int, int]]) -> str:
    """Moses/Pharaoh format: "0-0 1-2 ..." (source-target), sorted by target, then source."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links, key=lambda link: (link[1], link[0])))
