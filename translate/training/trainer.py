"""The training run as named phases: open the run, restore or initialise, train, evaluate.

`train_and_evaluate(config, workdir)` is what `translate-train` runs, and reads top to bottom:

    open_run                 check the workdir, make the mesh, load the data
    Trainer(...)             the jitted steps (training/steps.py) and the checkpoint manager
    restore_or_initialize    the newest whole checkpoint, `train.init_from`, or a fresh model;
                             then config.json is written
    train                    steps to the end, with the periodic actions each at its interval:
                             log a window, check it for non-finite steps, save a checkpoint,
                             stop on a signal, evaluate on dev (keep the best, stop early)
    final_evaluation         the mean of the newest checkpoints (Sec. 6.1) on dev and test
    write_test_report        report.json, report.txt and hypotheses.txt in the workdir

What a step changes lives in one `TrainState`; what the run holds fixed lives in `Run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from translate import checkpoint, sharding
from translate.atomic import remove_stale
from translate.compilation import cache_hits
from translate.config import Config, split_profile_steps
from translate.data.batching import Batch, BatchLayout, DataPosition, iterate_batches
from translate.data.bpe_dropout import SampledEpochs
from translate.data.sources import Data, DataFiles, load_data
from translate.data.tokenizer import PairTokenizer
from translate.decoding.report import translate_and_score
from translate.decoding.settings import decode_settings
from translate.devices import DeviceFacts, cpu_warning, published_peak
from translate.models.factory import resolve_model_attention, resolve_model_dtype
from translate.models.flops import batch_lengths, train_flops
from translate.provenance import host
from translate.training.evaluation import (
    dev_bleu,
    draw_training_curves,
    final_params,
    save_best,
    write_test_report,
)
from translate.training.init_from import InitFrom, check_init_from, read_init_params
from translate.training.monitor import (
    DevBleuHistory,
    Interrupted,
    MetricWriter,
    NonfiniteGuard,
    StepProfiler,
    StopRequested,
    StopSignal,
    ThroughputWindow,
    evaluated_steps,
    log_progress,
)
from translate.training.opening import (
    check_config,
    check_layout,
    check_vocabulary_unchanged,
    warn_of_data_change,
    warn_of_schedule_change,
)
from translate.training.previous_run import recover_previous_run, settle_previous_run
from translate.training.steps import Packed, Steps, dev_loss, make_steps
from translate.workdir import Workdir, copy_vocabulary, lock, write_config

log = logging.getLogger("translate")


class Run(NamedTuple):
    """What a run holds fixed from start to end (`open_run`)."""

    config: Config
    workdir: Workdir
    facts: DeviceFacts
    # train.init_from's workdir and step, when this run starts from another's parameters.
    init: InitFrom | None
    data: Data
    # The compute dtype that model.compute_dtype means on this device (the factory's).
    dtype: Any
    mesh: jax.sharding.Mesh
    layout: BatchLayout
    # This host's rows of every batch.
    row_slice: slice


@dataclasses.dataclass
class TrainState:
    """What each step changes: the steps done, the parameters, Adam's state, the data position,
    and the parameters' moving average (`train.ema_decay`; None without)."""

    step: int
    # The three pytrees are held packed (steps.Packed), as the train step takes and returns
    # them: `.tree()` gives each back, for evaluations and checkpoints.
    params: Packed
    opt_state: Packed
    position: DataPosition
    ema: Packed | None = None

    @classmethod
    def of(cls, step: int, params, opt_state, position: DataPosition) -> TrainState:
        return cls(step, Packed.of(params), Packed.of(opt_state), position)

    @property
    def evaluated(self) -> Any:
        """The parameters that evaluations decode: the moving average when there is one."""
        return (self.params if self.ema is None else self.ema).tree()


