"""Where the commands may write, and how they read their input streams (translate/streams.py,
translate/workdir.py `check_output_path`): no output lands in a training run or an export that
the command was not pointed at, and a pipe is read line by line beside a pipe or a file."""

import contextlib
import fcntl
import importlib
import os
import shutil
import termios
import threading
import time

import pytest
from helpers import copy_of_tiny_run

from translate import evaluate, export, score, translate_text
from translate.workdir import EXPORT_MARKER, Workdir

SOURCES = ["a dog .", "the cat .", "a man reads .", "the small dog .", "a cat .", "the man ."]
TARGETS = ["ein Hund .", "die Katze .", "ein Mann liest .", "der Hund .", "eine Katze .", "."]


@pytest.fixture(scope="module")
def runs(tiny_run, tmp_path_factory):
    """Two training runs, A and B, and a run C whose best/ is a workdir of its own."""
    a = copy_of_tiny_run(tiny_run, tmp_path_factory)
    b = copy_of_tiny_run(tiny_run, tmp_path_factory)
    c = copy_of_tiny_run(tiny_run, tmp_path_factory)
    best = Workdir(Workdir(c).best)
    best.path.mkdir()
    for name in ("config.json", "vocab.model", "checkpoints"):
        copy = shutil.copytree if (c / name).is_dir() else shutil.copyfile
        copy(c / name, best.path / name)
    return a, b, c


def files_of(path):
    return {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}


@contextlib.contextmanager
def pipe(lines, pause_after=None):
    """A pipe's path (/dev/fd/N, as `<(zcat x.gz)` gives), written by a thread: `lines` at
    once, or the first `pause_after` of them, then (once the reader has taken those and the
    input has paused) the rest, as a slow writer would."""
    read_fd, write_fd = os.pipe()
    data = [("".join(line + "\n" for line in part)).encode() for part in split(lines, pause_after)]

    def unread() -> int:
        return int.from_bytes(fcntl.ioctl(read_fd, termios.FIONREAD, b"\0" * 4), "little")

    def write():
        with open(write_fd, "wb", buffering=0) as writer:
            for n, part in enumerate(data):
                if n:
                    deadline = time.monotonic() + 60
                    while unread() and time.monotonic() < deadline:
                        time.sleep(0.01)
                    time.sleep(0.5)  # the reader has decoded what it read: the input paused
                writer.write(part)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    try:
        yield f"/dev/fd/{read_fd}"
    finally:
        thread.join(timeout=60)
        os.close(read_fd)


def split(lines, at):
    return [lines] if at is None else [lines[:at], lines[at:]]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_an_output_inside_another_runs_workdir_is_refused(runs, tmp_path):
    a, b, c = runs
    source = write_lines(tmp_path / "in.en", SOURCES)
    pairs = write_lines(tmp_path / "pairs.tsv", [f"{s}\t{t}" for s, t in zip(SOURCES, TARGETS)])
    exported = tmp_path / "exported"
    exported.mkdir()
    (exported / EXPORT_MARKER).write_text('{"files": ["model.bin", "vocab.model"]}\n')
    (exported / "model.bin").write_bytes(b"weights")
    (exported / "vocab.model").write_bytes(b"vocab")
    step = sorted((b / "checkpoints").iterdir())[-1]
    in_step = next(p for p in step.iterdir() if p.is_file())
    average = importlib.import_module("scripts.average_checkpoints")
    text = [f"--workdir={a}", f"--input={source}"]
    scoring = [f"--workdir={a}", f"--input={pairs}"]
    commands = [
        (translate_text.main, [*text, f"--output={b / 'config.json'}"]),
        (translate_text.main, [*text, f"--output={b / 'metrics.jsonl'}"]),
        (translate_text.main, [*text, f"--output={b / 'tokens' / 'new.txt'}"]),
        (translate_text.main, [*text, f"--output={tmp_path / 'x'}", f"--alignment={in_step}"]),
        # The everyday form: the run's best checkpoint decodes, into the run's own report.
        (
            translate_text.main,
            [f"--workdir={c / 'best'}", f"--input={source}", f"--output={c / 'hypotheses.txt'}"],
        ),
        (translate_text.main, [*text, f"--output={exported / 'model.bin'}"]),
        (score.main, [*scoring, f"--output={in_step}"]),
        (score.main, [*scoring, f"--per_token={b / 'report.txt'}"]),
        (evaluate.main, [*text[:1], f"--src={source}", f"--ref={source}", f"--output={step}"]),
        (
            export.main,
            [*text[:1], "--format=ctranslate2", f"--output={b / 'checkpoints' / 'exported'}"],
        ),
        (average.main, [*text[:1], "--num=1", f"--output={b / 'checkpoints' / 'average'}"]),
    ]
    before = {path: files_of(path) for path in (b, c, exported)}
    for command, argv in commands:
        with pytest.raises((ValueError, SystemExit)) as error:
            command(argv)
        message = str(error.value)
        assert message.startswith("--") and "\n" not in message, message
        assert any(f"={p}" in message for p in (b, c, exported, step, in_step)), message
        assert {path: files_of(path) for path in before} == before, argv
    assert not (b / "checkpoints" / "exported").exists()
    assert not (b / "checkpoints" / "average").exists()
    # Beside a run's own files, and in a run's best/ workdir's evaluations, a command writes.
    translate_text.main([*text, f"--output={b / 'notes.de'}", "--beam_size=1"])
    assert len((b / "notes.de").read_text(encoding="utf-8").splitlines()) == len(SOURCES)


