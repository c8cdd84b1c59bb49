"""The stages of a pipeline, each resumable; `plan_stages`, their one list; and `run_pipeline`,
which runs those not done."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import logging
import math
import pathlib
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from translate import atomic
from translate.config import Config
from translate.data.sources import DataFiles, open_text
from translate.decoding.report import translate_and_score, write_report
from translate.decoding.sentences import translate_sentences
from translate.decoding.settings import DecodeSettings, decode_settings
from translate.pipeline.directory import (
    PipelineDir,
    StageRecords,
    claimed,
    duration,
    files_record,
)
from translate.pipeline.plan import (
    BACK_TRANSLATED,
    DISTILLED,
    ORIGINAL,
    Plan,
    check_tags_not_pieces,
)
from translate.pipeline.report import pipeline_report, report_text
from translate.trained import load_ensemble
from translate.training.trainer import train_and_evaluate
from translate.workdir import Workdir

log = logging.getLogger("translate")

# Lines decoded and written per part: what a kill can cost, and how often progress is said.
LINES_PER_PART = 2000
# Lines of the training text read and written at a time when it is copied into corpus/.
LINES_PER_COPY = 100_000


def copy_corpus(pipe: PipelineDir, plan: Plan) -> dict[str, Any]:
    """Writes the teachers' training, dev and test text into corpus/, each file whole."""
    data = plan.teacher_config
    home = Workdir(plan.data_workdir) if plan.data_workdir else None
    generated = home.data if home else pipe.corpus / "generated"
    files = DataFiles(pipe.corpus / "unused.vocab", pipe.corpus / "unused.tokens", generated)
    pipe.corpus.mkdir(exist_ok=True)
    texts, dev, test = open_text(data, files)
    src, tgt = pipe.corpus_files(ORIGINAL, data)
    with atomic.AtomicFile(src) as out_src, atomic.AtomicFile(tgt) as out_tgt:
        for text in texts:
            for start in range(0, text.text.num_pairs, LINES_PER_COPY):
                stop = min(start + LINES_PER_COPY, text.text.num_pairs)
                sources, targets = text.text.read(range(start, stop))
                out_src.write("".join(s + "\n" for s in sources).encode())
                out_tgt.write("".join(t + "\n" for t in targets).encode())
        out_src.commit()
        out_tgt.commit()
    written = [src, tgt]
    for prefix, split in (("dev", dev), ("test", test)):
        if split is not None:
            paths = pipe.corpus_files(prefix, data)
            for path, lines in zip(paths, split):
                atomic.write_text(path, "".join(line + "\n" for line in lines))
            written += list(paths)
    return files_record(written)


def teacher_workdirs(pipe: PipelineDir, plan: Plan) -> list[str]:
    """The teachers' workdirs: given, or those the teacher stages train here."""
    if plan.teacher_workdirs:
        return plan.teacher_workdirs
    return [str(pipe.teacher(i).path) for i in range(len(plan.teachers))]


def train_teacher(pipe: PipelineDir, index: int, config: Config) -> dict[str, Any]:
    """Trains (or resumes) the teacher `index` of those trained here, on the first one's
    vocabulary."""
    workdir = pipe.teacher(index)
    if index:  # the first teacher's pieces: the ensemble reads and writes one vocabulary
        workdir.path.mkdir(parents=True, exist_ok=True)
        if not workdir.vocab.is_file():
            with atomic.file(workdir.vocab) as tmp:
                shutil.copyfile(pipe.teacher(0).vocab, tmp)
    return train_model(config, workdir)


def train_model(config: Config, workdir: Workdir) -> dict[str, Any]:
    """Trains (or resumes) one model; what the stage record keeps of it."""
    report = train_and_evaluate(copy.deepcopy(config), workdir.path)
    scores = {} if report is None else {"test_bleu": report["bleu"]}
    return {"workdir": str(workdir.path), "seed": config.train.seed, **scores}


