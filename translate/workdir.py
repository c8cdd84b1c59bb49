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
A workdir written by scripts/average_checkpoints.py (`write_average`) holds config.json,
vocab.model and one parameters-only checkpoint.

Orbax (translate/checkpoint.py) and the models (Flax) are imported inside the functions that
read or write checkpoints: a command that reads only a workdir's config and vocabulary (the
text command with its programs saved, translate/decoding/programs.py) starts without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import json
import os
import pathlib
import shutil
import socket
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax

from translate import atomic, sharding
from translate.config import Config, config_from_dict, split_init_from
from translate.data.tokenizer import Tokenizer

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
        return top in own.entry_names() or (top.startswith("metrics_") and top.endswith(".png"))

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


def check_layout(workdir: Workdir) -> None:
    """Refuses a workdir that is a file, or lies under one, and entries of the wrong kind in it
    (a file `tensorboard`, a directory `metrics.jsonl`), before anything is written.

    Raises:
      ValueError: naming --workdir and the path in the way.
    """
    if workdir.is_export():
        raise ValueError(
            f"--workdir={workdir.path} is an export that translate-export wrote "
            f"({EXPORT_MARKER}); training there would replace the exported model's files, "
            "with --force or without: give a new directory (nothing in it was changed)"
        )
    for path in (workdir.path, *workdir.path.parents):
        if path.exists() and not path.is_dir():
            raise ValueError(
                f"--workdir={workdir.path}: {path} is a file, not a directory: give a --workdir "
                "that is a directory or does not exist yet"
            )
    for path in workdir.directories():
        if path.exists() and not path.is_dir():
            raise ValueError(
                f"{path} is a file, where a run keeps its directory {path.name}/: move it away "
                f"or use another --workdir (nothing in {workdir.path} was changed)"
            )
    for path in workdir.files():
        if path.is_dir():
            raise ValueError(
                f"{path} is a directory, where a run keeps its file {path.name}: move it away "
                f"or use another --workdir (nothing in {workdir.path} was changed)"
            )


def check_config(config: Config, workdir: Workdir, force: bool) -> None:
    """Refuses to reuse a workdir trained with a different model or data vocabulary.

    With `force`, everything an earlier run generated in the workdir is moved into
    `previous_run/` instead, and deleted only once the new run's data has loaded
    (`settle_previous_run`): bad new data puts the old run back. On several hosts sharing the
    workdir, process 0 alone moves and writes.
    """
    primary = jax.process_index() == 0
    if force and primary:
        if workdir.previous_run.exists():
            raise FileExistsError(
                f"{workdir.previous_run} holds a run that an earlier --force set aside and "
                "could not put back; move it away (or delete it) and run again"
            )
        generated = [t for t in workdir.generated() if t.exists() or t.is_symlink()]
        if generated:
            workdir.previous_run.mkdir(parents=True)
        for target in generated:
            target.rename(workdir.previous_run / target.name)
    elif not force and workdir.config.is_file():
        # Through the Config, so fields added since the workdir was made take their defaults.
        saved = read_config(workdir).to_dict()
        now = config.to_dict()
        for conf in (saved, now):
            del conf["model"]["attention"]  # a kernel choice; the parameters do not depend on it
        compared = [("model", name) for name in saved["model"]]
        compared += [("data", "vocab_size"), ("data", "source")]
        # The direction: a swapped pair would train the run's model to translate backwards.
        compared += [("data", "src_lang"), ("data", "tgt_lang")]
        differ = [
            f"config.{section}.{field} = {saved[section][field]}, now {now[section][field]}"
            for section, field in compared
            if saved[section][field] != now[section][field]
        ]
        # AdamW keeps another optimizer state than Adam: its value may change, not its use.
        if bool(saved["train"]["weight_decay"]) != bool(now["train"]["weight_decay"]):
            differ.append(
                f"config.train.weight_decay = {saved['train']['weight_decay']}, now "
                f"{now['train']['weight_decay']} (the optimizer's state differs with it on)"
            )
        if differ:
            raise ValueError(
                f"{workdir.path} was created with {'; '.join(differ)}: use a fresh --workdir, "
                "or pass --force to set its run aside and start afresh"
            )
    elif not force:
        check_checkpoint_shapes(config, workdir)
    if not force:
        check_trainable(workdir)
    sharding.sync_processes("workdir checked")  # every host has read config.json before it changes