def test_two_pipes_are_paired_line_by_line_whatever_their_chunks(runs, tmp_path, capsys):
    # One pair a batch: a pair's score does not depend on how the input was cut into chunks.
    scoring = [f"--workdir={runs[0]}", "--batch_size=1"]
    src = write_lines(tmp_path / "s.en", SOURCES)
    tgt = write_lines(tmp_path / "s.de", TARGETS)
    score.main([*scoring, f"--src={src}", f"--tgt={tgt}"])
    expected = capsys.readouterr().out
    assert len(expected.splitlines()) == len(SOURCES)
    # A writer that pauses on one side: that side arrives in two chunks, the other in one.
    with pipe(SOURCES, pause_after=2) as src_pipe, pipe(TARGETS) as tgt_pipe:
        score.main([*scoring, f"--src={src_pipe}", f"--tgt={tgt_pipe}"])
    assert capsys.readouterr().out == expected
    # Pipes of different lengths are still refused, naming the line where one ends.
    out = write_lines(tmp_path / "out.tsv", ["earlier"])
    with pipe(SOURCES, pause_after=2) as src_pipe, pipe(TARGETS[:5]) as tgt_pipe:
        with pytest.raises(ValueError, match="different numbers of lines: --tgt ends at line 5"):
            score.main([*scoring, f"--src={src_pipe}", f"--tgt={tgt_pipe}", f"--output={out}"])
    assert out.read_text(encoding="utf-8") == "earlier\n"


def test_a_pipe_beside_a_file_is_read_as_a_file_would_be(runs, tmp_path, capsys):
    a = runs[0]
    source = write_lines(tmp_path / "in.en", SOURCES[:3])
    prefixes = write_lines(tmp_path / "prefix.de", ["ein", "", "die"])
    text = [f"--workdir={a}", "--beam_size=1"]
    translate_text.main([*text, f"--input={source}", f"--prefix={prefixes}"])
    expected = capsys.readouterr().out
    assert len(expected.splitlines()) == 3
    with pipe(SOURCES[:3]) as source_pipe:
        translate_text.main([*text, f"--input={source_pipe}", f"--prefix={prefixes}"])
    assert capsys.readouterr().out == expected
    with pipe(["ein", "", "die"]) as prefix_pipe:
        translate_text.main([*text, f"--input={source}", f"--prefix={prefix_pipe}"])
    assert capsys.readouterr().out == expected
    # A prefix pipe that ends first is refused while reading, and --output is not replaced.
    out = write_lines(tmp_path / "out.de", ["earlier"])
    with pipe(["ein"]) as prefix_pipe:
        with pytest.raises(ValueError, match="--prefix=.* has 1 lines and the input more"):
            translate_text.main(
                [*text, f"--input={source}", f"--prefix={prefix_pipe}", f"--output={out}"]
            )
    assert out.read_text(encoding="utf-8") == "earlier\n"
    # translate-score: --src from a pipe that pauses, --tgt a file read in one chunk.
    scoring = [f"--workdir={a}", "--batch_size=1"]
    src = write_lines(tmp_path / "s.en", SOURCES)
    tgt = write_lines(tmp_path / "s.de", TARGETS)
    score.main([*scoring, f"--src={src}", f"--tgt={tgt}"])
    expected = capsys.readouterr().out
    with pipe(SOURCES, pause_after=2) as src_pipe:
        score.main([*scoring, f"--src={src_pipe}", f"--tgt={tgt}"])
    assert capsys.readouterr().out == expected


