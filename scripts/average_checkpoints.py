"""Average the parameters of a run's newest checkpoints into a new workdir (paper Sec. 6.1).

    python -m scripts.average_checkpoints --workdir=runs/base --num=5 \
        [--steps=96000 --steps=97000 ...] [--output=runs/base/average_5] [--output_step=N]
    python -m translate.evaluate --workdir=runs/base/average_5 --src=... --ref=...

The paper averages the last 5 checkpoints of the base model and the last 20 of the big one.
The output is a workdir with the run's config and vocabulary and one checkpoint (parameters
only, saved at `--output_step`, by default the newest averaged step) whose metadata lists the
averaged steps; `translate.evaluate` reads it like any workdir and records those steps in its
report. `python -m translate.evaluate --average=5` does the same without writing anything.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import jax
from absl import logging as absl_logging

from translate import checkpoint
from translate.config import config_from_dict, parse_flags
from translate.model import abstract_model
from translate.tokenizer import Tokenizer
from translate.workdir import Workdir


def average_workdir(
    workdir: str | pathlib.Path,
    output: str | pathlib.Path,
    num: int = 5,
    steps: list[int] | None = None,
    output_step: int | None = None,
) -> list[int]:
    """Writes the mean parameters of `workdir`'s newest `num` checkpoints (or `steps`) to `output`.

    Returns:
      The averaged steps, oldest first.
    """
    workdir, output = pathlib.Path(workdir).absolute(), pathlib.Path(output).absolute()
    if output == workdir:
        # A parameters-only checkpoint there would become the step that training resumes from.
        raise ValueError("--output must not be the training workdir itself")
    run, out = Workdir(workdir), Workdir(output)
    config_text = run.config.read_text()
    config = config_from_dict(json.loads(config_text))
    tokenizer = Tokenizer(run.vocab)
    manager = checkpoint.make_manager(run.checkpoints, read_only=True)
    if steps:
        missing = sorted(set(steps) - set(manager.all_steps()))
        if missing:
            raise ValueError(
                f"--steps {missing} not in {manager.directory} (there: {manager.all_steps()})"
            )
        steps = sorted(steps)
    else:
        steps = checkpoint.steps_to_average(manager, num, config.train.keep_checkpoints)
    _, shapes = abstract_model(config, tokenizer.vocab_size)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    params = checkpoint.average_params(manager, steps, checkpoint.abstract_like(shapes, device))

    output.mkdir(parents=True, exist_ok=True)
    out.config.write_text(config_text)
    shutil.copyfile(run.vocab, out.vocab)
    out_step = steps[-1] if output_step is None else output_step
    meta = {"step": out_step, "averaged_steps": steps, "averaged_from": str(workdir)}
    checkpoint.save_params(checkpoint.make_manager(out.checkpoints, keep=1), out_step, params, meta)
    return steps


def main(argv: list[str]) -> None:
    absl_logging.set_verbosity(absl_logging.ERROR)  # Orbax's per-save INFO/WARNING lines
    flags, _ = parse_flags(
        argv, {"workdir": "", "num": 5, "steps": [], "output": "", "output_step": -1}
    )
    if not flags["workdir"]:
        raise SystemExit(__doc__)
    name = f"average_{len(flags['steps']) or flags['num']}"
    output = flags["output"] or str(pathlib.Path(flags["workdir"]) / name)
    try:
        steps = average_workdir(
            flags["workdir"],
            output,
            flags["num"],
            [int(s) for s in flags["steps"]],
            None if flags["output_step"] < 0 else flags["output_step"],
        )
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(str(e)) from None
    print(f"averaged steps {steps} of {flags['workdir']} into {output}")


if __name__ == "__main__":
    main(sys.argv[1:])
