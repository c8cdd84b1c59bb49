r"""Train the Transformer on every device and evaluate it: the `translate-train` command.

    python -m translate.train --config=configs/quickstart.py --workdir=/tmp/quickstart \
        [--config.train.num_train_steps=2000 ...] [--force]

Running the same command again resumes from the newest checkpoint in the workdir. The run
itself, phase by phase, is translate/training/trainer.py's `train_and_evaluate`.
"""

from __future__ import annotations

import logging

from translate import startup

_imports_done = startup.interrupts_said_in_one_line()  # Ctrl-C meanwhile: one line

from translate import cli, compilation, sharding
from translate.config import load_config, packaged_config_names
from translate.flags import Flag, compilation_cache_flag, parse_flags
from translate.training.monitor import Interrupted
from translate.training.trainer import train_and_evaluate

_imports_done()

log = logging.getLogger("translate")


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
            **compilation_cache_flag(),
        },
        doc=USAGE,
    )
    for name in ("config", "workdir"):
        if not flags[name]:
            raise ValueError(f"--{name} is required (--help lists every flag)")
    cli.setup_logging()
    config = load_config(flags["config"], overrides)
    compilation.use_persistent_cache(flags["compilation_cache"])
    sharding.initialize_distributed()
    try:
        train_and_evaluate(config, flags["workdir"], force=flags["force"])
    except Interrupted as stopped:
        log.info("%s", stopped)
        cli.exit_at_once(128 + stopped.signum)  # a signal may have cut a compile short


def console_main() -> None:
    """`translate-train`, the console script of pyproject.toml."""
    cli.run(main)


if __name__ == "__main__":
    console_main()
