"""Draw a training run's curves from WORKDIR/metrics.jsonl as PNG files.

    python -m scripts.plot_metrics --workdir=/tmp/quickstart [--output=DIR]

The trainer draws them into its workdir when it ends (translate/training/plots.py); this
redraws them for a run in progress or into another directory: DIR/metrics_loss.png (training
and dev NLL), metrics_learning_rate.png, metrics_tokens_per_sec.png and metrics_bleu.png (dev
BLEU); a picture whose metrics the file does not hold yet is skipped. DIR defaults to the workdir,
where `python -m translate.evaluate` lists the pictures in report.txt.
"""

from __future__ import annotations

import pathlib

from translate import cli
from translate.flags import Flag, parse_flags
from translate.training.plots import draw_training_curves
from translate.workdir import Workdir

FLAGS = {
    "workdir": Flag("", "Required. A training workdir (its metrics.jsonl is drawn)."),
    "output": Flag("", "Directory for the PNG files; default the workdir."),
}


def main(argv: list[str]) -> list[pathlib.Path]:
    flags, _ = parse_flags(argv, FLAGS, doc=__doc__, sections=())
    if not flags["workdir"]:
        raise SystemExit("usage: python -m scripts.plot_metrics --workdir=DIR [--output=DIR]")
    workdir = Workdir(flags["workdir"])
    try:
        written = draw_training_curves(workdir, Workdir(flags["output"] or workdir.path))
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    for path in written:
        print(path)
    return written


if __name__ == "__main__":
    cli.run(main)
