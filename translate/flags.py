"""A command's flags and --help: `parse_flags`, and the flags several commands share.

`--name=value` and `--name value` both work; a command's own flags are `Flag`s (a default,
whose type parses the value, and what the flag does), and `--config.SECTION.FIELD=value` sets a
config field, checked by name and type against translate/config/. `--help` prints the command's
usage, its flags and, for the sections it takes, every config field with the comment above it.
"""

from __future__ import annotations

import dataclasses
import sys
import textwrap
import typing
from collections.abc import Sequence
from typing import Any

from translate import compilation
from translate.config import (
    CONFIG_SECTIONS,
    Config,
    choices,
    config_field_type,
    field_descriptions,
    parse_value,
)


@dataclasses.dataclass(frozen=True)
class Flag:
    """An entry point's own flag: its default, whose type parses the value, and what it does.

    A list default collects the flag's repeated values; None takes any text.
    """

    default: Any
    help: str


# What a bool flag given without "=" may take as its value from the next argument.
_BOOL_WORDS = ("true", "false", "1", "0")


def _flag_type(default: Any) -> Any:
    if isinstance(default, list) or default is None:
        return str
    return type(default)


def format_help(doc: str, known: dict[str, Any], sections: Sequence[str]) -> str:
    """An entry point's --help: its docstring, its flags, then the config fields it takes.

    Every line after the docstring comes from `known` (the entry point's `Flag`s) and from
    the comments beside the config dataclasses' fields, so the help cannot fall behind them.
    """
    width = 100

    def entry(name: str, kind: Any, default: Any, text: str) -> list[str]:
        values = choices(kind)
        shown = "{" + ",".join(v or "''" for v in values) + "}" if values else ""
        # A tuple of records (data.train_corpora) is given as a JSON list.
        listed = kind is tuple or typing.get_origin(kind) is tuple
        shown = shown or ("JSON_LIST" if listed else kind.__name__.upper())
        head = f"  --{name}=" + shown
        if isinstance(default, list):
            head += "  (repeatable)"
        elif default is not None:
            head += f"  (default {default!r})"
        body = textwrap.wrap(text or "(no description)", width - 6)
        return [head, *(f"      {line}" for line in body)]

    lines = [textwrap.dedent(doc).strip(), "", "flags:"]
    for name, spec in known.items():
        flag = spec if isinstance(spec, Flag) else Flag(spec, "")
        lines += entry(name, _flag_type(flag.default), flag.default, flag.help)
    lines += ["  -h, --help", "      Show this help and exit."]
    if sections:
        lines += [
            "",
            "config fields (--config.SECTION.FIELD=VALUE or --config.SECTION.FIELD VALUE; "
            "the defaults",
            "shown are the paper's base model, which a config file changes):",
        ]
    defaults = Config()
    for section in sections:
        values = getattr(defaults, section)
        described = field_descriptions(type(values))
        for name, kind in typing.get_type_hints(type(values)).items():
            lines += entry(
                f"config.{section}.{name}", kind, getattr(values, name), described.get(name, "")
            )
    return "\n".join(lines) + "\n"


