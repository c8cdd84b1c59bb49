"""What opening a training run checks and does in its workdir before anything is written.

The trainer (translate/training/trainer.py, `open_run`) calls these in order: the workdir's
layout (a file in the way), the config against the one the workdir was trained with (or
`--force`, which sets the earlier run aside in previous_run/ until the new run's data has
loaded), the vocabulary against the checkpoints, `train.init_from`, and the learning rate a
resumed run continues at. Each refusal names the flag or the file and changes nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import shutil
from typing import NamedTuple

import jax

from translate import checkpoint, sharding
from translate.config import Config, split_init_from
from translate.data.tokenizer import Tokenizer
from translate.models.factory import abstract_model
from translate.training.optim import make_schedule
from translate.workdir import EXPORT_MARKER, Workdir, read_config

log = logging.getLogger("translate")


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
        # Muon keeps a momentum where Adam keeps two moments: another state again.
        if saved["train"]["optimizer"] != now["train"]["optimizer"]:
            differ.append(
                f"config.train.optimizer = {saved['train']['optimizer']}, now "
                f"{now['train']['optimizer']} (the optimizer's state differs)"
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


def read_init_params(init: InitFrom, abstract_params, tokenizer: Tokenizer):
    """The parameters saved at `init.step`, restored into `abstract_params`' shardings."""
    manager = checkpoint.make_manager(init.workdir.checkpoints, read_only=True)
    checkpoint.check_vocabulary(
        checkpoint.read_meta(manager, init.step), tokenizer, init.workdir.path
    )
    params, _, _ = checkpoint.restore(manager, init.step, abstract_params)
    manager.close()
    return params


def warn_of_schedule_change(config: Config, workdir: Workdir) -> None:
    """Warns when a run resumes at another learning rate than the one it was trained on.

    Or past its end: a workdir whose checkpoint is beyond `num_train_steps` trains nothing.

    `lr_decay=linear` or `cosine` decays towards 0 at `num_train_steps`: a finished run given
    more steps jumps from near 0 back to the middle of the decay at its first new step.
    """
    step = checkpoint.latest_step(workdir.checkpoints)
    if step is None:
        return
    if step > config.train.num_train_steps:  # e.g. a recipe that now takes fewer steps
        log.warning(
            "WARNING: the newest checkpoint in %s is step %d, past config.train.num_train_steps "
            "%d: nothing is trained, and the evaluations use step %d (another --workdir starts "
            "a new run)",
            workdir.checkpoints,
            step,
            config.train.num_train_steps,
            step,
        )
        return
    if not workdir.config.is_file():
        return
    try:
        saved = read_config(workdir)
    except ValueError:
        return  # check_config says what is wrong with it
    # Optax counts updates from 0: the next step is count `step`.
    before, now = (float(make_schedule(c)(step)) for c in (saved, config))
    if math.isclose(before, now, rel_tol=1e-3):
        return
    fields = [("train", n) for n in ("num_train_steps", "warmup_steps", "learning_rate_scale")]
    fields += [("train", "lr_decay"), ("model", "d_model")]
    changes = [
        f"config.{section}.{name} {getattr(getattr(saved, section), name)} -> "
        f"{getattr(getattr(config, section), name)}"
        for section, name in fields
        if getattr(getattr(saved, section), name) != getattr(getattr(config, section), name)
    ]
    log.warning(
        "WARNING: the learning rate of step %d is %.3g with this config and was %.3g with the "
        "config this run was trained with (%s): it jumps there when training resumes",
        step + 1,
        now,
        before,
        ", ".join(changes),
    )