def check_trainable(workdir: Workdir) -> None:
    """Refuses a directory that holds results but no run to continue: translate-evaluate's
    report (which the run's own report would replace), or a checkpoint of parameters alone
    (an average, or a run's best/), which has no optimizer state to resume.

    Raises:
      ValueError: naming --workdir and what it holds.
    """
    from translate import checkpoint

    reports = [p.name for p in (workdir.report_json, workdir.report_txt, workdir.hypotheses)]
    reports = [name for name in reports if (workdir.path / name).exists()]
    step = checkpoint.latest_step(workdir.checkpoints)
    if reports and step is None and not workdir.config.exists():
        raise ValueError(
            f"--workdir={workdir.path} holds {', '.join(reports)} but no training run (it looks "
            "like translate-evaluate's output, which training would overwrite): give another "
            "--workdir"
        )
    if step is not None and not checkpoint.holds_optimizer_state(workdir.checkpoints, step):
        raise ValueError(
            f"--workdir={workdir.path} holds a checkpoint of parameters alone (step {step}: an "
            "average written by scripts/average_checkpoints.py, or a run's best/), which "
            "training cannot resume: start a new run from it with "
            f"--config.train.init_from={workdir.path} and another --workdir"
        )


def check_checkpoint_shapes(config: Config, workdir: Workdir) -> None:
    """Refuses a config whose model does not fit the checkpoints of a workdir that has lost its
    config.json, before anything is written (the restore would fail only after it).

    Raises:
      ValueError: naming a parameter whose shape differs, there and here.
    """
    from translate import checkpoint
    from translate.models.factory import abstract_model

    step = checkpoint.latest_step(workdir.checkpoints)
    if step is None:
        return
    try:
        saved = checkpoint.param_shapes(workdir.checkpoints, step)
    except Exception:  # noqa: BLE001 - an unreadable step is the restore's to set aside
        return
    vocab_size = Tokenizer(workdir.vocab).vocab_size if workdir.vocab.is_file() else None
    _, abstract = abstract_model(config, vocab_size or config.data.vocab_size)
    mine = {
        checkpoint.dotted_name(p): tuple(x.shape) for p, x in jax.tree.leaves_with_path(abstract)
    }
    if saved == mine:
        return
    differ = sorted(set(saved) ^ set(mine)) or [n for n in sorted(saved) if saved[n] != mine[n]]
    name = differ[0]
    raise ValueError(
        f"{workdir.path} holds checkpoints of a model of another shape than this config's "
        f"({name}: {saved.get(name, 'absent')} there, {mine.get(name, 'absent')} here), and no "
        f"{workdir.config.name} to say which config made them: train with that config, use a "
        "fresh --workdir, or pass --force to set them aside and start afresh"
    )


def recover_previous_run(workdir: Workdir) -> str | None:
    """Finishes what a `--force` run that was killed left behind (process 0).

    previous_run/ at a run's start means the --force run died before its data had loaded: the
    earlier run is put back. `.previous_run.deleting/` means it died after: that is deleted.

    Returns:
      What was put back, for the log, or None.
    """
    if jax.process_index() != 0:
        return None
    if workdir.discarded_run.exists():
        shutil.rmtree(workdir.discarded_run)
    if not workdir.previous_run.is_dir():
        return None
    names = sorted(p.name for p in workdir.previous_run.iterdir())
    settle_previous_run(workdir, keep=True)
    return ", ".join(names)


def settle_previous_run(workdir: Workdir, keep: bool) -> None:
    """Deletes the run that `--force` set aside, or with `keep` puts it back (process 0).

    Putting it back first removes what the new run had generated in its place.
    """
    if jax.process_index() != 0 or not workdir.previous_run.is_dir():
        return
    if keep:
        for old in workdir.previous_run.iterdir():
            new = workdir.path / old.name
            if new.is_dir() and not new.is_symlink():
                shutil.rmtree(new)
            elif new.exists() or new.is_symlink():
                new.unlink()
            old.rename(new)
        workdir.previous_run.rmdir()
    else:
        # One rename commits the deletion: a run killed during rmtree leaves a directory that
        # the next start deletes, never a half-deleted run that it would put back.
        workdir.previous_run.rename(workdir.discarded_run)
        shutil.rmtree(workdir.discarded_run)


