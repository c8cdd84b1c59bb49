"""Reading a trained model back: which checkpoint, averaging, the moving average or not, ensembles.

Every command that decodes or exports a model reads it through `load_ensemble` (one workdir or
several): the newest checkpoint, the one at `--step`, or the mean of the newest `--average`
checkpoints (Sec. 6.1), each read as its moving average when it holds one (`--params`). A run
still training in the workdir may delete a step while it is read; the choice is then made again,
a few times. `mean_params` is the one averaging policy, also the trainer's final evaluation's,
and `write_params_workdir` the one writer of a parameters-only workdir (an average, a run's
best/).

Orbax (translate/checkpoint.py) and the models (Flax) are imported inside the functions that
read or write checkpoints: a command that reads only a workdir's config and vocabulary (the
text command with its searches saved, translate/decoding/saved_searches.py) starts without them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax

from translate.config import Config
from translate.data.tokenizer import PairTokenizer, Tokenizer
from translate.workdir import Workdir, copy_vocabulary, read_config

# The values of --matmul_dtype: "" the model's own products, or config.model.matmul_dtype's.
MATMUL_DTYPES = ("", "compute", "bfloat16")
# How many times `load_model` chooses the checkpoints to read again when a run still training
# in the workdir deletes one of them while they are read.
READ_ATTEMPTS = 3


def say(line: str) -> None:
    """How loading a model speaks (of a checkpoint it passes over): a line on stderr, so that
    a command's output on stdout holds what it was asked for alone."""
    print(line, file=sys.stderr)


class TrainedModel(NamedTuple):
    """One workdir's model as `load_model` reads it back."""

    graphdef: Any
    params: Any  # on the first local device: decoding runs there
    tokenizer: Tokenizer | PairTokenizer
    config: Config
    steps: list[int]  # the checkpoint's step, or the steps averaged


def mean_params(
    manager, steps: Sequence[int], abstract_params, choice: str = "auto", said=None, log=say
):
    """The mean of the parameters saved at `steps`: the one averaging policy (Sec. 6.1).

    Each checkpoint gives its moving average when it holds one and `choice` allows it
    (`checkpoint.params_item`); `said` is called whenever a moving average is read. With
    "auto", checkpoints of which only some hold an average (`train.ema_decay` switched on or
    off by a resume) are averaged as their parameters themselves, never mixed, and `log` says so.
    """
    from translate import checkpoint

    held = [checkpoint.holds_ema(manager.directory, step) for step in steps]
    if choice == "auto" and any(held) and not all(held):
        log(
            f"{manager.directory}: of the checkpoints {list(steps)}, only some hold a moving "
            "average of the parameters; averaging the parameters themselves (--params=raw)"
        )
        choice = "raw"

    def item(step: int) -> str:
        chosen = checkpoint.params_item(manager.directory, step, choice)
        if chosen == "ema" and said is not None:
            said()
        return chosen

    return checkpoint.average_params(manager, list(steps), abstract_params, item)


class _Reader:
    """Reads one workdir's checkpoints into `abstract` shapes, retrying when a live run deletes
    the step being read (`load_model`)."""

    def __init__(self, workdir: Workdir, config: Config, tokenizer: Tokenizer, abstract, log):
        from translate import checkpoint

        self.workdir, self.config, self.tokenizer = workdir, config, tokenizer
        self.abstract, self.log = abstract, log
        self.manager = checkpoint.make_manager(workdir.checkpoints, read_only=True)
        self.said_ema = False

    def say_ema(self) -> None:
        if not self.said_ema:
            self.said_ema = True
            self.log(
                f"{self.workdir.path}: decoding the moving average of the parameters "
                f"(train.ema_decay={self.config.train.ema_decay}); --params=raw decodes the "
                "parameters themselves"
            )

    def item(self, step: int, choice: str) -> str:
        from translate import checkpoint

        chosen = checkpoint.params_item(self.workdir.checkpoints, step, choice)
        if chosen == "ema" and choice == "auto":
            self.say_ema()
        return chosen

    def average(self, average: int | Sequence[int], choice: str) -> tuple[Any, list[int]]:
        """The mean of the newest `average` checkpoints, or of the steps listed."""
        from translate import checkpoint

        manager, keep = self.manager, self.config.train.keep_checkpoints
        said = self.say_ema if choice == "auto" else None
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
                mean = mean_params(manager, steps, self.abstract, choice, said, self.log)
                return mean, steps
            except Exception:
                manager.reload()
                if set(steps) <= set(manager.all_steps()):
                    raise
        raise ValueError(
            f"the checkpoints in {manager.directory} were deleted while they were read, "
            f"{READ_ATTEMPTS} times (a run training there keeps only its newest {keep}): "
            "try again, or average once that run has ended"
        )

    def check(self, meta: dict[str, Any]) -> None:
        from translate import checkpoint

        checkpoint.check_vocabulary(meta, self.tokenizer, self.workdir.path)

    def at_step(self, step: int, choice: str) -> tuple[Any, list[int]]:
        """The checkpoint of `step`, asked for by the user (not read again if deleted)."""
        from translate import checkpoint

        meta = checkpoint.read_meta(self.manager, step)
        self.check(meta)
        item = self.item(step, choice)
        restored, _, _ = checkpoint.restore(self.manager, step, self.abstract, item=item)
        return restored, meta.get("averaged_steps", [step])

    def newest(self, choice: str) -> tuple[Any, list[int]]:
        """The newest readable checkpoint (unreadable ones are passed over, and said)."""
        from translate import checkpoint

        manager, said = self.manager, False
        # A run still training there may delete the newest step while it is read: then the
        # newest is chosen again (a few times), as for an average.
        for _ in range(READ_ATTEMPTS):
            try:
                found = checkpoint.restore_latest(
                    manager,
                    self.abstract,
                    check_meta=self.check,
                    log=self.log,
                    item=lambda step: self.item(step, choice),
                )
            except checkpoint.StepDeleted as deleted:
                manager.reload()
                if not said:
                    said = True
                    self.log(
                        f"the checkpoint of step {deleted.step} in {manager.directory} was "
                        "deleted while it was read (a run is training there): reading the "
                        "newest again"
                    )
                continue
            if found is None:  # every step was deleted meanwhile
                break
            step, restored, _, meta = found
            return restored, meta.get("averaged_steps", [step])
        raise ValueError(
            f"the newest checkpoint in {manager.directory} was deleted while it was read, "
            f"{READ_ATTEMPTS} times (a run training there keeps only its newest "
            f"{self.config.train.keep_checkpoints}): try again"
        )


