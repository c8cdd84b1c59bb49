"""From teachers to a student: ensemble distillation and back-translation, stage by stage.

`run_pipeline(plan, directory)` is what `translate-distill` runs. Its state is one directory;
the stages run in order, each resumes where a kill stopped it and none is redone once done:

    corpus           the teachers' training, dev and test text, written once as files:
                     corpus/original.{src,tgt}, corpus/dev.*, corpus/test.*
    teacher-N        teachers trained from a config, seed after seed, on those files (or
                     given as trained workdirs); teachers after the first get its vocabulary,
                     so that they decode as one ensemble
    reverse          optional: a model of the other direction, trained on the same files
    distilled        the teachers' ensemble decodes every training source (beam search, its
                     n-best, or samples, as the decode settings say): corpus/distilled.*
                     (Kim & Rush 2016's sequence-level distillation; Freitag et al. 2017)
    back_translated  the reverse model decodes every training target into a new source:
                     corpus/back_translated.* (Sennrich et al. 2016; tagged: Caswell et al. 2019)
    student-N        the student trained on the corpora its config's data.train_corpora names
    evaluations      the teachers' ensemble and each student on the full dev and test sets
    report           report.json and report.txt: every input, every stage's time, the scores

Decoding writes parts of `LINES_PER_PART` lines, each whole or not at all, and a rerun decodes
only the parts missing: a part is decoded from the same lines, with the same models, whether or
not the run was stopped, so the corpus and the student are the same bit for bit. A finished
stage leaves stages/NAME.json (its outputs' sha256 and its time); the training stages resume
from their own checkpoints.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import os
import pathlib
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from translate import atomic
from translate.config import Config, TrainCorpus, apply_override
from translate.data.sources import DataFiles, open_text
from translate.data.tokenizer import Tokenizer
from translate.decoding.report import translate_and_score, write_report
from translate.decoding.sentences import translate_sentences
from translate.decoding.settings import DecodeSettings, decode_settings
from translate.trained import check_shared_vocabulary, load_ensemble, open_trained
from translate.training.trainer import train_and_evaluate
from translate.workdir import Workdir, check_output_path, read_config

log = logging.getLogger("translate")

# The corpora a student's data.train_corpora may name, each a prefix of files in corpus/.
ORIGINAL, DISTILLED, BACK_TRANSLATED = "original", "distilled", "back_translated"
CORPORA = (ORIGINAL, DISTILLED, BACK_TRANSLATED)
# Lines decoded and written per part: what a kill can cost, and how often progress is said.
LINES_PER_PART = 2000
# Lines of the training text read and written at a time when it is copied into corpus/.
LINES_PER_COPY = 100_000


@dataclasses.dataclass
class Plan:
    """What a pipeline trains and decodes; `pipeline.json` holds it, so that a rerun is the
    same pipeline.

    Attributes:
      teachers: the teachers' configs, to be trained here (their data is replaced by the
        pipeline's corpus); empty when `teacher_workdirs` gives trained teachers.
      teacher_workdirs: trained teachers' workdirs, used as they are.
      reverse: the reverse model's config (target to source), or None for no back-translation.
      students: one config per student (seeds); data.train_corpora names corpora of CORPORA.
      decode: how the teachers decode the training sources (beam, n-best or samples).
      data: the text the teachers were trained on: the corpus stage copies it.
      data_workdir: the workdir whose data/ holds a generated (synthetic) corpus, if any.
    """

    teachers: list[Config]
    teacher_workdirs: list[str]
    reverse: Config | None
    students: list[Config]
    decode: DecodeSettings
    data: Config
    data_workdir: str = ""

    def identity(self, corpus: pathlib.Path) -> dict[str, Any]:
        """What makes two runs of a pipeline the same one; the directory's own path (the
        corpus's, in each config) is left out, so that a pipeline moved elsewhere goes on."""

        def described(config: Config) -> dict[str, Any]:
            values = config.to_dict()
            if values["data"]["dir"] == str(corpus.resolve()):
                values["data"]["dir"] = "corpus/"
            return values

        return {
            "teachers": [described(c) for c in self.teachers],
            "teacher_workdirs": [str(pathlib.Path(w).resolve()) for w in self.teacher_workdirs],
            "reverse": None if self.reverse is None else described(self.reverse),
            "students": [described(c) for c in self.students],
            "decode": self.decode.described() | {"nbest": self.decode.nbest},
            "data": self.data.to_dict()["data"],
        }