def check_vocabulary_unchanged(workdir: Workdir) -> None:
    """Refuses a `vocab.model` that the newest readable checkpoint was not trained with.

    Runs before the data is opened, so a swapped vocabulary stops the run before the token
    cache is rebuilt or config.json rewritten.
    """
    from translate import checkpoint

    if not workdir.vocab.is_file() or checkpoint.latest_step(workdir.checkpoints) is None:
        return
    manager = checkpoint.make_manager(workdir.checkpoints, read_only=True)
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            meta = checkpoint.read_meta(manager, step)
        except Exception:  # noqa: BLE001 - an unreadable step is the restore's to set aside
            continue
        checkpoint.check_vocabulary(meta, Tokenizer(workdir.vocab), workdir.path)
        return


class InitFrom(NamedTuple):
    """Another run's checkpoint that a new run starts from (`train.init_from`), checked."""

    workdir: Workdir
    step: int


def check_init_from(config: Config, workdir: Workdir, force: bool = False) -> InitFrom:
    """Checks `train.init_from` for a run that starts in `workdir`, before anything is written.

    The other workdir must hold a config, a vocabulary and the checkpoint asked for, with
    parameters of this config's shapes; a vocabulary already in `workdir` must be the same one
    (unless `force`, which deletes it).

    Raises:
      FileNotFoundError, ValueError: naming the flag and both workdirs.
    """
    from translate import checkpoint
    from translate.models.factory import abstract_model

    path, step = split_init_from(config.train.init_from)
    source = Workdir(path)
    flag = f"--config.train.init_from={config.train.init_from}"
    if source.path.resolve() == workdir.path.resolve():
        raise ValueError(f"{flag}: that is this run's own --workdir; resuming needs no init_from")
    for needed in (source.config, source.vocab):
        if not needed.is_file():
            raise FileNotFoundError(
                f"{flag}: {needed} is missing; is it a translate.train workdir?"
            )
    steps = []
    if source.checkpoints.is_dir():
        steps = sorted(checkpoint.make_manager(source.checkpoints, read_only=True).all_steps())
    if not steps or (step is not None and step not in steps):
        raise FileNotFoundError(
            f"{flag}: no checkpoint{'' if step is None else f' at step {step}'} in "
            f"{source.checkpoints} (steps there: {steps})"
        )
    tokenizer = Tokenizer(source.vocab)
    # Compared by the fingerprint that checkpoints store (Tokenizer.sha256).
    mine = workdir.vocab
    if not force and mine.is_file() and Tokenizer(mine).sha256 != tokenizer.sha256:
        raise ValueError(
            f"{flag}: {source.vocab} and --workdir={workdir.path}'s {workdir.vocab.name} are "
            "different vocabularies; a run started from another's parameters reads and writes "
            "its pieces, so use a fresh --workdir (the vocabulary is copied into it)"
        )
    their_config = read_config(source)
    theirs = their_config.model
    _, shapes = abstract_model(config, tokenizer.vocab_size)
    _, their_shapes = abstract_model(their_config, tokenizer.vocab_size)
    if jax.tree.map(lambda x: x.shape, shapes) != jax.tree.map(lambda x: x.shape, their_shapes):
        differ = [
            f"{f.name} {getattr(theirs, f.name)} there, {getattr(config.model, f.name)} here"
            for f in dataclasses.fields(theirs)
            if getattr(theirs, f.name) != getattr(config.model, f.name)
        ]
        raise ValueError(
            f"{flag}: its parameters do not fit this config's model (config.model in "
            f"{source.config}: {'; '.join(differ)})"
        )
    return InitFrom(source, steps[-1] if step is None else step)


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


def read_init_params(init: InitFrom, abstract_params, tokenizer: Tokenizer):
    """The parameters saved at `init.step`, restored into `abstract_params`' shardings."""
    from translate import checkpoint

    manager = checkpoint.make_manager(init.workdir.checkpoints, read_only=True)
    checkpoint.check_vocabulary(
        checkpoint.read_meta(manager, init.step), tokenizer, init.workdir.path
    )
    params, _, _ = checkpoint.restore(manager, init.step, abstract_params)
    manager.close()
    return params


def write_config(config: Config, workdir: Workdir) -> None:
    """Process 0 records the config, whole or absent even if the process is killed here."""
    if jax.process_index() == 0:
        atomic.write_text(workdir.config, json.dumps(config.to_dict(), indent=2) + "\n")


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


# How many times `load_model` chooses the checkpoints to average again when a run still
# training in the workdir deletes one of them while they are read.
READ_ATTEMPTS = 3


def say(line: str) -> None:
    """How loading a model speaks (of a checkpoint it passes over): a line on stderr, so that
    a command's output on stdout holds what it was asked for alone."""
    print(line, file=sys.stderr)


