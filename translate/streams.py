"""Lines in, lines out: how the text commands read their input and write their outputs.

`read_chunks` reads lines as they arrive (a terminal or a slow pipe a line at a time, a file in
large chunks), and `read_parallel` pairs the lines of parallel inputs; `Outputs` writes a
command's output files, each replaced only once the command has finished (a failed or
interrupted run leaves an earlier file as it was; standard output, a pipe or a device streams
as it goes); `check_output_file` refuses, before anything is opened, an output whose writing
would destroy an input or a run's files. translate-text and translate-score read and write
through this module.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import stat
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import BinaryIO

from translate.atomic import AtomicFile, remove_stale
from translate.data.tokenizer import UNK_ID
from translate.workdir import check_output_path

# Bytes asked of the operating system per read.
READ_BYTES = 1 << 16


def read_chunks(stream: BinaryIO, name: str, size: int) -> Iterator[list[str]]:
    """Lists of at most `size` lines without their line ends; only "\\n" ends a line.

    A chunk ends at `size` lines or where the input pauses: the lines already written are
    decoded while no more are waiting. A file, or a pipe that a fast writer keeps full, gives
    chunks of `size` lines (decoded in length-sorted batches, fast); a terminal, or a pipe
    written a line at a time, gives each line as soon as it arrives (interactive).
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # in memory: all there at once
        fd = None
    number = 0

    def decode(raw: bytes) -> str:
        try:
            return raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            raise ValueError(f"{name}:{number}: not valid UTF-8 ({e.reason})") from None

    pending = bytearray()  # read but not yet a whole line
    chunk: list[str] = []
    while True:
        data = stream.read(READ_BYTES) if fd is None else os.read(fd, READ_BYTES)
        if data:
            pending += data
            *whole, rest = pending.split(b"\n")
            pending = bytearray(rest)
            for raw in whole:
                number += 1
                chunk.append(decode(raw))
                if len(chunk) == size:
                    yield chunk
                    chunk = []
            if fd is None or waiting(fd):
                continue
        elif pending:  # the last line has no line end
            number += 1
            chunk.append(decode(bytes(pending)))
            pending.clear()
        if chunk:
            yield chunk
            chunk = []
        if not data:
            return


def read_parallel(paths: Mapping[str, str], size: int) -> Iterator[tuple[list[str], ...]]:
    """The lines of parallel files ({flag: path}) side by side: tuples of one list per file,
    line n of each at the same place, at most `size` lines a list.

    Lines are paired, not chunks: each file is read by `read_chunks`, whose chunks end where
    that input pauses, so two pipes (`--src=<(zcat a.gz) --tgt=<(zcat b.gz)`), or a pipe and a
    file, give chunks of different lengths. What is paired so far is given as soon as any
    input pauses. Regular files are counted first, so that files of different lengths are
    refused before a line is given.

    Raises:
      ValueError: naming the flags and the line where the shorter input ends, or the file and
        line of a line that is not UTF-8.
    """
    flags = list(paths)
    counts = [count_lines(path) for path in paths.values()]
    if None not in counts and len(set(counts)) > 1:
        raise different_lengths(paths, flags[counts.index(min(counts))], min(counts))
    with contextlib.ExitStack() as files:
        readers = [
            read_chunks(files.enter_context(open(path, "rb")), path, size)
            for path in paths.values()
        ]
        pending: list[list[str]] = [[] for _ in flags]
        ended = [False] * len(flags)
        paired = 0
        while True:
            for n, reader in enumerate(readers):
                if not pending[n] and not ended[n]:
                    chunk = next(reader, None)
                    ended[n] = chunk is None
                    pending[n] = chunk or []
            together = min(len(lines) for lines in pending)
            if together:
                yield tuple(lines[:together] for lines in pending)
                pending = [lines[together:] for lines in pending]
                paired += together
            elif all(ended) and not any(pending):
                return
            else:  # one input has ended, another has lines left
                shorter = next(f for f, done, p in zip(flags, ended, pending) if done and not p)
                raise different_lengths(paths, shorter, paired)


def different_lengths(paths: Mapping[str, str], shorter: str, lines: int) -> ValueError:
    given = " and ".join(f"{flag}={path}" for flag, path in paths.items())
    return ValueError(f"{given} have different numbers of lines: {shorter} ends at line {lines}")


def waiting(fd: int) -> bool:
    """Whether reading `fd` would return at once (more input is there, or its end)."""
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


