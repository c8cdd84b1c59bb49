"""How every command ends: a user's mistake as one line and exit status 2, a bug's traceback.

The console scripts of pyproject.toml (`translate-train`, `translate-evaluate`,
`translate-text`) are the functions at the bottom; `python -m translate.train` and the scripts
under scripts/ end through `run` too, so every entry point reports errors alike.
"""

from __future__ import annotations

import os
import pathlib
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

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


def train() -> None:
    """`translate-train`: python -m translate.train."""
    from translate import train as command

    run(command.main)


def evaluate() -> None:
    """`translate-evaluate`: python -m translate.evaluate."""
    from translate import evaluate as command

    run(command.main)


def text() -> None:
    """`translate-text`: python -m translate.translate."""
    from translate import translate as command

    run(command.main)


def sample() -> None:
    """`translate-sample`: python -m translate.sample."""
    from translate import sample as command

    run(command.main)