def load_model(
    path: str | os.PathLike,
    step: int | None = None,
    average: int | Sequence[int] = 0,
    log: Callable[[str], None] = say,
    params: str = "auto",
):
    """Loads (graphdef, params, tokenizer, config, steps) from a training workdir.

    Args:
      path: a `translate.train` workdir, or one written by scripts/average_checkpoints.py.
      step: the checkpoint to load; None for the newest.
      average: if > 0, the parameters are the mean of the newest `average` checkpoints instead;
        a list of steps: the mean of the checkpoints at those steps.
      params: "auto" reads a checkpoint's moving average of the parameters (`train.ema_decay`)
        when it holds one, else the parameters; "ema" requires the average; "raw" reads the
        parameters themselves (--params).

    Returns:
      The model's graph and parameters (on the first local device: decoding runs there), the
      tokenizer, the config, and the training steps whose parameters these are: one step, or
      the averaged ones (also when the checkpoint was written by average_checkpoints.py).
    """
    from translate import checkpoint
    from translate.models.factory import abstract_model

    workdir = Workdir(path)
    config = read_config(workdir)
    # The attention kernel suits the machine that trained, perhaps a GPU this one lacks; the
    # parameters do not depend on it, so decoding picks the kernel for its own device.
    config.model.attention = "auto"
    tokenizer = Tokenizer(workdir.vocab)
    if checkpoint.latest_step(workdir.checkpoints) is None:
        raise FileNotFoundError(
            f"--workdir: no checkpoint in {workdir.checkpoints}; "
            "train first (python -m translate.train ...)"
        )
    manager = checkpoint.make_manager(workdir.checkpoints, read_only=True)
    graphdef, shapes = abstract_model(config, tokenizer.vocab_size)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = checkpoint.abstract_like(shapes, device)
    said_ema = False

    def item(step: int) -> str:
        nonlocal said_ema
        chosen = checkpoint.params_item(workdir.checkpoints, step, params)
        if chosen == "ema" and params == "auto" and not said_ema:
            said_ema = True
            log(
                f"{workdir.path}: decoding the moving average of the parameters "
                f"(train.ema_decay={config.train.ema_decay}); --params=raw decodes the "
                "parameters themselves"
            )
        return chosen

    if not isinstance(average, int) or average > 0:
        if step is not None:
            raise ValueError("give a step or a number of checkpoints to average, not both")
        keep = config.train.keep_checkpoints
        # A run still training there may delete a step while it is read: then the newest N
        # are chosen again (a few times); steps named one by one cannot be.
        for _ in range(READ_ATTEMPTS):
            if isinstance(average, int):
                steps = checkpoint.steps_to_average(manager, average, keep)
            else:
                steps = sorted(average)
                missing = sorted(set(steps) - set(manager.all_steps()))
                if missing:
                    raise ValueError(
                        f"no checkpoint of steps {missing} in {manager.directory} (there: "
                        f"{manager.all_steps()})"
                    )
            try:
                mean = checkpoint.average_params(manager, steps, abstract, item)
            except Exception:
                manager.reload()
                if set(steps) <= set(manager.all_steps()):
                    raise
                continue
            return graphdef, mean, tokenizer, config, steps
        raise ValueError(
            f"the checkpoints in {manager.directory} were deleted while they were read, "
            f"{READ_ATTEMPTS} times (a run training there keeps only its newest {keep}): "
            "try again, or average once that run has ended"
        )
    requested = step is not None
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
        raise FileNotFoundError(
            f"--workdir: no checkpoint{'' if step is None else f' at step {step}'} in "
            f"{workdir.checkpoints} (steps there: {list(manager.all_steps())})"
        )

    def check(meta):
        checkpoint.check_vocabulary(meta, tokenizer, workdir.path)

    if requested:
        meta = checkpoint.read_meta(manager, step)
        check(meta)
        restored, _, _ = checkpoint.restore(manager, step, abstract, item=item(step))
        return graphdef, restored, tokenizer, config, meta.get("averaged_steps", [step])
    # A run still training there may delete the newest step while it is read: then the newest
    # is chosen again (a few times), as for --average.
    said = False
    for _ in range(READ_ATTEMPTS):
        try:
            found = checkpoint.restore_latest(
                manager, abstract, check_meta=check, log=log, item=item
            )
        except checkpoint.StepDeleted as deleted:
            manager.reload()
            if not said:
                said = True
                log(
                    f"the checkpoint of step {deleted.step} in {manager.directory} was deleted "
                    "while it was read (a run is training there): reading the newest again"
                )
            continue
        if found is None:  # every step was deleted meanwhile
            break
        step, restored, _, meta = found
        return graphdef, restored, tokenizer, config, meta.get("averaged_steps", [step])
    raise ValueError(
        f"the newest checkpoint in {manager.directory} was deleted while it was read, "
        f"{READ_ATTEMPTS} times (a run training there keeps only its newest "
        f"{config.train.keep_checkpoints}): try again"
    )


