"""Orbax checkpoints in a directory: save, restore, resume, and average the last N (Sec. 6.1)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from translate import startup


@dataclasses.dataclass(frozen=True)
class KeepOnGrid:
    """Which saved steps a training run keeps (an Orbax preservation policy).

    The grid is every `every` steps and the `last`: the steps an uninterrupted run saves. The
    newest `keep` of the grid's steps and the newest step (a stop signal's, off the grid, which
    training resumes from) are kept; an older step off the grid is not. So a run stopped and
    resumed keeps what an uninterrupted one keeps, and the final average (Sec. 6.1) reads the
    same checkpoints: no step of a stop pushes a grid step out for good.
    """

    keep: int
    every: int
    last: int

    def on_grid(self, step: int) -> bool:
        return step % self.every == 0 or step == self.last

    def should_preserve(self, checkpoints: Sequence[Any], *, context: Any = None) -> list[bool]:
        steps = [info.step for info in checkpoints]
        newest = max(steps, default=None)
        candidates = sorted(s for s in steps if self.on_grid(s) or s == newest)
        kept = set(candidates[-self.keep :])
        return [s in kept for s in steps]


def make_manager(
    directory: str | pathlib.Path,
    keep: int = 5,
    read_only: bool = False,
    grid: KeepOnGrid | None = None,
) -> ocp.CheckpointManager:
    """A manager for the checkpoints in `directory` that keeps the newest `keep` steps, or
    those that `grid` keeps (a training run's).

    Orbax writes each step into a temporary directory and renames it when complete, so a
    process killed mid-save leaves no step that looks whole.
    """
    directory = pathlib.Path(directory).absolute()
    # A killed save leaves only a temporary directory; the next writer removes it.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=None if grid else keep,
        preservation_policy=grid,
        create=not read_only,
        read_only=read_only,
        cleanup_tmp_directories=not read_only,
    )
    return ocp.CheckpointManager(directory, options=options)


def write_error(
    error: Exception, directory: pathlib.Path, step: int | None, intact: Sequence[int], then: str
) -> OSError | None:
    """An OSError saying that the checkpoint of `step` could not be written (a full disk), which
    checkpoints are whole, and `then` (what to do); None when `error` is not a failed write.

    Orbax reports a failed write as a ValueError that ends in `[os_error_code='28']`.
    """
    code = re.search(r"os_error_code='(\d+)'", str(error))
    if code is None and not isinstance(error, OSError):
        return None
    reason = os.strerror(int(code.group(1))) if code else (error.strerror or str(error))
    kept = [s for s in sorted(intact) if s != step]
    whole = f"the checkpoints of steps {kept} there are whole" if kept else "no other is there"
    return OSError(
        f"could not write the checkpoint of step {step} in {directory}: {reason}; {whole}; {then}"
    )


def save(
    manager: ocp.CheckpointManager,
    step: int,
    params: Any,
    opt_state: Any,
    meta: dict[str, Any],
    ema: Any | None = None,
) -> None:
    """Saves parameters, optimizer state and JSON metadata (data position, config) at `step`,
    and the moving average of the parameters (`train.ema_decay`) when given, as item "ema"."""
    items = {
        "params": ocp.args.StandardSave(params),
        "opt_state": ocp.args.StandardSave(opt_state),
        "meta": ocp.args.JsonSave(meta),
    }
    if ema is not None:
        items["ema"] = ocp.args.StandardSave(ema)
    startup.drop_reports_into_closed_loops()
    manager.save(step, args=ocp.args.Composite(**items), force=True)


def restore(
    manager: ocp.CheckpointManager,
    step: int,
    abstract_params: Any,
    abstract_opt_state: Any | None = None,
    item: str = "params",
) -> tuple[Any, Any, dict[str, Any]]:
    """Restores (params, opt_state or None, meta) of `step` into the given shapes and shardings.

    `item` is where the parameters are read from: "params", or "ema" (their moving average).
    """
    items = {item: ocp.args.StandardRestore(abstract_params), "meta": ocp.args.JsonRestore()}
    if abstract_opt_state is not None:
        items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
    # A read that fails part-way (a damaged step) leaves such reports too.
    startup.drop_reports_into_closed_loops()
    restored = manager.restore(step, args=ocp.args.Composite(**items))
    opt_state = restored["opt_state"] if abstract_opt_state is not None else None
    return restored[item], opt_state, restored["meta"]


# --params: which parameters a decoding command reads from a checkpoint.
PARAMS_CHOICES = ("auto", "ema", "raw")


def holds_ema(directory: str | pathlib.Path, step: int) -> bool:
    """Whether the checkpoint of `step` holds a moving average of the parameters."""
    return (pathlib.Path(directory) / str(step) / "ema").is_dir()


def params_item(directory: str | pathlib.Path, step: int, choice: str = "auto") -> str:
    """The item a decoding command reads as the parameters of `step`: "ema" when the checkpoint
    holds a moving average (`train.ema_decay`) and `choice` is "auto" or "ema", else "params".

    Raises:
      ValueError: `choice` "ema" for a checkpoint without one, or an unknown choice.
    """
    if choice not in PARAMS_CHOICES:
        raise ValueError(f"--params={choice}: must be one of {', '.join(PARAMS_CHOICES)}")
    if choice == "raw":
        return "params"
    if holds_ema(directory, step):
        return "ema"
    if choice == "ema":
        raise ValueError(
            f"--params=ema: the checkpoint of step {step} in {directory} holds no moving "
            "average of the parameters (trained without train.ema_decay)"
        )
    return "params"


def read_meta(manager: ocp.CheckpointManager, step: int) -> dict[str, Any]:
    """The JSON metadata of `step` alone (cheap: no arrays are read)."""
    return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


class StepDeleted(Exception):
    """A step's directory went away while it was read: a run still training there deleted it
    (it keeps its newest `keep_checkpoints`). Not a damaged checkpoint: choose again."""

    def __init__(self, step: int):
        super().__init__(f"the checkpoint of step {step} was deleted while it was read")
        self.step = step


class Unreadable(ValueError):
    """No checkpoint of a directory that holds some can be read (each one's error is named)."""


def step_exists(manager: ocp.CheckpointManager, step: int) -> bool:
    """Whether `step`'s directory is still there."""
    return (pathlib.Path(manager.directory) / str(step)).exists()


# How long an unreadable step is given to finish disappearing (a live run's deletion of it in
# progress leaves its directory for a moment, its files gone) before it counts as unreadable.
DELETION_GRACE_SECONDS = 0.2


def deleted_meanwhile(manager: ocp.CheckpointManager, step: int, newest: int) -> bool:
    """Whether a step that could not be read was being deleted by a run training there: it is
    gone (now or a moment later), or a step newer than `newest` was saved since the listing."""
    if not step_exists(manager, step):
        return True
    time.sleep(DELETION_GRACE_SECONDS)
    if not step_exists(manager, step):
        return True
    listed = sorted(
        int(p.name) for p in pathlib.Path(manager.directory).iterdir() if p.name.isdigit()
    )
    return bool(listed) and listed[-1] > newest


def restore_latest(
    manager: ocp.CheckpointManager,
    abstract_params: Any,
    abstract_opt_state: Any | None = None,
    check_meta: Callable[[dict[str, Any]], None] = lambda meta: None,
    log: Callable[[str], None] = print,
    set_aside: bool = False,
    item: Callable[[int], str] = lambda step: "params",
) -> tuple[int, Any, Any, dict[str, Any]] | None:
    """Restores the newest readable step, falling back past unreadable ones.

    Args:
      check_meta: called with a step's metadata before its arrays are read; what it raises
        (e.g. a vocabulary mismatch) stops the restore instead of falling back.
      set_aside: move each unreadable step passed on the way into `<directory>.corrupt/`
        (never delete it), so training can save that step again; for the trainer, which
        restores and then writes. Process 0 moves them; nothing is moved when no step can be
        read.
      item: a step -> the item its parameters are read from (`params_item`).

    Returns:
      (step, params, opt_state, meta), or None when the manager holds no step at all.

    Raises:
      Unreadable: if there are steps but none of them can be read.
      OtherStructure: a whole step of another model or optimizer than the targets'; nothing
        is fallen back past or set aside.
      StepDeleted: a step went away while it was read (the caller may reload and choose again).
    """
    steps = sorted(manager.all_steps(), reverse=True)
    errors, unreadable = [], []

    def fall_back(step: int, e: Exception, targets: Sequence[tuple[str, Any]] = ()) -> None:
        if deleted_meanwhile(manager, step, steps[0]):
            raise StepDeleted(step) from e
        # A whole checkpoint of another model or optimizer is no damaged one: falling back
        # would call every step unreadable, and setting them aside would lose the run.
        for what, abstract in targets:
            if abstract is not None:
                if other := other_structure(manager.directory, step, what, abstract):
                    raise other from None
        errors.append(f"step {step}: {type(e).__name__}: {' '.join(str(e).split())[:200]}")
        unreadable.append(step)
        log(
            f"checkpoint at step {step} in {manager.directory} is unreadable "
            f"({type(e).__name__}); falling back to the previous one"
        )

    for step in steps:
        try:
            meta = read_meta(manager, step)
        except Exception as e:  # noqa: BLE001 - any unreadable step falls back to the previous
            fall_back(step, e)
            continue
        check_meta(meta)
        name = item(step)  # what it raises (--params=ema without one) is the caller's error
        try:
            restored = (step, *restore(manager, step, abstract_params, abstract_opt_state, name))
        except Exception as e:  # noqa: BLE001
            fall_back(step, e, [(name, abstract_params), ("opt_state", abstract_opt_state)])
            continue
        if set_aside and unreadable:
            move_aside(manager, unreadable, log)
        return restored
    if steps:
        raise Unreadable(f"no readable checkpoint in {manager.directory} ({'; '.join(errors)})")
    return None


def move_aside(manager: ocp.CheckpointManager, steps: list[int], log: Callable[[str], None]):
    """Moves the directories of `steps` into `<directory>.corrupt/` and says where."""
    directory = pathlib.Path(manager.directory)
    if jax.process_index() == 0:
        aside = directory.with_name(directory.name + ".corrupt")
        aside.mkdir(exist_ok=True)
        for step in steps:
            source = directory / str(step)
            if not source.exists():
                log(f"checkpoint at step {step}: {source} not found, so not moved aside")
                continue
            target, n = aside / str(step), 1
            while target.exists():  # an earlier corrupt copy of the same step stays too
                target, n = aside / f"{step}.{n}", n + 1
            source.rename(target)
            log(f"moved the unreadable checkpoint at step {step} to {target}")
    if jax.process_count() > 1:  # every host sees the moves before it reloads
        multihost_utils.sync_global_devices("checkpoints set aside")
    manager.reload()


def check_vocabulary(meta: dict[str, Any], tokenizer, workdir) -> None:
    """Raises if the workdir's vocabulary is not the one the checkpoint was trained with."""
    saved = meta.get("vocab_sha256")
    if saved is not None and saved != tokenizer.sha256:
        raise ValueError(
            f"{tokenizer.path} is not the vocabulary the checkpoints in {workdir} were trained "
            "with (its sha256 differs); restore the original vocab.model or use a fresh workdir"
        )


def abstract_like(tree: Any, sharding: jax.sharding.Sharding) -> Any:
    """Shape/dtype structs of `tree` placed with `sharding`, as Orbax restore targets."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def latest_step(directory: str | pathlib.Path) -> int | None:
    """The newest step saved in `directory`, or None when it holds no checkpoint."""
    if not pathlib.Path(directory).is_dir():
        return None
    return make_manager(directory, read_only=True).latest_step()


def holds_optimizer_state(directory: str | pathlib.Path, step: int) -> bool:
    """Whether the checkpoint of `step` holds Adam's state (a training run's), not parameters
    alone (an average's, or best/'s)."""
    return (pathlib.Path(directory) / str(step) / "opt_state").is_dir()


def dotted_name(path: tuple) -> str:
    """A parameter's tree path as one name: `decoder.0.cross_attention.key.kernel.value`."""
    return ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def item_shapes(
    directory: str | pathlib.Path, step: int, item: str = "params"
) -> dict[str, tuple[int, ...]]:
    """The shape of every array of `item` ("params", "opt_state", "ema") saved at `step`, by
    `dotted_name`; read from its metadata, no array is read."""
    with ocp.StandardCheckpointer() as reader:
        metadata = reader.metadata(pathlib.Path(directory).absolute() / str(step) / item)
    return shapes_of(getattr(metadata, "item_metadata", metadata))


def shapes_of(tree: Any) -> dict[str, tuple[int, ...]]:
    """The shape of every leaf of `tree` (arrays, their shapes, or Orbax's metadata), by
    `dotted_name`."""
    return {dotted_name(p): tuple(x.shape) for p, x in jax.tree.leaves_with_path(tree)}


def first_difference(there: dict[str, tuple], here: dict[str, tuple]) -> str:
    """The first name that one of two `shapes_of` lacks, else the first of another shape."""
    names = sorted(set(there) ^ set(here)) or [n for n in sorted(there) if there[n] != here[n]]
    return names[0]


class OtherStructure(ValueError):
    """A whole checkpoint whose arrays are not the ones asked for: another model's or another
    optimizer's, not a damaged one. Never fallen back past, never set aside as unreadable."""


def other_structure(
    directory: str | pathlib.Path, step: int, item: str, abstract: Any
) -> OtherStructure | None:
    """Why the checkpoint of `step` cannot be read into `abstract`, when its metadata is whole
    and names other arrays or shapes than `abstract` (item "opt_state": another optimizer;
    otherwise another model); None when it cannot tell (a damaged step)."""
    try:
        saved = item_shapes(directory, step, item)
    except Exception:  # noqa: BLE001 - metadata that cannot be read: a damaged step
        return None
    wanted = shapes_of(abstract)
    if not saved or saved == wanted:  # nothing to tell by
        return None
    name = first_difference(saved, wanted)
    differs = f"{name}: {saved.get(name, 'absent')} there, {wanted.get(name, 'absent')} here"
    if item == "opt_state":
        return OtherStructure(
            f"the checkpoint of step {step} in {directory} was trained with another optimizer "
            f"than this config's (its optimizer state differs, {differs}): train with the "
            "config.train.optimizer and weight_decay that made it, or use another --workdir"
        )
    return OtherStructure(
        f"the checkpoint of step {step} in {directory} holds a model of another shape than "
        f"this config's ({differs}): read it with the config that trained it"
    )


def steps_to_average(
    manager: ocp.CheckpointManager,
    num: int,
    keep_checkpoints: int | None = None,
    among: Callable[[int], bool] = lambda step: True,
) -> list[int]:
    """The newest `num` saved steps, oldest first, failing with what to change if there are fewer.

    Args:
      manager: the workdir's checkpoint manager.
      num: how many checkpoints to average (Sec. 6.1: 5 for base, 20 for big).
      keep_checkpoints: the run's `train.keep_checkpoints`; when given, a value below `num` is
        an error even if enough steps happen to be on disk, since the run deletes the older ones.
      among: which saved steps may be averaged (the trainer's: those on its grid).
    """
    if num < 1:
        raise ValueError(f"the number of checkpoints to average must be >= 1, not {num}")
    if keep_checkpoints is not None and keep_checkpoints < num:
        raise ValueError(
            f"averaging {num} checkpoints needs train.keep_checkpoints >= {num}, but this run "
            f"keeps {keep_checkpoints}; train with --config.train.keep_checkpoints={num}"
        )
    steps = sorted(s for s in manager.all_steps() if among(s))
    if len(steps) < num:
        raise ValueError(
            f"averaging {num} checkpoints, but {manager.directory} holds only {len(steps)} "
            f"(steps {steps})"
        )
    return steps[-num:]


def average_params(
    manager: ocp.CheckpointManager,
    steps: list[int],
    abstract_params: Any,
    item: Callable[[int], str] = lambda step: "params",
) -> Any:
    """The float32 mean of the parameters saved at `steps` (Sec. 6.1's checkpoint averaging).

    Checkpoints are read one at a time into a running sum, so memory holds about two copies
    of the parameters (the sum and the checkpoint being added), never all of them; optimizer
    states are not read.

    Args:
      manager: the checkpoint manager to read from.
      steps: the saved steps to average.
      abstract_params: shapes, dtypes and shardings to restore into (see `abstract_like`).
      item: a step -> the item its parameters are read from (`params_item`): the mean of the
        moving averages when the checkpoints hold them.
    """
    if not steps:
        raise ValueError("no steps to average")
    total = None
    for step in steps:
        params, _, _ = restore(manager, step, abstract_params, item=item(step))
        params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
        total = params if total is None else jax.tree.map(jnp.add, total, params)
        del params
    return jax.tree.map(lambda s, a: (s / len(steps)).astype(a.dtype), total, abstract_params)


def save_params(
    manager: ocp.CheckpointManager,
    step: int,
    params: Any,
    meta: dict[str, Any],
    ema: Any | None = None,
) -> None:
    """Saves parameters without optimizer state (an averaged model, a run's best/: for
    decoding only), and their moving average as item "ema" when given, as `save` does."""
    items = {"params": ocp.args.StandardSave(params), "meta": ocp.args.JsonSave(meta)}
    if ema is not None:
        items["ema"] = ocp.args.StandardSave(ema)
    startup.drop_reports_into_closed_loops()
    manager.save(step, args=ocp.args.Composite(**items), force=True)
    manager.wait_until_finished()
