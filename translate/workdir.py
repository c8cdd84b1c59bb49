"""What a run directory holds, and how it is written, checked and read back.

Only this module spells a workdir's file names. A training workdir holds:
  config.json     the run's config, written once its data has loaded
  vocab.model     the shared SentencePiece vocabulary; or, imported from OPUS-MT, its
  source.spm, target.spm, vocab.json    two SentencePiece models over one id table
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

Who owns what: a run owns the names it writes (`Workdir.own_names`, whether written yet or not)
and everything under them; everything else in its directory (evaluations/, attention/, a
translations.txt of the user's) is its user's. A run is found by what only a run writes
(`Workdir.is_run`: the trainer's lock, or checkpoints as translate/checkpoint.py saves them), never
by a config.json, which many programs write. An export owns the files its marker lists.

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
# Beside checkpoints/: the steps translate/checkpoint.py `move_aside` found unreadable.
CORRUPT = ".corrupt"


class Workdir:
    """The paths inside one run directory."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.config = self.path / "config.json"
        self.vocab = self.path / "vocab.model"
        # OPUS-MT's tokenizer (translate/pretrained/marian.py), in place of vocab.model.
        self.pair_vocab = tuple(self.path / n for n in ("source.spm", "target.spm", "vocab.json"))
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
            *self.pair_vocab,
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

    def tokenizer_files(self) -> tuple[pathlib.Path, ...]:
        """The files of the tokenizer held here: vocab.model, or OPUS-MT's three; () for none."""
        if self.vocab.is_file():
            return (self.vocab,)
        return self.pair_vocab if all(p.is_file() for p in self.pair_vocab) else ()

    def tokenizer(self):
        """The tokenizer held here, whichever kind (translate/data/tokenizer.py);
        FileNotFoundError naming the workdir for none."""
        from translate.data.tokenizer import PairTokenizer, Tokenizer

        files = self.tokenizer_files()
        if not files:
            raise FileNotFoundError(
                f"--workdir: {self.vocab} is missing; is it a translate.train workdir?"
            )
        return Tokenizer(files[0]) if len(files) == 1 else PairTokenizer(*files)

    def is_export(self) -> bool:
        """Whether translate-export wrote this directory (its marker is there)."""
        return (self.path / EXPORT_MARKER).is_file()

    def holds_training_files(self) -> list[str]:
        """The names of the entries here that only training writes (its checkpoints, tokens,
        logs, lock, report; not config.json or vocab.model, which an export holds too)."""
        own = [*self.training_directories(), self.metrics, self.lock, *self.report_files()]
        return sorted(p.name for p in own + [self.previous_run] if p.exists())

    def is_run(self) -> bool:
        """Whether a run wrote this directory, by what only a run writes: the trainer's lock
        (written when training starts, never removed), or a checkpoint as translate/checkpoint.py
        saves one (a step directory holding its params/ and meta/ items: a run's best/, an
        average). A config.json beside a checkpoints/ folder, a layout of many programs, is not.
        """
        if self.lock.is_file():
            return True
        try:
            steps = list(self.checkpoints.iterdir())
        except OSError:
            return False
        return any(
            step.name.isdigit() and (step / "params").is_dir() and (step / "meta").is_dir()
            for step in steps
        )

    def own_names(self) -> set[str]:
        """The names a training run writes at its top level, whether written yet or not: its
        files and directories (best/, checkpoints.corrupt/, a --force's previous_run/ and the
        one being deleted included). Not evaluations/ or attention/: other commands write there,
        for the user, as they write the user's files beside the run's."""
        own = [*self.files(), *self.training_directories(), self.previous_run, self.discarded_run]
        return {p.name for p in own} | {self.checkpoints.name + CORRUPT}

    def owns(self, path: str | os.PathLike) -> str | None:
        """The entry of this run (or export) that `path` is or lies in, resolved (symlinks,
        `..`), as the run names it (`best/`, `config.json`); None for the user's files.

        Owned: `own_names`, the training curves (metrics_*.png), the hidden temporaries that
        translate/atomic.py writes beside one of them, the files an export's marker lists.
        """
        root = pathlib.Path(os.path.realpath(self.path))
        real = pathlib.Path(os.path.realpath(path))
        if real == root or not real.is_relative_to(root):
            return None
        parts = real.relative_to(root).parts
        top = parts[0]
        names = self.export_files() if self.is_export() else self.own_names()
        hidden = top.startswith(".") and top.count(".") >= 3
        own = top in names or (top.startswith("metrics_") and top.endswith(".png"))
        if not own and hidden:  # `.NAME.<hex>.tmp`: atomic.beside's names
            own = top[1:].rsplit(".", 2)[0] in names
        if not own:
            return None
        return top + "/" if len(parts) > 1 or (root / top).is_dir() else top

    def in_evaluations(self, path: str | os.PathLike) -> bool:
        """Whether `path` lies in evaluations/, where translate-evaluate writes its reports, a
        directory each (its --output may be a new one there); no other command writes a file
        there."""
        real = pathlib.Path(os.path.realpath(path))
        return real.is_relative_to(os.path.realpath(self.evaluations))

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
        """What a training run creates, by its own names (`own_names`): what `--force` sets
        aside (and deletes once the new run's data has loaded). The user's files beside them,
        evaluations/ and attention/ included, stay where they are.

        `data/` counts only while it holds nothing but the generated corpus's files, so a
        user's own corpus kept there is never deleted; neither is `checkpoints.corrupt/`
        (steps set aside as unreadable are never deleted) nor the lock.
        """
        paths = [p for p in self.training_directories() + self.files() if p != self.lock]
        paths = [p for p in paths if p != self.data] + self.metric_plots()
        return paths + [self.data] if self.holds_generated_corpus() else paths

    def foreign_entries(self) -> list[pathlib.Path]:
        """What lies in this run's best/ that training did not write there (it writes a
        parameters-only workdir: config.json, vocab.model, checkpoints/): the user's, which
        `--force` would delete with best/."""
        try:
            found = sorted(self.best.iterdir())
        except OSError:
            return []
        own = {self.config.name, self.checkpoints.name, *(p.name for p in self.tokenizer_files())}
        return [p for p in found if p.name not in own and not p.name.startswith(".")]

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
    read-only commands (evaluate, translate) take no lock. A run refused at its first start
    (an error before it wrote anything) leaves no directory: the one made here goes with its
    lock.
    """
    if jax.process_index() != 0:
        yield
        return
    made = not workdir.path.exists()
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
        except BaseException:
            if made:
                remove_if_untouched(workdir)
            raise
        finally:
            f.truncate(0)  # still locked: no reader sees a half-cleared owner
            fcntl.flock(f, fcntl.LOCK_UN)


def remove_if_untouched(workdir: Workdir) -> None:
    """Removes a workdir that holds nothing but its lock (a run refused before it wrote)."""
    with contextlib.suppress(OSError):
        if [p.name for p in workdir.path.iterdir()] == [workdir.lock.name]:
            workdir.lock.unlink()
            workdir.path.rmdir()


class WorkdirBusy(RuntimeError):
    """Another trainer holds the workdir's lock."""


