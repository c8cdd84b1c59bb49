"""Draw a training run's curves from WORKDIR/metrics.jsonl as PNG files.

    python -m scripts.plot_metrics --workdir=/tmp/quickstart [--output=DIR]

writes, each against the training step, DIR/metrics_loss.png (training and dev loss),
metrics_learning_rate.png, metrics_tokens_per_sec.png and metrics_bleu.png (dev BLEU); a
picture whose metrics the file does not hold yet is skipped. DIR defaults to the workdir,
where `python -m translate.evaluate` lists the pictures in report.txt.
"""

from __future__ import annotations

import json
import pathlib

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from translate import cli
from translate.config import Flag, parse_flags
from translate.workdir import Workdir

# Every picture has this size (inches) and resolution, so it is FIGSIZE * DPI pixels.
FIGSIZE = (8.0, 5.0)
DPI = 100

# File stem (after "metrics_", the prefix translate.evaluate looks for) -> y-axis label and
# the (metric key, legend label) curves drawn on it.
PLOTS = {
    "loss": (
        "label-smoothed cross-entropy (nats per token)",
        [("train/loss", "training"), ("eval/loss", "dev")],
    ),
    "learning_rate": ("learning rate", [("train/learning_rate", "training")]),
    "tokens_per_sec": ("target tokens per second", [("train/tokens_per_sec", "training")]),
    "bleu": ("sacreBLEU", [("eval/bleu", "dev")]),
}


def read_metrics(path: pathlib.Path) -> dict[str, tuple[list[int], list[float]]]:
    """Metric name -> (steps, values) in step order.

    A resumed run may log a step again; its last value is kept.
    """
    by_step: dict[str, dict[int, float]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            for name, value in record.items():
                if name != "step":
                    by_step.setdefault(name, {})[int(record["step"])] = float(value)
    return {name: (sorted(v), [v[s] for s in sorted(v)]) for name, v in by_step.items()}


def draw_curves(metrics, ylabel: str, curves, title: str, path: pathlib.Path) -> None:
    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
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
    plt.close(fig)


def main(argv: list[str]) -> list[pathlib.Path]:
    flags, _ = parse_flags(
        argv,
        {
            "workdir": Flag("", "Required. A training workdir (its metrics.jsonl is drawn)."),
            "output": Flag("", "Directory for the PNG files; default the workdir."),
        },
        doc=__doc__,
        sections=(),
    )
    if not flags["workdir"]:
        raise SystemExit("usage: python -m scripts.plot_metrics --workdir=DIR [--output=DIR]")
    workdir = Workdir(flags["workdir"])
    source = workdir.metrics
    if not source.is_file():
        raise SystemExit(f"--workdir: {source} does not exist; has training logged a step?")
    metrics = read_metrics(source)
    out = Workdir(flags["output"] or workdir.path)
    out.path.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (ylabel, curves) in PLOTS.items():
        if any(key in metrics for key, _ in curves):
            path = out.metric_plot(stem)
            draw_curves(
                metrics, ylabel, curves, f"{workdir.path.name}: {stem.replace('_', ' ')}", path
            )
            print(path)
            written.append(path)
    return written


if __name__ == "__main__":
    cli.run(main)