def train_and_evaluate(
    config: Config, workdir: str | pathlib.Path, force: bool = False
) -> dict[str, Any] | None:
    """Trains to `config.train.num_train_steps`, resuming from the workdir; returns the test report.

    Holds the workdir's lock throughout (a second trainer there stops at once). Returns None
    when the data has no test split.
    """
    config.validate()  # also for configs built in Python: before the workdir is touched
    workdir = Workdir(workdir)
    check_layout(workdir)  # a file in the way is named before the lock creates the workdir
    # From here a first SIGTERM or SIGINT stops the run: loading the data is abandoned (and
    # --force's earlier run put back), training saves a checkpoint first.
    stop = StopSignal(every=config.train.stop_check_every_steps)
    with stop, lock(workdir), contextlib.ExitStack() as on_exit:
        trainer = Trainer(open_run(config, workdir, force, stop), on_exit, stop)
        trainer.restore_or_initialize()
        trainer.train()
        result = trainer.final_evaluation()
        return None if result is None else write_test_report(workdir, *result)


def open_run(config: Config, workdir: Workdir, force: bool, stop: StopSignal | None = None) -> Run:
    """Checks the workdir against the config, makes the mesh and loads the data.

    Everything that can refuse the run (a kernel this device cannot run, another model's
    workdir, a changed vocabulary, bad data) does so before the workdir changes; `--force`'s
    earlier run comes back when the data fails to load, or a stop signal (`stop`, installed
    by the caller) abandons it, or (at the next start) when the process was killed meanwhile.
    """
    t, m = config.train, config.model
    stop = stop or StopSignal()
    if jax.process_index() == 0:  # what a process killed while it wrote here left behind
        for path in workdir.files():
            remove_stale(path, "tmp")
        remove_stale(workdir.tokens, "new")
    if put_back := recover_previous_run(workdir):
        log.info(
            "an earlier --force run in %s stopped before its data had loaded: put the run it "
            "had set aside back (%s)",
            workdir.path,
            put_back,
        )
    facts = DeviceFacts.of()
    dtype = resolve_model_dtype(m)
    # Before the workdir changes: a kernel this device cannot run is a config error.
    attention = resolve_model_attention(m, facts)
    # A run that has its own checkpoints resumes from them: init_from is for its start only.
    # Checked before --force deletes anything.
    resuming = not force and checkpoint.latest_step(workdir.checkpoints) is not None
    init = check_init_from(config, workdir, force) if t.init_from and not resuming else None
    check_config(config, workdir, force)
    check_vocabulary_unchanged(workdir)  # before the data is opened and tokenized again
    if not force:
        warn_of_schedule_change(config, workdir)
        warn_of_data_change(config, workdir)

    mesh, machine = sharding.make_mesh(), host()
    log.info(
        "mesh: %d devices (%s, %s) on %d hosts; compute %s, %s attention; host %s, %d CPUs",
        mesh.size,
        facts.platform,
        facts.kind,
        jax.process_count(),
        jnp.dtype(dtype).name,
        attention,
        machine["cpu"],
        machine["cpus"],
    )
    if warning := cpu_warning(config, facts):
        log.warning("WARNING: %s", warning)

    try:
        with stop.abandonable():
            if init is not None:
                copy_vocabulary(init.workdir, workdir)  # the data is tokenized with its pieces
            data = sharding.on_process_zero_first(lambda: load_data(config, data_files(workdir)))
        if data.dev is None and (t.keep_best_by or t.early_stopping_patience):
            flag = "keep_best_by" if t.keep_best_by else "early_stopping_patience"
            raise ValueError(
                f"--config.train.{flag}={getattr(t, flag)}: needs dev BLEU, and the data has no "
                "dev split (see data.dev_prefix or data.tfds_dev_split)"
            )
    except StopRequested:
        settle_previous_run(workdir, keep=True)  # --force's earlier run comes back
        raise Interrupted(stop.signum, None) from None
    except BaseException:
        settle_previous_run(workdir, keep=True)  # bad data: --force's earlier run comes back
        raise
    settle_previous_run(workdir, keep=False)
    layout = BatchLayout.from_config(
        config.data.tokens_per_batch, config.data.row_len, t.grad_accum_steps, mesh.size
    )
    row_slice = sharding.host_row_slice(layout.rows)
    return Run(config, workdir, facts, init, data, dtype, mesh, layout, row_slice)


