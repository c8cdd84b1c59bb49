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
pieces (source). EOS on either side is left out. Words are the whitespace tokens of the line as
given (`str.split()`: runs of characters that are not whitespace, Unicode's whitespace and the
control characters Python counts as such included), and a piece belongs to the word whose
characters it was encoded from (`line_piece_words`), which SentencePiece's span of each piece in
the line says: its NFKC normalization may turn one character into a space and more ("´" into
" ́") or drop whitespace (\x1c, \x0b), so the pieces' word-start marks may count other words
than the line holds. Pieces given as ids, without their text, group by those marks
(`word_of_pieces`).

Pairs are scored in length-sorted batches of a few padded shapes, so a file of any size
compiles a handful of programs; `score_pairs` gives results back in input order. Given the
models' configs, it keeps each batch within `memory.memory_bound()` (`forced_bytes`): a batch
of long pairs is split, and a pair too long to score whole is refused.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from translate.config import ModelConfig
from translate.data.batching import Batch, decode_width
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from translate.decoding import memory
from translate.decoding.loop import merge_models

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


def line_piece_words(
    spans: Callable[[Sequence[str]], list[list[tuple[int, int]]]], lines: Sequence[str]
) -> list[list[tuple[int, ...]]]:
    """For each line, the words (0-based whitespace tokens of the line as given) of each piece
    of its encoding, whose byte spans `spans` gives (a tokenizer's `source_spans` or
    `target_spans`).

    A piece belongs to the words of the characters SentencePiece encoded it from (its span in
    the line, through the normalization): "´" of "It´s", which NFKC makes a space and a mark,
    stays in the word "It´s"; "ab" encoded from "a\x1cb" belongs to both words. A piece of
    whitespace alone, or of no character of the line (NFKC's "ﬁ" gives "f" and "i", the span
    goes to one of them), belongs to the word at or after its place, the last word at the end.
    """
    return [span_words(line, line_spans) for line, line_spans in zip(lines, spans(lines))]


def span_words(line: str, spans: Sequence[tuple[int, int]]) -> list[tuple[int, ...]]:
    """The words of `line` (`str.split()`'s, from 0) that each byte span [begin, end) of its
    UTF-8 text touches, as `line_piece_words` assigns them."""
    byte_word: list[int] = []  # the word of each byte; -1 for whitespace
    word, inside = -1, False
    for char in line:
        if char.isspace():
            inside = False
        elif not inside:
            word, inside = word + 1, True
        byte_word += [word if inside else -1] * len(char.encode("utf-8"))
    following = [word] * (len(byte_word) + 1)  # the word at or after each byte
    for b in range(len(byte_word) - 1, -1, -1):
        following[b] = byte_word[b] if byte_word[b] >= 0 else following[b + 1]
    words = []
    for begin, end in spans:
        touched = sorted({w for w in byte_word[begin:end] if w >= 0})
        if not touched and word >= 0:
            touched = [following[min(begin, len(byte_word))]]
        words.append(tuple(touched))
    return words


def hard_links(
    attention: np.ndarray,
    src_words: Sequence[int | tuple[int, ...]],
    tgt_words: Sequence[int | tuple[int, ...]],
) -> list[tuple[int, int]]:
    """(source word, target word) links: each target word to its most attended source word.

    Args:
      attention: [T, S] weights of the target pieces (EOS excluded) over the source pieces
        (EOS excluded).
      src_words, tgt_words: the word of each source and target piece (`word_of_pieces`), or the
        words, a tuple (`line_piece_words`: a piece encoded from characters of two words
        belongs to both, and one of none to no word); for links between pieces, `range(S)` and
        `range(T)`. A target word that no piece belongs to gets no link.
    """
    src_words, tgt_words = as_word_tuples(src_words), as_word_tuples(tgt_words)
    num_src = 1 + max((max(w) for w in src_words if w), default=-1)
    num_tgt = 1 + max((max(w) for w in tgt_words if w), default=-1)
    if attention.size == 0 or not num_src or not num_tgt:
        return []
    src_onehot = np.zeros((attention.shape[1], num_src))  # [S, I]
    for piece, words in enumerate(src_words):
        src_onehot[piece, list(words)] = 1.0
    tgt_mean = np.zeros((num_tgt, attention.shape[0]))  # [J, T]
    for piece, words in enumerate(tgt_words):
        tgt_mean[list(words), piece] = 1.0
    pieces = tgt_mean.sum(axis=1, keepdims=True)
    tgt_mean = np.divide(tgt_mean, pieces, out=np.zeros_like(tgt_mean), where=pieces > 0)
    words = tgt_mean @ attention @ src_onehot  # [J, I]
    linked = pieces[:, 0] > 0
    return [(int(i), j) for j, i in enumerate(np.argmax(words, axis=1)) if linked[j]]


def as_word_tuples(words: Sequence[int | tuple[int, ...]]) -> list[tuple[int, ...]]:
    """Each piece's words as a tuple: (w,) for a piece of word w."""
    return [(int(w),) if np.ndim(w) == 0 else tuple(w) for w in words]