def open_trained(path: str | os.PathLike) -> Workdir:
    """The workdir at `path`, checked before a command reads a model from it: the one place
    that says what is missing, the same for every command (each reads through `load_model` or
    `check_shared_vocabulary`).

    Raises:
      FileNotFoundError: naming --workdir: no such directory; a `--force` run killed while its
        data loaded (its earlier run set aside in previous_run/, no config.json yet: said
        before a vocabulary it may not have trained yet); no config.json; no vocab.model.
    """
    workdir = Workdir(path)
    if not workdir.config.is_file():
        read_config(workdir)  # raises, naming what the workdir holds instead
    if not workdir.tokenizer_files():
        raise FileNotFoundError(
            f"--workdir: {workdir.vocab} is missing; is it a translate.train workdir?"
        )
    return workdir


def load_model(
    path: str | os.PathLike,
    step: int | None = None,
    average: int | Sequence[int] = 0,
    log: Callable[[str], None] = say,
    params: str = "auto",
    matmul_dtype: str = "",
) -> TrainedModel:
    """Loads (graphdef, params, tokenizer, config, steps) from a training workdir.

    Args:
      path: a `translate.train` workdir, or one written by scripts/average_checkpoints.py.
      step: the checkpoint to load; None for the newest.
      average: if > 0, the parameters are the mean of the newest `average` checkpoints instead;
        a list of steps: the mean of the checkpoints at those steps.
      log: where lines about checkpoints passed over, or the moving average read, go.
      params: "auto" reads a checkpoint's moving average of the parameters (`train.ema_decay`)
        when it holds one, else the parameters; "ema" requires the average; "raw" reads the
        parameters themselves (--params).
      matmul_dtype: decode with these products (`model.matmul_dtype`: "compute" or "bfloat16")
        instead of the model's own; "" keeps the model's (--matmul_dtype).

    Returns:
      The model's graph and parameters (on the first local device: decoding runs there), the
      tokenizer, the config, and the training steps whose parameters these are: one step, or
      the averaged ones (also when the checkpoint was written by average_checkpoints.py).
    """
    from translate import checkpoint
    from translate.models.factory import abstract_model

    workdir = open_trained(path)
    config = read_config(workdir)
    # The attention kernel suits the machine that trained, perhaps a GPU this one lacks; the
    # parameters do not depend on it, so decoding picks the kernel for its own device.
    config.model.attention = "auto"
    if matmul_dtype:  # the products' rounding, not the parameters: a decoding-time choice
        config.model.matmul_dtype = matmul_dtype
    tokenizer = workdir.tokenizer()
    if checkpoint.latest_step(workdir.checkpoints) is None:
        raise FileNotFoundError(
            f"--workdir: no checkpoint in {workdir.checkpoints}; "
            "train first (python -m translate.train ...)"
        )
    graphdef, shapes = abstract_model(config, tokenizer.vocab_size)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    reader = _Reader(workdir, config, tokenizer, checkpoint.abstract_like(shapes, device), log)
    if not isinstance(average, int) or average > 0:
        if step is not None:
            raise ValueError("give a step or a number of checkpoints to average, not both")
        restored, steps = reader.average(average, params)
    else:
        saved = reader.manager.all_steps()
        if (reader.manager.latest_step() if step is None else step) not in saved:
            raise FileNotFoundError(
                f"--workdir: no checkpoint{'' if step is None else f' at step {step}'} in "
                f"{workdir.checkpoints} (steps there: {list(saved)})"
            )
        requested = step is not None
        restored, steps = reader.at_step(step, params) if requested else reader.newest(params)
    return TrainedModel(graphdef, restored, tokenizer, config, steps)


