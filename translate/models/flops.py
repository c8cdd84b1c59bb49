"""Model FLOPs counted from shapes, for utilisation figures; each architecture counts its own.

A multiply-add counts as 2 FLOPs. Only matrix products are counted (projections, feed-forward,
attention scores and mixing, the vocabulary projection); norms, softmax, dropout and the
optimizer are left out, as is usual for model-FLOPs utilisation. A training step costs 3x the
forward pass (the backward pass computes two products for each forward one).

Each architecture's class says its forward FLOPs (`Transformer.forward_flops`,
`DecoderOnlyTransformer.forward_flops`); this module picks the configured one through the
factory, and reads the per-sentence lengths off a packed batch.

Attention within a packed row is counted per sentence for the "real" figure (what the model
needs) and over the whole row for the "padded" figure (what the masked kernel computes).
Causal self-attention is counted as the full square in both, as the kernel computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from translate.config import ModelConfig
from translate.models.factory import architecture

if TYPE_CHECKING:  # for annotations only: the data pipeline feeds the model, not the reverse
    from translate.data.batching import Batch


def forward_flops(
    model: ModelConfig,
    vocab_size: int,
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
) -> float:
    """Forward FLOPs for sentence pairs with these lengths (tokens incl. EOS / BOS).

    Pass the packed rows' full lengths (row_len for every row) to count the padded cost.
    """
    src = np.asarray(src_lengths, np.float64)
    tgt = np.asarray(tgt_lengths, np.float64)
    if src.shape != tgt.shape:
        raise ValueError(f"{src.shape} source lengths but {tgt.shape} target lengths")
    return architecture(model).forward_flops(model, vocab_size, src, tgt)


def train_flops(
    model: ModelConfig,
    vocab_size: int,
    src_lengths: Sequence[int] | np.ndarray,
    tgt_lengths: Sequence[int] | np.ndarray,
) -> float:
    """FLOPs of one training step (forward + backward) on these sentence pairs."""
    return 3.0 * forward_flops(model, vocab_size, src_lengths, tgt_lengths)


def batch_lengths(batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """Per-sentence (source, target) lengths of a packed batch from the data pipeline.

    Sentence k of a row on one side is sentence k of that row on the other, so counting the
    tokens of each (row, segment id) on both sides pairs them up.
    """
    lengths = []
    for segments in (batch.src_segments, batch.tgt_segments):
        seg = np.asarray(segments).reshape(-1, segments.shape[-1])  # [rows, row_len]
        rows = np.repeat(np.arange(seg.shape[0]), seg.shape[1])
        ids = rows * (seg.shape[1] + 1) + seg.reshape(-1)
        lengths.append(np.bincount(ids[seg.reshape(-1) > 0]))
    src, tgt = lengths
    size = max(len(src), len(tgt))
    src, tgt = np.pad(src, (0, size - len(src))), np.pad(tgt, (0, size - len(tgt)))
    used = (src > 0) | (tgt > 0)
    return src[used], tgt[used]
