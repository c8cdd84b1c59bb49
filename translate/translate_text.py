"""Translate text from the command line with a trained workdir, or an ensemble of workdirs.

    translate-text --workdir=/tmp/quickstart < input.en > output.de
    translate-text --workdir=A [--workdir=B ...] --input=in.en --output=out.de \\
        [--step=N | --average=N] [--beam_size=4] [--length_penalty=0.6] \\
        [--max_extra_len=50] [--batch_size=64] [--parallel_batches=2] [--nbest=N]
    translate-text --workdir=/tmp/quickstart    (type a sentence, read its translation)

(`python -m translate.translate_text`, or by its older name `python -m translate.translate`, is
the same command.) One sentence per input line gives one translation per output line, in input
order; an empty line gives an empty line. Lines are decoded as soon as they arrive: typed at a
terminal or written to a pipe one at a time, each line is translated and written at once; from a
file, or a pipe that holds many lines, up to 10,000 lines are decoded together in length-sorted
batches, so memory stays bounded and output streams however long the input. With `--nbest=N`
every non-empty line gives N lines `LINE<TAB>SCORE<TAB>TRANSLATION` (LINE counts input lines
from 0; SCORE is the length-normalised log-probability that beam search ranks by),
best first; an empty line gives the single line `LINE<TAB>0.0000<TAB>`. The N are distinct texts
from the beam's hypotheses; fewer come out when pieces that spell the same text fill the beam (a
wider --beam_size helps). Without --step or --average the newest checkpoint decodes; `--step=N`
picks one, and `--average=N` the mean of the newest N (as translate.evaluate); the first line
on stderr says which (and, when the training report decoded the mean of the newest N, how to
pick that). Several --workdir flags decode with their ensemble (one shared vocabulary), each
workdir at the same choice. Decoding options left unset come from the first workdir's config;
one that cannot decode (`--beam_size=-3`, `--length_penalty=nan`) is refused before anything
is loaded. A line longer than the model's `data.max_len` tokens is translated from its first
tokens only, and stderr says which line. Writing to --output shows progress and sentences/s on
stderr.

--output is written to a temporary file beside it that replaces it only once every line is
translated, so a failed or interrupted run (Ctrl-C, SIGTERM) leaves an existing --output as it
was, and the temporary file of one killed outright is removed by the next run into that file
(standard output, a pipe or a device streams as it goes). An --output that is the --input file
(however spelled: ./x, a symlink), a directory, or anything a --workdir holds (its config,
vocabulary, checkpoints, tokens, logs, report, curves, best/, evaluations/, data/, or any other
file already there) is refused before any file is opened.
"""

from __future__ import annotations

import contextlib
import io
import os
import pathlib
import select
import stat
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

from translate import startup

startup.import_jax()  # before anything imports JAX: without etils.epath (translate/startup.py)


from translate import cli, compilation
from translate.atomic import AtomicFile, remove_stale
from translate.cli import Flag, parse_flags
from translate.config import DecodeConfig, field_descriptions
from translate.decoding import programs
from translate.decoding.settings import check_values, decode_settings
from translate.workdir import check_output_path

# Most lines decoded and written at a time: bounds memory on arbitrarily long input.
LINES_PER_CHUNK = 10_000
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


def waiting(fd: int) -> bool:
    """Whether reading `fd` would return at once (more input is there, or its end)."""
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


class Progress:
    """One self-overwriting stderr line: sentences done (of the total, if known) and speed."""

    def __init__(self, total: int | None):
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.showing = False

    def update(self, count: int) -> None:
        self.done += count
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        line = f"{self.done} sentences  {rate:.1f} sentences/s"
        if self.total:
            filled = 30 * self.done // self.total
            eta = (self.total - self.done) / max(rate, 1e-9)
            line = (
                f"[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} sentences  "
                f"{rate:.1f} sentences/s  ETA {time.strftime('%H:%M:%S', time.gmtime(eta))}"
            )
        sys.stderr.write("\r" + line)
        sys.stderr.flush()
        self.showing = True

    def end_line(self) -> None:
        """Ends the progress line, so that a message written next starts a line of its own."""
        if self.showing:
            sys.stderr.write("\n")
            self.showing = False

    def close(self) -> None:
        self.end_line()


def format_lines(first_index: int, results: list[list[tuple[float, str]]], nbest: int) -> str:
    if not nbest:
        return "".join(hypotheses[0][1] + "\n" for hypotheses in results)
    return "".join(
        f"{first_index + i}\t{score:.4f}\t{text}\n"
        for i, hypotheses in enumerate(results)
        for score, text in hypotheses
    )