def write_params_workdir(
    target: Workdir,
    config_json: str,
    vocab_from: Workdir,
    manager,
    step: int,
    params,
    meta,
    ema=None,
) -> bool:
    """Writes a parameters-only workdir: config.json, vocab.model and one checkpoint.

    A run's best/ (translate/training/trainer.py) and scripts/average_checkpoints.py's average
    are such workdirs, which every command reads as it reads a run. On several hosts process 0
    writes the files; every process takes part in the checkpoint's save.

    Args:
      target: the workdir to write.
      config_json: the config.json to write there (`workdir.config_text`, or a run's own).
      vocab_from: the workdir whose vocab.model is copied, unless `target` holds one.
      manager: `target`'s checkpoint manager (translate/checkpoint.py).
      step, params, meta: the checkpoint: its step, parameters and JSON metadata.
      ema: the moving average of the parameters, kept beside them (item "ema") when the run
        has one, so that --params=raw and --params=ema read what they say.

    Returns:
      Whether the checkpoint was written: False when `manager` holds `step` already.
    """
    from translate import atomic, checkpoint

    if jax.process_index() == 0:
        target.path.mkdir(parents=True, exist_ok=True)
        atomic.write_text(target.config, config_json)
    copy_vocabulary(vocab_from, target)
    if step in manager.all_steps():
        return False
    checkpoint.save_params(manager, step, params, meta, ema)
    return True


def parameters_read(workdirs: Sequence[str], steps: Sequence[list[int]], choice: str) -> str:
    """ "ema" or "raw" when a decoded checkpoint holds a moving average of its parameters
    (train.ema_decay), so which of the two was read is worth saying ("mixed" across an
    ensemble); "" when none holds one (the parameters are all there is)."""
    from translate import checkpoint

    held = [checkpoint.holds_ema(Workdir(w).checkpoints, s[-1]) for w, s in zip(workdirs, steps)]
    if not any(held):
        return ""
    return "raw" if choice == "raw" else "ema" if all(held) else "mixed"


class Ensemble(NamedTuple):
    """One or more models read back for decoding; `graphdefs` and `params` are always tuples."""

    graphdefs: tuple
    params: tuple
    tokenizer: Tokenizer | PairTokenizer
    config: Config  # the first workdir's
    steps: tuple[list[int], ...]  # per model: its step, or the steps averaged


def check_choice(step: int | None, average: int, params: str, matmul_dtype: str = "") -> None:
    """Refuses a checkpoint choice that cannot be made, naming its flag (before any reading)."""
    if matmul_dtype not in MATMUL_DTYPES:
        raise ValueError(
            f"--matmul_dtype={matmul_dtype}: must be one of "
            + ", ".join(repr(d) for d in MATMUL_DTYPES)
        )
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


def load_ensemble(
    paths: Sequence[str | os.PathLike],
    step: int | None = None,
    average: int = 0,
    log: Callable[[str], None] = say,
    params: str = "auto",
    matmul_dtype: str = "",
) -> Ensemble:
    """The models of one or more workdirs, each at `step` (None: the newest) or the mean of
    its newest `average` checkpoints: how every command picks its checkpoints (--step and
    --average).

    Raises ValueError naming the flag for a bad choice, and naming two workdirs whose
    vocabularies differ.
    """
    if not paths:
        raise ValueError("--workdir is required (repeat it for an ensemble)")
    check_choice(step, average, params, matmul_dtype)
    check_shared_vocabulary(paths)
    members = []
    for path in paths:
        try:
            members.append(load_model(path, step, average, log, params, matmul_dtype))
        except ValueError as e:
            # The flags as given: an --average that was not asked for is not named.
            given = f" --average={average}" if average else ""
            raise ValueError(f"--workdir={path}{given}: {e}") from None
    return Ensemble(
        tuple(m.graphdef for m in members),
        tuple(m.params for m in members),
        members[0].tokenizer,
        members[0].config,
        tuple(m.steps for m in members),
    )


def check_shared_vocabulary(paths: Sequence[str | os.PathLike]) -> None:
    """Raises ValueError naming two workdirs whose vocabularies differ.

    An ensemble averages log-probabilities token id by token id, which means nothing unless
    every model reads and writes the same pieces.
    """
    workdirs = [open_trained(p) for p in paths]
    first = workdirs[0]

    def contents(workdir: Workdir) -> list[tuple[str, bytes]]:
        return [(path.name, path.read_bytes()) for path in workdir.tokenizer_files()]

    expected = contents(first)
    for other in workdirs[1:]:
        if contents(other) != expected:
            names = ", ".join(name for name, _ in expected)
            raise ValueError(
                f"--workdir {first.path} and --workdir {other.path} have different vocabularies "
                f"({names} differs); an ensemble needs models trained on one vocabulary"
            )
