"""The rules a config's values must keep, each naming the flag it is about.

Each function takes the `Config` (schema.py, which imports this module) and reads its sections.

`config_rules(config)` lists them as (field, condition on its value, what it must be), in the
order `Config.validate` checks them, so a rule may rely on one above it. `SEARCH_RULES` are
those a decoding command also checks on flags of its own (translate/decoding/settings.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from collections.abc import Callable
from typing import Any

from translate.config.choices import (
    BeamStop,
    choice_rule,
    choices,
    has_type,
    is_positive_number,
    type_name,
)
from translate.config.sections import TrainCorpus

# A validation rule: (field as "section.name", condition on its value, what it must be).
Rule = tuple[str, Callable[[Any], bool], str]

# The longest output past its source's length that decoding allows (decode.max_extra_len).
MAX_EXTRA_LEN = 1024
# The values of decode.beam_stop.
BEAM_STOPS = choices(BeamStop)
# The rules of the decoding settings that a command may also take as flags of its own
# (translate-text's --beam_size ...), as {field of DecodeConfig: (condition, what it must be)}:
# config.validate and translate/decoding/settings.py check them, the one place they are written.
SEARCH_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "beam_size": (lambda v: v >= 1, "must be >= 1"),
    "length_penalty": (lambda v: math.isfinite(v) and v >= 0.0, "must be a finite number >= 0"),
    # A cap past MAX_EXTRA_LEN makes every search allocate and, on a model that does not end
    # its outputs, run that many steps in one XLA call that no signal interrupts.
    "max_extra_len": (lambda v: 0 <= v <= MAX_EXTRA_LEN, f"must be in [0, {MAX_EXTRA_LEN}]"),
    "beam_stop": (
        lambda v: v in BEAM_STOPS,
        choice_rule(BEAM_STOPS),
    ),
    "batch_size": (lambda v: v >= 1, "must be >= 1"),
    "parallel_batches": (lambda v: v >= 1, "must be >= 1"),
}


def config_rules(config) -> list[Rule]:
    """Every rule, in the order they are checked."""
    return [
        *model_rules(config),
        *data_rules(config),
        *train_rules(config),
        *decode_rules(config),
    ]


def flag_of(config, field: str) -> str:
    """`field` ("section.name") as the flag that sets it, with its value."""
    section, name = field.split(".")
    value = getattr(getattr(config, section), name)
    if isinstance(value, (tuple, list)):  # a list of corpora: as the JSON that sets it
        value = json.dumps(
            [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else repr(v) for v in value]
        )
    return f"--config.{field}={value}"


def check_types(config) -> None:
    """Refuses a value that its field's type cannot hold, or a float that is not finite."""
    for section in dataclasses.fields(config):
        for name, kind in typing.get_type_hints(type(getattr(config, section.name))).items():
            field = f"{section.name}.{name}"
            value = getattr(getattr(config, section.name), name)
            if not has_type(value, kind):
                raise ValueError(
                    f"invalid config: {flag_of(config, field)}: must be {type_name(kind)}, "
                    f"not {type(value).__name__}"
                )
            if kind is float and not math.isfinite(value):
                raise ValueError(f"invalid config: {flag_of(config, field)}: must be finite")


def check_choices(config) -> None:
    """Refuses a choice's value that is not one of its values."""
    for section in dataclasses.fields(config):
        for name, kind in typing.get_type_hints(type(getattr(config, section.name))).items():
            values = choices(kind)
            if values and getattr(getattr(config, section.name), name) not in values:
                field = f"{section.name}.{name}"
                raise ValueError(f"invalid config: {flag_of(config, field)}: {choice_rule(values)}")


