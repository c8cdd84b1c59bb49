r"""Train the Transformer on every device and evaluate it: `train_and_evaluate(config, workdir)`.

    python -m translate.train --config=configs/quickstart.py --workdir=/tmp/quickstart \
        [--config.train.num_train_steps=2000 ...] [--force]

Running the same command again resumes from the newest checkpoint in the workdir. The phases
read top to bottom: mesh -> data -> model and optimizer -> jitted step -> restore -> loop ->
final evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging as absl_logging
from flax import nnx

from translate import checkpoint, cli, evaluate, sharding
from translate.batching import BatchLayout, DataPosition, iterate_batches, make_batch, plan_epoch
from translate.config import (
    Config,
    Flag,
    load_config,
    packaged_config_names,
    parse_flags,
    split_profile_steps,
)
from translate.corpus import TokenizedCorpus
from translate.data import Data, load_data
from translate.devices import DeviceFacts, cpu_warning, published_peak, resolve_attention
from translate.factory import abstract_model, make_model
from translate.flops import batch_lengths, train_flops
from translate.losses import projected_cross_entropy
from translate.model import resolve_dtype
from translate.monitor import (
    DevBleuHistory,
    EvaluationInterrupted,
    Interrupted,
    MetricWriter,
    NonfiniteGuard,
    StepProfiler,
    StopSignal,
    evaluated_steps,
    log_progress,
    summarize,
)
from translate.optim import make_optimizer
from translate.workdir import (
    Workdir,
    check_config,
    check_init_from,
    check_vocabulary_unchanged,
    copy_vocabulary,
    lock,
    read_init_params,
    settle_previous_run,
    write_config,
)

log = logging.getLogger("translate")


def make_init(config: Config, vocab_size: int, optimizer, mesh):
    """Jitted key -> (params, opt_state), created directly with their (replicated) shardings."""

    def init(key):
        model = make_model(config.model, vocab_size, nnx.Rngs(params=key))
        params = nnx.state(model, nnx.Param)
        return params, optimizer.init(params)

    replicated = sharding.replicated(mesh)
    return jax.jit(init, out_shardings=(replicated, replicated))


def make_train_step(graphdef, optimizer, label_smoothing: float, mesh):
    """The jitted step: accumulate gradients of summed losses over micro-batches, then update."""
    replicated = sharding.replicated(mesh)

    def loss_fn(params, micro, key):
        model = nnx.merge(graphdef, params)
        y = model.hidden(micro, dropout_key=key)  # [R, T, D]
        weights = (micro.tgt_segments > 0).astype(jnp.float32)
        loss_sum, nll_sum, count, correct = projected_cross_entropy(
            y, model.embed.embedding[...], micro.tgt_out, weights, label_smoothing
        )
        return loss_sum, (nll_sum, count, correct)

    def train_step(params, opt_state, batch, step, base_key):
        key = jax.random.fold_in(base_key, step)

        def accumulate(carry, inputs):
            grads, sums = carry
            micro, index = inputs
            (loss_sum, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(
                params, micro, jax.random.fold_in(key, index)
            )
            grads = jax.tree.map(jnp.add, grads, g)
            return (grads, sums + jnp.stack([loss_sum, *aux])), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        num_micro = batch.src.shape[0]
        (grads, sums), _ = jax.lax.scan(
            accumulate, (zeros, jnp.zeros(4)), (batch, jnp.arange(num_micro))
        )
        loss_sum, nll_sum, count, correct = sums
        # Mean over every real target token of the whole batch, however it was split.
        grads = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0), grads)
        grad_norm = optax.global_norm(grads)
        updates, new_opt_state = optimizer.update(grads, opt_state, params)
        # A non-finite loss or gradient never reaches the parameters or Adam's moments: the
        # step keeps the old state and reports itself, and the host stops or counts it.
        finite = jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)
        params, opt_state = jax.tree.map(
            lambda new, old: jnp.where(finite, new, old),
            (optax.apply_updates(params, updates), new_opt_state),
            (params, opt_state),
        )
        metrics = {
            "loss_sum": loss_sum,
            "nll_sum": nll_sum,
            "tokens": count,
            "correct": correct,
            "grad_norm": grad_norm,
            "nonfinite": 1.0 - finite.astype(jnp.float32),
        }
        return params, opt_state, metrics

    return jax.jit(
        train_step,
        in_shardings=(replicated, replicated, sharding.batch_sharding(mesh), None, replicated),
        out_shardings=(replicated, replicated, replicated),
        donate_argnums=(0, 1),
    )


def make_eval_step(graphdef, label_smoothing: float, mesh):
    def eval_step(params, batch):
        model = nnx.merge(graphdef, params)
        micro = jax.tree.map(lambda x: x[0], batch)
        weights = (micro.tgt_segments > 0).astype(jnp.float32)
        loss_sum, nll_sum, count, _ = projected_cross_entropy(
            model.hidden(micro),
            model.embed.embedding[...],
            micro.tgt_out,
            weights,
            label_smoothing,
        )
        return jnp.stack([loss_sum, nll_sum, count])

    replicated = sharding.replicated(mesh)
    return jax.jit(
        eval_step,
        in_shardings=(replicated, sharding.batch_sharding(mesh)),
        out_shardings=replicated,
    )


class Steps(NamedTuple):
    """The trainer's jitted functions for one config, vocabulary and mesh (`make_steps`)."""

    graphdef: nnx.GraphDef
    # key -> (params, opt_state), created with their shardings.
    init: Callable
    # (params, opt_state, batch, step, dropout key) -> (params, opt_state, metrics).
    train: Callable
    # (params, batch) -> [loss sum, nll sum, target tokens] of its first micro-batch.
    eval: Callable
    # step -> learning rate.
    schedule: optax.Schedule


