"""What opening a training run checks and does in its workdir before anything is written.

The trainer (translate/training/trainer.py, `open_run`) calls these in order: the workdir's
layout (a file in the way), the config against the one the workdir was trained with (or
`--force`, which sets the earlier run aside in previous_run/ until the new run's data has
loaded), or against the checkpoints' model and optimizer when config.json is gone, the
vocabulary against the checkpoints, `train.init_from` (training/init_from.py), and the
learning rate and the text a resumed run continues with. Each refusal names the flag or the
file and changes nothing.
"""

from __future__ import annotations

import copy
import logging
import math
import pathlib
import typing

import jax
import jax.numpy as jnp

from translate import checkpoint, sharding
from translate.config import Config, Optimizer
from translate.models.factory import (
    abstract_model,
    resolve_model_attention,
    resolve_model_dtype,
)
from translate.training.optim import make_optimizer, make_schedule
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

    With `force`, everything an earlier run generated in the workdir (its own names,
    `Workdir.generated`) and evaluations/ are moved into `previous_run/` instead; once the new
    run's data has loaded the run is deleted and evaluations/ put back (`settle_previous_run`),
    and bad new data puts all back. The user's other files beside them stay; a file of the
    user's in best/, which goes whole, refuses `force` before anything is moved. On several
    hosts sharing the workdir, process 0 alone moves and writes.
    """
    check_compute_dtype(config)
    primary = jax.process_index() == 0
    if force and primary:
        if workdir.previous_run.exists():
            raise FileExistsError(
                f"{workdir.previous_run} holds a run that an earlier --force set aside and "
                "could not put back; move it away (or delete it) and run again"
            )
        if foreign := workdir.foreign_entries():
            likewise = (
                f" ({', '.join(p.name for p in foreign[1:])} likewise)" if foreign[1:] else ""
            )
            raise ValueError(
                f"--force: {foreign[0]} is not the run's{likewise}: best/ holds what training "
                "writes there (config.json, vocab.model, checkpoints/) and --force deletes it "
                "whole, so move it out of best/ first; nothing was changed"
            )
        # evaluations/ goes aside with the run, so that bad new data puts back all as it was,
        # and comes back once the new run's data has loaded (`settle_previous_run`).
        aside = workdir.generated() + [workdir.evaluations]
        generated = [t for t in aside if t.exists() or t.is_symlink()]
        if generated:
            workdir.previous_run.mkdir(parents=True)
        for target in generated:
            target.rename(workdir.previous_run / target.name)
    elif not force and workdir.config.is_file():
        check_same_model(config, workdir)
    elif not force:
        check_checkpoint_state(config, workdir)
    if not force:
        check_vocabulary_size(config, workdir)
        check_trainable(workdir)
    sharding.sync_processes("workdir checked")  # every host has read config.json before it changes


def check_same_model(config: Config, workdir: Workdir) -> None:
    """Refuses to resume a workdir whose config.json holds another model, vocabulary, data
    order, corpora, direction or optimizer state than `config`; says which precision fields
    the run resumes with changed (its parameters are float32 either way).

    Raises:
      ValueError: naming every field that differs.
    """
    # Through the Config, so fields added since the workdir was made take their defaults.
    saved = read_config(workdir).to_dict()
    now = config.to_dict()
    precision = [
        f"config.model.{name} {saved['model'][name]} -> {now['model'][name]}"
        for name in PRECISION_FIELDS
        if saved["model"][name] != now["model"][name]
    ]
    for conf in (saved, now):
        for name in ("attention", *PRECISION_FIELDS):  # the parameters do not depend on them
            del conf["model"][name]
    compared = [("model", name) for name in saved["model"]]
    compared += [("data", "vocab_size"), ("data", "source")]
    # The order of each epoch's pairs, which the saved data position counts in, and dropout.
    compared += [("train", "seed")]
    # The corpora and their weights: each epoch's draw, which that position counts in too.
    compared += [("data", "train_corpora")]
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
    if precision:
        log.info(
            "%s resumes with %s: its parameters and optimizer state are float32 either way "
            "and its data the same; the steps from here compute at the new precision",
            workdir.path,
            ", ".join(precision),
        )


# What a run may resume with another of: the parameters and the optimizer state are float32
# whatever these say (translate/config/sections.py), and the data does not depend on them.
PRECISION_FIELDS = ("compute_dtype", "matmul_dtype")


def check_compute_dtype(config: Config) -> None:
    """Refuses a compute dtype that this device cannot run, before anything is written: XLA's
    CPU backend, for one, has no float16 attention product (jax 0.10.2), which a run
    would otherwise meet at its first step. Attention and its gradient are compiled at that
    dtype on tiny shapes (about 0.1 s).

    Raises:
      ValueError: naming --config.model.compute_dtype and the device.
    """
    m = config.model
    dtype, attention = resolve_model_dtype(m), resolve_model_attention(m)
    q = jax.ShapeDtypeStruct((1, 2, 1, 8), dtype)  # [B, T, H, K]

    def attend(q):
        y = jax.nn.dot_product_attention(q, q, q, implementation=attention)
        return y.astype(jnp.float32).sum()

    try:
        jax.jit(jax.value_and_grad(attend)).lower(q).compile()
    except Exception as e:  # noqa: BLE001 - XLA's refusal, whatever its type
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"--config.model.compute_dtype={m.compute_dtype}: this {jax.default_backend()} "
            f"device cannot compute in {jnp.dtype(dtype).name} ({reason}); give "
            "--config.model.compute_dtype=float32 (or auto)"
        ) from None


def check_vocabulary_size(config: Config, workdir: Workdir) -> None:
    """Refuses a `data.vocab_size` other than the one the workdir's vocab.model was trained
    with (a config.json edited by hand agrees with the flag, but the run would go on reading
    and writing the old pieces without a word).

    Raises:
      ValueError: naming the flag, vocab.model and its size.
    """
    trained = trained_vocab_size(workdir.vocab)
    if trained is None or trained == config.data.vocab_size:
        return
    raise ValueError(
        f"--config.data.vocab_size={config.data.vocab_size}: {workdir.vocab} was trained with "
        f"vocab_size={trained}, and this run reads and writes its pieces (its checkpoints are "
        f"of them): give --config.data.vocab_size={trained}, use a fresh --workdir, or pass "
        "--force to set the run aside and start afresh"
    )


def trained_vocab_size(path: pathlib.Path) -> int | None:
    """The vocab_size that SentencePiece was asked for when it trained `path` (its model
    records it; the pieces may be fewer), or None when there is no such file to read."""
    try:
        from sentencepiece import sentencepiece_model_pb2

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(path.read_bytes())
    except Exception:  # noqa: BLE001 - absent or unreadable: the tokenizer's load says why
        return None
    return model.trainer_spec.vocab_size or None


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


def check_checkpoint_state(config: Config, workdir: Workdir) -> None:
    """Refuses a config whose model or optimizer does not fit the checkpoints of a workdir that
    has lost its config.json, before anything is written (the restore would fail only after the
    data has loaded).

    Raises:
      ValueError: naming a parameter whose shape differs, there and here; or the optimizer
        whose state the checkpoints hold (config.train.optimizer and weight_decay).
    """
    step = checkpoint.latest_step(workdir.checkpoints)
    if step is None:
        return
    try:
        saved = checkpoint.item_shapes(workdir.checkpoints, step, "params")
    except Exception:  # noqa: BLE001 - an unreadable step is the restore's to set aside
        return
    vocab_size = workdir.tokenizer().vocab_size if workdir.tokenizer_files() else None
    _, abstract = abstract_model(config, vocab_size or config.data.vocab_size)
    mine = checkpoint.shapes_of(abstract)
    if saved != mine:
        name = checkpoint.first_difference(saved, mine)
        raise ValueError(
            f"{workdir.path} holds checkpoints of a model of another shape than this config's "
            f"({name}: {saved.get(name, 'absent')} there, {mine.get(name, 'absent')} here), and "
            f"no {workdir.config.name} to say which config made them: train with that config, use "
            "a fresh --workdir, or pass --force to set them aside and start afresh"
        )
    if not checkpoint.holds_optimizer_state(workdir.checkpoints, step):
        return  # parameters alone: check_trainable says what to do
    try:
        saved = checkpoint.item_shapes(workdir.checkpoints, step, "opt_state")
    except Exception:  # noqa: BLE001 - as above
        return
    if saved == optimizer_state_shapes(config, abstract):
        return
    # Only a refusal when another optimizer's state fits: one that none fits is the restore's
    # to report, so a state this code would not recognise never stops a run that could resume.
    fits = [c for c in other_optimizers(config) if optimizer_state_shapes(c, abstract) == saved]
    if not fits:
        return
    t, theirs = config.train, fits[0].train
    flags = [f"--config.train.optimizer={theirs.optimizer}"]
    if bool(theirs.weight_decay) != bool(t.weight_decay):
        flags.append(
            "--config.train.weight_decay=0"
            if not theirs.weight_decay
            else "--config.train.weight_decay above 0 (its value is not recorded)"
        )
    raise ValueError(
        f"{workdir.path} holds checkpoints trained with another optimizer than this config's "
        f"(config.train.optimizer={t.optimizer}, weight_decay={t.weight_decay}): their optimizer "
        f"state is the one of {' and '.join(flags)}, and there is no {workdir.config.name} to "
        "say which config made them: train with that config, use a fresh --workdir, or pass "
        "--force to set them aside and start afresh"
    )


def optimizer_state_shapes(config: Config, abstract_params) -> dict[str, tuple[int, ...]]:
    """The shape of every array of the optimizer state that `config` trains with, by name (as
    `checkpoint.item_shapes` reads a saved one); nothing is allocated."""
    optimizer, _ = make_optimizer(config)
    return checkpoint.shapes_of(jax.eval_shape(optimizer.init, abstract_params))


def other_optimizers(config: Config) -> list[Config]:
    """`config` with each other optimizer whose state has another structure: each choice of
    `train.optimizer`, with and without `train.weight_decay` (AdamW's state is not Adam's)."""
    others = []
    for name in typing.get_args(Optimizer):
        for decay in (0.0, config.train.weight_decay or 0.1):
            if (name, bool(decay)) == (config.train.optimizer, bool(config.train.weight_decay)):
                continue
            other = copy.deepcopy(config)
            other.train.optimizer, other.train.weight_decay = name, decay
            others.append(other)
    return others


def check_vocabulary_unchanged(workdir: Workdir) -> None:
    """Refuses a `vocab.model` that the newest readable checkpoint was not trained with.

    Runs before the data is opened, so a swapped vocabulary stops the run before the token
    cache is rebuilt or config.json rewritten.
    """
    if not workdir.tokenizer_files() or checkpoint.latest_step(workdir.checkpoints) is None:
        return
    manager = checkpoint.make_manager(workdir.checkpoints, read_only=True)
    for step in sorted(manager.all_steps(), reverse=True):
        try:
            meta = checkpoint.read_meta(manager, step)
        except Exception:  # noqa: BLE001 - an unreadable step is the restore's to set aside
            continue
        checkpoint.check_vocabulary(meta, workdir.tokenizer(), workdir.path)
        return


def data_named(config: Config) -> dict[str, str]:
    """The fields that say where a run's text is read from, by flag, for its source (the
    synthetic corpus is generated into the workdir once)."""
    d = config.data
    if d.source in ("files", "monolingual"):
        here = {"dir": str(pathlib.Path(d.dir).resolve()) if d.dir else ""}
        prefixes = ("train", "dev", "test") if d.source == "files" else ("train", "dev")
        here.update({f"{p}_prefix": getattr(d, f"{p}_prefix") for p in prefixes})
    elif d.source == "tfds":
        fields = ("tfds_name", "tfds_train_split", "tfds_dev_split", "tfds_test_split")
        here = {name: getattr(d, name) for name in fields}
    else:
        return {}
    return {f"config.data.{name}": value for name, value in here.items()}


def warn_of_data_change(config: Config, workdir: Workdir) -> None:
    """Warns when a run resumes on other text than the one it was trained on (another
    data.dir, prefix or TFDS split): allowed (a corpus moved, a new dev set), but said.

    A run that has finished trains nothing more, but its evaluations and report are then of the
    new dev and test sets; one that has not goes on with the new pairs from the position it
    had reached in the old ones, with the vocabulary trained on the old.
    """
    step = checkpoint.latest_step(workdir.checkpoints)
    if step is None or not workdir.config.is_file():
        return
    try:
        saved = read_config(workdir)
    except ValueError:
        return  # check_config says what is wrong with it
    if saved.data.source != config.data.source:
        return  # refused by check_config
    before, now = data_named(saved), data_named(config)
    changes = [f"{name} {before[name]} -> {now[name]}" for name in now if before[name] != now[name]]
    if not changes:
        return
    if step >= config.train.num_train_steps:
        then = "it has finished training: its evaluations and report are of the new text"
    else:
        then = (
            f"training goes on with the new pairs from the position step {step} reached in the "
            "old ones, with the vocabulary trained on them"
        )
    log.warning(
        "WARNING: %s was trained on other text than this config's (%s); %s (another --workdir "
        "starts a new run)",
        workdir.path,
        ", ".join(changes),
        then,
    )


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
