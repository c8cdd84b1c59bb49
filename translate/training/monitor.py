"""What a training run reports, and how it stops.

Reports: a console line per logging window (loss, learning rate, tokens/s, steps/s, ETA, MFU:
a `ThroughputWindow`), and `metrics.jsonl` and TensorBoard events in the workdir; a profiler
trace of chosen steps (`StepProfiler`). Stops: a first SIGTERM or SIGINT asks for a checkpoint
after the current step (`StopSignal`, then `Interrupted`); a step whose loss or gradient is not
finite stops the run or is counted, by `train.on_nonfinite`; dev BLEU that stops improving ends
it early, by `train.early_stopping_patience` (`DevBleuHistory`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import pathlib
import signal
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from translate.workdir import Workdir

log = logging.getLogger("translate")


class MetricWriter:
    """metrics.jsonl and TensorBoard events in the workdir (process 0 only).

    A last line cut short (the process was killed while writing it) is removed before this
    writer appends, so every line it writes is a line of its own.
    """

    def __init__(self, workdir: Workdir):
        self.active = jax.process_index() == 0
        if self.active:
            from tensorboardX import SummaryWriter

            drop_partial_line(workdir.metrics)
            self.jsonl = open(workdir.metrics, "a")
            self.tensorboard = SummaryWriter(str(workdir.tensorboard))

    def write(self, step: int, metrics: dict[str, float]) -> None:
        if not self.active:
            return
        self.jsonl.write(json.dumps({"step": step, **metrics}) + "\n")
        self.jsonl.flush()
        for name, value in metrics.items():
            self.tensorboard.add_scalar(name, value, step)
        self.tensorboard.flush()

    def close(self) -> None:
        if self.active:
            self.jsonl.close()
            self.tensorboard.close()
            self.active = False  # closed once, however many ways out call this


def drop_partial_line(path: pathlib.Path) -> None:
    """Cuts `path` back to its last whole line (one that ends in a newline), if one is cut short."""
    if not path.is_file():
        return
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        f.seek(0)
        whole = f.read().rfind(b"\n") + 1
        f.truncate(whole)
    log.info("removed the last line of %s, cut short when an earlier run stopped", path)


def read_metrics(path: pathlib.Path) -> dict[str, tuple[list[int], list[float]]]:
    """Metric name -> (steps, values) in step order, from a `metrics.jsonl`.

    A resumed run may log a step again; its last value is kept. A last line cut short (the
    process was killed while writing it) is left out, and so is a line that an earlier version
    appended to such a line (it is not JSON), with a warning naming it.
    """
    by_step: dict[str, dict[int, float]] = {}
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    for number, line in enumerate(lines[:-1], start=1):  # after the last newline: partial
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step = int(record["step"])
            values = {k: float(v) for k, v in record.items() if k != "step"}
        except (ValueError, TypeError, KeyError):
            log.warning("WARNING: %s:%d is not a whole line of metrics; left out", path, number)
            continue
        for name, value in values.items():
            by_step.setdefault(name, {})[step] = value
    return {name: (sorted(v), [v[s] for s in sorted(v)]) for name, v in by_step.items()}


class DevBleuHistory:
    """The best dev BLEU so far, its step, and the evaluations since it last improved.

    Built from the dev BLEU the run has already logged (up to the step it resumes from), so a
    resumed run counts as if it had never stopped.
    """

    def __init__(self, logged: list[tuple[int, float]] = ()):
        self.best: float | None = None
        self.best_step: int | None = None
        self.since_best = 0
        for step, bleu in logged:
            self.add(step, bleu)

    @classmethod
    def of_run(cls, metrics: pathlib.Path, up_to_step: int) -> DevBleuHistory:
        """The history in a workdir's `metrics.jsonl`, for evaluations at steps <= `up_to_step`."""
        steps, values = (
            read_metrics(metrics).get("eval/bleu", ([], [])) if metrics.is_file() else ([], [])
        )
        return cls([(s, v) for s, v in zip(steps, values) if s <= up_to_step])

    def add(self, step: int, bleu: float) -> bool:
        """Records the dev BLEU at `step`; whether it is better than every earlier one."""
        if self.best is None or bleu > self.best:
            self.best, self.best_step, self.since_best = bleu, step, 0
            return True
        self.since_best += 1
        return False

    def exhausted(self, patience: int) -> bool:
        """Whether `patience` evaluations in a row brought no better BLEU (never when 0)."""
        return patience > 0 and self.since_best >= patience


def evaluated_steps(workdir: Workdir) -> set[int]:
    """Steps whose dev evaluation `metrics.jsonl` records."""
    if not workdir.metrics.is_file():
        return set()
    return set(read_metrics(workdir.metrics).get("eval/loss", ([], []))[0])