def make_steps(config: Config, vocab_size: int, mesh, optimizer=None) -> Steps:
    """Assembles the model's graph, the optimizer and the jitted steps, once.

    `optimizer` replaces the paper's Adam and schedule (tests use plain SGD); the schedule is
    then the config's all the same, for logging.
    """
    graphdef, _ = abstract_model(config, vocab_size)
    adam, schedule = make_optimizer(config)
    optimizer = adam if optimizer is None else optimizer
    smoothing = config.train.label_smoothing
    return Steps(
        graphdef,
        make_init(config, vocab_size, optimizer, mesh),
        make_train_step(graphdef, optimizer, smoothing, mesh),
        make_eval_step(graphdef, smoothing, mesh),
        schedule,
    )


def dev_loss(
    eval_step, params, corpus: TokenizedCorpus, layout: BatchLayout, mesh, row_slice: slice
) -> dict[str, float]:
    single = BatchLayout(layout.row_len, layout.rows, 1)
    totals = sum(
        np.asarray(
            eval_step(params, sharding.put_batch(make_batch(corpus, rows, single, row_slice), mesh))
        )
        for rows in plan_epoch(corpus, single, seed=0, epoch=0)
    )
    tokens = max(float(totals[2]), 1.0)
    return {"eval/loss": float(totals[0]) / tokens, "eval/nll": float(totals[1]) / tokens}


def train_and_evaluate(
    config: Config, workdir: str | pathlib.Path, force: bool = False
) -> dict[str, Any] | None:
    """Trains to `config.train.num_train_steps`, resuming from the workdir; returns the test report.

    Holds the workdir's lock throughout (a second trainer there stops at once). Returns None
    when the data has no test split.
    """
    config.validate()  # also for configs built in Python: before the workdir is touched
    workdir = Workdir(workdir)
    with lock(workdir), contextlib.ExitStack() as on_exit:
        return train_in_workdir(config, workdir, force, on_exit)


