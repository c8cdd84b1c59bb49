"""What a pipeline trains and decodes, checked before anything is written: `make_plan`."""

from __future__ import annotations

import copy
import dataclasses
import os
import pathlib
from collections.abc import Sequence
from typing import Any

from translate.config import Config, TrainCorpus, apply_override
from translate.decoding.settings import DecodeSettings, decode_settings
from translate.pipeline.directory import PipelineDir
from translate.trained import check_shared_vocabulary, open_trained
from translate.workdir import Workdir, check_output_path, read_config

# The corpora a student's data.train_corpora may name, each a prefix of files in corpus/.
ORIGINAL, DISTILLED, BACK_TRANSLATED = "original", "distilled", "back_translated"
CORPORA = (ORIGINAL, DISTILLED, BACK_TRANSLATED)


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
      teacher_config: the config the teachers were trained from (--teacher_config, or the
        first trained teacher's): its data section is the text the corpus stage copies and
        its languages name every corpus file.
      data_workdir: the workdir whose data/ holds a generated (synthetic) corpus, if any.
    """

    teachers: list[Config]
    teacher_workdirs: list[str]
    reverse: Config | None
    students: list[Config]
    decode: DecodeSettings
    teacher_config: Config
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
            "data": self.teacher_config.to_dict()["data"],
        }


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


def pipeline_data(
    config: Config, teacher_config: Config, corpus: pathlib.Path, reverse=False
) -> Config:
    """`config` reading the pipeline's corpus files: its model, training and decoding kept,
    its text the teachers' (`teacher_config`'s languages, swapped for the reverse model)."""
    config = copy.deepcopy(config)
    d, given = config.data, teacher_config.data
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
    *,
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
        teacher_config, data_workdir = check_teachers(teacher_workdirs), teacher_workdirs[0]
    else:
        teacher_config.validate()
        for i in range(num_teachers):
            teacher = pipeline_data(teacher_config, teacher_config, corpus)
            teacher.train.seed = teacher_config.train.seed + i
            teachers.append(teacher.validate())
    if teacher_config.data.source == "monolingual":
        raise ValueError(
            "the teachers are language models (data.source=monolingual): a "
            "pipeline distils translation models"
        )
    check_untagged(teacher_config)
    base = student or teacher_config
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
    if reverse is not None and all(c.prefix != BACK_TRANSLATED for c in base.data.train_corpora):
        raise ValueError(
            "--reverse_config: the students' data.train_corpora do not name back_translated, "
            "so the reverse model would train and decode for nothing: name it in "
            "--student_config or leave out --reverse_config"
        )
    students = []
    for i in range(num_students):
        config = pipeline_data(base, teacher_config, corpus)
        config.train.seed = base.train.seed + i
        students.append(config.validate())  # weights: > 0 and finite, tags one piece each
    if teacher_workdirs:  # teachers trained here are checked once the first has its pieces
        check_tags_not_pieces(students[0], Workdir(teacher_workdirs[0]))
    if reverse is not None:
        reverse = pipeline_data(reverse, teacher_config, corpus, reverse=True).validate()
    decoding = copy.deepcopy(teachers[0] if teachers else teacher_config)
    for dotted, text in decode_overrides.items():  # --config.decode.*, over the teachers'
        apply_override(decoding, dotted, text)
    settings = decode_settings(decoding.validate().decode, {}, nbest)
    check_output_path(directory, "--dir", teacher_workdirs, directory=True)
    return Plan(
        teachers=teachers,
        teacher_workdirs=list(teacher_workdirs),
        reverse=reverse,
        students=students,
        decode=settings,
        teacher_config=teacher_config,
        data_workdir=data_workdir,
    )


def check_teachers(workdirs: Sequence[str]) -> Config:
    """The first teacher's config, once every teacher is a trained model of one vocabulary, one
    direction and one architecture (an ensemble averages their pieces' probabilities)."""
    for path in workdirs:
        if not os.path.isdir(path):
            raise ValueError(f"--teacher={path}: no such directory")
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


def check_untagged(teacher_config: Config) -> None:
    if any(c.tag for c in teacher_config.data.train_corpora):
        raise ValueError(
            "the teachers were trained on tagged corpora (data.train_corpora): their "
            "training sources would need the tags to be decoded; give untagged teachers"
        )


def check_tags_not_pieces(student: Config, teacher: Workdir) -> None:
    """Refuses a tag that the teachers' vocabulary already holds as a piece: the student's
    vocabulary, trained on the same text and more, would hold it too (data/tokenizer.py refuses it
    there, after the decoding)."""
    tokenizer = teacher.tokenizer()
    for corpus in student.data.train_corpora:
        if corpus.tag and tokenizer.has_piece(corpus.tag):
            raise ValueError(
                f"--student_config: the tag {corpus.tag!r} of corpus {corpus.prefix!r} is a "
                f"piece of the teachers' vocabulary {tokenizer.path}: text holds it; choose a "
                "tag no text holds, such as <BT>"
            )
