"""What a run directory holds, and how it is written, checked and read back.

Only this module spells a workdir's file names. A training workdir holds:
  config.json     the run's config, written once its data has loaded
  vocab.model     the shared SentencePiece vocabulary
  tokens/         the training pairs tokenized once (translate/data/corpus.py, `tokenize_once`)
  data/           the generated corpus, when data.source is "synthetic"
  checkpoints/    Orbax checkpoints (translate/checkpoint.py)
  best/           with train.keep_best_by: the best checkpoint by dev BLEU, as a workdir of
                  its own (config.json, vocab.model, one parameters-only checkpoint)
  metrics.jsonl, tensorboard/    what the run logged (translate/training/monitor.py)
  profile/        the jax.profiler trace of train.profile_steps
  report.json, report.txt, hypotheses.txt    the test-set evaluation at the end of training
  evaluations/    translate.evaluate's reports, one directory each (the same three files)
  metrics_*.png   training curves drawn when training ends (translate/training/plots.py)
  attention/      scripts/plot_attention.py's pictures, by default
  train.lock      held by the trainer that runs in it (an advisory lock; see `lock`)
  previous_run/   an earlier run that --force set aside, while the new run's data loads; a
                  run that finds it at its start (the --force was killed) puts it back
  .previous_run.deleting/    previous_run/ once the new run's data has loaded, being deleted
A workdir written by scripts/average_checkpoints.py, and a run's best/, hold config.json,
vocab.model and one parameters-only checkpoint (translate/trained.py, `write_params_workdir`).

Reading a trained model back is translate/trained.py's; the checks that open a training run are
translate/training/opening.py's. `check_output_path` is the one answer to "may this command write
there?" that every command asks before it writes. This module imports neither Orbax nor Flax.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import pathlib
import shutil
import socket
from collections.abc import Sequence

import jax

from translate import atomic, sharding
from translate.config import Config, config_from_dict

# The file that marks a directory as written by translate-export (translate/engines/writer.py).
EXPORT_MARKER = "translate-export.json"


class Workdir:
    """The paths inside one run directory."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.config = self.path / "config.json"
        self.vocab = self.path / "vocab.model"
        self.tokens = self.path / "tokens"
        self.data = self.path / "data"
        self.checkpoints = self.path / "checkpoints"
        self.best = self.path / "best"
        self.profile = self.path / "profile"
        self.metrics = self.path / "metrics.jsonl"
        self.tensorboard = self.path / "tensorboard"
        self.report_json = self.path / "report.json"
        self.report_txt = self.path / "report.txt"
        self.hypotheses = self.path / "hypotheses.txt"
        self.lock = self.path / "train.lock"
        self.evaluations = self.path / "evaluations"
        self.attention = self.path / "attention"
        # Where `--force` keeps the earlier run until the new run's data has loaded.
        self.previous_run = self.path / "previous_run"
        # previous_run/ renamed once the new run's data has loaded: deleted, never put back.
        self.discarded_run = self.path / ".previous_run.deleting"

    def metric_plots(self) -> list[pathlib.Path]:
        """Training-curve pictures drawn by translate/training/plots.py, by name."""
        return sorted(self.path.glob("metrics_*.png"))

    def metric_plot(self, name: str) -> pathlib.Path:
        """Where translate/training/plots.py draws the curve `name` (e.g. "loss")."""
        return self.path / f"metrics_{name}.png"

    def directories(self) -> list[pathlib.Path]:
        """What a run keeps as directories here (a file by one of these names is in the way)."""
        return [
            self.tokens,
            self.checkpoints,
            self.best,
            self.profile,
            self.tensorboard,
            self.evaluations,
            self.attention,
        ]

    def files(self) -> list[pathlib.Path]:
        """What a run keeps as files here (a directory by one of these names is in the way)."""
        return [
            self.config,
            self.vocab,
            self.metrics,
            self.report_json,
            self.report_txt,
            self.hypotheses,
            self.lock,
        ]

    def entry_names(self) -> set[str]:
        """The names of everything a run keeps at its top level (files and directories, the
        generated corpus's data/, a --force's previous_run/), written yet or not."""
        entries = self.directories() + self.files()
        return {p.name for p in entries + [self.data, self.previous_run, self.discarded_run]}

    def training_directories(self) -> list[pathlib.Path]:
        """The directories that training writes and reads back; evaluations/ and attention/
        are where the commands that report on a run write."""
        return [self.checkpoints, self.tokens, self.best, self.tensorboard, self.profile, self.data]

    def report_files(self) -> list[pathlib.Path]:
        """The three files of a report (translate/decoding/report.py writes them)."""
        return [self.report_json, self.report_txt, self.hypotheses]

    def is_export(self) -> bool:
        """Whether translate-export wrote this directory (its marker is there)."""
        return (self.path / EXPORT_MARKER).is_file()

    def holds_training_files(self) -> list[str]:
        """The names of the entries here that only training writes (its checkpoints, tokens,
        logs, lock, report; not config.json or vocab.model, which an export holds too)."""
        own = [*self.training_directories(), self.metrics, self.lock, *self.report_files()]
        return sorted(p.name for p in own + [self.previous_run] if p.exists())

    def is_training_run(self) -> bool:
        """Whether a training run has written here (its config or checkpoints)."""
        return self.config.exists() or self.checkpoints.exists()

    def is_marked_run(self) -> bool:
        """Whether this directory is, by what only training writes, a training run or a
        parameters-only workdir (best/, an average): its lock, an interrupted --force's
        previous_run/, or its config beside its checkpoints or vocabulary. Stricter than
        `is_training_run`: it is asked of every directory above an output, where a config.json
        of some other program's is no run."""
        if self.lock.is_file() or self.previous_run.is_dir():
            return True
        return self.config.is_file() and (self.checkpoints.is_dir() or self.vocab.is_file())

    def export_files(self) -> set[str]:
        """The names of the entries that translate-export wrote here, as its marker lists them
        (the marker itself included); empty for a directory that is no export."""
        marker = self.path / EXPORT_MARKER
        if not marker.is_file():
            return set()
        try:
            listed = json.loads(marker.read_text(encoding="utf-8")).get("files")
        except (OSError, ValueError, AttributeError):  # damaged: what every export holds
            listed = None
        names = {str(name) for name in listed} if isinstance(listed, list) else set()
        return names | {EXPORT_MARKER, self.vocab.name}

    def generated(self) -> list[pathlib.Path]:
        """What a training run, and the commands that report on it, create: what `--force`
        sets aside (and deletes once the new run's data has loaded).

        `data/` counts only while it holds nothing but the generated corpus's files, so a
        user's own corpus kept there is never deleted; neither is `checkpoints.corrupt/`
        (steps set aside as unreadable are never deleted) nor the lock.
        """
        paths = [p for p in self.directories() + self.files() if p != self.lock]
        paths += self.metric_plots()
        return paths + [self.data] if self.holds_generated_corpus() else paths

    def holds(self, path: str | os.PathLike) -> bool:
        """Whether writing `path` could damage this run: a file that is already in the
        workdir, one of the files a run writes (whether written yet or not), or anything
        under one of its directories. Paths are compared resolved (symlinks, `..`)."""
        root = pathlib.Path(os.path.realpath(self.path))
        real = pathlib.Path(os.path.realpath(path))
        if real == root or not real.is_relative_to(root):
            return False
        if real.exists() or real.is_symlink():
            return True
        own = Workdir(root)
        if any(real.is_relative_to(d) for d in own.directories() + [own.data]):
            return True
        top = real.relative_to(root).parts[0]
        if top in own.entry_names() | own.export_files():
            return True
        return top.startswith("metrics_") and top.endswith(".png")

    def holds_generated_corpus(self) -> bool:
        """Whether `data/` holds only files named as data/sources.py writes the synthetic corpus."""
        names = {f"{split}.{lang}" for split in ("train", "dev", "test") for lang in ("en", "de")}
        if not self.data.is_dir():
            return False
        return all(p.is_file() and p.name in names for p in self.data.iterdir())