class Progress:
    """One self-overwriting stderr line: sentences (or pairs) done, of the total if known, and
    speed. Our own rather than tqdm's: it must end its line before any message (`end_line`) and
    lose nothing when stderr's reader goes away (`say`)."""

    def __init__(self, total: int | None, unit: str = "sentences"):
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.unit = unit
        self.showing = False

    def update(self, count: int) -> None:
        self.done += count
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        unit = self.unit
        line = f"{self.done} {unit}  {rate:.1f} {unit}/s"
        if self.total:
            filled = 30 * self.done // self.total
            eta = (self.total - self.done) / max(rate, 1e-9)
            line = (
                f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {unit}  "
                f"{rate:.1f} {unit}/s  ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}"
            )
        say("\r" + line)
        self.showing = True

    def end_line(self) -> None:
        """Ends the progress line, so that a message written next starts a line of its own."""
        if self.showing:
            say("\n")
            self.showing = False

    def close(self) -> None:
        self.end_line()


def say(text: str) -> None:
    """Writes `text` to stderr, flushed; a stderr that is closed or whose reader went away
    (`... 2>&1 | head -2`) loses the text and never the command's work."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()


def unknown_characters_warning(ids: Sequence[int], where: str) -> str | None:
    """The stderr line for a text forced as it is tokenized (`--prompt`, a `--prefix` line),
    named by `where`, when its pieces `ids` hold <unk>; None when they do not.

    A run of characters outside the vocabulary is one <unk> piece, which the output then shows
    as SentencePiece writes it, "⁇": the line says so rather than let the text change unseen.
    """
    if UNK_ID not in ids:
        return None
    return (
        f"warning: {where} has characters outside the vocabulary: they are forced as <unk> and "
        "printed as ⁇\n"
    )


def count_lines(path: str | os.PathLike) -> int | None:
    """The lines of a regular file, for the progress line; None for anything that can be read
    only once (a pipe, `/dev/stdin`, `<(...)`): counting would consume what is to be translated.
    So a length compared before reading is compared only between regular files; a pipe's is
    known once it has been read (`read_parallel`).
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
    except OSError:
        return None
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same resolved path, or one inode when both exist."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def regular_stdin() -> os.stat_result | None:
    """The status of the file standard input reads, when it is a regular file (`< x`)."""
    try:
        status = os.fstat(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):  # replaced or closed (as under pytest)
        return None
    return status if stat.S_ISREG(status.st_mode) else None


