"""`train.init_from`: a run that starts from another run's parameters (fine-tuning, a new
domain), checked before anything is written; the optimizer and the step start afresh and the
vocabulary is that run's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import NamedTuple

import jax

from translate import checkpoint
from translate.config import Config, split_init_from
from translate.data.tokenizer import Tokenizer
from translate.models.factory import (
    abstract_model,
)
from translate.workdir import EXPORT_MARKER, Workdir, read_config

log = logging.getLogger("translate")


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
    path, step = split_init_from(config.train.init_from)
    source = Workdir(path)
    flag = f"--config.train.init_from={config.train.init_from}"
    if source.path.resolve() == workdir.path.resolve():
        raise ValueError(f"{flag}: that is this run's own --workdir; resuming needs no init_from")
    if source.is_export():
        try:
            origin = json.loads((source.path / EXPORT_MARKER).read_text(encoding="utf-8"))
            origin = origin.get("workdir") if isinstance(origin, dict) else None
        except (OSError, ValueError):
            origin = None
        raise ValueError(
            f"{flag}: {source.path} is an export that translate-export wrote ({EXPORT_MARKER}), "
            "whose weights training does not read: give the training workdir it was exported "
            "from" + (f" ({origin})" if origin else "")
        )
    for needed, there in ((source.config, source.config.is_file()),
                          (source.vocab, source.tokenizer_files())):  # fmt: skip
        if not there:
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
    tokenizer = source.tokenizer()
    # Compared by the fingerprint that checkpoints store (Tokenizer.sha256).
    mine = workdir.tokenizer_files()
    if not force and mine and workdir.tokenizer().sha256 != tokenizer.sha256:
        names = ", ".join(path.name for path in mine)
        raise ValueError(
            f"{flag}: {source.path}'s vocabulary and --workdir={workdir.path}'s ({names}) are "
            "different vocabularies; a run started from another's parameters reads and writes "
            "its pieces, so use a fresh --workdir (the vocabulary is copied into it)"
        )
    their_config = read_config(source)
    if config.data.vocab_size != their_config.data.vocab_size:
        # The run reads and writes the other run's pieces: the size asked for here would be
        # recorded in config.json, but never used.
        raise ValueError(
            f"--config.data.vocab_size={config.data.vocab_size}: {flag} brings its vocabulary "
            f"({tokenizer.path}), trained with config.data.vocab_size="
            f"{their_config.data.vocab_size} ({tokenizer.vocab_size} pieces), which this run "
            f"reads and writes: give --config.data.vocab_size={their_config.data.vocab_size}"
        )
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


def read_init_params(init: InitFrom, abstract_params, tokenizer: Tokenizer):
    """The parameters saved at `init.step`, restored into `abstract_params`' shardings."""
    manager = checkpoint.make_manager(init.workdir.checkpoints, read_only=True)
    checkpoint.check_vocabulary(
        checkpoint.read_meta(manager, init.step), tokenizer, init.workdir.path
    )
    params, _, _ = checkpoint.restore(manager, init.step, abstract_params)
    manager.close()
    return params
