"""A pipeline's directory: the paths it spells, whose it is, and the record of its stages."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import pathlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from translate import atomic
from translate.config import Config
from translate.workdir import Workdir

log = logging.getLogger("translate")


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


@contextlib.contextmanager
def claimed(pipe: PipelineDir, wanted: dict[str, Any]) -> Iterator[None]:
    """Holds the directory's lock while the pipeline runs; writes pipeline.json on the first
    run (`wanted`, the plan's identity) and refuses a directory that another pipeline or
    anything else wrote. A pipeline.json of another plan whose run wrote nothing else (a try
    that failed before its first stage wrote a file) claims nothing: it is replaced."""
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
        if pipe.plan.is_file():
            saved = json.loads(pipe.plan.read_text())
            if saved != wanted and not wrote_anything(pipe):
                for tries in pipe.stages.glob("*.tries"):  # the failed try's seconds
                    tries.unlink()
                saved = wanted
                atomic.write_text(pipe.plan, json.dumps(wanted, indent=1) + "\n")
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


def wrote_anything(pipe: PipelineDir) -> bool:
    """Whether a run in `pipe` wrote a file besides pipeline.json, its lock and the seconds of
    failed tries (stages/NAME.tries): a stage's record, a corpus, a model. Empty directories
    are nothing."""
    for root, _, files in os.walk(pipe.path):
        for name in files:
            path = pathlib.Path(root) / name
            tries = path.parent == pipe.stages and path.suffix == ".tries"
            if path not in (pipe.plan, pipe.lock) and not tries:
                return True
    return False


def first_difference(saved: Any, wanted: Any, path: str = "") -> str:
    """Where two JSON values first differ, e.g. `students.0.train.seed: 0, now 1`."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        for key in sorted(set(saved) | set(wanted)):
            if saved.get(key) != wanted.get(key):
                return first_difference(saved.get(key), wanted.get(key), f"{path}{key}.")
    if isinstance(saved, list) and isinstance(wanted, list):
        if len(saved) != len(wanted):  # e.g. another --num_students: the count, not the lists
            return f"{path.rstrip('.')}: {len(saved)} entries, now {len(wanted)}"
        for i, (a, b) in enumerate(zip(saved, wanted)):
            if a != b:
                return first_difference(a, b, f"{path}{i}.")
    return f"{path.rstrip('.') or 'the plan'}: {saved}, now {wanted}"


class StageRecords:
    """The records of finished stages: which are done, and the seconds each took over all its
    tries."""

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
