r"""Average the parameters of a run's newest checkpoints into a new workdir (paper Sec. 6.1).

    python -m scripts.average_checkpoints --workdir=runs/base --num=5 \
        [--steps=96000 --steps=97000 ...] [--output=runs/base/average_5] [--output_step=N]
    python -m translate.evaluate --workdir=runs/base/average_5 --src=... --ref=...

The paper averages the last 5 checkpoints of the base model and the last 20 of the big one.
The output is a workdir with the run's config and vocabulary and one parameters-only checkpoint
(at `--output_step`, by default the newest averaged step) whose metadata lists the averaged
steps, which `translate.evaluate` reads like any workdir (`translate.evaluate --average=5`
averages without writing anything). --output must be new, empty, or an earlier average of this
script from the same --workdir (config.json, vocab.model and checkpoints listing `averaged_steps`
and `averaged_from`, nothing else); anything else, another run's average included, is refused
and left as it was. The average is written beside --output and swapped
in once complete, so a failed run keeps the old one.
"""

from __future__ import annotations

import os
import pathlib

from absl import logging as absl_logging

from translate import atomic, checkpoint, cli
from translate.config import parse_value
from translate.flags import Flag, checkpoint_flags, parse_flags
from translate.trained import load_model, write_params_workdir
from translate.workdir import Workdir, check_not_owned, check_output_path


def average_workdir(
    workdir: str | pathlib.Path,
    output: str | pathlib.Path,
    num: int = 5,
    steps: list[int] | None = None,
    output_step: int | None = None,
    params: str = "auto",
) -> list[int]:
    """Writes the mean parameters of `workdir`'s newest `num` checkpoints (or `steps`) to
    `output` and returns the averaged steps, oldest first. `params` as trained.load_model's: by
    default the mean of the checkpoints' moving averages (train.ema_decay) where they hold them."""
    workdir, output = pathlib.Path(workdir).resolve(), pathlib.Path(output).resolve()
    if output == workdir:
        # A parameters-only checkpoint there would become the step that training resumes from.
        raise ValueError(f"--output={output} must not be the training workdir itself (--workdir)")
    run = Workdir(workdir)
    check_output(output, run)
    if not steps and num < 1:  # load_model reads 0 as "no average"
        raise ValueError(f"--num={num}: the number of checkpoints to average must be >= 1")
    # Before any checkpoint is read: the new average is written beside --output.
    cli.check_writable(output.parent, f"--output={output}")
    atomic.remove_stale(output, "new")  # what an average killed while it wrote left there
    _, mean, _, _, steps = load_model(workdir, average=steps or num, params=params)
    out_step = steps[-1] if output_step is None else output_step
    # Written whole beside --output, then swapped in: a failure leaves --output as it was, and
    # a process killed between the two renames leaves an earlier average under a hidden
    # `.NAME.*.old` name beside --output, and no --output.
    with atomic.directory(output) as new:
        # config.json as the run wrote it; the metadata lists the averaged steps, which
        # load_model returns as the steps of this checkpoint.
        meta = {"step": out_step, "averaged_steps": list(steps), "averaged_from": str(run.path)}
        with checkpoint.make_manager(Workdir(new).checkpoints, keep=1) as manager:
            config_json = run.config.read_text(encoding="utf-8")
            write_params_workdir(Workdir(new), config_json, run, manager, out_step, mean, meta)
        check_output(output, run)  # still true: nothing else began writing there meanwhile
    return steps