def model_rules(config) -> list[Rule]:
    """The model's rules, as (field, condition on its value, rule)."""
    m = config.model
    flag = functools.partial(flag_of, config)
    return [
        ("model.num_layers", lambda v: v >= 1, "must be >= 1"),
        ("model.num_heads", lambda v: v >= 1, "must be >= 1"),
        # The position encoding pairs a sine and a cosine per frequency (Sec. 3.5).
        ("model.d_model", lambda v: v >= 2 and v % 2 == 0, "must be even and >= 2"),
        (
            "model.d_model",
            lambda v: v % m.num_heads == 0,
            f"must be divisible by {flag('model.num_heads')}",
        ),
        ("model.d_ff", lambda v: v >= 1, "must be >= 1"),
        (
            "model.num_kv_heads",
            lambda v: v == 0 or (1 <= v <= m.num_heads and m.num_heads % v == 0),
            f"must be 0 (= {flag('model.num_heads')}) or a divisor of it",
        ),
        # Rotary positions turn pairs of a head's channels.
        (
            "model.positions",
            lambda v: v != "rotary" or (m.d_model // max(m.num_heads, 1)) % 2 == 0,
            f"rotary needs an even head size ({flag('model.d_model')} / {flag('model.num_heads')})",
        ),
        ("model.dropout_rate", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
        ("model.attention_dropout_rate", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
        ("model.activation_dropout_rate", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
        (
            "model.prefix_attention",
            lambda v: v == "causal" or m.architecture == "decoder_only",
            "applies only to --config.model.architecture=decoder_only",
        ),
        # One stack reads source and target alike: there is no encoder to embed apart.
        (
            "model.share_encoder_decoder_embeddings",
            lambda v: v or m.architecture == "encoder_decoder",
            "must be true with --config.model.architecture=decoder_only",
        ),
    ]


def data_rules(config) -> list[Rule]:
    """The data's rules; some depend on the model's architecture."""
    m, d = config.model, config.data
    flag = functools.partial(flag_of, config)
    return [
        (
            "data.source",
            lambda v: v != "monolingual" or m.architecture == "decoder_only",
            "needs --config.model.architecture=decoder_only (a language model)",
        ),
        # Empty dev and test splits mean none; without a training split there is no run.
        ("data.tfds_train_split", lambda v: v != "", "must be non-empty"),
        ("data.train_prefix", lambda v: v != "", "must be non-empty"),
        ("data.src_lang", lambda v: v != "", "must be non-empty"),
        ("data.tgt_lang", lambda v: v != "", "must be non-empty"),
        (
            "data.tgt_lang",
            lambda v: v != d.src_lang,
            f"must differ from {flag('data.src_lang')}",
        ),
        # The four special ids (pad, unk, bos, eos) and at least one piece; SentencePiece
        # itself asks for more on a corpus with more distinct characters.
        ("data.vocab_size", lambda v: v >= 5, "must be >= 5"),
        ("data.vocab_sample_size", lambda v: v >= 1, "must be >= 1"),
        ("data.row_len", lambda v: v >= 1, "must be >= 1"),
        # Every pair holds at least its EOS; a longer pair than a row could never be packed.
        ("data.max_len", lambda v: v >= 1, "must be >= 1"),
        ("data.max_len", lambda v: v <= d.row_len, f"must not exceed {flag('data.row_len')}"),
        (
            "data.tokens_per_batch",
            lambda v: v >= d.row_len,
            f"must be >= {flag('data.row_len')}",
        ),
        ("data.synthetic_num_train", lambda v: v >= 1, "must be >= 1"),
        ("data.synthetic_num_dev", lambda v: v >= 1, "must be >= 1"),
        ("data.synthetic_num_test", lambda v: v >= 1, "must be >= 1"),
        ("data.src_subword_alpha", lambda v: 0.0 <= v < 1.0, "must be in [0, 1) (0 = off)"),
        ("data.tgt_subword_alpha", lambda v: 0.0 <= v < 1.0, "must be in [0, 1) (0 = off)"),
        *corpora_rules(config),
    ]


def corpora_rules(config) -> list[Rule]:
    """The rules of data.train_corpora, each naming the entry it is about."""
    d = config.data
    field = "data.train_corpora"
    rules: list[Rule] = [
        (
            field,
            lambda v: not v or d.source in ("files", "tfds"),
            "applies to --config.data.source=files or tfds",
        ),
    ]
    seen: dict[tuple[str, str], int] = {}
    tags: dict[str, int] = {}
    for i, c in enumerate(d.train_corpora):
        named = f"corpus {i + 1}"
        if not isinstance(c, TrainCorpus) or not all(
            isinstance(x, str) for x in (c.prefix, c.tfds_split, c.tag)
        ):
            return [*rules, (field, lambda v: False, f"{named}: must be a TrainCorpus of str")]
        key = ("prefix", c.prefix) if c.prefix else ("tfds_split", c.tfds_split)
        first, first_tag = seen.setdefault(key, i), tags.setdefault(c.tag, i)
        rules += [
            (
                field,
                lambda v, i=i: bool(v[i].prefix) != bool(v[i].tfds_split),
                f"{named}: give one of prefix and tfds_split",
            ),
            (
                field,
                lambda v, i=i: is_positive_number(v[i].weight),
                f"{named}: weight must be a finite number > 0, not {c.weight!r}",
            ),
            (
                field,
                lambda v, i=i: not any(ch.isspace() for ch in v[i].tag),
                f"{named}: tag {c.tag!r} must be one piece, without spaces",
            ),
            (
                field,
                lambda v, ok=first == i: ok,
                f"{named}: {key[0]} {key[1]!r} is corpus {first + 1} already",
            ),
            (
                field,
                lambda v, ok=not c.tag or first_tag == i: ok,
                f"{named}: tag {c.tag!r} is corpus {first_tag + 1}'s already",
            ),
        ]
    # Each tag takes a piece of the vocabulary, beside the four special ones.
    num_tags = len(set(tags) - {""})
    rules.append(
        (
            "data.vocab_size",
            lambda v: v >= 5 + num_tags,
            f"must be >= 5 + the {num_tags} tags of data.train_corpora",
        )
    )
    return rules


def train_rules(config) -> list[Rule]:
    """The training run's rules; some depend on the batch's shape."""
    d, t = config.data, config.train
    flag = functools.partial(flag_of, config)
    return [
        ("train.num_train_steps", lambda v: v >= 1, "must be >= 1"),
        ("train.warmup_steps", lambda v: v >= 1, "must be >= 1"),
        ("train.learning_rate_scale", lambda v: v > 0.0, "must be > 0"),
        # A decay to 0 needs steps after the warm-up to fall over.
        (
            "train.warmup_steps",
            lambda v: t.lr_decay == "rsqrt" or v < t.num_train_steps,
            f"must be below {flag('train.num_train_steps')} when {flag('train.lr_decay')}",
        ),
        # Adam divides by (1 - beta^t) and by sqrt(v) + eps (Sec. 5.3).
        ("train.adam_beta1", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
        ("train.adam_beta2", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
        ("train.adam_eps", lambda v: v > 0.0, "must be > 0"),
        ("train.weight_decay", lambda v: 0.0 <= v < 1.0, "must be in [0, 1) (0 = off)"),
        ("train.label_smoothing", lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
        ("train.ema_decay", lambda v: 0.0 <= v < 1.0, "must be in [0, 1) (0 = off)"),
        ("train.grad_accum_steps", lambda v: v >= 1, "must be >= 1"),
        # Each micro-batch needs a row (and on several devices a row per device).
        (
            "train.grad_accum_steps",
            lambda v: v <= d.tokens_per_batch // d.row_len,
            "must not exceed the rows of a batch, "
            f"{flag('data.tokens_per_batch')} // {flag('data.row_len')}",
        ),
        # NumPy's generators take no negative seed, JAX's key no seed beyond 64 bits.
        ("train.seed", lambda v: 0 <= v < 2**63, "must be in [0, 2**63)"),
        ("train.steps_per_call", lambda v: v >= 1, "must be >= 1"),
        ("train.log_every_steps", lambda v: v >= 1, "must be >= 1"),
        ("train.checkpoint_every_steps", lambda v: v >= 1, "must be >= 1"),
        # Orbax keeps this many and deletes the rest: 0 would keep no checkpoint at all.
        ("train.keep_checkpoints", lambda v: v >= 1, "must be >= 1"),
        ("train.max_consecutive_skips", lambda v: v >= 1, "must be >= 1"),
        ("train.stop_check_every_steps", lambda v: v >= 1, "must be >= 1"),
        ("train.eval_every_steps", lambda v: v >= 1, "must be >= 1"),
        (
            "train.init_from",
            lambda v: v == "" or split_init_from(v)[0] != "",
            'must be WORKDIR or WORKDIR@STEP ("" = off)',
        ),
        (
            "train.early_stopping_patience",
            lambda v: v >= 0,
            "must be >= 0 (0 = off)",
        ),
        # A language model is scored by its dev loss alone: it has no BLEU to keep or wait for.
        (
            "train.keep_best_by",
            lambda v: v == "" or d.source != "monolingual",
            f"needs dev BLEU, which a language model ({flag('data.source')}) has not",
        ),
        (
            "train.early_stopping_patience",
            lambda v: v == 0 or d.source != "monolingual",
            f"needs dev BLEU, which a language model ({flag('data.source')}) has not",
        ),
        (
            "train.profile_steps",
            lambda v: v == "" or split_profile_steps(v) is not None,
            'must be A:B with 1 <= A <= B ("" = off)',
        ),
    ]


def decode_rules(config) -> list[Rule]:
    """The search's rules, and those between averaging and the checkpoints kept."""
    t = config.train
    flag = functools.partial(flag_of, config)
    return [
        *((f"decode.{name}", ok, rule) for name, (ok, rule) in SEARCH_RULES.items()),
        ("decode.eval_num_sentences", lambda v: v >= 0, "must be >= 0 (0 = whole dev set)"),
        ("decode.average_last", lambda v: v >= 1, "must be >= 1 (1 = the last step alone)"),
        (
            "decode.alignment_layer",
            lambda v: v == -1 or 0 <= v < config.model.num_layers,
            f"must be -1 or a decoder layer, 0 to {flag('model.num_layers')} - 1",
        ),
        # Orbax deletes all but the newest keep_checkpoints: the older ones are gone by the
        # time the final evaluation would average them.
        (
            "train.keep_checkpoints",
            lambda v: v >= config.decode.average_last,
            f"must be >= {flag('decode.average_last')}, the checkpoints averaged at the end",
        ),
        # Several steps a call act only between calls: each interval ends on a call's end.
        *(
            (
                name,
                lambda v: v % max(t.steps_per_call, 1) == 0,
                f"must be a multiple of {flag('train.steps_per_call')}",
            )
            for name in (
                "train.log_every_steps",
                "train.checkpoint_every_steps",
                "train.eval_every_steps",
                "train.stop_check_every_steps",
            )
        ),
        # Steps checkpoint_every_steps apart and the last one are saved.
        (
            "decode.average_last",
            lambda v: v <= -(-t.num_train_steps // t.checkpoint_every_steps),
            f"must not exceed the {-(-t.num_train_steps // max(t.checkpoint_every_steps, 1))} "
            f"checkpoints that {flag('train.num_train_steps')} saves at "
            f"{flag('train.checkpoint_every_steps')}",
        ),
    ]


def split_init_from(text: str) -> tuple[str, int | None]:
    """`train.init_from` as (workdir, step), step None for the newest: "runs/a@4000" or "runs/a".

    Only a trailing "@" and digits name a step, so a path may hold "@" itself.
    """
    path, at, step = text.rpartition("@")
    if at and step.isdigit():
        return path, int(step)
    return text, None


def split_profile_steps(text: str) -> tuple[int, int] | None:
    """`train.profile_steps` "A:B" as (A, B), or None unless 1 <= A <= B."""
    first, colon, last = text.partition(":")
    if not (colon and first.strip().isdigit() and last.strip().isdigit()):
        return None
    first, last = int(first), int(last)
    return (first, last) if 1 <= first <= last else None