def parameter_bytes(params) -> int:
    """The bytes of float32 copies of an ensemble's parameters (`params`, a tuple of states)."""
    return sum(4 * int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))


def forced_bytes(
    models: Sequence[ModelConfig],
    vocab_size: int,
    rows: int,
    src_width: int,
    tgt_width: int,
    param_bytes: int = 0,
) -> int:
    """About the most memory (bytes) one teacher-forced pass over a batch of `rows` pairs takes:
    for each model and row, the attention weights of the longest sequence it attends over (the
    source or the target; both, one after the other, for a decoder-only model), four arrays of
    them as XLA keeps them at once (scores, their exponentials, the weights, the next layer's),
    in float32 whatever the compute dtype (the softmax is float32); the float32 logits [T, V]
    with their log-softmax; and the cross-attention weights [T, S] an alignment returns. Once
    per pass, `param_bytes` (`parameter_bytes`): XLA's copies of the parameters in the compute
    dtype, or transposed, which short pairs' batches are mostly made of.

    XLA's own memory analysis of the compiled pass (the forced log-probabilities and the
    cross-attention alike) on the CPU stays within this for the tiny, multi30k and base
    models, both architectures, float32 and bfloat16 compute, from pairs of 64 to 24,576
    pieces a side (tests/test_forced.py): the weights of the longest sequence are what
    grows with its square. Counted in the compute dtype's bytes, bfloat16's estimate was half
    the peak (4.9 GB for 9.8 GB).
    """
    per_row = 0
    for model in models:
        decoder_only = model.architecture == "decoder_only"
        attended = src_width + tgt_width if decoder_only else max(src_width, tgt_width)
        scored = src_width + tgt_width if decoder_only else tgt_width
        weights = 4 * 4 * model.num_heads * attended**2
        per_row += weights + 4 * 2 * scored * vocab_size + 4 * tgt_width * src_width
    return rows * per_row + param_bytes


def pair_batches(
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    batch_size: int,
    max_src_len: int | None = None,
    fits: Callable[[int, int, int], bool] | None = None,
) -> Iterator[tuple[np.ndarray, Batch, np.ndarray]]:
    """Pairs of pieces (no EOS) as teacher-forced batches, sorted by length: (indices [B],
    Batch [B, ...], tgt_out [B, T]); index -1 marks a padding row. Widths are `decode_width`'s
    few, and the last batch is padded to the rows of the others, so a file compiles a handful
    of shapes. With `max_src_len`, sources are cut to it (EOS included), as the search cuts
    them. With `fits(rows, src_width, tgt_width)`, a batch it refuses is halved until it
    fits (every pair must fit alone); the batches are all planned before the first is made."""
    if max_src_len:
        src_ids = [ids[: max_src_len - 1] for ids in src_ids]
    order = np.argsort([len(s) + len(t) for s, t in zip(src_ids, tgt_ids)], kind="stable")
    rows = min(batch_size, 1 << max(len(order) - 1, 0).bit_length())

    def widths(chunk) -> tuple[int, int]:
        return (
            decode_width(max(len(src_ids[i]) for i in chunk) + 1),
            decode_width(max(len(tgt_ids[i]) for i in chunk) + 1),
        )

    plan, start = [], 0
    while start < len(order):
        chunk, chunk_rows = order[start : start + batch_size], rows
        # Long pairs (past data.max_len, scored whole) may need fewer rows than others.
        while fits is not None and chunk_rows > 1 and not fits(chunk_rows, *widths(chunk)):
            chunk_rows = chunk_rows // 2
            chunk = chunk[:chunk_rows]
        plan.append((chunk, chunk_rows))
        start += len(chunk)
    for chunk, chunk_rows in plan:
        s_width, t_width = widths(chunk)
        src = np.zeros((chunk_rows, s_width), np.int32)  # [B, S]
        tgt_in = np.zeros((chunk_rows, t_width), np.int32)  # [B, T]
        tgt_out = np.zeros((chunk_rows, t_width), np.int32)  # [B, T]
        for r, i in enumerate(chunk):
            s, t = list(src_ids[i]) + [EOS_ID], list(tgt_ids[i])
            src[r, : len(s)] = s
            tgt_in[r, : len(t) + 1] = [BOS_ID] + t
            tgt_out[r, : len(t) + 1] = t + [EOS_ID]
        indices = np.full(chunk_rows, -1, np.int64)
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