def count_lines(path: str | os.PathLike) -> int | None:
    """The lines of a regular file, for the progress line; None for anything that can be read
    only once (a pipe, `/dev/stdin`, `<(...)`): counting would consume what is to be translated.
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


def check_output(output: str, input_path: str, workdirs: Sequence[str]) -> None:
    """Refuses, before anything is opened, an --output whose writing would destroy data.

    Raises SystemExit naming the flags when --output is the --input file (or the file that
    standard input reads), and ValueError (`workdir.check_output_path`) when it is a directory,
    a --workdir, or a file of a --workdir's run. A device or FIFO (/dev/stdout, /dev/null) is
    written as a stream and destroys nothing.
    """
    with contextlib.suppress(OSError):
        mode = os.stat(output).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            return
    if input_path and same_file(output, input_path):
        raise SystemExit(
            f"--output={output} is the same file as --input={input_path}; writing the "
            "translation would overwrite the text being translated: give another --output"
        )
    stdin = None if input_path else regular_stdin()
    with contextlib.suppress(OSError):
        if stdin and os.path.samestat(stdin, os.stat(output)):
            raise SystemExit(
                f"--output={output} is the file that standard input reads (no --input); "
                "writing the translation would overwrite the text being translated: give "
                "another --output"
            )
    check_output_path(output, "--output", workdirs, directory=False)
    real = pathlib.Path(os.path.realpath(output))
    if not real.parent.is_dir():
        raise SystemExit(f"--output={output}: the directory {real.parent} does not exist")


def open_output(path: str) -> tuple[BinaryIO | AtomicFile, bool]:
    """(stream, whether it is an `AtomicFile`): a device, FIFO or socket is written as is."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISREG(os.stat(path).st_mode):
            return open(path, "wb"), False
    return AtomicFile(path), True


DECODE_FIELDS = field_descriptions(DecodeConfig)
# The decoding flags' defaults, which mean "the workdir's config.decode value".
UNSET = {
    "beam_size": 0,
    "length_penalty": -1.0,
    "max_extra_len": -1,
    "batch_size": 0,
    "parallel_batches": 0,
    "beam_stop": "",
}
# Lines longer than data.max_len named on stderr, at most; then one line says there are more.
MAX_TRUNCATION_WARNINGS = 5
FLAGS = {
    "workdir": Flag([], "Required. A training workdir; repeat it for an ensemble."),
    **cli.checkpoint_flags("decode with"),
    "input": Flag("", "The text to translate, one sentence a line; default stdin."),
    "output": Flag(
        "",
        "Where the translations go (replaced only once all are written); default stdout.",
    ),
    # Left at these values: the first workdir's config.decode value.
    **{
        name: Flag(unset, DECODE_FIELDS[name] + " Left at the default shown: the workdir's config.")
        for name, unset in UNSET.items()
    },
    "nbest": Flag(0, "Write the N best translations of each line with their scores."),
    **cli.compilation_cache_flag(),
}


def named_flags(argv: Sequence[str]) -> set[str]:
    """The names of the flags on a command line (`--beam_size=0` and `--beam_size 0` alike)."""
    return {arg[2:].partition("=")[0] for arg in argv if arg.startswith("--")}


def given_decoding_flags(flags: dict[str, Any], named: set[str] = frozenset()) -> dict[str, Any]:
    """The decoding flags given a value of their own (not left at "unset"), checked by
    config.py's rules (translate/decoding/settings.py), with --nbest.

    Raises:
      ValueError: naming a flag whose value cannot decode (before any model is loaded).
    """
    # A flag at its "unset" value counts as given when the command line names it: an
    # explicit --beam_size=0 is a mistake, not "the workdir's setting".
    given = {
        name: flags[name] for name, unset in UNSET.items() if flags[name] != unset or name in named
    }
    check_values(given)
    if flags["nbest"] < 0:
        raise ValueError(f"--nbest={flags['nbest']}: must be >= 0 (0: the best translation alone)")
    return given


