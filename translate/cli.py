"""Running a command: one-line user errors, exit codes, signals and standard streams.

Every command (translate/train.py, evaluate.py, translate_text.py, sample.py) and every script
under scripts/ parses its flags with translate/flags.py's `parse_flags` and ends through `run`,
so all of them read flags, print help and report a user's mistake alike: one line and exit
status 2; a bug keeps its traceback. The console scripts of pyproject.toml point at the
commands themselves; this module imports none of them.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import io
import logging
import os
import pathlib
import select
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from absl import logging as absl_logging

from translate import devices
from translate.workdir import WorkdirBusy

# Exceptions that report a user's mistake when this project's code raises them itself: a bad
# flag or value, an invalid config, a missing or malformed file (ValueError, OSError: the
# messages of config/, data/text.py, workdir.py and the entry points name the flag, file or
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
    if message := platform_error_message(error):
        return message
    if not isinstance(error, USER_ERRORS):
        return None
    frames = traceback.extract_tb(error.__traceback__)
    if not frames or not os.path.realpath(frames[-1].filename).startswith(_project_dirs()):
        return None
    message = str(error)
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
        message = f"{error.filename}: {error.strerror}"
    return " ".join(message.split()) or type(error).__name__


def platform_error_message(error: BaseException) -> str | None:
    """One line naming JAX_PLATFORMS when JAX could not start the platform it names
    (`JAX_PLATFORMS=CPU`, a misspelt or uninstalled platform); None for anything else."""
    text = str(error)
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if not platforms:
        return None
    frames = traceback.extract_tb(error.__traceback__)
    if isinstance(error, AssertionError) and frames and "xla_bridge" in frames[-1].filename:
        # JAX 0.10 asserts, naming nothing, when no platform it names could start (a GPU
        # platform without its plugin installed, say).
        return (
            f"JAX_PLATFORMS={platforms}: JAX could not start that platform here (is its plugin "
            "installed, e.g. pip install -r requirements-gpu.txt for cuda?); unset it to use "
            "the CPU"
        )
    if not isinstance(error, RuntimeError) or "Unable to initialize backend" not in text:
        return None
    # JAX's own message names the platform and the known ones; its advice is for JAX users.
    reason = " ".join(text.split("(set JAX_PLATFORMS")[0].split())
    return f"JAX_PLATFORMS={platforms}: {reason} (platform names are lowercase: cpu, cuda, tpu)"


class Terminated(BaseException):
    """SIGTERM as an exception, as Python makes SIGINT a KeyboardInterrupt: the command's
    `finally` blocks and context managers run (a half-written output is removed)."""


def raise_terminated(signum, frame) -> NoReturn:
    raise Terminated()


def stop_signal_of(error: BaseException | None) -> int | None:
    """The signal behind a stop exception (SIGINT's KeyboardInterrupt, SIGTERM's Terminated)."""
    if isinstance(error, KeyboardInterrupt):
        return signal.SIGINT
    if isinstance(error, Terminated):
        return signal.SIGTERM
    return None


def deliver_lost_stops_again(previous_hook: Callable[[Any], Any]) -> Callable[[Any], None]:
    """A `sys.unraisablehook` that sends a stop signal again when Python swallowed its exception.

    Python runs a signal's handler between any two bytecodes of the main thread, also inside a
    garbage collector's callback (JAX keeps one, `_xla_gc_callback`) or a `__del__`; an exception
    raised there cannot propagate, so Python prints "Exception ignored" and carries on, and the
    command would run to its end as if never stopped. The signal is sent again from a thread a
    moment later, when the main thread has left that callback (raising from this hook would be
    swallowed the same way). Other unraisable exceptions go to `previous_hook`.
    """

    def hook(unraisable) -> None:
        signum = stop_signal_of(unraisable.exc_value)
        if signum is None:
            previous_hook(unraisable)
            return
        again = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        again.daemon = True
        again.start()

    return hook


def exit_at_once(status: int) -> NoReturn:
    """Flushes the console and ends the process without tearing the interpreter down.

    After a signal, XLA may still be compiling in threads of its own (JAX stops waiting for a
    compile when a signal arrives); the interpreter's teardown destroys the client under them
    and the process dies of a segmentation fault. What a command writes is closed by then.
    """
    for stream in [*logging.getLogger("translate").handlers, sys.stdout, sys.stderr]:
        with contextlib.suppress(Exception):  # a stream already closed has nothing to flush
            stream.flush()
    os._exit(status)


def xla_flags_error(value: str) -> str | None:
    """One line naming XLA_FLAGS when XLA would abort the process on its first word, or None.

    XLA takes `--name=value` words, or a first word that names a file of them; any other word
    ends the process in C++ when the first device starts, with no way to say which variable.
    (An unknown `--name` XLA names itself in one line; a value of the wrong type it answers
    with its whole list of flags.)
    """
    words = value.split()
    if not words or words[0].startswith("-") or os.path.isfile(words[0]):
        rest = words[1:]
    else:
        return (
            f"XLA_FLAGS={value}: {words[0]!r} is neither a flag (--xla_name=value) nor a file "
            "of flags; fix or unset XLA_FLAGS"
        )
    for word in rest:
        if not word.startswith("-"):
            return (
                f"XLA_FLAGS={value}: {word!r} is not a flag (--xla_name=value); fix or unset "
                "XLA_FLAGS"
            )
    return None


def readable_in_any_encoding() -> None:
    """Makes text the console's encoding cannot spell (German in a report line, under
    PYTHONIOENCODING=ascii or a C locale) come out escaped, not end the command with an
    encoding error after its work is done. Files are written as UTF-8 regardless."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
            stream.reconfigure(errors="backslashreplace")


