"""What the export formats share: the model settings each implements, the position table's size,
weights as numpy arrays, and sources cut and grouped as our search reads them (for decoding an
export as ours decodes)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from translate.config import ModelConfig
from translate.data.tokenizer import Tokenizer


class Decision(NamedTuple):
    """What an export does with one model field.

    `accepted`: the values it implements: None for every value (a size it reads off the
    weights, a setting of training alone); a function of the model's config where the field's
    meaning depends on another; else a tuple of the values it computes. `why`: why every value
    is taken, or the reason a value outside `accepted` is refused. `refused`: for a choice
    (a Literal field) that changes what the model computes, each other value of the choice
    with the reason it is refused, so that the export has decided every value (`decide` builds
    it); a value in neither, added to the choice after the export was written, is refused.
    """

    accepted: tuple | Callable[[ModelConfig], bool] | None
    why: str
    refused: Mapping[Any, str] | None = None


def decide(accepted: Sequence, refused: Mapping[Any, str]) -> Decision:
    """A choice decided per value: the values the export computes (often the keys of the table
    that computes them) and each refused value's reason."""
    return Decision(tuple(accepted), "", dict(refused))


def refusal(config: ModelConfig, implements: Mapping[str, Decision]) -> str | None:
    """Why an export refuses this model, or None: it fails closed.

    Every field of the model's config must have a decision in `implements`; a field without
    one (added to the model after the export was written) is refused by name, and so is a value
    of a choice that the export has not decided, so that a model the export does not know is
    never written as one it does.
    """
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        decision = implements.get(field.name)
        if decision is None:
            return (
                f"the export does not know model.{field.name} (={value!r}): it implements "
                "only the settings it lists (translate/engines/)"
            )
        accepted = decision.accepted
        if callable(accepted) and not accepted(config):
            return decision.why
        if isinstance(accepted, tuple) and value not in accepted:
            if decision.refused is None:
                return decision.why
            return decision.refused.get(
                value,
                f"the export does not know model.{field.name}={value!r}: it computes "
                + ", ".join(map(repr, accepted))
                + " (translate/engines/)",
            )
    return None


# The decisions every export shares; each format adds its own for the other fields.
SHARED_DECISIONS = {
    **{
        name: Decision(None, "read off the weights")
        for name in ("num_layers", "d_model", "num_heads", "d_ff")
    },
    **{
        name: Decision(None, "training only")
        for name in (
            "dropout_rate",
            "attention_dropout_rate",
            "activation_dropout_rate",
            "dropout_bits",
        )
    },
    # The weights are written in float32 (or a quantization's type); how our model rounded its
    # products, and which attention kernel it ran, are ours to choose, not the weights'.
    "compute_dtype": Decision(None, "the weights are float32"),
    "matmul_dtype": Decision(None, "the weights are float32"),
    "attention": Decision(None, "a kernel of ours"),
}


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
        for ids in tokenizer.encode_source(sentences)
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