class PipelineDir:
    """The paths inside a pipeline's directory: the one place that spells them."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.plan = self.path / "pipeline.json"
        self.lock = self.path / "pipeline.lock"
        self.corpus = self.path / "corpus"
        self.teachers = self.path / "teachers"
        self.reverse = self.path / "reverse"
        self.parts = self.path / "parts"
        self.students = self.path / "students"
        self.evaluations = self.path / "evaluations"
        self.stages = self.path / "stages"
        self.report_json = self.path / "report.json"
        self.report_txt = self.path / "report.txt"

    def entries(self) -> list[pathlib.Path]:
        """Everything a pipeline writes at its top level."""
        return [
            self.plan,
            self.lock,
            self.corpus,
            self.teachers,
            self.reverse,
            self.parts,
            self.students,
            self.evaluations,
            self.stages,
            self.report_json,
            self.report_txt,
        ]

    def teacher(self, index: int) -> Workdir:
        return Workdir(self.teachers / f"seed-{index}")

    def student(self, index: int) -> Workdir:
        return Workdir(self.students / f"seed-{index}")

    def corpus_files(self, prefix: str, config: Config) -> tuple[pathlib.Path, pathlib.Path]:
        d = config.data
        return self.corpus / f"{prefix}.{d.src_lang}", self.corpus / f"{prefix}.{d.tgt_lang}"

    def stage(self, name: str) -> pathlib.Path:
        return self.stages / f"{name}.json"


# -- The plan: every refusal before anything is written ------------------------------------


def check_weights(config: Config, flag: str) -> None:
    """Refuses a student whose corpora are not the pipeline's, or are named twice."""
    seen = set()
    for i, corpus in enumerate(config.data.train_corpora, start=1):
        named = f"{flag}: corpus {i} of data.train_corpora"
        if corpus.tfds_split or corpus.prefix not in CORPORA:
            raise ValueError(
                f"{named} is {corpus.prefix or corpus.tfds_split!r}: a student trains on the "
                f"pipeline's corpora, {', '.join(CORPORA)}"
            )
        if corpus.prefix in seen:
            raise ValueError(
                f"{named} names {corpus.prefix!r} twice; give it a weight to draw it more often"
            )
        seen.add(corpus.prefix)


def pipeline_data(config: Config, data: Config, corpus: pathlib.Path, reverse=False) -> Config:
    """`config` reading the pipeline's corpus files: its model, training and decoding kept,
    its text the teachers' (`data`'s languages, swapped for the reverse model)."""
    config = copy.deepcopy(config)
    d, given = config.data, data.data
    d.source, d.dir, d.train_prefix = "files", str(corpus.resolve()), ORIGINAL
    dev, test = {
        "files": (given.dev_prefix, given.test_prefix),
        "tfds": (given.tfds_dev_split, given.tfds_test_split),
    }.get(given.source, ("dev", "test"))  # synthetic: both generated
    d.dev_prefix, d.test_prefix = "dev" if dev else "", "test" if test else ""
    d.src_lang, d.tgt_lang = given.src_lang, given.tgt_lang
    if reverse:
        d.src_lang, d.tgt_lang = d.tgt_lang, d.src_lang
        d.train_corpora = ()
    return config


