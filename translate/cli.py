"""Running a command: its flags and --help, one-line user errors, and exit codes.

Every command (translate/train.py, evaluate.py, translate_text.py, sample.py) and every script
under scripts/ parses its flags with `parse_flags` and ends through `run`, so all of them read
flags, print help and report a user's mistake alike: one line and exit status 2; a bug keeps
its traceback. The console scripts of pyproject.toml point at the commands themselves; this
module imports none of them.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import textwrap
import traceback
import typing
from collections.abc import Callable, Sequence
from typing import Any

from absl import logging as absl_logging

from translate.config import (
    CONFIG_SECTIONS,
    Config,
    config_field_type,
    field_descriptions,
    parse_value,
)
from translate.workdir import WorkdirBusy

# Exceptions that report a user's mistake when this project's code raises them itself: a bad
# flag or value, an invalid config, a missing or malformed file (ValueError, OSError: the
# messages of config.py, text.py, workdir.py and the entry points name the flag, file or
# line), a workdir that another run holds (WorkdirBusy). The same types raised inside a
# library are bugs or surprises and keep their traceback.
USER_ERRORS = (ValueError, OSError, WorkdirBusy)


def _project_dirs() -> tuple[str, ...]:
    """Where this project's own code lives: the package (with its installed example configs)
    and, in a checkout, scripts/ and configs/ beside it."""
    package = pathlib.Path(__file__).resolve().parent
    dirs = [package]
    if (package.parent / "pyproject.toml").is_file():
        dirs += [package.parent / "scripts", package.parent / "configs"]
    return tuple(str(d) + os.sep for d in dirs)


def user_error_message(error: BaseException) -> str | None:
    """The one line to print for a user's mistake; None for anything else (a bug).

    A user's mistake is `SystemExit` with a message (an entry point's own refusal) or one of
    `USER_ERRORS` raised by this project's own code rather than inside a library it calls.
    """
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, str) else None
    if not isinstance(error, USER_ERRORS):
        return None
    frames = traceback.extract_tb(error.__traceback__)
    if not frames or not os.path.realpath(frames[-1].filename).startswith(_project_dirs()):
        return None
    message = str(error)
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        message = f"{error.filename}: {error.strerror}"
    return " ".join(message.split()) or type(error).__name__


def run(main: Callable[[list[str]], Any], argv: Sequence[str] | None = None) -> None:
    """Calls `main(argv)` and exits: 0, main's own int status, or 2 with one line on a
    user's mistake. Anything else propagates with its traceback.

    Args:
      main: an entry point's `main(argv)`.
      argv: the arguments without the program name; default `sys.argv[1:]`.
    """
    program = pathlib.Path(sys.argv[0]).name
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if program.endswith(".py") and spec is not None:
        program = f"python -m {spec.name}"  # run as python -m translate.train
    try:
        status = main(list(sys.argv[1:] if argv is None else argv))
    except (SystemExit, *USER_ERRORS) as error:
        message = user_error_message(error)
        if message is None:
            raise
        sys.stderr.write(f"{program}: error: {message}\n")
        sys.exit(2)
    sys.exit(status if isinstance(status, int) else 0)


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
        head = f"  --{name}={kind.__name__.upper()}"
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
    position = 0
    while position < len(argv):
        arg = argv[position]
        position += 1
        if not arg.startswith("--"):
            raise ValueError(
                f"unexpected argument {arg!r}; flags look like --name=value or --name value"
            )
        name, has_value, text = arg[2:].partition("=")
        if name.startswith("config."):
            dotted = name[len("config.") :]
            kind = config_field_type(dotted)
            if dotted.split(".")[0] not in sections:
                allowed = ", ".join(f"--config.{s}.*" for s in sections)
                raise ValueError(
                    f"--{name}: this command takes "
                    + (f"only {allowed}" if sections else "no --config.* flags")
                )
        elif name in defaults:
            kind = _flag_type(defaults[name])
        else:
            raise ValueError(
                f"unknown flag --{name}; known flags: "
                + ", ".join(f"--{k}" for k in sorted(defaults))
                + " (--help lists them)"
            )
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
        if name.startswith("config."):
            overrides[name[len("config.") :]] = text
        elif isinstance(defaults[name], list):
            flags[name].append(text)
        else:
            flags[name] = parse_value(text, kind, f"--{name}")
    return flags, overrides


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
    }


def checkpoint_choice(flags: dict[str, Any]) -> tuple[int | None, int]:
    """(step, average) from `checkpoint_flags`' values: step None means the newest."""
    return (None if flags["step"] == -1 else flags["step"]), flags["average"]


def quiet_libraries() -> None:
    """Keeps Orbax's per-save INFO lines and read-only manager warnings off the console."""
    absl_logging.set_verbosity(absl_logging.ERROR)