def describe_models(workdirs: Sequence[str], steps: Sequence[list[int]], chosen: bool, config):
    """The stderr line that says which model decodes (and how to pick the report's)."""
    models = [
        f"the checkpoint of step {s[0]} of {w}"
        if len(s) == 1
        else f"the mean of the checkpoints at steps {s} of {w}"
        for w, s in zip(workdirs, steps)
    ]
    line = "decoding with " + "; ".join(models)
    n = config.decode.average_last
    if not chosen and n > 1 and len(steps[0]) == 1:
        line += f" (the training report decoded the mean of the newest {n} (--average={n}))"
    return line


def warn_of_long_lines(
    tokenizer, chunk: list[str], first: int, max_len: int, said: list[int], progress
) -> None:
    """Names on stderr the lines that decoding cuts to their first `max_len` - 1 tokens."""
    lengths = [len(ids) for ids in tokenizer.encode(chunk)]
    for i, length in enumerate(lengths):
        if length + 1 <= max_len or not chunk[i].strip():
            continue
        said.append(first + i + 1)
        if progress is not None:
            progress.end_line()
        if len(said) <= MAX_TRUNCATION_WARNINGS:
            sys.stderr.write(
                f"warning: line {first + i + 1} is longer than data.max_len={max_len} tokens "
                f"({length} + EOS): only its first {max_len - 1} are translated\n"
            )
        elif len(said) == MAX_TRUNCATION_WARNINGS + 1:
            sys.stderr.write("warning: more lines are longer than data.max_len; not named\n")


def main(argv: Sequence[str]) -> None:
    flags, _ = parse_flags(list(argv), FLAGS, doc=__doc__, sections=())
    cli.quiet_libraries()
    given = given_decoding_flags(flags, named_flags(argv))  # refused before anything is loaded
    if flags["input"] and (os.path.isdir(flags["input"]) or not os.path.exists(flags["input"])):
        what = "a directory" if os.path.isdir(flags["input"]) else "no such file"
        raise ValueError(f"--input={flags['input']}: {what}; give a file of sentences")
    if flags["output"]:
        check_output(flags["output"], flags["input"], flags["workdir"])
    step, average = cli.checkpoint_choice(flags)
    cache = compilation.use_persistent_cache(flags["compilation_cache"])
    models = programs.OpenedModels(flags["workdir"], step, average, flags["params"], cache)
    chosen = step is not None or average > 0
    sys.stderr.write(describe_models(flags["workdir"], models.steps, chosen, models.config) + "\n")
    if not flags["input"] and sys.stdin.isatty():  # a person at a terminal: say it waits
        sys.stderr.write("type a sentence and press Enter to translate it; Ctrl-D ends\n")
    settings = decode_settings(models.config.decode, given, flags["nbest"])
    tokenizer, max_len = models.tokenizer, models.config.data.max_len

    source = open(flags["input"], "rb") if flags["input"] else sys.stdin.buffer
    target, atomic = sys.stdout.buffer, False
    progress, done = None, False
    try:
        if flags["output"]:
            remove_stale(flags["output"], "tmp")  # what a killed translation left there
            try:
                target, atomic = open_output(flags["output"])
            except OSError as e:
                raise ValueError(
                    f"--output={flags['output']}: cannot write there ({e.strerror}); give an "
                    "--output where you can write"
                ) from None
            progress = Progress(count_lines(flags["input"]) if flags["input"] else None)
        first, truncated = 0, []
        for chunk in read_chunks(source, flags["input"] or "<stdin>", LINES_PER_CHUNK):
            warn_of_long_lines(tokenizer, chunk, first, max_len, truncated, progress)
            results = models.translate(
                chunk, settings, on_batch=progress.update if progress else None
            )
            try:
                target.write(format_lines(first, results, settings.nbest).encode("utf-8"))
                target.flush()
            except OSError as e:  # a full disk or device: name where the lines were going
                if e.filename is not None or e.errno is None:
                    raise
                raise OSError(e.errno, e.strerror, flags["output"] or "<stdout>") from None
            first += len(chunk)
        if atomic:
            target.commit()
        done = True
    finally:
        if progress:
            progress.close()
        if source is not sys.stdin.buffer:
            source.close()
        if atomic:
            target.discard()  # after a commit: nothing to do
        elif target is not sys.stdout.buffer:
            # After an error, what the close would flush is lost with it: that error says why.
            with contextlib.suppress(OSError) if not done else contextlib.nullcontext():
                target.close()


def console_main() -> None:
    """`translate-text`, the console script of pyproject.toml. It ends without the interpreter's
    teardown (`cli.run`): a one-line translation is a 2-second command."""
    cli.run(main, teardown=False)


if __name__ == "__main__":
    console_main()