def summarize(window: list[dict[str, np.ndarray]], seconds: float, steps: int) -> dict[str, float]:
    """Turns a window of per-step metrics (fetched to the host) into logged numbers."""
    good = [m for m in window if not m["nonfinite"]] or window
    totals = {k: np.sum([m[k] for m in good], axis=0) for k in window[0]}
    tokens = max(float(totals["tokens"]), 1.0)
    nll = float(totals["nll_sum"]) / tokens
    return {
        "train/loss": float(totals["loss_sum"]) / tokens,
        "train/nll": nll,
        "train/perplexity": math.exp(min(nll, 50.0)),
        "train/accuracy": float(totals["correct"]) / tokens,
        # Over the steps that were applied, as the sums above (a skipped step's may be inf).
        "train/grad_norm": float(totals["grad_norm"]) / len(good),
        "train/tokens_per_sec": tokens / seconds,
        "train/steps_per_sec": steps / seconds,
        "train/skipped_steps": float(sum(m["nonfinite"] for m in window)),
    }


class ThroughputWindow:
    """The steps since the last log line: their metrics, their model FLOPs and their wall time.

    `summary` turns them into the logged numbers: loss and accuracy, tokens/s and steps/s (from
    which `log_progress` gives the ETA), model FLOPs/s, and MFU against the devices' published
    peak. Time that is not training (compiling the step, dev evaluations) is `exclude`d.
    """

    def __init__(self, step: int, peak_flops_per_device: float | None):
        self.peak = peak_flops_per_device
        self.reset(step)

    def reset(self, step: int) -> None:
        """Starts a new window after `step` steps."""
        self.metrics: list[dict[str, Any]] = []
        self.flops = 0.0
        self.first_step = step
        self.start = time.perf_counter()

    def add(self, metrics: dict[str, Any], flops: float, steps: int = 1) -> None:
        """One step's metrics (still on the device) and its model FLOPs on this host's rows; with
        `steps` > 1, that many steps' metrics stacked on a leading axis and their FLOPs."""
        self.metrics.append(metrics if steps == 1 else (steps, metrics))
        self.flops += flops

    def exclude(self, seconds: float) -> None:
        """Leaves `seconds` of other work out of the window's clock."""
        self.start += seconds

    def fetch(self) -> list[dict[str, Any]]:
        """The window's metrics on the host, one dict a step: the one host sync of a window."""
        fetched = jax.device_get(self.metrics)
        self.metrics = []
        for entry in fetched:
            if isinstance(entry, tuple):  # several steps' metrics, stacked
                steps, stacked = entry
                self.metrics.extend({k: v[i] for k, v in stacked.items()} for i in range(steps))
            else:
                self.metrics.append(entry)
        return self.metrics

    def summary(self, step: int, learning_rate: float) -> dict[str, float]:
        """The logged numbers of the window that ends after `step` steps (fetched first)."""
        seconds = time.perf_counter() - self.start
        logged = summarize(self.metrics, seconds, step - self.first_step)
        logged["train/learning_rate"] = learning_rate
        logged["train/model_flops_per_sec"] = self.flops / seconds
        if self.peak:
            logged["train/mfu"] = self.flops / seconds / (self.peak * jax.local_device_count())
        return logged


class Interrupted(Exception):
    """Training stopped on a signal after saving a checkpoint (or before training began, with
    `step` None); the same command resumes it."""

    def __init__(self, signum: int, step: int | None):
        self.signum, self.step = signum, step
        name = signal.Signals(signum).name
        if step is None:
            message = (
                f"stopped by {name} while loading the data, before training: the workdir is as "
                "it was, and the same command starts again"
            )
        else:
            message = (
                f"stopped by {name} at step {step}; a checkpoint of step {step} is saved and the "
                "same command resumes from it"
            )
        super().__init__(message)


class StopRequested(BaseException):
    """A stop signal cut short work that a restart redoes (an evaluation, loading the data).

    A BaseException, as KeyboardInterrupt is: an `except Exception` around a convenience (the
    training curves) must not swallow it.
    """


class StopSignal:
    """While active, a first SIGTERM or SIGINT asks the run to checkpoint and stop; a second one
    exits at once (pre-emptible jobs get such a warning before they are killed).

    Between steps, the loop asks `agreed(step)`. One process acts on its own signal at the next
    step. On several hosts, a signal may reach them on different sides of a step boundary (SLURM
    signals each task separately), and a host that saves while another enters the next step's
    collectives hangs both; so they agree, every `every` steps, by gathering every host's flag,
    and all stop at the same step. Within `abandonable()` (an evaluation, loading the data),
    one process abandons the work at once; on several hosts an evaluation's collectives must
    finish together, so it ends first.
    """

    def __init__(self, every: int = 1):
        self.signum: int | None = None
        self.every = every
        self.previous: dict[int, Any] = {}
        self.abandoning = False

    def handle(self, signum, frame):
        if self.signum is not None:
            log.info("second %s: exiting now without a checkpoint", signal.Signals(signum).name)
            os._exit(128 + signum)
        self.signum = signum
        log.info(
            "%s received: stopping (send it again to exit at once)",
            signal.Signals(signum).name,
        )
        if self.abandoning:
            self.abandoning = False
            raise StopRequested(signal.Signals(signum).name)

    def agreed(self, step: int) -> int | None:
        """The signal every process stops for after `step`, or None to carry on."""
        if jax.process_count() == 1:
            return self.signum
        if step % self.every:
            return None
        # One small all-gather every `every` steps: the only way hosts agree on the same step.
        signums = multihost_utils.process_allgather(np.int32(self.signum or 0))
        return int(np.max(signums)) or None

    @contextlib.contextmanager
    def abandonable(self):
        """A block that a stop signal abandons at once (raising StopRequested)."""
        if jax.process_count() > 1:
            yield
            return
        if self.signum is not None:
            raise StopRequested(signal.Signals(self.signum).name)
        self.abandoning = True
        try:
            yield
        finally:
            self.abandoning = False

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            # None: the previous handler was not installed from Python (JAX's own, on several
            # hosts) and cannot be put back from here; the default is the safe choice.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


