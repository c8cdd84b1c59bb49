"""The choices a config field offers, each declared once, and the checks of a value's type.

Validation, `--help` and the code that acts on a field read these (`choices`); that code
refuses a value outside them (`check_choice`).
"""

from __future__ import annotations

import difflib
import math
import typing
from typing import Any, Literal

# Each choice a config field offers, declared once: validation, `--help` and the code that acts
# on the field read these (`choices`), and that code refuses a value outside them.
DropoutBits = Literal["threefry", "hash"]
ComputeDtype = Literal["auto", "float32", "bfloat16", "float16"]
MatmulDtype = Literal["compute", "bfloat16"]
AttentionKernel = Literal["auto", "xla", "cudnn"]
NormPosition = Literal["post", "pre"]
Architecture = Literal["encoder_decoder", "decoder_only"]
PrefixAttention = Literal["causal", "bidirectional"]
PositionScheme = Literal["sinusoidal", "rotary", "relative"]
Normalization = Literal["layernorm", "rmsnorm"]
FeedForwardKind = Literal["relu", "gelu", "silu", "swiglu", "geglu"]
DataSource = Literal["files", "synthetic", "tfds", "monolingual"]
LrDecay = Literal["rsqrt", "linear", "cosine"]
Optimizer = Literal["adam", "muon"]
LossKeep = Literal["auto", "exp", "logits", "logits_bf16"]
OnNonfinite = Literal["stop", "skip"]
KeepBestBy = Literal["dev_bleu", ""]
BeamStop = Literal["exact", "finished"]


def choices(kind: Any) -> tuple | None:
    """The values a field of type `kind` may take when it is a choice (a Literal), else None."""
    return typing.get_args(kind) if typing.get_origin(kind) is Literal else None


def choice_rule(values: tuple) -> str:
    """ "must be 'a', 'b' or 'c'": the rule a choice's value breaks."""
    quoted = [f"'{v}'" for v in values]
    return "must be " + " or ".join(
        [", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted
    )


def check_choice(value: Any, kind: Any, name: str) -> Any:
    """`value` when it is one of the choice `kind`'s; ValueError naming `name` otherwise. For code
    that branches on a choice: a value it does not know is refused, never read as another."""
    if value not in choices(kind):
        raise ValueError(f"{name}={value!r}: {choice_rule(choices(kind))}")
    return value


def is_positive_number(value: Any) -> bool:
    """Whether `value` is an int or float (not a bool), finite and > 0."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def did_you_mean(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {close[0]}?)" if close else f"; its fields are {', '.join(names)}"


def has_type(value: Any, kind: Any) -> bool:
    """Whether a field of type `kind` may hold `value` (an int may stand for a float)."""
    if isinstance(value, bool):
        return kind is bool
    if typing.get_origin(kind) is tuple:  # tuple[Item, ...]: a config file may give a list
        item = typing.get_args(kind)[0]
        return isinstance(value, (tuple, list)) and all(isinstance(v, item) for v in value)
    if choices(kind):
        return isinstance(value, str)
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def type_name(kind: Any) -> str:
    """The name a message gives a field's type: a choice's values are strings."""
    if typing.get_origin(kind) is tuple:
        return f"a tuple of {typing.get_args(kind)[0].__name__}"
    return "str" if choices(kind) else kind.__name__