def test_a_dash_output_flag_is_standard_output_and_never_a_file_named_dash(
    runs, tmp_path, capsys, monkeypatch
):
    a = runs[0]
    monkeypatch.chdir(tmp_path)
    source = write_lines(tmp_path / "in.en", SOURCES[:2])
    out = tmp_path / "out.de"
    text = [f"--workdir={a}", f"--input={source}", "--beam_size=1"]
    translate_text.main([*text, f"--output={out}", f"--alignment={tmp_path / 'align.txt'}"])
    capsys.readouterr()
    translate_text.main([*text, f"--output={out}", "--alignment=-"])
    assert capsys.readouterr().out == (tmp_path / "align.txt").read_text(encoding="utf-8")
    pairs = write_lines(tmp_path / "pairs.tsv", [f"{s}\t{t}" for s, t in zip(SOURCES, TARGETS)])
    score.main(
        [
            f"--workdir={a}",
            f"--input={pairs}",
            f"--output={tmp_path / 'scores.tsv'}",
            "--per_token=-",
        ]
    )
    assert len(capsys.readouterr().out.splitlines()) == len(SOURCES)
    # Two outputs on standard output would interleave: refused before anything is read.
    for command, argv in (
        (translate_text.main, [*text, "--alignment=-"]),
        (score.main, [f"--workdir={a}", f"--input={pairs}", "--per_token=-", "--alignment=-"]),
    ):
        with pytest.raises(ValueError, match="standard output"):
            command(argv)
    assert not (tmp_path / "-").exists()


def an_average(path, source):
    """A parameters-only workdir as scripts/average_checkpoints.py writes one, of run `source`."""
    import jax.numpy as jnp

    from translate import checkpoint

    out = Workdir(path)
    out.path.mkdir(parents=True)
    out.config.write_text("{}\n")
    out.vocab.write_bytes(b"vocab")
    meta = {"step": 2, "averaged_steps": [1, 2], "averaged_from": str(source)}
    with checkpoint.make_manager(out.checkpoints, keep=1) as manager:
        checkpoint.save_params(manager, 2, {"w": jnp.zeros(2)}, meta)
    return out


def test_an_average_of_another_run_is_never_replaced(tmp_path):
    average = importlib.import_module("scripts.average_checkpoints")
    a, b = Workdir(tmp_path / "a"), Workdir(tmp_path / "b")
    for run in (a, b):
        run.path.mkdir()
        run.lock.write_text("")
    theirs = an_average(b.path / "average_2", b.path)
    before = files_of(theirs.path)
    with pytest.raises(ValueError) as error:
        average.check_output(theirs.path, a)
    message = str(error.value)
    assert message.startswith(f"--output={theirs.path} is an average of {b.path}")
    assert "\n" not in message
    assert files_of(theirs.path) == before
    # The run's own earlier average, where it lies, is the script's to replace.
    average.check_output(theirs.path, b)
    mine = an_average(tmp_path / "elsewhere" / "average_2", a.path)
    average.check_output(mine.path, a)


def test_an_evaluation_of_a_runs_best_goes_where_training_never_deletes_it(tmp_path):
    run = Workdir(tmp_path / "run")
    run.path.mkdir()
    run.lock.write_text("")
    best = Workdir(run.best)
    for item in ("params", "meta"):
        (best.checkpoints / "9" / item).mkdir(parents=True)
    out = evaluate.default_output(str(best.path), "test.en", [9], 1)
    assert out.path == run.evaluations / "best.test.en.step9"
    assert out.path.is_dir() and not best.evaluations.exists()
    # A run's own evaluations keep their names.
    assert evaluate.default_output(str(run.path), "test.en", [6], 1).path == (
        run.evaluations / "test.en.step6"
    )