def copy_vocabulary(source: Workdir, target: Workdir) -> None:
    """Process 0 copies `source`'s tokenizer (vocab.model, or OPUS-MT's three files) into
    `target` unless it holds one already.

    For a run started from another's parameters (whose pieces it must read and write) and
    for the best checkpoint's own workdir. Each file whole or absent, even if the process is
    killed; the tokenizer counts as held once its last file is there.
    """
    if jax.process_index() == 0 and not target.tokenizer_files():
        target.path.mkdir(parents=True, exist_ok=True)
        for path in source.tokenizer_files():
            with atomic.file(target.path / path.name) as tmp:
                shutil.copyfile(path, tmp)
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
    """The nearest of `enclosing_runs(path)`, or None."""
    runs = enclosing_runs(path)
    return runs[0] if runs else None


def enclosing_runs(path: str | os.PathLike) -> list[Workdir]:
    """Every directory above `path` (resolved), nearest first, that a run or translate-export
    wrote (`Workdir.is_run`, `Workdir.is_export`): the runs that writing `path` could damage,
    whatever --workdir the command was given. A run's best/ is a run of its own inside one."""
    runs = []
    for parent in pathlib.Path(os.path.realpath(path)).parents:
        run = Workdir(parent)
        try:
            if run.is_export() or run.is_run():
                runs.append(run)
        except OSError:  # a directory that cannot be looked into holds no run we could damage
            continue
    return runs