def train_in_workdir(
    config: Config, workdir: Workdir, force: bool, on_exit: contextlib.ExitStack
) -> dict[str, Any] | None:
    """The phases of `train_and_evaluate`, in a workdir this process has locked.

    What is entered into `on_exit` is closed however the run ends.
    """
    t = config.train
    facts = DeviceFacts.of()
    m = config.model
    # Before the workdir changes: a kernel this device cannot run is a config error.
    attention = resolve_attention(
        m.attention, resolve_dtype(m.compute_dtype), m.d_model // m.num_heads, facts
    )
    # A run that has its own checkpoints resumes from them: init_from is for its start only.
    # Checked before --force deletes anything.
    resuming = not force and checkpoint.latest_step(workdir.checkpoints) is not None
    init = check_init_from(config, workdir, force) if t.init_from and not resuming else None
    check_config(config, workdir, force)
    check_vocabulary_unchanged(workdir)  # before the data is opened and tokenized again

    mesh = sharding.make_mesh()
    log.info(
        "mesh: %d devices (%s, %s) on %d hosts; compute %s, %s attention",
        mesh.size,
        facts.platform,
        facts.kind,
        jax.process_count(),
        jnp.dtype(resolve_dtype(m.compute_dtype)).name,
        attention,
    )
    if warning := cpu_warning(config, facts):
        log.warning("WARNING: %s", warning)

    try:
        if init is not None:
            copy_vocabulary(init.workdir, workdir)  # the data is tokenized with its pieces
        data = sharding.on_process_zero_first(lambda: load_data(config, workdir))
        if data.dev is None and (t.keep_best_by or t.early_stopping_patience):
            flag = "keep_best_by" if t.keep_best_by else "early_stopping_patience"
            raise ValueError(
                f"--config.train.{flag}={getattr(t, flag)}: needs dev BLEU, and the data has no "
                "dev split (see data.dev_prefix or data.tfds_dev_split)"
            )
        write_config(config, workdir)  # only once the data has loaded without error
    except BaseException:
        settle_previous_run(workdir, keep=True)  # bad data: --force's earlier run comes back
        raise
    settle_previous_run(workdir, keep=False)
    layout = BatchLayout.from_config(
        config.data.tokens_per_batch, config.data.row_len, t.grad_accum_steps, mesh.size
    )
    row_slice = sharding.host_row_slice(layout.rows)

    keys = dict(zip(("params", "dropout"), jax.random.split(jax.random.key(t.seed))))
    steps = make_steps(config, data.tokenizer.vocab_size, mesh)
    graphdef = steps.graphdef
    replicated = sharding.replicated(mesh)

    # Closed on every way out, an exception included: a save in flight is finished first, so
    # the checkpoint an error message calls intact is whole.
    manager = on_exit.enter_context(
        checkpoint.make_manager(workdir.checkpoints, keep=t.keep_checkpoints)
    )
    position, step = DataPosition(), 0
    abstract = [
        checkpoint.abstract_like(a, replicated) for a in jax.eval_shape(steps.init, keys["params"])
    ]
    restored = checkpoint.restore_latest(
        manager,
        *abstract,
        check_meta=lambda meta: checkpoint.check_vocabulary(meta, data.tokenizer, workdir.path),
        log=log.info,
        set_aside=True,
    )
    if restored is not None:
        step, params, opt_state, meta = restored
        position = DataPosition(**meta["data_position"])
        log.info("resumed from step %d (epoch %d, batch %d)", step, position.epoch, position.index)
    elif init is not None:
        params = read_init_params(init, abstract[0], data.tokenizer)
        _, opt_state = steps.init(keys["params"])  # Adam's moments and count start afresh
        log.info(
            "initialized from the parameters of %s at step %d; optimizer and step start afresh",
            init.workdir.path,
            init.step,
        )
    else:
        params, opt_state = steps.init(keys["params"])
    num_params = sum(x.size for x in jax.tree.leaves(abstract[0]))
    log.info(
        "model: %d parameters; batch %d micro x %d rows x %d tokens",
        num_params,
        layout.num_micro,
        layout.rows,
        layout.row_len,
    )

    writer = MetricWriter(workdir)
    batches = iterate_batches(data.train, layout, t.seed, position, row_slice)
    window, window_start, window_step = [], time.perf_counter(), step
    # Model FLOPs of this host's rows (real tokens only), over its devices' published peak.
    window_flops = 0.0
    peak = published_peak(facts.kind, jnp.dtype(resolve_dtype(m.compute_dtype)).name)
    guard = NonfiniteGuard(t.on_nonfinite, t.max_consecutive_skips)
    stop = StopSignal(every=t.stop_check_every_steps)
    # The dev BLEU logged up to this step: the best so far and the evaluations since.
    dev_history = DevBleuHistory.of_run(workdir.metrics, step)
    best = None
    if t.keep_best_by:
        best = checkpoint.make_manager(Workdir(workdir.best).checkpoints, keep=1)
        on_exit.enter_context(best)
    profiler = StepProfiler(split_profile_steps(t.profile_steps), workdir.profile)
    on_exit.callback(profiler.close)
    compiled = False

    def save_checkpoint() -> None:
        meta = {
            "data_position": dataclasses.asdict(position),
            "step": step,
            "vocab_sha256": data.tokenizer.sha256,
        }
        checkpoint.save(manager, step, params, opt_state, meta)
        log.info("saving the checkpoint of step %d", step)

    def stop_after_evaluation(signum: int) -> Interrupted:
        """A signal abandoned the evaluation of `step`: keep that step; a restart redoes it."""
        if manager.latest_step() != step:
            save_checkpoint()
        manager.wait_until_finished()
        writer.close()
        return Interrupted(signum, step)

    def is_eval_step(step: int) -> bool:
        return (
            step % t.eval_every_steps == 0 or step == t.num_train_steps
        ) and data.dev is not None

    def evaluate_dev() -> bool:
        """Evaluates on the dev set at `step`, keeps a best checkpoint; whether to stop early."""
        try:
            metrics_eval = run_dev_evaluation(
                steps, params, data, config, layout, mesh, row_slice, step, writer, stop
            )
        except EvaluationInterrupted:
            raise stop_after_evaluation(stop.signum) from None
        if "eval/bleu" not in metrics_eval:  # a language model has no BLEU
            return False
        improved = dev_history.add(step, metrics_eval["eval/bleu"])
        if improved and best is not None:
            save_best(best, config, workdir, data, params, step, metrics_eval["eval/bleu"])
        if not dev_history.exhausted(t.early_stopping_patience) or step == t.num_train_steps:
            return False
        log.info(
            "early stopping at step %d: dev BLEU has not improved for %d evaluations "
            "(best %.2f at step %d)",
            step,
            dev_history.since_best,
            dev_history.best,
            dev_history.best_step,
        )
        if manager.latest_step() != step:
            save_checkpoint()
        return True

    early_stop = dev_history.exhausted(t.early_stopping_patience)
    if early_stop:
        log.info("this run stopped early at step %d already (dev BLEU)", step)
    with stop:
        # A run stopped at (or during) a dev evaluation redoes it first.
        if restored is not None and is_eval_step(step) and step not in evaluated_steps(workdir):
            early_stop = evaluate_dev() or early_stop
        while step < t.num_train_steps and not early_stop:
            batch, position = next(batches)
            profiler.before(step)
            call_start = time.perf_counter()
            params, opt_state, metrics = steps.train(
                params, opt_state, sharding.put_batch(batch, mesh), step, keys["dropout"]
            )
            if not compiled:
                # The first call traces and compiles before it dispatches: time that is not
                # training speed, said once and kept out of the first window's clock.
                compiled = True
                compile_seconds = time.perf_counter() - call_start
                log.info("compiled the train step in %.1f s", compile_seconds)
                window_start += compile_seconds
            window.append(metrics)
            window_flops += train_flops(m, data.tokenizer.vocab_size, *batch_lengths(batch))
            step += 1
            profiler.after(step, (params, metrics))
            last = step == t.num_train_steps
            signum = stop.agreed(step)  # read once: a signal may land at any moment
            stopping = signum is not None
            do_save = step % t.checkpoint_every_steps == 0 or last or stopping
            if step % t.log_every_steps == 0 or do_save:
                window = jax.device_get(window)  # the one host sync of the window
                guard.check(window, window_step, manager.latest_step())
            if step % t.log_every_steps == 0 or last:
                seconds = time.perf_counter() - window_start
                logged = summarize(window, seconds, step - window_step)
                logged["train/learning_rate"] = float(steps.schedule(step - 1))
                logged["train/model_flops_per_sec"] = window_flops / seconds
                if peak:
                    logged["train/mfu"] = window_flops / seconds / (peak * jax.local_device_count())
                log_progress(step, t.num_train_steps, logged)
                writer.write(step, logged)
                window, window_start, window_step = [], time.perf_counter(), step
                window_flops = 0.0
            if do_save:
                save_checkpoint()
            if stopping:
                manager.wait_until_finished()
                writer.close()
                raise Interrupted(signum, step)
            if is_eval_step(step):
                eval_start = time.perf_counter()
                early_stop = evaluate_dev()
                # Evaluation time is not training speed: the window's clock skips it.
                window_start += time.perf_counter() - eval_start
        manager.wait_until_finished()
        # Sec. 6.1: the final evaluation decodes the mean of the newest checkpoints.
        params, checkpoint_steps = final_params(config, manager, params, step, abstract[0])
        try:
            with stop.evaluation():
                if len(checkpoint_steps) > 1 and data.dev is not None:
                    metrics_eval = dev_loss(steps.eval, params, data.dev, layout, mesh, row_slice)
                    metrics_eval.update(dev_bleu(graphdef, params, data, config, step))
                    averaged = {
                        k.replace("eval/", "eval/averaged_"): v for k, v in metrics_eval.items()
                    }
                    log.info(
                        "eval of the mean of steps %s: %s",
                        checkpoint_steps,
                        "  ".join(f"{k} {v:.3f}" for k, v in averaged.items()),
                    )
                    writer.write(step, averaged)
                writer.close()
                if jax.process_index() == 0:
                    draw_training_curves(workdir)
                if data.test_text is None:
                    return None
                sources, references = data.test_text
                report, hypotheses = evaluate.evaluate(
                    (graphdef,),
                    (evaluate.local_copy(params),),
                    data.tokenizer,
                    config,
                    sources,
                    references,
                    step,
                    checkpoint_steps,
                )
        except EvaluationInterrupted:
            # The final checkpoint is whole (saved above); a restart evaluates again.
            writer.close()
            raise Interrupted(stop.signum, step) from None
    if jax.process_index() == 0:
        evaluate.write_report(workdir.path, report, sources, references, hypotheses)
        log.info(
            "test: sacreBLEU %.2f (%s), tokenized BLEU %.2f (the paper's metric), chrF %.2f; "
            "report in %s",
            report["bleu"],
            report["signature"],
            report["tokenized_bleu"],
            report["chrf"],
            workdir.report_json,
        )
    return report