class Trainer:
    """One run's loop over a `TrainState`, and the actions it takes every so many steps."""

    def __init__(self, run: Run, on_exit: contextlib.ExitStack, stop: StopSignal):
        self.run, self.on_exit, self.stop = run, on_exit, stop
        self.config, self.workdir, self.data = run.config, run.workdir, run.data
        t = run.config.train
        self.keys = dict(zip(("params", "dropout"), jax.random.split(jax.random.key(t.seed))))
        self.steps: Steps = make_steps(
            run.config,
            run.data.tokenizer.vocab_size,
            run.mesh,
            steps_per_call=run.config.train.steps_per_call,
        )
        self.grid = checkpoint.KeepOnGrid(
            t.keep_checkpoints, t.checkpoint_every_steps, t.num_train_steps
        )
        self.manager = checkpoint.make_manager(run.workdir.checkpoints, grid=self.grid)
        on_exit.push(closing(self.manager, self.save_failed))
        replicated = sharding.replicated(run.mesh)
        # The restore targets: shapes and shardings of (params, opt_state) on the mesh.
        self.abstract = [
            checkpoint.abstract_like(a, replicated)
            for a in jax.eval_shape(self.steps.init, self.keys["params"])
        ]
        self.guard = NonfiniteGuard(t.on_nonfinite, t.max_consecutive_skips)
        self.state: TrainState | None = None
        self.resumed = False
        self.saving: int | None = None  # the step of the checkpoint being written
        # What the loop writes to and reads from, opened at the restored step (`open_loop`).
        self.writer: MetricWriter | None = None
        self.batches: Iterator[tuple[Batch, DataPosition]] | None = None
        self.window: ThroughputWindow | None = None
        self.dev_history: DevBleuHistory | None = None  # dev BLEU logged up to the step
        self.best: Any = None  # the best checkpoint's manager, with train.keep_best_by
        self.kept_bleu: float | None = None  # the dev BLEU of the checkpoint in best/
        self.profiler: StepProfiler | None = None
        self.compiled: dict[int, bool] = {}  # steps a call -> whether that program is compiled

    # Phase: restore or initialise.

    def restore_or_initialize(self) -> None:
        """The newest whole checkpoint; else `train.init_from`'s parameters; else a fresh model."""
        data, init = self.data, self.run.init
        restored = checkpoint.restore_latest(
            self.manager,
            *self.abstract,
            check_meta=lambda meta: checkpoint.check_vocabulary(
                meta, data.tokenizer, self.workdir.path
            ),
            log=log.info,
            set_aside=True,
        )
        if restored is not None:
            step, params, opt_state, meta = restored
            position = DataPosition(**meta["data_position"])
            self.state, self.resumed = TrainState.of(step, params, opt_state, position), True
            log.info(
                "resumed from step %d (epoch %d, batch %d)", step, position.epoch, position.index
            )
        elif init is not None:
            params = read_init_params(init, self.abstract[0], data.tokenizer)
            _, opt_state = self.steps.init(self.keys["params"])  # Adam starts afresh
            self.state = TrainState.of(0, params, opt_state, DataPosition())
            log.info(
                "initialized from the parameters of %s at step %d; optimizer and step start afresh",
                init.workdir.path,
                init.step,
            )
        else:
            self.state = TrainState.of(0, *self.steps.init(self.keys["params"]), DataPosition())
        if self.steps.ema is not None:
            self.state.ema = Packed.of(self.restore_ema())
        # Only now: a config.json written before the checkpoints were read would name this
        # config for a run that it cannot resume (another optimizer's), and refuse the right one.
        write_config(self.config, self.workdir)
        layout = self.run.layout
        log.info(
            "model: %d parameters; batch %d micro x %d rows x %d tokens",
            sum(x.size for x in jax.tree.leaves(self.abstract[0])),
            layout.num_micro,
            layout.rows,
            layout.row_len,
        )

    def restore_ema(self) -> Any:
        """The moving average of the restored step's checkpoint; else (a fresh run, a
        checkpoint saved without one, or one whose average cannot be read) the parameters
        themselves, from which it starts again."""
        step, directory = self.state.step, self.workdir.checkpoints
        if self.resumed and checkpoint.holds_ema(directory, step):
            try:
                return checkpoint.restore(self.manager, step, self.abstract[0], item="ema")[0]
            except Exception as e:  # noqa: BLE001 - the parameters are whole: go on from them
                log.warning(
                    "WARNING: the moving average of the parameters in the checkpoint of step %d "
                    "is unreadable (%s: %s): it starts again from that step's parameters",
                    step,
                    type(e).__name__,
                    str(e)[:200],
                )
                return jax.tree.map(jnp.copy, self.state.params.tree())
        if step > 0:
            log.info(
                "the checkpoint of step %d holds no moving average of the parameters: "
                "train.ema_decay=%g starts it from that step's parameters",
                step,
                self.config.train.ema_decay,
            )
        # Its own buffers: the parameters are donated to the train step.
        return jax.tree.map(jnp.copy, self.state.params.tree())

    # Phase: the loop.

    def open_loop(self) -> None:
        """What the loop writes to and reads from, from the restored step on."""
        t, step = self.config.train, self.state.step
        self.writer = MetricWriter(self.workdir)
        self.batches = iterate_batches(
            training_pairs(self.config, self.data),
            self.run.layout,
            t.seed,
            self.state.position,
            self.run.row_slice,
            self.data.mixture,
        )
        # Model FLOPs of this host's rows over its devices' published peak.
        peak = published_peak(self.run.facts.kind, jnp.dtype(self.run.dtype).name)
        self.window = ThroughputWindow(step, peak)
        # The dev BLEU logged up to this step: the best so far and the evaluations since.
        self.dev_history = DevBleuHistory.of_run(self.workdir.metrics, step)
        if t.keep_best_by:
            self.best = checkpoint.make_manager(Workdir(self.workdir.best).checkpoints, keep=1)
            self.on_exit.push(closing(self.best, lambda error: None))
            # The dev BLEU that best/ holds. None while it holds nothing, also when a resume
            # turned keep_best_by on after dev evaluations: the next one is kept, then better.
            self.kept_bleu = self.dev_history.best if self.best.all_steps() else None
        self.profiler = StepProfiler(split_profile_steps(t.profile_steps), self.workdir.profile)
        self.on_exit.callback(self.profiler.close)

    def train(self) -> None:
        """Trains to `train.num_train_steps`, or until dev BLEU stops improving."""
        t = self.config.train
        self.open_loop()
        early_stop = self.dev_history.exhausted(t.early_stopping_patience)
        if early_stop:
            log.info("this run stopped early at step %d already (dev BLEU)", self.state.step)
        # A run stopped at (or during) a dev evaluation redoes it first.
        step = self.state.step
        if self.resumed and self.is_eval_step(step) and step not in evaluated_steps(self.workdir):
            early_stop = self.evaluate_dev() or early_stop
        while self.state.step < t.num_train_steps and not early_stop:
            early_stop = self.train_step()
        self.finish_saves()

    def train_step(self) -> bool:
        """One step, then each periodic action that is due; whether to stop early."""
        t = self.config.train
        self.take_step()
        step = self.state.step
        last = step == t.num_train_steps
        signum = self.stop.agreed(step)  # read once: a signal may land at any moment
        save = step % t.checkpoint_every_steps == 0 or last or signum is not None
        if step % t.log_every_steps == 0 or save:
            self.guard.check(
                self.window.fetch(), self.window.first_step, self.manager.latest_step()
            )
        if step % t.log_every_steps == 0 or last:
            self.log_window()
        if save:
            self.save_checkpoint()
        if signum is not None:
            self.finish_saves()
            self.writer.close()
            raise Interrupted(signum, step)
        if not self.is_eval_step(step):
            return False
        eval_start = time.perf_counter()
        early_stop = self.evaluate_dev()
        self.window.exclude(time.perf_counter() - eval_start)  # evaluating is not training speed
        return early_stop

    def take_step(self) -> None:
        """Runs the jitted train step on the next batch, or on the next `train.steps_per_call`
        batches in one call when the step count is a multiple of it and they fit before the
        last step, and adds them to the throughput window."""
        s, t = self.state, self.config.train
        count = t.steps_per_call
        if count == 1 or s.step % count or s.step + count > t.num_train_steps:
            count = 1
        batches = []
        for _ in range(count):
            batch, s.position = next(self.batches)
            batches.append(batch)
        self.profiler.before(s.step, count)
        hits = 0 if self.compiled.get(count) else cache_hits()
        call_start = time.perf_counter()
        key = self.keys["dropout"]
        if count > 1:  # several steps (and their moving averages) in one call
            placed = sharding.put_batches(batches, self.run.mesh)
            states = (s.params, s.opt_state) + (
                () if self.steps.packed_train_ema is None else (s.ema,)
            )
            *states, metrics = self.steps.packed_train_many(*states, placed, s.step, key)
            s.params, s.opt_state, *ema = states
            s.ema = ema[0] if ema else s.ema
        elif self.steps.packed_train_ema is None:
            placed = sharding.put_batch(batches[0], self.run.mesh)
            s.params, s.opt_state, metrics = self.steps.packed_train(
                s.params, s.opt_state, placed, s.step, key
            )
        else:  # the step and the moving average's update in one call
            placed = sharding.put_batch(batches[0], self.run.mesh)
            s.params, s.opt_state, s.ema, metrics = self.steps.packed_train_ema(
                s.params, s.opt_state, s.ema, placed, s.step, key
            )
        if not self.compiled.get(count):
            # The first call traces and compiles before it dispatches: time that is not
            # training speed, said once and kept out of the first window's clock.
            self.compiled[count] = True
            compile_seconds = time.perf_counter() - call_start
            found = cache_hits() - hits
            cached = f" ({found} program(s) read from the persistent compilation cache)"
            cached = cached if found else ""
            what = "the train step" if count == 1 else f"the train steps, {count} a call,"
            log.info("compiled %s in %.1f s%s", what, compile_seconds, cached)
            self.window.exclude(compile_seconds)
        vocab_size = self.data.tokenizer.vocab_size
        flops = sum(train_flops(self.config.model, vocab_size, *batch_lengths(b)) for b in batches)
        self.window.add(metrics, flops, count)
        s.step += count
        self.profiler.after(s.step, (s.params, metrics))

    # The periodic actions.

    def log_window(self) -> None:
        """Every `train.log_every_steps` and at the end: the console line and metrics.jsonl."""
        step = self.state.step
        logged = self.window.summary(step, float(self.steps.schedule(step - 1)))
        log_progress(step, self.config.train.num_train_steps, logged)
        self.writer.write(step, logged)
        self.window.reset(step)

    def save_checkpoint(self) -> None:
        """Every `train.checkpoint_every_steps`, at the end and on a stop signal."""
        s = self.state
        meta = {
            "data_position": dataclasses.asdict(s.position),
            "step": s.step,
            "vocab_sha256": self.data.tokenizer.sha256,
        }
        self.finish_saves()  # Orbax would wait for it in save(); here a failure names its step
        self.saving = s.step
        try:
            ema = None if s.ema is None else s.ema.tree()
            checkpoint.save(self.manager, s.step, s.params.tree(), s.opt_state.tree(), meta, ema)
        except Exception as e:
            if (error := self.save_failed(e)) is None:
                raise
            raise error from e
        log.info("saving the checkpoint of step %d", s.step)

    def finish_saves(self) -> None:
        """Waits for the checkpoint being written; a write that failed (a full disk) is an
        error naming its step and the checkpoints that are whole."""
        try:
            self.manager.wait_until_finished()
        except Exception as e:
            if (error := self.save_failed(e)) is None:
                raise
            raise error from e

    def save_failed(self, error: Exception) -> OSError | None:
        if self.saving is None:  # no save of this run's: not a failed write of ours
            return None
        return checkpoint.write_error(
            error,
            self.workdir.checkpoints,
            self.saving,
            self.manager.all_steps(),
            "make room, and the same command resumes from the newest",
        )

    def is_eval_step(self, step: int) -> bool:
        """Every `train.eval_every_steps` and at the end, when the data has a dev split."""
        t = self.config.train
        return (
            step % t.eval_every_steps == 0 or step == t.num_train_steps
        ) and self.data.dev is not None

    def evaluate_dev(self) -> bool:
        """Evaluates on the dev set, keeps a best checkpoint; whether to stop early."""
        t, step = self.config.train, self.state.step
        try:
            metrics_eval = self.run_dev_evaluation()
        except StopRequested:
            raise self.stop_after_evaluation(self.stop.signum) from None
        if "eval/bleu" not in metrics_eval:  # a language model has no BLEU
            return False
        bleu = metrics_eval["eval/bleu"]
        self.dev_history.add(step, bleu)
        if self.best is not None and (self.kept_bleu is None or bleu > self.kept_bleu):
            ema = None if self.state.ema is None else self.state.ema.tree()
            params = self.state.params.tree()
            save_best(self.best, self.config, self.workdir, self.data, params, ema, step, bleu)
            self.kept_bleu = bleu
        if not self.dev_history.exhausted(t.early_stopping_patience) or step == t.num_train_steps:
            return False
        history = self.dev_history
        log.info(
            "early stopping at step %d: dev BLEU has not improved for %d evaluations "
            "(best %.2f at step %d)",
            step,
            history.since_best,
            history.best,
            history.best_step,
        )
        if self.manager.latest_step() != step:
            self.save_checkpoint()
        return True

    def run_dev_evaluation(self) -> dict[str, float]:
        """Dev loss and BLEU at this step, logged, written and returned; a signal abandons it."""
        run, step = self.run, self.state.step
        log.info("evaluating at step %d", step)
        with self.stop.abandonable():
            metrics_eval = dev_loss(
                self.steps.eval,
                self.state.evaluated,
                self.data.dev,
                run.layout,
                run.mesh,
                run.row_slice,
            )
            metrics_eval.update(
                dev_bleu(self.steps.graphdef, self.state.evaluated, self.data, self.config, step)
            )
        log.info(
            "eval at step %d: %s", step, "  ".join(f"{k} {v:.3f}" for k, v in metrics_eval.items())
        )
        self.writer.write(step, metrics_eval)
        return metrics_eval

    def stop_after_evaluation(self, signum: int) -> Interrupted:
        """A signal abandoned the evaluation of this step: keep the step; a restart redoes it."""
        if self.manager.latest_step() != self.state.step:
            self.save_checkpoint()
        self.finish_saves()
        self.writer.close()
        return Interrupted(signum, self.state.step)

    # Phase: the final evaluation.

    def final_evaluation(self) -> tuple[dict[str, Any], list[str], list[str], list[str]] | None:
        """Dev and test evaluation of the final parameters: (report, sources, references,
        hypotheses) of the test set, or None without one. A stop signal abandons it; a restart
        evaluates again (the final checkpoint is whole)."""
        step = self.state.step
        # Sec. 6.1: the final evaluation decodes the mean of the newest checkpoints.
        params, checkpoint_steps = final_params(
            self.config, self.manager, self.state.evaluated, step, self.abstract[0], self.grid
        )
        try:
            with self.stop.abandonable():
                if len(checkpoint_steps) > 1 and self.data.dev is not None:
                    self.evaluate_average(params, checkpoint_steps)
                if self.state.ema is not None and self.data.dev is not None:
                    self.evaluate_raw()
                self.writer.close()
                if jax.process_index() == 0:
                    draw_training_curves(self.workdir)
                if self.data.test_text is None:
                    return None
                sources, references = self.data.test_text
                report, hypotheses = translate_and_score(
                    (self.steps.graphdef,),
                    (sharding.local_copy(params),),
                    self.data.tokenizer,
                    self.config,
                    decode_settings(self.config.decode),
                    sources,
                    references,
                    step,
                    checkpoint_steps,
                )
        except StopRequested:
            self.writer.close()
            raise Interrupted(self.stop.signum, step) from None
        return report, sources, references, hypotheses

    def evaluate_raw(self) -> None:
        """With a moving average: dev loss and BLEU of the last step's parameters themselves,
        logged as eval/raw_*, beside the average's eval/* (what the average is worth)."""
        self.evaluate_other(
            self.state.params.tree(), "raw", "the parameters themselves (not their moving average)"
        )

    def evaluate_average(self, params, checkpoint_steps: list[int]) -> None:
        """Dev loss and BLEU of averaged parameters, logged as eval/averaged_*."""
        self.evaluate_other(params, "averaged", f"the mean of steps {checkpoint_steps}")

    def evaluate_other(self, params, name: str, what: str) -> None:
        """Dev loss and BLEU of parameters other than the run's evaluated ones, logged and
        written as eval/<name>_* at this step; `what` names them in the log."""
        run, step = self.run, self.state.step
        metrics_eval = dev_loss(
            self.steps.eval, params, self.data.dev, run.layout, run.mesh, run.row_slice
        )
        metrics_eval.update(dev_bleu(self.steps.graphdef, params, self.data, self.config, step))
        named = {k.replace("eval/", f"eval/{name}_"): v for k, v in metrics_eval.items()}
        log.info("eval of %s: %s", what, "  ".join(f"{k} {v:.3f}" for k, v in named.items()))
        self.writer.write(step, named)


