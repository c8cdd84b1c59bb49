"""What a command does first: Ctrl-C while it imports said in one line, and JAX imported
without the file-path library it does not need.

`interrupts_said_in_one_line()` is called at the top of every command module, before its heavy
imports (JAX, Flax, Orbax: a second or more), and undone once they are in: a Ctrl-C meanwhile
ends the command with one line, as it does later (translate/cli.py), not with a traceback of
the interrupted import (or an abort inside an extension's initialisation).

`import jax` prefers `etils.epath` for its own file I/O (the persistent compilation cache's
directory) whenever it is installed, and Orbax installs it. Importing it costs about 0.1 s on a
2-core machine, most of it `unittest` and `unittest.mock` pulled in by `etils.epath.testing`:
7% of a one-sentence `translate-text` (BENCHMARKS.md). JAX falls back to `pathlib`,
which serves every local directory, so the commands that read no Orbax checkpoint (translate-text)
import JAX through `import_jax()`: JAX is imported while `etils.epath` cannot be found, and then
the module can be imported again as usual by anyone who needs it (Orbax, for one).

A compilation cache that only `etils.epath` can reach (JAX_COMPILATION_CACHE_DIR=gs://...) keeps
JAX's usual import.

`drop_reports_into_closed_loops()`, which every checkpoint save and restore calls, keeps the
process's `sys.unraisablehook` from printing hundreds of tracebacks after an Orbax save that
failed (a full disk): the one hook of a process's own that a library forces on it.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

_EPATH = "etils.epath"


def wants_epath() -> bool:
    """Whether the user's own JAX cache setting names a non-local path (a URL)."""
    return "://" in os.environ.get("JAX_COMPILATION_CACHE_DIR", "")


def import_jax() -> None:
    """Imports JAX without `etils.epath` (see the module's docstring); a no-op once JAX is in."""
    if "jax" in sys.modules or _EPATH in sys.modules or wants_epath():
        return
    sys.modules[_EPATH] = None  # type: ignore[assignment]  # `import` raises ImportError
    try:
        import jax  # noqa: F401
    finally:
        del sys.modules[_EPATH]


def interrupts_said_in_one_line() -> Callable[[], None]:
    """Until the returned function is called, Ctrl-C (SIGINT) ends the process at once with one
    line, `PROGRAM: stopped by SIGINT`, and status 130: nothing has been read or written while
    a command's modules import, and an exception raised inside an extension's initialisation
    would come out as an ImportError's traceback, or abort the process."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGINT)

    def stop(signum: int, frame: Any) -> None:
        program = pathlib.Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "translate"
        os.write(2, f"{program}: stopped by SIGINT\n".encode())
        os._exit(128 + signum)

    signal.signal(signal.SIGINT, stop)

    def undo() -> None:
        if signal.getsignal(signal.SIGINT) is stop:
            signal.signal(signal.SIGINT, previous)

    return undo


def is_report_into_a_closed_loop(unraisable: Any) -> bool:
    """Whether an unraisable exception is a tensorstore write reporting its end to the event
    loop of a save that has already failed.

    Orbax runs a save's writes in an asyncio loop of its own (`asyncio_utils.run_sync`) and
    closes that loop as soon as the first write fails (a full disk). The writes still in
    flight finish later, and each one's callback, called from tensorstore's threads, calls
    `loop.call_soon_threadsafe` on the closed loop: a RuntimeError that tensorstore can only
    hand to `sys.unraisablehook`, which prints its traceback, up to hundreds of them. The
    failure they follow is the save's own error, which the caller reports once
    (`write_error`).
    """
    error = unraisable.exc_value
    if unraisable.object is not None or not isinstance(error, RuntimeError):
        return False
    if str(error) != "Event loop is closed":
        return False
    frames = traceback.extract_tb(unraisable.exc_traceback)
    return any(f.name == "call_soon_threadsafe" and "asyncio" in f.filename for f in frames)


class _DropReportsIntoClosedLoops:
    """A `sys.unraisablehook` that drops `is_report_into_a_closed_loop` and passes every other
    unraisable exception to the hook it replaced."""

    def __init__(self, previous: Callable[[Any], Any]):
        self.previous = previous

    def __call__(self, unraisable: Any) -> None:
        if not is_report_into_a_closed_loop(unraisable):
            self.previous(unraisable)


def drop_reports_into_closed_loops() -> None:
    """Installs `_DropReportsIntoClosedLoops` over the current `sys.unraisablehook`, unless it
    is that already; every save and restore calls it, so a hook set since (a command's,
    pytest's) is kept and wrapped. Process-wide, since the reports come from tensorstore's
    threads at any moment after a failed save, also once the caller has moved on."""
    if not isinstance(sys.unraisablehook, _DropReportsIntoClosedLoops):
        sys.unraisablehook = _DropReportsIntoClosedLoops(sys.unraisablehook)
