"""Decode a test set with a trained workdir (or an ensemble) and write the BLEU report.

    translate-evaluate --workdir=DIR --src=test.en --ref=test.de [--output=OUT] \\
        [--step=N | --average=5] [--lowercase] [--compare=OTHER_HYPOTHESES]

(or `python -m translate.evaluate ...`) writes OUT/report.json, OUT/report.txt and
OUT/hypotheses.txt. OUT defaults to a new directory DIR/evaluations/SRC.stepN (.2, .3, ... when
that exists), so the training run's own report is never overwritten; an --output that holds a
report already, is a training workdir or a file, or that another translate-evaluate is writing,
is refused. OUT is made (or, by default, chosen) before decoding, so a workdir where nothing can
be written is named before any time is spent.
Repeating --workdir decodes with the ensemble of those models (they must share a vocabulary).
`--average=N` decodes with the mean parameters of the newest N checkpoints (Sec. 6.1: 5 for
base, 20 for big). The report holds two BLEU scores that must not be confused:
- `bleu`: sacreBLEU's default, cased, 13a tokenization (or the target language's own tokenizer
  for Chinese, Japanese, Korean: `trg_lang` comes from data.tgt_lang), on detokenized output
  against the raw reference; comparable across papers that report sacreBLEU with the same
  signature. `--lowercase` adds the case-insensitive `bleu_lowercase` beside it.
- `tokenized_bleu`: the recipe behind the paper's numbers (tensor2tensor's get_ende_bleu.sh):
  Moses tokenization of hypotheses and references, hyphenated compounds split, BLEU on the
  tokens. Compare it with the paper's Table 2 only.
`--compare=FILE` runs sacreBLEU's paired bootstrap resampling test (1,000 resamples) of these
hypotheses against another system's (FILE, one line per source line) and says whether the BLEU
difference is significant at p < 0.05. report.json also records what produced it: the git
commit, package versions, device, config, parameter count and the test files' sha256.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
from collections.abc import Iterator, Sequence
from typing import Any

from translate import startup

_imports_done = startup.interrupts_said_in_one_line()  # Ctrl-C meanwhile: one line

from translate import cli, compilation
from translate.config import apply_override
from translate.data.text import read_lines
from translate.decoding import metrics
from translate.decoding.report import sha256_of_file, translate_and_score, write_report
from translate.decoding.settings import decode_settings
from translate.flags import (
    Flag,
    checkpoint_choice,
    checkpoint_flags,
    compilation_cache_flag,
    matmul_dtype_flag,
    parse_flags,
)
from translate.trained import load_ensemble, parameters_read
from translate.workdir import Workdir, check_output_path, evaluations_home

_imports_done()


def default_output(
    workdir: str, source: str, steps: Sequence[int], num_models: int, parameters: str = ""
) -> Workdir:
    """A new directory under the first workdir's evaluations/ named by the test set and model,
    made here, so that no other evaluation takes it; for a run's best/, under the run's
    evaluations/ as `best.NAME` (`workdir.evaluations_home`), where training never deletes it.

    `evaluations/newstest2014.en.step100000`, `...average5.step100000` or `...ensemble2.step..`,
    with `.raw` or `.ema` after the step when `parameters` says which a run's moving average
    made a choice of (`trained.parameters_read`); `.2`, `.3`, ... are added while a directory of
    that name exists, so nothing is overwritten.

    Raises:
      ValueError: naming --workdir when nothing can be created there.
    """
    home, name = evaluations_home(workdir)
    name += pathlib.Path(source).name
    if num_models > 1:
        name += f".ensemble{num_models}"
    if len(steps) > 1:
        name += f".average{len(steps)}"
    name += f".step{steps[-1]}"
    if parameters:
        name += f".{parameters}"
    evaluations = home.evaluations
    candidate, number = evaluations / name, 1
    while True:
        try:
            evaluations.mkdir(parents=True, exist_ok=True)
            candidate.mkdir()  # made by one process only: the name is this evaluation's
            return Workdir(candidate)
        except FileExistsError:
            number += 1
            candidate = evaluations / f"{name}.{number}"
        except OSError as e:
            raise ValueError(
                f"--workdir={workdir}: cannot write in {e.filename or evaluations} "
                f"({e.strerror}), where the report goes by default: give --output=DIR where "
                "you can write"
            ) from None


@contextlib.contextmanager
def claim_output(output: str) -> Iterator[Workdir]:
    """Makes --output and holds it while this evaluation writes there: a second evaluation
    given the same --output meanwhile is refused at once, and one that starts after this one
    finds the report (`check_output`, checked while it is held). A directory made here and
    left empty (the evaluation failed) is removed.

    Raises:
      ValueError: naming --output when it cannot be made or another evaluation holds it.
    """
    path = pathlib.Path(output)
    made = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise ValueError(
            f"--output={output}: cannot make it ({e.strerror}: {e.filename}): give --output=DIR "
            "where you can write"
        ) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(
                f"--output={output} is being written by another translate-evaluate; give "
                "another --output, or leave it out for a new WORKDIR/evaluations/... directory"
            ) from None
        check_output(output)
        if made:
            with removed_if_empty(Workdir(path)) as out:
                yield out
        else:
            yield Workdir(path)
    finally:
        os.close(fd)  # and with it the lock


@contextlib.contextmanager
def removed_if_empty(out: Workdir) -> Iterator[Workdir]:
    """Yields `out`, a directory made for this evaluation; removed if an error leaves it empty."""
    try:
        yield out
    except BaseException:
        with contextlib.suppress(OSError):
            out.path.rmdir()  # only if empty
        raise


def check_output(output: str, workdirs: Sequence[str] = ()) -> None:
    """Refuses an --output that `workdir.check_output_path` refuses (a file, or under one, a
    training workdir, inside a training workdir's checkpoints or data), or that holds a report
    already."""
    instead = "leave --output out (the default is WORKDIR/evaluations/...) or give another"
    check_output_path(output, "--output", workdirs, directory=True, instead=instead)
    found = [p.name for p in Workdir(output).report_files() if p.exists()]
    if found:
        raise ValueError(
            f"--output={output} holds {', '.join(found)} already; nothing was overwritten: "
            "give a new --output, or leave it out for a new WORKDIR/evaluations/... directory"
        )


FLAGS = {
    "workdir": Flag([], "Required. A training workdir; repeat it to decode with an ensemble."),
    "src": Flag("", "Required. The source side of the test set, one sentence a line."),
    "ref": Flag("", "Required. The reference translations, aligned with --src."),
    "output": Flag(
        "",
        "Directory for report.json, report.txt and hypotheses.txt; must not hold a "
        "report yet. Default: a new WORKDIR/evaluations/SRC.stepN.",
    ),
    **checkpoint_flags("decode with"),
    "lowercase": Flag(False, "Add the case-insensitive sacreBLEU beside the cased one."),
    "compare": Flag(
        "",
        "Another system's hypotheses for --src (one line each): paired bootstrap test "
        "of the BLEU difference (sacreBLEU, 1,000 resamples, p < 0.05).",
    ),
    **matmul_dtype_flag(),
    **compilation_cache_flag(),
}


# The UTF-8 byte order mark, as a character: what some editors put at the start of a file.
BOM = "\ufeff"


def read_test_set(flags: dict[str, Any]) -> tuple[list[str], list[str], list[str] | None]:
    """(sources, references, the --compare hypotheses or None), their line counts checked."""
    sources = read_lines(flags["src"])
    references = read_lines(flags["ref"])
    if not sources:
        raise ValueError(f"--src={flags['src']} holds no sentence: there is nothing to evaluate")
    if len(sources) != len(references):
        raise ValueError(
            f"--src {flags['src']} has {len(sources)} lines but --ref "
            f"{flags['ref']} has {len(references)}"
        )
    other = read_lines(flags["compare"], allow_empty=True) if flags["compare"] else None
    if other and other[0].startswith(BOM):
        # An editor's byte order mark is no part of the first hypothesis: with it, the same
        # hypotheses compare as different ones.
        other[0] = other[0][len(BOM) :]
    if other is not None and len(other) != len(sources):
        raise ValueError(
            f"--compare {flags['compare']} has {len(other)} lines but --src "
            f"{flags['src']} has {len(sources)}"
        )
    return sources, references, other


def main(argv: Sequence[str]) -> None:
    flags, overrides = parse_flags(list(argv), FLAGS, doc=__doc__, sections=("decode",))
    for name in ("workdir", "src", "ref"):
        if not flags[name]:
            raise ValueError(f"--{name} is required (--help lists every flag)")
    workdirs = flags["workdir"]
    if flags["output"]:
        check_output(flags["output"], workdirs)
    cli.quiet_libraries()
    step, average = checkpoint_choice(flags)
    compilation.use_persistent_cache(flags["compilation_cache"])
    graphdef, params, tokenizer, config, members = load_ensemble(
        workdirs, step, average, params=flags["params"], matmul_dtype=flags["matmul_dtype"]
    )
    steps = members[0]
    for dotted, text in overrides.items():
        apply_override(config, dotted, text)
    config.validate()
    settings = decode_settings(config.decode)  # --config.decode.* over the workdir's
    sources, references, other = read_test_set(flags)
    parameters = parameters_read(workdirs, members, flags["params"])
    if flags["output"]:
        output = claim_output(flags["output"])
    else:
        output = removed_if_empty(
            default_output(workdirs[0], flags["src"], steps, len(members), parameters)
        )
    with output as out:
        report, hypotheses = translate_and_score(
            graphdef,
            params,
            tokenizer,
            config,
            settings,
            sources,
            references,
            steps[-1],
            steps,
            lowercase=flags["lowercase"],
        )
        report["test_set"] = {
            "source": str(pathlib.Path(flags["src"]).resolve()),
            "source_sha256": sha256_of_file(flags["src"]),
            "reference": str(pathlib.Path(flags["ref"]).resolve()),
            "reference_sha256": sha256_of_file(flags["ref"]),
        }
        if parameters:
            report["parameters"] = parameters
        if flags["matmul_dtype"]:  # decoded with other products than the model's own
            report["matmul_dtype"] = flags["matmul_dtype"]
        if len(members) > 1:
            report["ensemble"] = [f"{w} step {s}" for w, s in zip(workdirs, members)]
        if other is not None:
            report["comparison"] = {
                "other": str(pathlib.Path(flags["compare"]).resolve()),
                "other_sha256": sha256_of_file(flags["compare"]),
                **metrics.paired_bootstrap(hypotheses, other, references, config.data.tgt_lang),
            }
        write_report(out.path, report, sources, references, hypotheses, plots_dir=workdirs[0])
    print(out.report_txt.read_text(), end="")
    print(f"(written to {out.path})")


def console_main() -> None:
    """`translate-evaluate`, the console script of pyproject.toml."""
    cli.run(main)


if __name__ == "__main__":
    console_main()
