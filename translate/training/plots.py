"""A training run's curves, drawn from its metrics.jsonl as PNG files (the trainer's last act).

`draw_training_curves(workdir)` writes, each against the training step, metrics_loss.png
(training and dev negative log-likelihood), metrics_learning_rate.png,
metrics_tokens_per_sec.png and metrics_bleu.png (dev BLEU); a picture whose metrics the file
does not hold yet is skipped. `python -m scripts.plot_metrics` draws them for any workdir.
"""

from __future__ import annotations

import pathlib

# The object-oriented API without pyplot: no global figure state and no display backend, so
# drawing works in any process and thread.
from matplotlib.figure import Figure

from translate.training.monitor import read_metrics
from translate.workdir import Workdir

# Every picture has this size (inches) and resolution, so it is FIGSIZE * DPI pixels.
FIGSIZE = (8.0, 5.0)
DPI = 100

# File stem (after "metrics_", the prefix translate.evaluate looks for) -> y-axis label and
# the (metric key, legend label) curves drawn on it. The loss picture shows the NLL, not the
# label-smoothed loss the optimizer sees: smoothing adds a floor that flattens the curve.
PLOTS = {
    "loss": (
        "negative log-likelihood (nats per token, no label smoothing)",
        [("train/nll", "training"), ("eval/nll", "dev")],
    ),
    "learning_rate": ("learning rate", [("train/learning_rate", "training")]),
    "tokens_per_sec": ("target tokens per second", [("train/tokens_per_sec", "training")]),
    "bleu": ("sacreBLEU", [("eval/bleu", "dev")]),
}


def draw_curves(metrics, ylabel: str, curves, title: str, path: pathlib.Path) -> None:
    """Draws `curves` (metric key, legend label) of `metrics` (see `read_metrics`) into `path`."""
    fig = Figure(figsize=FIGSIZE, dpi=DPI)
    ax = fig.subplots()
    for key, label in curves:
        if key in metrics:
            steps, values = metrics[key]
            # Dev metrics come every few thousand steps: markers show where they were taken.
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    # No bbox_inches="tight": the file keeps exactly FIGSIZE * DPI pixels.
    fig.savefig(path)


def draw_training_curves(workdir: Workdir, out: Workdir | None = None) -> list[pathlib.Path]:
    """Draws the curves of `workdir`'s metrics.jsonl into `out` (default the workdir).

    Returns:
      The pictures written, in the order of `PLOTS`.

    Raises:
      FileNotFoundError: if the workdir has no metrics.jsonl.
    """
    if not workdir.metrics.is_file():
        raise FileNotFoundError(
            f"--workdir: {workdir.metrics} does not exist; has training logged a step?"
        )
    metrics = read_metrics(workdir.metrics)
    out = workdir if out is None else out
    out.path.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (ylabel, curves) in PLOTS.items():
        if any(key in metrics for key, _ in curves):
            path = out.metric_plot(stem)
            title = f"{workdir.path.absolute().name}: {stem.replace('_', ' ')}"
            draw_curves(metrics, ylabel, curves, title, path)
            written.append(path)
    return written