class ClosedStream(io.TextIOBase):
    """Stands in for standard input or output that the process was started without (`>&-`,
    `<&-`): using it is a one-line error naming the flag that gives a file instead."""

    def __init__(self, name: str, flag: str):
        self.name, self.flag = name, flag
        self.buffer = self

    def _closed(self, *args: Any, **kwargs: Any) -> Any:
        raise ValueError(f"{self.name} is closed: give {self.flag}=FILE")

    read = readline = write = _closed

    def fileno(self) -> int:
        raise io.UnsupportedOperation(f"{self.name} is closed")

    def isatty(self) -> bool:
        return False

    def flush(self) -> None:
        pass


def guard_standard_streams() -> None:
    """Standard streams the process was started without give a one-line error (input,
    output) or are done without (error: its lines are lost), never a traceback. (A stderr
    whose reader goes away later is translate/streams.py's `say`'s to bear.)"""
    if sys.stdin is None:
        sys.stdin = ClosedStream("standard input", "--input")
    if sys.stdout is None:
        sys.stdout = ClosedStream("standard output", "--output")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the process's life


def run(
    main: Callable[[list[str]], Any], argv: Sequence[str] | None = None, teardown: bool = True
) -> None:
    """Calls `main(argv)` and exits: 0, main's own int status, 2 with one line on a user's
    mistake, 128 + the signal with one line on SIGINT or SIGTERM (after main's cleanup), or
    128 + SIGPIPE with nothing said when standard output's reader has gone (`| head -1`).
    Anything else propagates with its traceback.

    Args:
      main: an entry point's `main(argv)`.
      argv: the arguments without the program name; default `sys.argv[1:]`.
      teardown: False ends a command that returned without tearing the interpreter down
        (`finish`): its files are closed and written by then, and the teardown of a process
        that loaded JAX's CPU client takes about 0.3 s of a 2-second command.
    """
    program = pathlib.Path(sys.argv[0]).name
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    if program.endswith(".py") and spec is not None:
        program = f"python -m {spec.name}"  # run as python -m translate.train
    guard_standard_streams()
    # Before XLA's threads allocate: one arena is chosen at a first malloc.
    devices.keep_freed_memory()
    readable_in_any_encoding()
    if message := xla_flags_error(os.environ.get("XLA_FLAGS", "")):
        sys.stderr.write(f"{program}: error: {message}\n")
        sys.exit(2)
    previous = None
    previous_unraisable_hook = sys.unraisablehook
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, raise_terminated)
        sys.unraisablehook = deliver_lost_stops_again(previous_unraisable_hook)
    try:
        status = main(list(sys.argv[1:] if argv is None else argv))
    except (SystemExit, RuntimeError, AssertionError, *USER_ERRORS) as error:
        if standard_output_gone(error):
            # As a Unix tool that SIGPIPE ends: the reader has what it took, and nothing else
            # was left to write (an output file of the command is kept as it was).
            write_standard_output_to_null()
            status = 128 + signal.SIGPIPE
        else:
            message = user_error_message(error)
            if message is None:
                raise
            sys.stderr.write(f"{program}: error: {message}\n")
            sys.exit(2)
    except (KeyboardInterrupt, Terminated) as stopped:
        signum = stop_signal_of(stopped)
        sys.stderr.write(f"{program}: stopped by {signum.name}\n")
        exit_at_once(128 + signum)
    finally:
        sys.unraisablehook = previous_unraisable_hook
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    status = status if isinstance(status, int) else 0
    if not teardown:
        finish(program, status)
    sys.exit(status)