def open_output(path: str) -> tuple[BinaryIO | AtomicFile, bool]:
    """(stream, whether it is an `AtomicFile`): a device, FIFO or socket is written as is."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.stat(path).st_mode):
            return open(path, "wb"), False
    return AtomicFile(path), True


def check_output_file(
    output: str, flag: str, inputs: Mapping[str, str], workdirs: Sequence[str]
) -> None:
    """Refuses, before anything is opened, an output file whose writing would destroy data.

    Raises SystemExit naming the flags when `output` is one of the `inputs` ({flag: path}; the
    file that standard input reads when none is given), and ValueError
    (`workdir.check_output_path`) when it is a directory, a --workdir, or a file of any
    training run or export (the --workdir's, or one that `output` lies in). A device or FIFO
    (/dev/stdout, /dev/null) is written as a stream and destroys nothing; neither does
    `STANDARD_OUTPUT` ("-").
    """
    if output == STANDARD_OUTPUT:
        return
    with contextlib.suppress(OSError):
        mode = os.stat(output).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return
    for input_flag, path in inputs.items():
        if path and same_file(output, path):
            raise SystemExit(
                f"{flag}={output} is the same file as {input_flag}={path}; writing there would "
                f"overwrite the text being read: give another {flag}"
            )
    stdin = None if any(inputs.values()) else regular_stdin()
    with contextlib.suppress(OSError):
        if stdin and os.path.samestat(stdin, os.stat(output)):
            raise SystemExit(
                f"{flag}={output} is the file that standard input reads; writing there would "
                f"overwrite the text being read: give another {flag}"
            )
    check_output_path(output, flag, workdirs, directory=False)
    real = os.path.realpath(output)
    if not os.path.isdir(os.path.dirname(real)):
        raise SystemExit(f"{flag}={output}: the directory {os.path.dirname(real)} does not exist")


def check_output_files(
    outputs: Mapping[str, str],
    inputs: Mapping[str, str],
    workdirs: Sequence[str],
    stdout_flag: str = "--output",
) -> None:
    """Refuses output files ({flag: path}, "" for none; `stdout_flag` left empty and "-" are
    standard output) that would destroy an input or a run's files (`check_output_file`), that
    name one file twice, or two outputs on standard output (their lines would interleave)."""
    for flag, path in outputs.items():
        if path:
            check_output_file(path, flag, inputs, workdirs)
    check_distinct_outputs(outputs)
    standard = [
        # An empty flag is `--output` left out or given as "-" (`dash_is_standard`).
        f"{flag}=-" if path else f"{flag} (standard output)"
        for flag, path in outputs.items()
        if path == STANDARD_OUTPUT or (flag == stdout_flag and not path)
    ]
    if len(standard) > 1:
        raise ValueError(
            f"{' and '.join(standard)} would both write standard output, their lines mixed: "
            "give all but one of them a file"
        )


# An output flag's value that means standard output (`--alignment=-`); --input=- and --output=-
# are read as the standard streams by `dash_is_standard`.
STANDARD_OUTPUT = "-"


def dash_is_standard(flags: dict, names: Sequence[str] = ("input", "output")) -> None:
    """Reads `--input=-` and `--output=-` as the standard streams, as most commands do (their
    empty default means the same); an other output flag's "-" stays `STANDARD_OUTPUT`, which
    `Outputs` writes to standard output."""
    for name in names:
        flags[name] = "" if flags[name] == "-" else flags[name]


def check_distinct_outputs(outputs: Mapping[str, str]) -> None:
    """Refuses two output flags that name one file (however spelled)."""
    given = [(flag, path) for flag, path in outputs.items() if path and path != STANDARD_OUTPUT]
    for n, (flag, path) in enumerate(given):
        for other_flag, other in given[n + 1 :]:
            if same_file(path, other):
                raise ValueError(
                    f"{flag}={path} and {other_flag}={other} are the same file; give each "
                    "output a file of its own"
                )


class Outputs:
    """A command's output files by flag, written as it goes and kept only if it finishes.

    A regular file is written beside its path and replaces it on `commit`; standard output
    (the flag `stdout_flag` left empty, or any flag given "-"), a pipe or a device is written as
    it goes. Leaving the
    `with` block without `commit` leaves every earlier file as it was. A write that fails (a
    full disk) names the file it was for.
    """

    def __init__(self, paths: Mapping[str, str], stdout_flag: str = "--output"):
        self.paths = dict(paths)
        self.stdout_flag = stdout_flag
        self.streams: dict[str, BinaryIO | AtomicFile] = {}
        self.atomic: set[str] = set()
        self.done = False

    def __enter__(self) -> Outputs:
        for flag, path in self.paths.items():
            if path == STANDARD_OUTPUT or (not path and flag == self.stdout_flag):
                self.streams[flag] = sys.stdout.buffer
                continue
            if not path:
                continue
            remove_stale(path, "tmp")  # what a killed run left there
            try:
                stream, atomic = open_output(path)
            except OSError as e:
                raise ValueError(
                    f"{flag}={path}: cannot write there ({e.strerror}); give a {flag} where "
                    "you can write"
                ) from None
            self.streams[flag] = stream
            if atomic:
                self.atomic.add(flag)
        return self

    def __contains__(self, flag: str) -> bool:
        return flag in self.streams

    def write(self, flag: str, text: str) -> None:
        """Writes `text` to the output of `flag`, flushed (a pipe's reader sees it at once)."""
        stream = self.streams[flag]
        try:
            stream.write(text.encode("utf-8"))
            stream.flush()
        except OSError as e:  # a full disk or device: name where the lines were going
            if e.filename is not None or e.errno is None:
                raise
            name = self.paths[flag] if stream is not sys.stdout.buffer else "<stdout>"
            raise OSError(e.errno, e.strerror, name) from None

    def commit(self) -> None:
        """Puts every file in place: the command has written all of it."""
        for flag in self.atomic:
            self.streams[flag].commit()
        self.done = True

    def __exit__(self, *exc) -> None:
        for flag, stream in self.streams.items():
            if flag in self.atomic:
                stream.discard()  # after a commit: nothing to do
            elif stream is not sys.stdout.buffer:
                # After an error, what the close would flush is lost with it: that error says
                # why.
                with contextlib.suppress(OSError) if not self.done else contextlib.nullcontext():
                    stream.close()