def make_plan(
    directory: str,
    teacher_config: Config | None,
    num_teachers: int,
    teacher_workdirs: Sequence[str],
    reverse: Config | None,
    student: Config | None,
    num_students: int,
    decode_overrides: dict[str, str],
    nbest: int,
) -> Plan:
    """Checks every input and returns the plan; raises ValueError naming the first bad one.

    Nothing is written: a missing teacher workdir, teachers of other vocabularies, languages or
    architectures, a student's corpus the pipeline does not make (or `back_translated` without
    a reverse model), a weight of 0, negative or NaN, a tag that the teachers' vocabulary holds
    as a piece, and a --dir inside a run are all refused here.
    """
    if bool(teacher_config) == bool(teacher_workdirs):
        raise ValueError(
            "give --teacher_config=FILE (teachers trained here) or --teacher=WORKDIR, repeated "
            "(trained teachers), one of the two"
        )
    if teacher_config is not None and num_teachers < 1:
        raise ValueError(f"--num_teachers={num_teachers}: must be >= 1")
    if num_students < 1:
        raise ValueError(f"--num_students={num_students}: must be >= 1")
    corpus = PipelineDir(directory).corpus
    teachers, data_workdir = [], ""
    if teacher_workdirs:
        data, data_workdir = check_teachers(teacher_workdirs), teacher_workdirs[0]
    else:
        data = teacher_config.validate()
        for i in range(num_teachers):
            teacher = pipeline_data(teacher_config, data, corpus)
            teacher.train.seed = teacher_config.train.seed + i
            teachers.append(teacher.validate())
    if data.data.source == "monolingual":
        raise ValueError(
            "the teachers are language models (data.source=monolingual): a "
            "pipeline distils translation models"
        )
    check_untagged(data)
    base = student or (teacher_config if teacher_config is not None else data)
    if not base.data.train_corpora:
        base = copy.deepcopy(base)
        named = [TrainCorpus(ORIGINAL), TrainCorpus(DISTILLED)]
        if reverse is not None:
            named.append(TrainCorpus(BACK_TRANSLATED, tag="<BT>"))
        base.data.train_corpora = tuple(named)
    check_weights(base, "--student_config")
    if reverse is None and any(c.prefix == BACK_TRANSLATED for c in base.data.train_corpora):
        raise ValueError(
            "--student_config: data.train_corpora names back_translated, which only a reverse "
            "model makes: give --reverse_config=FILE"
        )
    students = []
    for i in range(num_students):
        config = pipeline_data(base, data, corpus)
        config.train.seed = base.train.seed + i
        students.append(config.validate())  # weights: > 0 and finite, tags one piece each
    if teacher_workdirs:  # teachers trained here are checked once the first has its pieces
        check_tags_not_pieces(students[0], Workdir(teacher_workdirs[0]).vocab)
    if reverse is not None:
        reverse = pipeline_data(reverse, data, corpus, reverse=True).validate()
    decoding = copy.deepcopy(teachers[0] if teachers else data)
    for dotted, text in decode_overrides.items():  # --config.decode.*, over the teachers'
        apply_override(decoding, dotted, text)
    settings = decode_settings(decoding.validate().decode, {}, nbest)
    check_output_path(directory, "--dir", teacher_workdirs, directory=True)
    return Plan(teachers, list(teacher_workdirs), reverse, students, settings, data, data_workdir)


def check_teachers(workdirs: Sequence[str]) -> Config:
    """The first teacher's config, once every teacher is a trained model of one vocabulary, one
    direction and one architecture (an ensemble averages their pieces' probabilities)."""
    for path in workdirs:
        try:
            open_trained(path)
        except (ValueError, FileNotFoundError) as e:
            raise ValueError(f"--teacher={path}: {e}") from None
    if len({os.path.realpath(p) for p in workdirs}) < len(workdirs):
        raise ValueError("--teacher names one workdir twice: an ensemble of a model and itself")
    check_shared_vocabulary(workdirs)
    configs = [read_config(Workdir(p)) for p in workdirs]
    first = configs[0]
    for path, config in zip(workdirs[1:], configs[1:]):
        for section, name in (
            ("data", "src_lang"),
            ("data", "tgt_lang"),
            ("model", "architecture"),
        ):
            mine, theirs = (
                getattr(first, section).__dict__[name],
                getattr(config, section).__dict__[name],
            )
            if mine != theirs:
                raise ValueError(
                    f"--teacher={path}: config.{section}.{name}={theirs}, but --teacher="
                    f"{workdirs[0]} has {mine}: the teachers must be models of one kind"
                )
    return first