def standard_output_gone(error: BaseException) -> bool:
    """Whether `error` is a write to standard output whose reader has gone (`| head -1`).

    Python ignores SIGPIPE, so such a write raises EPIPE where a C tool would be ended by the
    signal; `Outputs` names the stream "<stdout>", a print names none. Standard output is
    asked as well, so that a pipe the command opened itself (an --output FIFO) is not taken
    for it.
    """
    if not isinstance(error, OSError) or error.errno != errno.EPIPE:
        return False
    if error.filename not in (None, "<stdout>"):
        return False
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def write_standard_output_to_null() -> None:
    """Points standard output's descriptor at /dev/null, so that what its buffer still holds
    is dropped at the exit's flush rather than failing there a second time."""
    with contextlib.suppress(OSError, ValueError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def finish(program: str, status: int) -> NoReturn:
    """Ends a command whose work is done as the interpreter would, less its teardown: the
    console flushed (a failure to is an error, as at a normal exit), the `atexit` functions
    run (logging's among them), then the process ends."""
    try:
        sys.stdout.flush()
    except OSError as e:
        with contextlib.suppress(OSError):
            sys.stderr.write(f"{program}: error: <stdout>: {e.strerror or e}\n")
        status = status or 120  # what Python exits with when the flush at its exit fails
    atexit._run_exitfuncs()
    exit_at_once(status)


def check_writable(directory: str | os.PathLike, flag: str) -> None:
    """Checks that `directory` (or, while it does not exist, the directories that would hold
    it) can be written, before the work whose output goes there. Leaves nothing behind.

    Raises:
      ValueError: naming `flag` and the directory, and saying to give --output elsewhere.
    """
    directory = pathlib.Path(directory).absolute()
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".write-check.", dir=directory))
    except OSError as e:
        raise ValueError(
            f"{flag}: cannot write in {directory} ({e.strerror}): give --output=DIR where you "
            "can write"
        ) from None
    finally:
        for made in missing:  # deepest first
            with contextlib.suppress(OSError):
                made.rmdir()


class WriteFailuresSaidOnce(logging.Filter):
    """Drops the log records of a failed write (a full disk) that Orbax's background save
    threads write with their tracebacks, several times over (hundreds of lines), before the
    save's error reaches the command, which says it in one line naming the checkpoint
    (checkpoint.write_error)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        texts, seen = [record.getMessage()], set()
        while error is not None and id(error) not in seen:
            if isinstance(error, OSError):
                return False
            texts.append(str(error))
            seen.add(id(error))
            error = error.__cause__ or error.__context__
        text = "\n".join(texts)
        # Orbax's own report ends in the OS error's code; tensorstore's (a parameters-only save,
        # best/ or an average, reaching asyncio's "never retrieved" report) names the write.
        failed_write = "Error writing" in text and "Failed writing" in text
        return "os_error_code=" not in text and not failed_write


def setup_logging() -> None:
    """Progress lines on stderr from the `translate` logger only (libraries stay quiet): the
    log of the commands that train (translate-train, translate-distill)."""
    log = logging.getLogger("translate")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    quiet_libraries()


def quiet_libraries() -> None:
    """Keeps Orbax's per-save INFO lines and read-only manager warnings off the console, and
    the tracebacks of its save threads for a failed write (the command says it once)."""
    absl_logging.set_verbosity(absl_logging.ERROR)
    if not logging.root.handlers:
        # absl calls logging.basicConfig() at its first log call when the root logger has no
        # handler, and that handler would print our own lines as "WARNING:translate:WARNING:
        # ...". A handler of our own first: every line as it is written.
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.root.addHandler(handler)
    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, WriteFailuresSaidOnce) for f in logger.filters):
            logger.addFilter(WriteFailuresSaidOnce())