def write_average(
    source: Workdir, target: Workdir, params, steps: Sequence[int], step: int
) -> None:
    """Writes a workdir for decoding with the mean parameters of `source`'s checkpoints.

    It holds `source`'s config.json and vocab.model as they are, and `params` as one
    parameters-only checkpoint at `step` whose metadata lists the averaged `steps` (which
    `load_model` returns) and where they come from. scripts/average_checkpoints.py writes it
    into a new directory that it renames into place once whole.

    Args:
      source: the training workdir whose checkpoints were averaged.
      target: a new or empty workdir.
      params: the mean parameters (`load_model(source.path, average=...)`).
      steps: the averaged steps, oldest first.
      step: the step to save the average at.
    """
    from translate import checkpoint

    target.path.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source.config, target.config)
    shutil.copyfile(source.vocab, target.vocab)
    meta = {"step": step, "averaged_steps": list(steps), "averaged_from": str(source.path)}
    with checkpoint.make_manager(target.checkpoints, keep=1) as manager:
        checkpoint.save_params(manager, step, params, meta)


class Ensemble(NamedTuple):
    """One or more models read back for decoding; `graphdefs` and `params` are always tuples."""

    graphdefs: tuple
    params: tuple
    tokenizer: Tokenizer
    config: Config  # the first workdir's
    steps: tuple[list[int], ...]  # per model: its step, or the steps averaged


def load_ensemble(
    paths: Sequence[str | os.PathLike],
    step: int | None = None,
    average: int = 0,
    log: Callable[[str], None] = say,
    params: str = "auto",
) -> Ensemble:
    """The models of one or more workdirs, each at `step` (None: the newest) or the mean of
    its newest `average` checkpoints: how every command picks its checkpoints (--step and
    --average).

    Raises ValueError naming the flag for a bad choice, and naming two workdirs whose
    vocabularies differ.
    """
    if not paths:
        raise ValueError("--workdir is required (repeat it for an ensemble)")
    if average < 0:
        raise ValueError(f"--average={average}: must be >= 0 (0, the default: no average)")
    if step is not None and step < 0:
        raise ValueError(f"--step={step}: must be >= 0 (or -1, the default: the newest)")
    if step is not None and average:
        raise ValueError(
            f"--step={step} and --average={average}: give a step or a number of checkpoints "
            "to average, not both"
        )
    from translate.checkpoint import PARAMS_CHOICES

    if params not in PARAMS_CHOICES:
        raise ValueError(f"--params={params}: must be one of {', '.join(PARAMS_CHOICES)}")
    check_shared_vocabulary(paths)
    members = []
    for path in paths:
        try:
            members.append(load_model(path, step, average, log, params))
        except ValueError as e:
            raise ValueError(f"--workdir={path} --average={average}: {e}") from None
    return Ensemble(
        tuple(m[0] for m in members),
        tuple(m[1] for m in members),
        members[0][2],
        members[0][3],
        tuple(m[4] for m in members),
    )


def check_shared_vocabulary(paths: Sequence[str | os.PathLike]) -> None:
    """Raises ValueError naming two workdirs whose vocabularies differ.

    An ensemble averages log-probabilities token id by token id, which means nothing unless
    every model reads and writes the same pieces.
    """
    workdirs = [Workdir(p) for p in paths]
    for workdir in workdirs:
        if not workdir.path.exists():
            raise FileNotFoundError(f"--workdir={workdir.path}: no such directory")
        if not workdir.vocab.is_file():
            raise FileNotFoundError(
                f"--workdir: {workdir.vocab} is missing; is it a translate.train workdir?"
            )
    first, expected = workdirs[0], workdirs[0].vocab.read_bytes()
    for other in workdirs[1:]:
        if other.vocab.read_bytes() != expected:
            raise ValueError(
                f"--workdir {first.path} and --workdir {other.path} have different vocabularies "
                f"({first.vocab.name} differs); an ensemble needs models trained on one "
                "vocabulary"
            )