def decode_corpus(
    pipe: PipelineDir,
    name: str,
    workdirs: Sequence[str],
    settings: DecodeSettings,
    lines: list[str],
) -> list[list[tuple[float, str]]]:
    """Every line's translations by the ensemble of `workdirs`, decoded in parts of
    LINES_PER_PART lines; a part written earlier (a killed run's) is read back, not decoded."""
    parts = pipe.parts / name
    parts.mkdir(parents=True, exist_ok=True)
    num_parts = math.ceil(len(lines) / LINES_PER_PART)
    done = {i for i in range(num_parts) if (parts / f"{i:05d}.json").is_file()}
    ensemble = None
    start, decoded = time.monotonic(), 0
    results: list[list[tuple[float, str]]] = []
    for i in range(num_parts):
        path = parts / f"{i:05d}.json"
        chunk = lines[i * LINES_PER_PART : (i + 1) * LINES_PER_PART]
        if i in done:
            results += [[tuple(c) for c in line] for line in json.loads(path.read_text())]
            continue
        if ensemble is None:
            ensemble = load_ensemble(workdirs, log=lambda line: log.info("%s", line))
        got = translate_sentences(
            ensemble.graphdefs,
            ensemble.params,
            ensemble.tokenizer,
            chunk,
            settings,
            ensemble.config.data.max_len,
            first_line=i * LINES_PER_PART,
        )
        atomic.write_text(path, json.dumps(got) + "\n")
        results += got
        decoded += len(chunk)
        rate = decoded / max(time.monotonic() - start, 1e-9)
        left = len(lines) - (i + 1) * LINES_PER_PART
        log.info(
            "%s: %d/%d lines, %.1f lines/s, ETA %s",
            name,
            min((i + 1) * LINES_PER_PART, len(lines)),
            len(lines),
            rate,
            duration(max(left, 0) / max(rate, 1e-9)),
        )
    return results


def write_pairs(
    paths: tuple[pathlib.Path, pathlib.Path], pairs: Iterator[tuple[str, str]]
) -> dict[str, Any]:
    """Writes a corpus's two files, each whole or not at all; pairs with an empty side are
    left out (a translation the search ended at once teaches nothing)."""
    kept = dropped = 0
    with atomic.AtomicFile(paths[0]) as src, atomic.AtomicFile(paths[1]) as tgt:
        for source, target in pairs:
            if not source.strip() or not target.strip():
                dropped += 1
                continue
            src.write((source + "\n").encode())
            tgt.write((target + "\n").encode())
            kept += 1
        if not kept:
            raise ValueError(
                f"{paths[0].name}: every translation was empty ({dropped} lines): the models "
                "decode nothing yet; train them longer (train.num_train_steps), then run again"
            )
        src.commit()
        tgt.commit()
    return {"pairs": kept, "pairs_left_out": dropped, **files_record(list(paths))}


def distil(pipe: PipelineDir, plan: Plan, teachers: Sequence[str]) -> dict[str, Any]:
    """corpus/distilled.*: each training source with its translations by the teachers."""
    src, tgt = pipe.corpus_files(ORIGINAL, plan.teacher_config)
    sources = src.read_text().splitlines()
    results = decode_corpus(pipe, DISTILLED, teachers, plan.decode, sources)
    pairs = ((s, text) for s, line in zip(sources, results) for _, text in line)
    record = write_pairs(pipe.corpus_files(DISTILLED, plan.teacher_config), pairs)
    shutil.rmtree(pipe.parts / DISTILLED)
    return record


def back_translate(pipe: PipelineDir, plan: Plan) -> dict[str, Any]:
    """corpus/back_translated.*: each training target with the reverse model's source for it."""
    _, tgt = pipe.corpus_files(ORIGINAL, plan.teacher_config)
    targets = tgt.read_text().splitlines()
    settings = decode_settings(plan.reverse.decode)
    results = decode_corpus(pipe, BACK_TRANSLATED, [str(pipe.reverse)], settings, targets)
    pairs = ((line[0][1], t) for t, line in zip(targets, results))
    record = write_pairs(pipe.corpus_files(BACK_TRANSLATED, plan.teacher_config), pairs)
    shutil.rmtree(pipe.parts / BACK_TRANSLATED)
    return record