class NonfiniteGuard:
    """Applies `train.on_nonfinite` to each window of steps fetched to the host.

    A non-finite step was never applied (the train step keeps the old state). "stop" raises at
    the first one; "skip" counts them and carries on, but raises once `max_in_a_row` steps in a
    row were skipped: such a run has stopped learning and must not end as if it had finished.
    """

    def __init__(self, policy: str, max_in_a_row: int):
        self.policy, self.max_in_a_row = policy, max_in_a_row
        self.in_a_row = 0

    def check(
        self, window: list[dict[str, Any]], first_step: int, last_checkpoint: int | None
    ) -> None:
        bad = [first_step + 1 + i for i, m in enumerate(window) if m["nonfinite"]]
        if bad and self.policy == "stop":
            raise FloatingPointError(
                f"non-finite loss or gradient at step {bad[0]}; the update was not applied and "
                f"training stopped. The last checkpoint (step {last_checkpoint}) is intact; set "
                "--config.train.on_nonfinite=skip to skip such steps instead"
            )
        for i, m in enumerate(window):
            self.in_a_row = self.in_a_row + 1 if m["nonfinite"] else 0
            if self.in_a_row >= self.max_in_a_row:
                step = first_step + 1 + i
                raise FloatingPointError(
                    f"{self.in_a_row} steps in a row (steps {step - self.in_a_row + 1} to {step}) "
                    "had a non-finite loss or gradient and were skipped: training has stopped "
                    f"learning. The last checkpoint (step {last_checkpoint}) is intact; lower the "
                    "learning rate (--config.train.learning_rate_scale) or raise "
                    "--config.train.max_consecutive_skips"
                )
        if bad:
            log.info(
                "skipped %d update(s) with non-finite loss or gradient at steps %s",
                len(bad),
                bad[:10],
            )


def format_duration(seconds: float) -> str:
    """A duration as HH:MM:SS, with days in front from 24 hours on: 30 hours is "1d 06:00:00"."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}d {clock}" if days else clock


def log_progress(step: int, num_steps: int, logged: dict[str, float]) -> None:
    eta = (num_steps - step) / max(logged["train/steps_per_sec"], 1e-9)
    log.info(
        "step %d/%d  loss %.3f  nll %.3f  acc %.3f  lr %.2e  %.0f tok/s  %.2f steps/s  ETA %s",
        step,
        num_steps,
        logged["train/loss"],
        logged["train/nll"],
        logged["train/accuracy"],
        logged["train/learning_rate"],
        logged["train/tokens_per_sec"],
        logged["train/steps_per_sec"],
        format_duration(eta),
    )


class StepProfiler:
    """A `jax.profiler` trace of steps `first` to `last` (1-based, as the log counts them).

    The trainer calls `before(step)` with the steps done before each step and `after(step,
    outputs)` with the steps done after it; `close()` ends a trace that an error cut short.
    """

    def __init__(self, steps: tuple[int, int] | None, directory: pathlib.Path):
        self.steps, self.directory, self.tracing = steps, directory, False

    def before(self, done: int, steps: int = 1) -> None:
        """Before a call of `steps` steps, `done` steps done: starts the trace if the call
        holds its first step."""
        if self.steps is not None and done < self.steps[0] <= done + steps:
            # A Perfetto trace beside TensorBoard's: ui.perfetto.dev opens it with no install.
            jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)
            self.tracing = True

    def after(self, done: int, outputs: Any) -> None:
        if self.tracing and done >= self.steps[1]:
            jax.block_until_ready(outputs)  # the trace holds the steps' device work, not dispatch
            self.close()
            log.info(
                "profiled steps %d to %d into %s: open it with `xprof --port 8791 %s` (pip "
                "install xprof) or TensorBoard's Profile tab, or load its "
                "plugins/profile/*/perfetto_trace.json.gz at https://ui.perfetto.dev",
                *self.steps,
                self.directory,
                self.directory,
            )

    def close(self) -> None:
        if self.tracing:
            self.tracing = False
            jax.profiler.stop_trace()