def run_dev_evaluation(
    steps: Steps, params, data: Data, config: Config, layout, mesh, row_slice, step, writer, stop
) -> dict[str, float]:
    """Dev loss and dev BLEU at `step`, logged, written and returned; a stop signal abandons it."""
    log.info("evaluating at step %d", step)
    with stop.evaluation():
        metrics_eval = dev_loss(steps.eval, params, data.dev, layout, mesh, row_slice)
        metrics_eval.update(dev_bleu(steps.graphdef, params, data, config, step))
    log.info(
        "eval at step %d: %s", step, "  ".join(f"{k} {v:.3f}" for k, v in metrics_eval.items())
    )
    writer.write(step, metrics_eval)
    return metrics_eval


def save_best(
    manager, config: Config, workdir: Workdir, data: Data, params, step: int, bleu: float
) -> None:
    """Keeps `params` as the workdir's best checkpoint (`train.keep_best_by`), replacing the last.

    best/ is a workdir of its own, so every command that reads a workdir reads it. Orbax
    writes the step beside and renames it when whole, then deletes the one it replaces.
    """
    best = Workdir(workdir.best)
    write_config(config, best)
    copy_vocabulary(workdir, best)
    if step in manager.all_steps():  # kept before this run resumed; the same parameters
        return
    meta = {"step": step, "dev_bleu": bleu, "vocab_sha256": data.tokenizer.sha256}
    checkpoint.save_params(manager, step, params, meta)
    log.info("kept step %d as the best by dev BLEU (%.2f) in %s", step, bleu, best.path)