def closing(manager, failed: Callable[[Exception], Exception | None]):
    """An exit callback (`contextlib.ExitStack.push`) that closes a checkpoint manager on every
    way out of the run, an exception included: a save in flight is finished first, so the
    checkpoint an error message calls intact is whole.

    A save that failed in the background (a full disk) raises from the close: `failed` turns
    that into the run's one-line error (None: raised as it is). When the run is ending with
    an error already (the best checkpoint's write on the same full disk), that one is said
    and the close's is dropped: raised here, it would replace the one line with Orbax's
    traceback.
    """

    def close(exc_type, exc, traceback) -> bool:
        try:
            manager.close()
        except Exception as e:
            if exc is not None:
                return False
            if (error := failed(e)) is None:
                raise
            raise error from e
        return False

    return close


def data_files(workdir: Workdir) -> DataFiles:
    """Where the data family keeps a run's vocabulary, tokens and generated corpus."""
    return DataFiles(workdir.vocab, workdir.tokens, workdir.data, workdir.pair_vocab)


def training_pairs(config: Config, data: Data):
    """The training pairs the batcher reads: the cached tokens, or with `data.src_subword_alpha`
    or `tgt_subword_alpha` a segmentation sampled anew for each epoch (data/bpe_dropout.py)."""
    d = config.data
    alphas = (d.src_subword_alpha, d.tgt_subword_alpha)
    if not any(alphas):
        return data.train
    if isinstance(data.tokenizer, PairTokenizer):
        raise ValueError(
            "--config.data.src_subword_alpha / tgt_subword_alpha: BPE-dropout resegments our "
            "BPE vocabulary; OPUS-MT's tokenizer (two unigram models, imported) is not one: "
            "set both to 0"
        )
    return SampledEpochs(data.train, data.tokenizer, alphas, d.max_len, config.train.seed)
