"""Train the Transformer on every device and evaluate it: `train_and_evaluate(config, workdir)`.

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

from translate import checkpoint, evaluate, sharding
from translate.batching import BatchLayout, DataPosition, iterate_batches, make_batch, plan_epoch
from translate.config import Config, load_config, parse_flags
from translate.corpus import TokenizedCorpus
from translate.data import Data, load_data
from translate.devices import DeviceFacts, cpu_warning, published_peak, resolve_attention
from translate.flops import batch_lengths, train_flops
from translate.losses import projected_cross_entropy
from translate.model import Transformer, abstract_model, resolve_dtype
from translate.monitor import (
    Interrupted,
    MetricWriter,
    StopSignal,
    check_finite,
    log_progress,
    summarize,
)
from translate.optim import make_optimizer
from translate.workdir import (
    Workdir,
    check_config,
    check_vocabulary_unchanged,
    lock,
    write_config,
)

log = logging.getLogger("translate")


def make_init(config: Config, vocab_size: int, optimizer, mesh):
    """Jitted key -> (params, opt_state), created directly with their (replicated) shardings."""

    def init(key):
        model = Transformer(config.model, vocab_size, rngs=nnx.Rngs(params=key))
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

    data = sharding.on_process_zero_first(lambda: load_data(config, workdir))
    write_config(config, workdir)  # only once the data has loaded without error
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
    stop = StopSignal()
    with stop:
        while step < t.num_train_steps:
            batch, position = next(batches)
            params, opt_state, metrics = steps.train(
                params, opt_state, sharding.put_batch(batch, mesh), step, keys["dropout"]
            )
            window.append(metrics)
            window_flops += train_flops(m, data.tokenizer.vocab_size, *batch_lengths(batch))
            step += 1
            last = step == t.num_train_steps
            stopping = stop.signum is not None  # read once: a signal may land at any moment
            save = step % t.checkpoint_every_steps == 0 or last or stopping
            if step % t.log_every_steps == 0 or save:
                window = jax.device_get(window)  # the one host sync of the window
                check_finite(window, window_step, t.on_nonfinite, manager.latest_step())
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
            if save:
                meta = {
                    "data_position": dataclasses.asdict(position),
                    "step": step,
                    "vocab_sha256": data.tokenizer.sha256,
                }
                checkpoint.save(manager, step, params, opt_state, meta)
            if stopping:
                manager.wait_until_finished()
                writer.close()
                raise Interrupted(stop.signum, step)
            if (step % t.eval_every_steps == 0 or last) and data.dev is not None:
                eval_start = time.perf_counter()
                metrics_eval = dev_loss(steps.eval, params, data.dev, layout, mesh, row_slice)
                metrics_eval.update(dev_bleu(graphdef, params, data, config, step))
                log.info(
                    "eval at step %d: %s",
                    step,
                    "  ".join(f"{k} {v:.3f}" for k, v in metrics_eval.items()),
                )
                writer.write(step, metrics_eval)
                # Evaluation time is not training speed: the window's clock skips it.
                window_start += time.perf_counter() - eval_start
    manager.wait_until_finished()
    # Sec. 6.1: the final evaluation decodes the mean of the newest checkpoints.
    params, checkpoint_steps = final_params(config, manager, params, step, abstract[0])
    if len(checkpoint_steps) > 1 and data.dev is not None:
        metrics_eval = dev_loss(steps.eval, params, data.dev, layout, mesh, row_slice)
        metrics_eval.update(dev_bleu(graphdef, params, data, config, step))
        averaged = {k.replace("eval/", "eval/averaged_"): v for k, v in metrics_eval.items()}
        log.info(
            "eval of the mean of steps %s: %s",
            checkpoint_steps,
            "  ".join(f"{k} {v:.3f}" for k, v in averaged.items()),
        )
        writer.write(step, averaged)
    writer.close()

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
    """BLEU on the first `decode.eval_num_sentences` dev sentences."""
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


def main(argv: list[str]) -> None:
    setup_logging()
    flags, overrides = parse_flags(argv, {"config": "", "workdir": "", "force": False})
    if not flags["config"] or not flags["workdir"]:
        raise SystemExit(
            "usage: python -m translate.train --config=configs/NAME.py "
            "--workdir=DIR [--config.SECTION.FIELD=VALUE ...] [--force]"
        )
    config = load_config(flags["config"], overrides)
    sharding.initialize_distributed()
    try:
        train_and_evaluate(config, flags["workdir"], force=flags["force"])
    except Interrupted as stopped:
        log.info("%s", stopped)
        sys.exit(128 + stopped.signum)


if __name__ == "__main__":
    main(sys.argv[1:])