def draw_training_curves(workdir: Workdir) -> None:
    """Draws the run's curves into its workdir; a failure is a warning, never the run's end."""
    try:
        # Imported here: matplotlib takes seconds to import, and only the end of a run draws.
        from translate.plots import draw_training_curves as draw

        written = draw(workdir)
    except Exception as e:  # noqa: BLE001 - pictures are a convenience, the run is done
        log.warning("WARNING: could not draw the training curves: %s: %s", type(e).__name__, e)
        return
    log.info("training curves: %s", ", ".join(str(p) for p in written))


def final_params(
    config: Config, manager, params, step: int, abstract_params
) -> tuple[Any, list[int]]:
    """The parameters the final evaluation decodes, and the training steps they come from.

    With `decode.average_last` = N > 1, the mean of the newest N saved checkpoints, read as
    scripts/average_checkpoints.py reads them (translate.checkpoint); else `params`, the last
    step's own. A run that holds fewer than N checkpoints (some set aside as unreadable)
    averages those it has, and says so.

    Args:
      manager: the run's checkpoint manager, its saves finished.
      params: the parameters after the last step, on the mesh.
      step: the last step.
      abstract_params: the parameters' shapes and shardings on the mesh (restore targets).
    """
    num = config.decode.average_last
    if num == 1:
        return params, [step]
    saved = manager.all_steps()
    if len(saved) < num:
        log.warning(
            "WARNING: --config.decode.average_last=%d, but %s holds only %d checkpoints %s; "
            "averaging those",
            num,
            manager.directory,
            len(saved),
            sorted(saved),
        )
        num = len(saved)
    steps = checkpoint.steps_to_average(manager, num, config.train.keep_checkpoints)
    return checkpoint.average_params(manager, steps, abstract_params), steps