def ensemble_alignment_layer(configs: Sequence, workdirs: Sequence[str], layer: int = -1) -> int:
    """The decoder layer that aligns for an ensemble: `alignment_layer` of its first model,
    which every model must have, as an encoder-decoder: each gives that layer's cross-attention
    to the mean (`cross_attention`).

    Raises:
      ValueError: naming --alignment (or --alignment_layer) and the --workdir of the first
        model that cannot align: decoder-only, or without the layer.
    """
    for config, workdir in zip(configs, workdirs, strict=True):
        if config.model.architecture != "encoder_decoder":
            raise ValueError(
                f"--alignment: --workdir={workdir} is a {config.model.architecture} model, with "
                "no cross-attention to align with; alignments need every model of the ensemble "
                "to be an encoder-decoder"
            )
    chosen = alignment_layer(configs[0], layer)
    common = min(config.model.num_layers for config in configs)
    for config, workdir in zip(configs[1:], workdirs[1:]):
        num = config.model.num_layers
        if chosen >= num:
            if layer != -1:
                what = f"--alignment_layer={layer}: --workdir={workdir} has {num} decoder layers"
            else:
                which = (
                    "config.decode.alignment_layer"
                    if configs[0].decode.alignment_layer != -1
                    else "second-to-last"
                )
                what = (
                    f"--alignment: decoder layer {chosen} (the {which} of --workdir="
                    f"{workdirs[0]}) is not in --workdir={workdir}, which has {num} decoder layers"
                )
            raise ValueError(
                f"{what}; give --alignment_layer in [0, {common - 1}], a layer of every model "
                "of the ensemble"
            )
    return chosen


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
    models: Sequence[ModelConfig] | None = None,
    first_pair: int = 0,
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
      models: the ensemble's model configs, in order: each batch is then kept within
        `memory.memory_bound()` by `forced_bytes`' estimate (a batch of long pairs split);
        None: batches of `batch_size` whatever their lengths.
      first_pair: the number of pairs before these, for naming one (from 1) in an error.

    Raises:
      ValueError: with `models`, naming a pair too long to score whole within the bound,
        before any pair is scored.
    """
    results: list[PairScore | None] = [None] * len(sources)
    cut = max_len if cut_sources else None
    texts = [bool(lines) and isinstance(lines[0], str) for lines in (sources, targets)]
    src_ids, tgt_ids = (
        encode(lines) if text else lines
        for lines, text, encode in zip(
            (sources, targets), texts, (tokenizer.encode_source, tokenizer.encode_target)
        )
    )
    # The words of a side given as text: the line's own whitespace tokens.
    words = [None, None]
    if alignment_layer is not None and not alignment_pieces:
        words = [
            line_piece_words(spans, lines) if text else None
            for lines, text, spans in zip(
                (sources, targets), texts, (tokenizer.source_spans, tokenizer.target_spans)
            )
        ]
    fits = None
    if models:
        fits = memory_check(
            models, tokenizer.vocab_size, src_ids, tgt_ids, cut, first_pair, parameter_bytes(params)
        )
    for indices, batch, tgt_out in pair_batches(src_ids, tgt_ids, batch_size, cut, fits):
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
                src_words, tgt_words = range(src_len - 1), range(tgt_len - 1)
                if not alignment_pieces:
                    src_words = piece_words(tokenizer, words[0], i, batch.src[row, : src_len - 1])
                    tgt_words = piece_words(tokenizer, words[1], i, ids[:-1])
                links = hard_links(
                    attention[row, : tgt_len - 1, : src_len - 1], src_words, tgt_words
                )
            too_long = max(src_len, tgt_len) > max_len
            results[i] = PairScore(pieces, log_probs[row, :tgt_len].tolist(), links, too_long)
    return results  # type: ignore[return-value]


def piece_words(tokenizer: Tokenizer, line_words, line: int, ids: np.ndarray) -> list:
    """The words of the pieces `ids` of pair `line`'s side: its line's (`line_words`, the
    side's `line_piece_words`) for the pieces kept, else (ids given) by their word starts."""
    if line_words is not None:
        return line_words[line][: len(ids)]
    return word_of_pieces(tokenizer.pieces(ids))


def memory_check(
    models: Sequence[ModelConfig],
    vocab_size: int,
    src_ids: Sequence[Sequence[int]],
    tgt_ids: Sequence[Sequence[int]],
    cut: int | None,
    first_pair: int,
    param_bytes: int = 0,
) -> Callable[[int, int, int], bool]:
    """`pair_batches`' `fits` for the memory bound, once every pair is seen to fit alone.

    Raises:
      ValueError: naming the first pair (from `first_pair` + 1) that does not.
    """
    bound = memory.memory_bound()
    for n, (src, tgt) in enumerate(zip(src_ids, tgt_ids)):
        src_len = min(len(src), cut - 1) if cut else len(src)
        widths = decode_width(src_len + 1), decode_width(len(tgt) + 1)
        need = forced_bytes(models, vocab_size, 1, *widths, param_bytes)
        if need > bound:
            raise ValueError(
                f"pair {first_pair + n + 1}: {src_len} source and {len(tgt)} target pieces; "
                f"scoring it whole would need {memory.over_bound(need)}: shorten it, split "
                "it or leave it out"
            )
    return lambda rows, s_width, t_width: (
        forced_bytes(models, vocab_size, rows, s_width, t_width, param_bytes) <= bound
    )


def format_links(links: Sequence[tuple[int, int]]) -> str:
    """Moses/Pharaoh format: "0-0 1-2 ..." (source-target), sorted by target, then source."""
    return " ".join(f"{i}-{j}" for i, j in sorted(links, key=lambda link: (link[1], link[0])))