def check_output(output: pathlib.Path, run: Workdir) -> None:
    """Raises ValueError, naming --output and what is there, unless `output` is absent, empty,
    or an earlier average alone: this script's config.json, vocab.model and checkpoints/, each
    step's metadata listing `averaged_steps` (a training checkpoint's never does)."""
    if output.exists() and not output.is_dir():
        raise ValueError(f"--output={output} exists and is not a directory; nothing was written")
    source = averaged_from(output)
    if source is not None and source != pathlib.Path(os.path.realpath(run.path)):
        raise ValueError(
            f"--output={output} is an average of {source}, not of --workdir={run.path}: "
            "replacing it would lose that run's average, so nothing was changed; give another "
            "--output"
        )
    # Where no command may write (inside a run's own files, a run itself); an earlier average
    # of this run is a model's workdir that this script replaces, where it may lie.
    if source is None:
        check_output_path(output, "--output", [run.path], directory=True)
    else:
        check_not_owned(output, "--output", [run.path], directory=True)
    if not output.exists() and not output.is_symlink():
        return
    out = Workdir(output)
    names = sorted(p.name for p in output.iterdir())
    if not names:
        return
    refusal = (
        "--output={} holds {}; only a new or empty directory, or an earlier average written by "
        "this script, is written to, so nothing there was changed: give another --output"
    )
    others = [n for n in names if n not in (out.config.name, out.vocab.name, out.checkpoints.name)]
    if others:
        found = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
        reports = {out.report_json.name, out.report_txt.name, out.hypotheses.name}
        if set(others) <= reports:
            raise ValueError(
                f"--output={output} holds translate.evaluate's report ({found}), which would "
                "no longer describe the new average; nothing there was changed: move those "
                "files away to replace the average, or give another --output"
            )
        run_files = {out.metrics.name, out.tokens.name, out.lock.name} & set(others)
        what = "files of a training run" if run_files else "files this script does not write"
        raise ValueError(refusal.format(output, f"{what} ({found})"))
    steps = []
    if out.checkpoints.is_dir():
        manager = checkpoint.make_manager(out.checkpoints, read_only=True)
        steps = sorted(manager.all_steps())
    if not steps:
        raise ValueError(refusal.format(output, f"{', '.join(names)} but no checkpoint"))
    for step in steps:
        try:
            averaged = "averaged_steps" in checkpoint.read_meta(manager, step)
        except Exception:  # noqa: BLE001 - unreadable, so not recognisably an average
            averaged = False
        if not averaged:
            found = f"a checkpoint at step {step} that is not an average (a training run's)"
            raise ValueError(refusal.format(output, found))


def averaged_from(output: pathlib.Path) -> pathlib.Path | None:
    """The run (resolved) whose average `output` holds: every step's metadata lists
    `averaged_steps` and names one `averaged_from`. None for anything else."""
    out = Workdir(output)
    if not out.checkpoints.is_dir():
        return None
    manager = checkpoint.make_manager(out.checkpoints, read_only=True)
    sources = set()
    for step in manager.all_steps():
        try:
            meta = checkpoint.read_meta(manager, step)
        except Exception:  # noqa: BLE001 - unreadable, so not recognisably an average
            return None
        if "averaged_steps" not in meta or not meta.get("averaged_from"):
            return None
        sources.add(pathlib.Path(os.path.realpath(meta["averaged_from"])))
    return sources.pop() if len(sources) == 1 else None


FLAGS = {
    "workdir": Flag("", "Required. The training workdir whose checkpoints are averaged."),
    "num": Flag(5, "Average the newest N checkpoints."),
    "steps": Flag([], "Average these steps instead of the newest --num (repeat it)."),
    "output": Flag("", "The new workdir; default WORKDIR/average_N."),
    "output_step": Flag(-1, "The step to save the average at; -1: the newest averaged."),
    "params": checkpoint_flags("average")["params"],
}


def main(argv: list[str]) -> None:
    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's per-save INFO/WARNING lines
    flags, _ = parse_flags(argv, FLAGS, doc=__doc__, sections=())
    if not flags["workdir"]:
        raise SystemExit(__doc__)
    name = f"average_{len(flags['steps']) or flags['num']}"
    output = flags["output"] or str(pathlib.Path(flags["workdir"]) / name)
    try:
        steps = [parse_value(s, int, "--steps") for s in flags["steps"]]
        out_step = None if flags["output_step"] < 0 else flags["output_step"]
        steps = average_workdir(
            flags["workdir"], output, flags["num"], steps, out_step, flags["params"]
        )
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(str(e)) from None
    print(f"averaged steps {steps} of {flags['workdir']} into {output}")


if __name__ == "__main__":
    cli.run(main)