@contextlib.contextmanager
def lock(workdir: Workdir):
    """Holds the workdir's advisory lock, so two trainers never share one workdir.

    A second trainer stops at once with an error naming the process (and host) that holds it.
    The operating system drops the lock when its process exits, however it exits, so a
    killed run leaves no stale lock. On several hosts, process 0 holds it for the job;
    read-only commands (evaluate, translate) take no lock.
    """
    if jax.process_index() != 0:
        yield
        return
    try:
        workdir.path.mkdir(parents=True, exist_ok=True)
        f = open(workdir.lock, "a+", encoding="utf-8")
    except OSError as e:
        raise ValueError(
            f"--workdir={workdir.path}: cannot write there ({e.strerror}: {e.filename}); give "
            "a --workdir where you can write"
        ) from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            owner = f.read().strip() or "another process"
            raise WorkdirBusy(
                f"--workdir={workdir.path} is in use by {owner}; wait for that run to end or "
                "use another --workdir"
            ) from None
        f.seek(0)
        f.truncate()
        since = datetime.datetime.now().isoformat(timespec="seconds")
        f.write(f"translate.train (pid {os.getpid()} on {socket.gethostname()}, since {since})\n")
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)  # still locked: no reader sees a half-cleared owner
            fcntl.flock(f, fcntl.LOCK_UN)