def evaluations_home(workdir: str | os.PathLike) -> tuple[Workdir, str]:
    """Where translate-evaluate writes `workdir`'s reports by default, and how their names
    begin: in the workdir's own evaluations/; for a workdir inside a run's own files (its
    best/), in that run's evaluations/, each name beginning with the path inside it (`best.`),
    so that nothing is written where training deletes it."""
    home, prefix = Workdir(workdir), ""
    real = pathlib.Path(os.path.realpath(workdir))
    for run in enclosing_runs(real):
        if run.owns(real):
            home = run
            prefix = ".".join(real.relative_to(os.path.realpath(run.path)).parts) + "."
    return home, prefix


def check_output_path(
    output: str | os.PathLike,
    flag: str,
    workdirs: Sequence[str | os.PathLike],
    directory: bool,
    instead: str = "",
) -> None:
    """May a command write `output`? The one answer every command gives before it writes.

    The runs it protects are the command's `workdirs` and every run or export that `output`
    lies in, found from the path (`enclosing_runs`). Each owns its own names (`Workdir.owns`:
    best/ and previous_run/ included) and everything under them; the rest of its directory is
    the user's, which any command may write as the user asks (the same command again rewrites
    its own output), but for evaluations/, where only translate-evaluate writes.

    Refused, naming `flag` (`--output`) and changing nothing:
      - a path that is one of `workdirs`, or holds one;
      - a directory output under a file, or that is a file; a file output that is a directory;
      - a path that is, or lies in, an entry that a run or export owns, or a file output in a
        run's evaluations/;
      - a directory output that is itself a run (an export is the export command's to judge).
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
    if not directory and os.path.isdir(output):
        raise ValueError(f"{flag}={output} is a directory; give a file name")
    if directory:
        for path in (pathlib.Path(output), *pathlib.Path(output).parents):
            if path.exists() and not path.is_dir():
                raise ValueError(
                    f"{flag}={output}: {path} is a file; {flag} is the directory that the "
                    "command's files go in"
                )
    check_not_owned(output, flag, workdirs, directory, instead)
    out = Workdir(real)
    if directory and not out.is_export() and out.is_run():  # an export's config.json is its own
        what = "a training workdir" if out.lock.is_file() else "a model's workdir (checkpoints)"
        raise ValueError(f"{flag}={output} is {what}, whose files are that run's own: {instead}")


def check_not_owned(
    output: str | os.PathLike,
    flag: str,
    workdirs: Sequence[str | os.PathLike],
    directory: bool,
    instead: str = "",
) -> None:
    """Refuses an output that is, or lies in, what one of `workdirs` or a run or export above
    it owns (`Workdir.owns`), or a file output in a run's evaluations/; the part of
    `check_output_path` that a command replacing its own earlier output asks alone.

    Raises:
      ValueError: naming the flag, the path, the run and its entry.
    """
    instead = instead or f"give another {flag}"
    real = pathlib.Path(os.path.realpath(output))
    given = [(Workdir(os.path.realpath(w)), f"--workdir={w}") for w in workdirs]
    mine = {run.path for run, _ in given}
    found = [(run, described(run)) for run in enclosing_runs(real) if run.path not in mine]
    runs = given + found
    for run, name in runs:
        entry = run.owns(real)
        if directory and entry:
            raise ValueError(f"{flag}={output} is inside {name}'s own files ({entry}); {instead}")
        if entry:
            raise ValueError(
                f"{flag}={output} is a file of {name} ({entry}); writing there would damage "
                f"it: give a {flag} beside its own files (its config, vocabulary, checkpoints, "
                "logs, reports, curves, best/ and data/), e.g. a new name"
            )
    for run, name in runs if not directory else []:
        if not run.is_export() and run.in_evaluations(real):
            raise ValueError(
                f"{flag}={output} is a file of {name} (evaluations/, where only "
                f"translate-evaluate writes, a directory each): {instead}"
            )


def described(run: Workdir) -> str:
    """A run found from an output's path, as a refusal names it."""
    return f"the export {run.path}" if run.is_export() else f"the training run {run.path}"