def parse_flags(
    argv: Sequence[str],
    known: dict[str, Any],
    doc: str = "",
    sections: Sequence[str] = CONFIG_SECTIONS,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Splits flags into the entry point's own flags and config overrides; -h prints the help.

    `--name=value` and `--name value` both work. A bool flag alone means true, and takes a
    following `true`, `false`, `1` or `0` as its value.

    Args:
      argv: command-line arguments without the program name.
      known: the entry point's own flags: a `Flag` each (or a bare default, undocumented); a
        default's type parses the value, a list default collects repeated flags.
      doc: what --help prints above the flags: the entry point's usage (its module docstring).
      sections: the config sections whose fields `--config.SECTION.FIELD` may set, all by
        default; () for a command that takes no config overrides.

    Returns:
      (flags, overrides): flag values by name, and `section.field -> text` config overrides.

    Raises:
      SystemExit(0) after printing the help for -h or --help.
      ValueError naming the flag for an unknown flag, a missing value or a value of the
        wrong type.
    """
    argv = list(argv)
    if "-h" in argv or "--help" in argv:
        sys.stdout.write(format_help(doc, known, sections))
        raise SystemExit(0)
    defaults = {n: (s.default if isinstance(s, Flag) else s) for n, s in known.items()}
    flags = {n: (list(d) if isinstance(d, list) else d) for n, d in defaults.items()}
    overrides: dict[str, str] = {}
    seen: dict[str, str] = {}  # each flag's text, for a flag given twice
    position = 0
    while position < len(argv):
        arg = argv[position]
        position += 1
        if not arg.startswith("--"):
            raise ValueError(
                f"unexpected argument {arg!r}; flags look like --name=value or --name value"
            )
        name, has_value, text = arg[2:].partition("=")
        kind = _flag_kind(name, defaults, sections)
        if not has_value:
            following = argv[position] if position < len(argv) else None
            if kind is bool:
                text = "true"
                if following is not None and following.lower() in _BOOL_WORDS:
                    text, position = following, position + 1
            elif following is None or following.startswith("--"):
                raise ValueError(f"--{name} needs a value: --{name}=VALUE or --{name} VALUE")
            else:
                text, position = following, position + 1
        if not isinstance(defaults.get(name), list):
            # The same flag twice with two values is a mistake (an edited command line, a
            # script's default and the user's): which one was meant cannot be known.
            if seen.setdefault(name, text) != text:
                raise ValueError(
                    f"--{name} is given twice, as {seen[name]!r} and {text!r}; give it once"
                )
        if name.startswith("config."):
            overrides[name[len("config.") :]] = text
        elif isinstance(defaults[name], list):
            flags[name].append(text)
        else:
            flags[name] = parse_value(text, kind, f"--{name}")
    return flags, overrides


def _flag_kind(name: str, defaults: dict[str, Any], sections: Sequence[str]) -> type:
    """The type that parses flag `name`'s value; ValueError for a flag this command lacks."""
    if name.startswith("config."):
        dotted = name[len("config.") :]
        kind = config_field_type(dotted)
        if dotted.split(".")[0] not in sections:
            allowed = ", ".join(f"--config.{s}.*" for s in sections)
            raise ValueError(
                f"--{name}: this command takes "
                + (f"only {allowed}" if sections else "no --config.* flags")
            )
        return kind
    if name in defaults:
        return _flag_type(defaults[name])
    raise ValueError(
        f"unknown flag --{name}; known flags: "
        + ", ".join(f"--{k}" for k in sorted(defaults))
        + " (--help lists them)"
    )


def compilation_cache_flag() -> dict[str, Flag]:
    """The flag of every command that compiles: where its compiled programs are kept."""
    return {"compilation_cache": Flag("", compilation.FLAG_HELP)}


def checkpoint_flags(use: str) -> dict[str, Flag]:
    """The `--step` and `--average` flags of a command that reads a workdir's checkpoints.

    Args:
      use: what the command does with the model, as in "decode with" or "sample from".
    """
    return {
        "step": Flag(-1, f"The checkpoint step to {use}; -1: the newest."),
        "average": Flag(
            0, f"{use[0].upper()}{use[1:]} the mean parameters of the newest N checkpoints."
        ),
        "params": Flag(
            "auto",
            "Which parameters to read: 'auto' (a run's moving average when it kept one, "
            "train.ema_decay; else the parameters), 'ema' or 'raw' (the parameters themselves).",
        ),
    }


def matmul_dtype_flag() -> dict[str, Flag]:
    """The flag of a command that decodes or scores: the products' dtype, the model's or not."""
    return {
        "matmul_dtype": Flag(
            "",
            "Decode with these products instead of the model's own (config.model.matmul_dtype): "
            "'compute' (float32 on the CPU: compares a model trained with bfloat16 products "
            "exactly with its float32 export) or 'bfloat16'; default: the model's.",
        )
    }


def alignment_flags() -> dict[str, Flag]:
    """The flags of a command that writes word alignments (translate-text, translate-score)."""
    return {
        "alignment": Flag(
            "",
            "Write word alignments to FILE, one line per output line: Moses/Pharaoh 'i-j' pairs "
            "(source word i, target word j, from 0; words are whitespace tokens).",
        ),
        "alignment_pieces": Flag(False, "Align SentencePiece pieces instead of words."),
        "alignment_layer": Flag(
            -1,
            "The decoder layer (from 0) whose cross-attention, heads averaged, aligns; -1: the "
            "workdir's config.decode.alignment_layer (chosen on val for the recipes), else the "
            "second-to-last layer.",
        ),
    }


def check_alignment_flags(flags: dict[str, Any]) -> None:
    """Refuses `alignment_flags` that say how to align without --alignment, which asks for it."""
    defaults = alignment_flags()
    for name in ("alignment_pieces", "alignment_layer"):
        if flags[name] != defaults[name].default and not flags["alignment"]:
            raise ValueError(f"--{name} says how to align: give --alignment=FILE too")


def checkpoint_choice(flags: dict[str, Any]) -> tuple[int | None, int]:
    """(step, average) from `checkpoint_flags`' values: step None means the newest."""
    return (None if flags["step"] == -1 else flags["step"]), flags["average"]