class WorkdirBusy(RuntimeError):
    """Another trainer holds the workdir's lock."""


def copy_vocabulary(source: Workdir, target: Workdir) -> None:
    """Process 0 copies `source`'s vocab.model into `target` unless it holds one already.

    For a run started from another's parameters (whose pieces it must read and write) and
    for the best checkpoint's own workdir. Whole or absent, even if the process is killed.
    """
    if jax.process_index() == 0 and not target.vocab.is_file():
        target.path.mkdir(parents=True, exist_ok=True)
        with atomic.file(target.vocab) as tmp:
            shutil.copyfile(source.vocab, tmp)
    sharding.sync_processes("vocabulary copied")


def config_text(config: Config) -> str:
    """A config as config.json holds it."""
    return json.dumps(config.to_dict(), indent=2) + "\n"


def write_config(config: Config, workdir: Workdir) -> None:
    """Process 0 records the config, whole or absent even if the process is killed here."""
    if jax.process_index() == 0:
        atomic.write_text(workdir.config, config_text(config))


def read_config(workdir: Workdir) -> Config:
    """The config a workdir was trained with."""
    if not workdir.path.exists():
        raise FileNotFoundError(f"--workdir={workdir.path}: no such directory")
    if not workdir.config.is_file():
        if workdir.previous_run.is_dir():
            raise FileNotFoundError(
                f"--workdir: {workdir.path} holds an interrupted --force run (its earlier run is "
                f"set aside in {workdir.previous_run.name}/): run translate-train there again to "
                "put the earlier run back, or to finish the new one"
            )
        raise FileNotFoundError(
            f"--workdir: {workdir.path} holds no {workdir.config.name}; is it a translate.train "
            "workdir?"
        )
    try:
        values = json.loads(workdir.config.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{workdir.config}: not UTF-8 text ({e.reason})") from None
    except json.JSONDecodeError as e:
        raise ValueError(
            f"{workdir.config}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "restore it, or delete it and train with the config that made this run (training "
            "writes it again)"
        ) from None
    if not isinstance(values, dict) or not all(isinstance(v, dict) for v in values.values()):
        raise ValueError(f"{workdir.config}: not a config (sections of fields) as training writes")
    try:
        return config_from_dict(values)
    except ValueError as e:
        raise ValueError(f"{workdir.config}: {e}") from None


def enclosing_run(path: str | os.PathLike) -> Workdir | None:
    """The nearest directory above `path` (resolved) that is a training run, a parameters-only
    workdir or an export (`Workdir.is_marked_run`, `Workdir.is_export`): the run that writing
    `path` could damage, whatever --workdir the command was given. A workdir kept inside a run
    (its best/, an average) answers for what is inside it."""
    for parent in pathlib.Path(os.path.realpath(path)).parents:
        run = Workdir(parent)
        try:
            if run.is_export() or run.is_marked_run():
                return run
        except OSError:  # a directory that cannot be looked into holds no run we could damage
            continue
    return None


def check_output_path(
    output: str | os.PathLike,
    flag: str,
    workdirs: Sequence[str | os.PathLike],
    directory: bool,
    instead: str = "",
) -> None:
    """May a command write `output`? The one answer every command gives before it writes.

    The runs it protects are the command's `workdirs` and the run or export that `output` lies
    in, found from the path (`enclosing_run`): an output inside another run's workdir is
    refused as one inside the command's own.

    Refused, naming `flag` (`--output`) and changing nothing:
      - a path that is one of `workdirs`, or holds one;
      - a directory output under a file, or that is a file; a file output that is a directory;
      - a file output that is a file of a run (`Workdir.holds`: any file already there, or one
        a run writes, or anything under its directories), or one an export holds or wrote;
      - a directory output inside the directories that training writes and reads back
        (checkpoints/, tokens/, best/, ...), where a run keeps a file, or among an export's
        files; or that is itself a training run.
    What a command adds of its own (translate-text: not the --input; translate-evaluate: no
    report there yet; translate-export and the average: only their own earlier output) it
    checks after this. `instead` ends a refusal with what to do (default: give another path).

    Raises:
      ValueError: naming the flag, the path and the run it would damage.
    """
    instead = instead or f"give another {flag}"
    real = pathlib.Path(os.path.realpath(output))
    for workdir in workdirs:
        run = pathlib.Path(os.path.realpath(workdir))
        if real == run or real in run.parents:
            raise ValueError(
                f"{flag}={output} is --workdir={workdir} itself or holds it: writing there "
                f"would damage that run; {instead}"
            )
    given = {pathlib.Path(os.path.realpath(workdir)) for workdir in workdirs}
    found = enclosing_run(real)
    others = [found] if found is not None and found.path not in given else []
    if not directory:
        if os.path.isdir(output):
            raise ValueError(f"{flag}={output} is a directory; give a file name")
        for workdir in workdirs:
            if Workdir(workdir).holds(output):
                raise ValueError(
                    f"{flag}={output} is a file of --workdir={workdir} ({real}); writing there "
                    f"would damage that run: give a {flag} outside the files the workdir "
                    "holds and a run writes there (its config, vocabulary, checkpoints, logs, "
                    "reports, curves, best/, evaluations/ and data/)"
                )
        for run in others:
            if run.holds(real):
                raise ValueError(
                    f"{flag}={output} is a file of {described(run)} ({real}); writing there "
                    f"would damage it: give a {flag} outside the files it holds and writes"
                )
        return
    out = Workdir(output)
    for path in (out.path, *out.path.parents):
        if path.exists() and not path.is_dir():
            raise ValueError(
                f"{flag}={output}: {path} is a file; {flag} is the directory that the "
                "command's files go in"
            )
    for workdir in workdirs:
        if owned_by(Workdir(os.path.realpath(workdir)), real):
            raise ValueError(
                f"{flag}={output} is inside --workdir={workdir}'s own files; {instead}"
            )
    for run in others:
        if owned_by(run, real):
            raise ValueError(f"{flag}={output} is inside {described(run)}'s own files; {instead}")
    if out.is_training_run() and not out.is_export():  # an export's config.json is its own
        raise ValueError(
            f"{flag}={output} is a training workdir, whose report.json is the training run's "
            f"own: {instead}"
        )


def owned_by(run: Workdir, real: pathlib.Path) -> bool:
    """Whether the resolved path `real` lies in what `run` keeps for itself: the directories
    training writes and reads back, the files a run keeps (a directory there would block
    them), an export's own files."""
    own = run.training_directories() + run.files() + [run.path / n for n in run.export_files()]
    return any(real.is_relative_to(path) for path in own)


def described(run: Workdir) -> str:
    """A run found from an output's path, as a refusal names it."""
    return f"the export {run.path}" if run.is_export() else f"the training run {run.path}"