def dev_bleu(graphdef, params, data: Data, config: Config, step: int) -> dict[str, float]:
    """BLEU on the first `decode.eval_num_sentences` dev sentences (none for a language model)."""
    if config.data.source == "monolingual":
        return {}
    sources, references = data.dev_text
    n = config.decode.eval_num_sentences or len(sources)
    host_params = evaluate.local_copy(params)
    report, _ = evaluate.evaluate(
        (graphdef,), (host_params,), data.tokenizer, config, sources[:n], references[:n], step
    )
    return {
        "eval/bleu": report["bleu"],
        "eval/tokenized_bleu": report["tokenized_bleu"],
        "eval/chrf": report["chrf"],
    }


def setup_logging() -> None:
    """Progress lines on stderr from the `translate` logger only (libraries stay quiet)."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's per-save INFO/WARNING lines


USAGE = """Train the Transformer and evaluate it on the test set (translate-train).

    translate-train --config=NAME_OR_FILE --workdir=DIR [--config.SECTION.FIELD=VALUE ...] \\
        [--force]

e.g. `translate-train --config=quickstart --workdir=/tmp/quickstart` (or `python -m
translate.train ...`). Running the same command again resumes from the newest checkpoint.
"""


def main(argv: list[str]) -> None:
    flags, overrides = parse_flags(
        argv,
        {
            "config": Flag(
                "",
                "Required. A config file (configs/base.py) or an example config by name: "
                + ", ".join(packaged_config_names())
                + ".",
            ),
            "workdir": Flag("", "Required. The run directory: checkpoints, logs, report."),
            "force": Flag(
                False,
                "Delete what an earlier run generated in --workdir (checkpoints, tokens, logs) "
                "and start afresh; without it a workdir of another model is refused.",
            ),
        },
        doc=USAGE,
    )
    for name in ("config", "workdir"):
        if not flags[name]:
            raise ValueError(f"--{name} is required (--help lists every flag)")
    setup_logging()
    config = load_config(flags["config"], overrides)
    sharding.initialize_distributed()
    try:
        train_and_evaluate(config, flags["workdir"], force=flags["force"])
    except Interrupted as stopped:
        log.info("%s", stopped)
        sys.exit(128 + stopped.signum)


if __name__ == "__main__":
    cli.run(main)
