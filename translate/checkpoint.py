"""Orbax checkpoints in the workdir: save, restore the latest or a given step, resume."""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


def make_manager(
    workdir: str | pathlib.Path, keep: int = 5, read_only: bool = False
) -> ocp.CheckpointManager:
    """A manager for `workdir/checkpoints` that keeps the newest `keep` steps.

    Orbax writes each step into a temporary directory and renames it when complete, so a
    process killed mid-save leaves no step that looks whole.
    """
    directory = pathlib.Path(workdir).absolute() / CHECKPOINT_DIR
    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, create=not read_only, read_only=read_only
    )
    return ocp.CheckpointManager(directory, options=options)


def save(
    manager: ocp.CheckpointManager, step: int, params: Any, opt_state: Any, meta: dict[str, Any]
) -> None:
    """Saves parameters, optimizer state and JSON metadata (data position, config) at `step`."""
    manager.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta),
        ),
        force=True,
    )


def restore(
    manager: ocp.CheckpointManager,
    step: int,
    abstract_params: Any,
    abstract_opt_state: Any | None = None,
) -> tuple[Any, Any, dict[str, Any]]:
    """Restores (params, opt_state or None, meta) of `step` into the given shapes and shardings."""
    items = {"params": ocp.args.StandardRestore(abstract_params), "meta": ocp.args.JsonRestore()}
    if abstract_opt_state is not None:
        items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
    restored = manager.restore(step, args=ocp.args.Composite(**items))
    opt_state = restored["opt_state"] if abstract_opt_state is not None else None
    return restored["params"], opt_state, restored["meta"]


def abstract_like(tree: Any, sharding: jax.sharding.Sharding) -> Any:
    """Shape/dtype structs of `tree` placed with `sharding`, as Orbax restore targets."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def latest_step(workdir: str | pathlib.Path) -> int | None:
    directory = pathlib.Path(workdir) / CHECKPOINT_DIR
    if not directory.is_dir():
        return None
    return make_manager(workdir, read_only=True).latest_step()
