"""What the export formats share: the position table's size, weights as numpy arrays, and
sources cut and grouped as our search reads them (for decoding an export as ours decodes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from translate.data.tokenizer import Tokenizer

# Positions an export can embed: the rows of CTranslate2's stored position table (it refuses a
# position past it, and cuts sources at 1,024 tokens by its default `max_input_length`; a
# decoder-only prompt and its output share it) and transformers' `max_position_embeddings`.
NUM_POSITIONS = 1024


def array(param: Any) -> np.ndarray:
    """A parameter's value as a float32 numpy array of its own (the converter writes into it)."""
    return np.array(param[...], dtype=np.float32)


def source_pieces(tokenizer: Tokenizer, sentences: Sequence[str], max_len: int) -> list[list[str]]:
    """Each sentence's pieces, cut to `max_len - 1` as our search cuts them (EOS is added later).

    The same cut as batching.source_batches, so both engines read the same source.
    """
    return [
        tokenizer.pieces(ids[: max_len - 1]) if max_len else tokenizer.pieces(ids)
        for ids in tokenizer.encode(sentences)
    ]


def groups_by_length(pieces: Sequence[Sequence[str]]) -> dict[int, list[int]]:
    """Sentence indices by source length.

    Our search caps each output at (source tokens) + max_extra_len; CTranslate2 and transformers
    take one cap per call, so sentences of one length are decoded together under their cap.
    """
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(pieces):
        groups.setdefault(len(p), []).append(i)
    return dict(sorted(groups.items()))