def evaluate(pipe: PipelineDir, plan: Plan, teachers: Sequence[str]) -> dict[str, Any]:
    """The teachers' ensemble and each student on the whole dev and test sets."""
    pipe.evaluations.mkdir(exist_ok=True)
    systems = {"teachers": list(teachers)}
    for i in range(len(plan.students)):
        systems[f"student-{i}"] = [str(pipe.student(i).path)]
    scores: dict[str, dict[str, float]] = {}
    for system, workdirs in systems.items():
        ensemble = load_ensemble(workdirs, log=lambda line: log.info("%s", line))
        settings = decode_settings(ensemble.config.decode)
        scores[system] = {}
        for split in ("dev", "test"):
            paths = pipe.corpus_files(split, plan.teacher_config)
            if not paths[0].is_file():
                continue
            out = pipe.evaluations / f"{system}.{split}"
            report_file = Workdir(out).report_json
            if report_file.is_file():  # written by a stopped run: whole (write_report)
                report = json.loads(report_file.read_text())
            else:
                sources, references = (p.read_text().splitlines() for p in paths)
                report, hypotheses = translate_and_score(
                    ensemble.graphdefs,
                    ensemble.params,
                    ensemble.tokenizer,
                    ensemble.config,
                    settings,
                    sources,
                    references,
                    ensemble.steps[0][-1],
                    lowercase=True,
                )
                report["models"] = workdirs
                with atomic.directory(out) as new:
                    write_report(new, report, sources, references, hypotheses)
            scores[system][split] = {
                "bleu": report["bleu"],
                "bleu_lowercase": report.get("bleu_lowercase"),
                "tokenized_bleu": report["tokenized_bleu"],
                "literature_bleu": report["literature_bleu"],
                "chrf": report["chrf"],
            }
            log.info("%s %s: sacreBLEU %.2f", system, split, report["bleu"])
    return scores


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage of a plan: the name that its record and the report know it by, and its work.

    Attributes:
      name: the stage's record is stages/NAME.json; its time is report.json's stages.NAME.
      work: does the stage (or resumes it); returns what its record keeps.
      check: when set, run before the stage on every run, done or not: it refuses, as soon as
        what it reads exists, what a later stage would fail on hours afterwards.
    """

    name: str
    work: Callable[[], dict[str, Any]]
    check: Callable[[], None] | None = None


def plan_stages(pipe: PipelineDir, plan: Plan) -> list[Stage]:
    """The plan's stages in the order they run: the one list that the run follows and the
    report reads, so that a stage added here is run, recorded and timed alike."""
    teachers = teacher_workdirs(pipe, plan)
    stages = [Stage("corpus", functools.partial(copy_corpus, pipe, plan))]
    stages += [
        Stage(f"teacher-{i}", functools.partial(train_teacher, pipe, i, config))
        for i, config in enumerate(plan.teachers)
    ]
    after_teachers = []
    if plan.reverse is not None:
        reverse = functools.partial(train_model, plan.reverse, Workdir(pipe.reverse))
        after_teachers.append(Stage("reverse", reverse))
    after_teachers.append(Stage(DISTILLED, functools.partial(distil, pipe, plan, teachers)))
    if plan.reverse is not None:
        back = functools.partial(back_translate, pipe, plan)
        after_teachers.append(Stage(BACK_TRANSLATED, back))
    after_teachers += [
        Stage(f"student-{i}", functools.partial(train_model, config, pipe.student(i)))
        for i, config in enumerate(plan.students)
    ]
    after_teachers.append(Stage("evaluations", functools.partial(evaluate, pipe, plan, teachers)))
    # Teachers trained here have their pieces only once the first is trained: the students'
    # tags are checked against them after the teachers, before any later stage starts.
    tags = functools.partial(check_tags_not_pieces, plan.students[0], Workdir(teachers[0]))
    after_teachers[0] = dataclasses.replace(after_teachers[0], check=tags)
    return stages + after_teachers


def run_pipeline(plan: Plan, directory: str) -> dict[str, Any]:
    """Runs every stage not done yet, in order, and writes the report; returns it."""
    pipe = PipelineDir(directory)
    stages = plan_stages(pipe, plan)
    with claimed(pipe, plan.identity(pipe.corpus)):
        records = StageRecords(pipe)
        for stage in stages:
            if stage.check is not None:
                stage.check()
            records.run(stage.name, stage.work)
        names = [stage.name for stage in stages]
        report = pipeline_report(pipe, plan, teacher_workdirs(pipe, plan), names)
        atomic.write_text(pipe.report_json, json.dumps(report, indent=1) + "\n")
        atomic.write_text(pipe.report_txt, report_text(report))
        return report