def check_untagged(data: Config) -> None:
    if any(c.tag for c in data.data.train_corpora):
        raise ValueError(
            "the teachers were trained on tagged corpora (data.train_corpora): their "
            "training sources would need the tags to be decoded; give untagged teachers"
        )


def check_tags_not_pieces(student: Config, vocab: pathlib.Path) -> None:
    """Refuses a tag that the teachers' vocabulary already holds as a piece: the student's
    vocabulary, trained on the same text and more, would hold it too (tokenizer.py refuses it
    there, after the decoding)."""
    processor = Tokenizer(vocab).processor
    for corpus in student.data.train_corpora:
        if corpus.tag and processor.id_to_piece(processor.piece_to_id(corpus.tag)) == corpus.tag:
            raise ValueError(
                f"--student_config: the tag {corpus.tag!r} of corpus {corpus.prefix!r} is a "
                f"piece of the teachers' vocabulary {vocab}: text holds it; choose a tag no "
                "text holds, such as <BT>"
            )


# -- The directory: whose it is, and one pipeline at a time --------------------------------


@contextlib.contextmanager
def claimed(pipe: PipelineDir, plan: Plan) -> Iterator[None]:
    """Holds the directory's lock while the pipeline runs; writes pipeline.json on the first
    run and refuses a directory that another pipeline (another plan) or anything else wrote."""
    if not pipe.plan.is_file():
        found = [p.name for p in pipe.entries() if p.exists() and p != pipe.lock]
        if found:
            raise ValueError(
                f"--dir={pipe.path} holds {', '.join(found)} but no pipeline.json: it is not a "
                "pipeline's directory, and nothing there was changed; give a new --dir"
            )
    pipe.path.mkdir(parents=True, exist_ok=True)
    fd = os.open(pipe.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(
                f"--dir={pipe.path} is being run by another translate-distill; wait for it "
                "or give another --dir"
            ) from None
        wanted = plan.identity(pipe.corpus)
        if pipe.plan.is_file():
            saved = json.loads(pipe.plan.read_text())
            if saved != wanted:
                raise ValueError(
                    f"--dir={pipe.path} holds another pipeline ({first_difference(saved, wanted)}"
                    "); nothing was changed: give the same flags and configs, or a new --dir"
                )
        else:
            atomic.write_text(pipe.plan, json.dumps(wanted, indent=1) + "\n")
        yield
    finally:
        os.close(fd)


def first_difference(saved: Any, wanted: Any, path: str = "") -> str:
    """Where two JSON values first differ, e.g. `students.0.train.seed: 0, now 1`."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        for key in sorted(set(saved) | set(wanted)):
            if saved.get(key) != wanted.get(key):
                return first_difference(saved.get(key), wanted.get(key), f"{path}{key}.")
    if isinstance(saved, list) and isinstance(wanted, list) and len(saved) == len(wanted):
        for i, (a, b) in enumerate(zip(saved, wanted)):
            if a != b:
                return first_difference(a, b, f"{path}{i}.")
    return f"{path.rstrip('.') or 'the plan'}: {saved}, now {wanted}"


# -- Stages ---------------------------------------------------------------------------------


class Stages:
    """The stages' record: which are done, and the seconds each took over all its tries."""

    def __init__(self, pipe: PipelineDir):
        self.pipe = pipe
        pipe.stages.mkdir(exist_ok=True)

    def done(self, name: str) -> dict[str, Any] | None:
        path = self.pipe.stage(name)
        return json.loads(path.read_text()) if path.is_file() else None

    def run(self, name: str, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Runs `work` unless the stage is done; records its outputs and time when it ends.

        The seconds of tries that a signal or an error ended are kept in stages/NAME.tries and
        added to the stage's time.
        """
        if (record := self.done(name)) is not None:
            log.info("%s: done earlier (%s), kept", name, duration(record["seconds"]))
            return record
        tries = self.pipe.stages / f"{name}.tries"
        earlier = float(tries.read_text()) if tries.is_file() else 0.0
        log.info("%s: starting", name)
        start = time.monotonic()
        try:
            outputs = work()
        except BaseException:
            atomic.write_text(tries, f"{earlier + time.monotonic() - start:.1f}\n")
            raise
        seconds = earlier + time.monotonic() - start
        record = {"seconds": round(seconds, 1), "outputs": outputs}
        atomic.write_text(self.pipe.stage(name), json.dumps(record, indent=1) + "\n")
        tries.unlink(missing_ok=True)
        log.info("%s: done in %s", name, duration(seconds))
        return record


def duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def sha256_of(path: pathlib.Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def files_record(paths: Sequence[pathlib.Path]) -> dict[str, Any]:
    """Each file's lines and sha256, by name."""
    record = {}
    for path in paths:
        with open(path, "rb") as f:
            lines = sum(1 for _ in f)
        record[path.name] = {"lines": lines, "sha256": sha256_of(path)}
    return record


def copy_corpus(pipe: PipelineDir, plan: Plan) -> dict[str, Any]:
    """Writes the teachers' training, dev and test text into corpus/, each file whole."""
    data = plan.data
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


def train_teachers(pipe: PipelineDir, plan: Plan, stages: Stages) -> list[str]:
    """The teachers' workdirs: given, or trained here one after another on one vocabulary."""
    if plan.teacher_workdirs:
        return plan.teacher_workdirs
    paths = []
    for i, config in enumerate(plan.teachers):
        workdir = pipe.teacher(i)
        if i:  # the first teacher's pieces: the ensemble reads and writes one vocabulary
            first = pipe.teacher(0)
            workdir.path.mkdir(parents=True, exist_ok=True)
            if not workdir.vocab.is_file():
                with atomic.file(workdir.vocab) as tmp:
                    shutil.copyfile(first.vocab, tmp)
        stages.run(f"teacher-{i}", lambda c=config, w=workdir: trained(c, w))
        paths.append(str(workdir.path))
    return paths


def trained(config: Config, workdir: Workdir) -> dict[str, Any]:
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
    src, tgt = pipe.corpus_files(ORIGINAL, plan.data)
    sources = src.read_text().splitlines()
    results = decode_corpus(pipe, DISTILLED, teachers, plan.decode, sources)
    pairs = ((s, text) for s, line in zip(sources, results) for _, text in line)
    record = write_pairs(pipe.corpus_files(DISTILLED, plan.data), pairs)
    shutil.rmtree(pipe.parts / DISTILLED)
    return record


def back_translate(pipe: PipelineDir, plan: Plan) -> dict[str, Any]:
    """corpus/back_translated.*: each training target with the reverse model's source for it."""
    _, tgt = pipe.corpus_files(ORIGINAL, plan.data)
    targets = tgt.read_text().splitlines()
    settings = decode_settings(plan.reverse.decode)
    results = decode_corpus(pipe, BACK_TRANSLATED, [str(pipe.reverse)], settings, targets)
    pairs = ((line[0][1], t) for t, line in zip(targets, results))
    record = write_pairs(pipe.corpus_files(BACK_TRANSLATED, plan.data), pairs)
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
            paths = pipe.corpus_files(split, plan.data)
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


def stage_names(plan: Plan) -> list[str]:
    """The plan's stages, in the order they run."""
    teachers = [f"teacher-{i}" for i in range(len(plan.teachers))]
    reverse = ["reverse"] if plan.reverse is not None else []
    back = [BACK_TRANSLATED] if plan.reverse is not None else []
    students = [f"student-{i}" for i in range(len(plan.students))]
    return ["corpus", *teachers, *reverse, DISTILLED, *back, *students, "evaluations"]


def run_pipeline(plan: Plan, directory: str) -> dict[str, Any]:
    """Runs every stage not done yet, in order, and writes the report; returns it."""
    pipe = PipelineDir(directory)
    with claimed(pipe, plan):
        stages = Stages(pipe)
        stages.run("corpus", lambda: copy_corpus(pipe, plan))
        teachers = train_teachers(pipe, plan, stages)
        check_tags_not_pieces(plan.students[0], Workdir(teachers[0]).vocab)
        if plan.reverse is not None:
            stages.run("reverse", lambda: trained(plan.reverse, Workdir(pipe.reverse)))
        stages.run(DISTILLED, lambda: distil(pipe, plan, teachers))
        if plan.reverse is not None:
            stages.run(BACK_TRANSLATED, lambda: back_translate(pipe, plan))
        for i, config in enumerate(plan.students):
            stages.run(f"student-{i}", lambda c=config, i=i: trained(c, pipe.student(i)))
        stages.run("evaluations", lambda: evaluate(pipe, plan, teachers))
        report = pipeline_report(pipe, plan, teachers)
        atomic.write_text(pipe.report_json, json.dumps(report, indent=1) + "\n")
        atomic.write_text(pipe.report_txt, report_text(report))
        return report


def teacher_record(path: str) -> dict[str, Any]:
    """A teacher as the report names it: its workdir, the step it decoded and its code's commit
    (from its own report, when it wrote one)."""
    workdir = Workdir(path)
    record: dict[str, Any] = {"workdir": str(pathlib.Path(path).resolve())}
    if workdir.report_json.is_file():
        report = json.loads(workdir.report_json.read_text())
        record["commit"] = (report.get("git") or {}).get("commit")
        record["step"] = report.get("step")
        record["test_bleu"] = report.get("bleu")
    record["config_sha256"] = sha256_of(workdir.config)
    return record


def pipeline_report(pipe: PipelineDir, plan: Plan, teachers: Sequence[str]) -> dict[str, Any]:
    stages = Stages(pipe)
    names = stage_names(plan)
    records = {name: stages.done(name) for name in names}
    students = plan.students[0].data.train_corpora
    corpora = []
    for corpus in students:
        made = (
            records["corpus"]["outputs"]
            if corpus.prefix == ORIGINAL
            else (records[corpus.prefix]["outputs"])
        )
        src, tgt = pipe.corpus_files(corpus.prefix, plan.data)
        corpora.append(
            {
                "corpus": corpus.prefix,
                "weight": corpus.weight,
                "tag": corpus.tag,
                "pairs": made[src.name]["lines"],
                "sha256": {src.name: made[src.name]["sha256"], tgt.name: made[tgt.name]["sha256"]},
            }
        )
    scores = records["evaluations"]["outputs"]
    student_scores = [scores[f"student-{i}"] for i in range(len(plan.students))]
    mean = {}
    for split in ("dev", "test"):
        values = [s[split] for s in student_scores if split in s]
        if values:
            mean[split] = {
                key: round(sum(v[key] for v in values) / len(values), 2)
                for key in values[0]
                if values[0][key] is not None
            }
    return {
        "teachers": [teacher_record(p) for p in teachers],
        "reverse": teacher_record(str(pipe.reverse)) if plan.reverse is not None else None,
        "data": records["corpus"]["outputs"],
        "corpora": corpora,
        "decode": plan.decode.described() | {"nbest": plan.decode.nbest},
        "stages": {name: records[name]["seconds"] for name in names},
        "scores": scores,
        "student_mean": mean,
        "seconds": round(sum(r["seconds"] for r in records.values()), 1),
    }


def report_text(report: dict[str, Any]) -> str:
    lines = ["stage times:"]
    lines += [f"  {name:<16} {duration(s)}" for name, s in report["stages"].items()]
    lines += [f"  {'all':<16} {duration(report['seconds'])}", "", "corpora of the student:"]
    for c in report["corpora"]:
        tag = f", tag {c['tag']}" if c["tag"] else ""
        lines.append(f"  {c['corpus']:<16} {c['pairs']} pairs, weight {c['weight']:g}{tag}")
    lines += ["", "sacreBLEU (lowercased tokenized BLEU, the Multi30k papers' metric):"]
    for system, splits in report["scores"].items():
        row = "  ".join(
            f"{split} {s['bleu']:.2f} ({s['literature_bleu']:.2f})" for split, s in splits.items()
        )
        lines.append(f"  {system:<16} {row}")
    for split, s in report["student_mean"].items():
        lines.append(f"  students' mean {split}: {s['bleu']:.2f} ({s['literature_bleu']:.2f})")
    return "\n".join(lines) + "\n"
