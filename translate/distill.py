r"""Distil an ensemble of teachers into a student, with back-translation: `translate-distill`.

    translate-distill --dir=PIPE --teacher_config=multi30k --num_teachers=2 \
        --student_config=multi30k_student --reverse_config=multi30k_reverse \
        [--num_students=3] [--nbest=N] [--config.decode.FIELD=VALUE ...]
    translate-distill --dir=PIPE --teacher=RUN_A --teacher=RUN_B --student_config=FILE

(or `python -m translate.distill ...`). PIPE holds the pipeline's state; the same command again
goes on from where a kill or Ctrl-C stopped it and never redoes a finished stage. The stages
(translate/pipeline/): copy the teachers' text into PIPE/corpus, train the teachers
(or take trained ones), optionally train a model of the reverse direction, decode every training
source with the teachers' ensemble (`--config.decode.*` and --nbest say how: beam, n-best,
sampling), back-translate every training target with the reverse model, train the students on
the corpora their config's data.train_corpora names (`original`, `distilled`,
`back_translated`; default: the first two, and the third tagged <BT> with a reverse model),
and score the ensemble and each student on the whole dev and test sets. PIPE/report.json and
report.txt name every input and give each stage's time and every score. docs/distillation.md
is the manual.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from translate import startup

_imports_done = startup.interrupts_said_in_one_line()  # Ctrl-C meanwhile: one line

from translate import cli, compilation
from translate.config import load_config
from translate.flags import Flag, compilation_cache_flag, parse_flags
from translate.pipeline.plan import make_plan
from translate.pipeline.report import report_text
from translate.pipeline.stages import run_pipeline
from translate.training.monitor import Interrupted

_imports_done()

log = logging.getLogger("translate")

FLAGS = {
    "dir": Flag("", "Required. The pipeline's directory: its state, corpora, models, report."),
    "teacher_config": Flag(
        "", "A config file (or packaged name) of the teachers, trained here, seed after seed."
    ),
    "num_teachers": Flag(2, "Teachers trained from --teacher_config (seeds seed, seed+1, ...)."),
    "teacher": Flag([], "A trained teacher's workdir, in place of --teacher_config; repeat it."),
    "reverse_config": Flag(
        "",
        "A config of the back-translation model (target to source), trained here on the same "
        "text; its decode section says how it decodes (beam, or sampling). Default: none.",
    ),
    "student_config": Flag(
        "",
        "The student's config; its data.train_corpora names the pipeline's corpora (original, "
        "distilled, back_translated) with weights and tags. Default: the teachers' config.",
    ),
    "num_students": Flag(1, "Students trained (seeds seed, seed+1, ...), each scored."),
    "nbest": Flag(
        0, "Keep this many distinct translations of each source from the ensemble (0: the best)."
    ),
    **compilation_cache_flag(),
}


def main(argv: Sequence[str]) -> None:
    flags, overrides = parse_flags(list(argv), FLAGS, doc=__doc__, sections=("decode",))
    if not flags["dir"]:
        raise ValueError("--dir is required (--help lists every flag)")
    cli.setup_logging()
    configs = {
        name: load_config(flags[name]) if flags[name] else None
        for name in ("teacher_config", "reverse_config", "student_config")
    }
    plan = make_plan(
        directory=flags["dir"],
        teacher_config=configs["teacher_config"],
        num_teachers=flags["num_teachers"],
        teacher_workdirs=flags["teacher"],
        reverse=configs["reverse_config"],
        student=configs["student_config"],
        num_students=flags["num_students"],
        decode_overrides=overrides,
        nbest=flags["nbest"],
    )
    compilation.use_persistent_cache(flags["compilation_cache"])
    try:
        report = run_pipeline(plan, flags["dir"])
    except Interrupted as stopped:
        log.info("%s; the same command goes on from here", stopped)
        cli.exit_at_once(128 + stopped.signum)
    print(report_text(report), end="")


def console_main() -> None:
    """`translate-distill`, the console script of pyproject.toml."""
    cli.run(main)


if __name__ == "__main__":
    console_main()
