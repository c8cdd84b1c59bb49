"""translate/pipeline/ and its command, translate-distill: teachers to a student.

A tiny pipeline (two teachers, a reverse model, one student; seconds each) runs once for the
module; the tests stop it in a stage, run it again and compare with that run.
"""

import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from test_import import with_pair_tokenizer

from translate import cli, distill
from translate.config import load_config
from translate.data.tokenizer import Tokenizer
from translate.pipeline import stages
from translate.pipeline.directory import PipelineDir, claimed
from translate.pipeline.plan import make_plan
from translate.pipeline.stages import plan_stages, run_pipeline
from translate.trained import load_model
from translate.workdir import Workdir

REPO = pathlib.Path(__file__).resolve().parent.parent

# The tiny config, taught fast enough that its translations are not empty (the pipeline refuses
# a corpus of empty translations).
TEACHER = """
from translate.config import load_config

def get_config():
    config = load_config("tiny")
    config.train.num_train_steps = 60
    config.train.warmup_steps = 20
    config.train.learning_rate_scale = 0.6
    config.train.checkpoint_every_steps = 30
    config.train.log_every_steps = 30
    config.train.eval_every_steps = 60  # one dev evaluation, at the end (tiny's is every 100)
    return config
"""


@pytest.fixture(scope="module")
def teacher_file(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("configs") / "teacher.py"
    path.write_text(TEACHER)
    return path


def plan_of(directory, teacher_file, **changes):
    given = {
        "teacher_config": load_config(teacher_file),
        "num_teachers": 2,
        "teacher_workdirs": [],
        "reverse": load_config(teacher_file),
        "student": None,
        "num_students": 1,
        "decode_overrides": {},
        "nbest": 0,
    }
    given.update(changes)
    return make_plan(directory=str(directory), **given)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, teacher_file) -> pathlib.Path:
    directory = tmp_path_factory.mktemp("pipeline") / "pipe"
    run_pipeline(plan_of(directory, teacher_file), str(directory))
    return directory


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def student_leaves(directory: pathlib.Path) -> list[np.ndarray]:
    model = load_model(PipelineDir(directory).student(0).path, log=lambda line: None)
    return [np.asarray(x) for x in jax.tree.leaves(model.params)]


def test_a_pipeline_writes_its_corpora_students_and_a_report_naming_its_inputs(finished):
    pipe = PipelineDir(finished)
    report = json.loads(pipe.report_json.read_text())
    assert [c["corpus"] for c in report["corpora"]] == ["original", "distilled", "back_translated"]
    assert [c["tag"] for c in report["corpora"]] == ["", "", "<BT>"]
    for corpus in report["corpora"]:
        src = pipe.corpus / f"{corpus['corpus']}.en"
        assert corpus["pairs"] == len(src.read_text().splitlines())
        assert corpus["sha256"]["original.en" if corpus["corpus"] == "original" else src.name]
    # Each distilled pair is a training source with a translation of the ensemble's.
    sources = (pipe.corpus / "original.en").read_text().splitlines()
    distilled = (pipe.corpus / "distilled.en").read_text().splitlines()
    assert set(distilled) <= set(sources) and distilled
    # Back-translated pairs keep the training targets and get new sources.
    targets = (pipe.corpus / "original.de").read_text().splitlines()
    assert set((pipe.corpus / "back_translated.de").read_text().splitlines()) <= set(targets)
    assert len(report["teachers"]) == 2
    assert all(t["workdir"] and t["config_sha256"] for t in report["teachers"])
    assert set(report["scores"]) == {"teachers", "student-0"}
    assert set(report["scores"]["teachers"]) == {"dev", "test"}
    names = {"corpus", "teacher-0", "teacher-1", "reverse", "distilled", "back_translated"}
    assert names | {"student-0", "evaluations"} == set(report["stages"])
    assert "student-0" in pipe.report_txt.read_text()
    # The teachers share the first one's vocabulary: they decode as one ensemble.
    assert sha256(pipe.teacher(0).vocab) == sha256(pipe.teacher(1).vocab)
    # The student's config reads its corpora from the pipeline's files.
    student = json.loads(pipe.student(0).config.read_text())
    assert student["data"]["dir"] == str(pipe.corpus.resolve())
    assert [c["prefix"] for c in student["data"]["train_corpora"]] == [
        "original",
        "distilled",
        "back_translated",
    ]


def test_the_report_times_every_stage_the_run_recorded_in_the_plans_order(finished, teacher_file):
    # The run and the report read one list: a stage run outside it would leave a record that
    # the report leaves out, and a report of its own list would miss a stage added to it.
    pipe = PipelineDir(finished)
    names = [stage.name for stage in plan_stages(pipe, plan_of(finished, teacher_file))]
    report = json.loads(pipe.report_json.read_text())
    assert list(report["stages"]) == names
    assert sorted(p.stem for p in pipe.stages.glob("*.json")) == sorted(names)


def test_running_a_finished_pipeline_again_redoes_nothing(finished, teacher_file, monkeypatch):
    before = {p: sha256(p) for p in finished.rglob("*") if p.is_file() and "report" not in p.name}

    def never(*args, **kwargs):
        raise AssertionError("a finished stage ran again")

    monkeypatch.setattr(stages, "train_and_evaluate", never)
    monkeypatch.setattr(stages, "translate_sentences", never)
    monkeypatch.setattr(stages, "translate_and_score", never)
    report = run_pipeline(plan_of(finished, teacher_file), str(finished))
    assert report == json.loads((finished / "report.json").read_text())
    after = {p: sha256(p) for p in before}
    assert after == before


def test_a_stop_in_decoding_keeps_the_parts_done_and_gives_the_same_corpus_and_student(
    finished, teacher_file, tmp_path, monkeypatch
):
    # The finished pipeline, with the distillation and everything after it undone.
    directory = tmp_path / "pipe"
    shutil.copytree(finished, directory)
    pipe = PipelineDir(directory)
    for name in ("distilled", "back_translated", "student-0", "evaluations"):
        pipe.stage(name).unlink()
    for path in pipe.corpus.glob("distilled.*"):
        path.unlink()
    shutil.rmtree(pipe.students)
    shutil.rmtree(pipe.evaluations)
    monkeypatch.setattr(stages, "LINES_PER_PART", 100)
    decode = stages.translate_sentences
    calls = []

    def stopped_at_the_third_part(*args, **kwargs):
        calls.append(kwargs["first_line"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(stages, "translate_sentences", stopped_at_the_third_part)
    plan = plan_of(directory, teacher_file)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(plan, str(directory))
    assert sorted(p.name for p in (pipe.parts / "distilled").iterdir()) == [
        "00000.json",
        "00001.json",
    ]
    assert (pipe.stages / "distilled.tries").is_file()
    calls.clear()
    monkeypatch.setattr(stages, "translate_sentences", decode)
    run_pipeline(plan, str(directory))
    for name in ("distilled.en", "distilled.de"):
        assert sha256(pipe.corpus / name) == sha256(finished / "corpus" / name)
    assert not (pipe.parts / "distilled").exists()
    for mine, theirs in zip(student_leaves(directory), student_leaves(finished), strict=True):
        np.testing.assert_array_equal(mine, theirs)


def test_bad_inputs_are_refused_in_one_line_before_anything_is_written(
    finished, teacher_file, tmp_path
):
    directory = tmp_path / "pipe"
    student = tmp_path / "student.py"

    def refused(match, student_file=None, **changes):
        with pytest.raises(ValueError, match=match):
            if student_file is not None:  # loading it may refuse it already
                changes["student"] = load_config(student_file)
            plan = plan_of(directory, teacher_file, **changes)
            run_pipeline(plan, str(directory))
        assert not directory.exists()

    def student_with(corpora: str):
        # A student's config reads files: the pipeline's corpora.
        lines = f"config.data.source = 'files'\n    config.data.train_corpora = {corpora}\n    "
        text = TEACHER.replace("return config", lines + "return config")
        student.write_text(text.replace("import load_config", "import TrainCorpus, load_config"))
        return student

    for weight in ("0.0", "-1.0", "float('nan')"):
        corpora = f"(TrainCorpus('original'), TrainCorpus('distilled', weight={weight}))"
        refused("weight", student_file=student_with(corpora))
    refused(
        "corpus 1 already",
        student_file=student_with("(TrainCorpus('distilled'), TrainCorpus('distilled'))"),
    )
    refused("pipeline's corpora", student_file=student_with("(TrainCorpus('train'),)"))
    back = student_with("(TrainCorpus('back_translated'),)")
    refused("reverse", reverse=None, student_file=back)
    # A reverse model whose back-translations no student reads: 20 minutes for nothing.
    forward_only = student_with("(TrainCorpus('original'), TrainCorpus('distilled'))")
    refused("^--reverse_config: .* do not name back_translated", student_file=forward_only)
    missing = str(tmp_path / "missing")
    no_such = f"^--teacher={re.escape(missing)}: no such directory$"
    refused(no_such, teacher_config=None, teacher_workdirs=[missing])
    teachers = [str(PipelineDir(finished).teacher(i).path) for i in (0, 1)]
    refused("twice", teacher_config=None, teacher_workdirs=[teachers[0], teachers[0]])
    student_run = str(PipelineDir(finished).student(0).path)  # its own pieces, with <BT>
    pair = [teachers[0], student_run]
    refused("different vocabularies", teacher_config=None, teacher_workdirs=pair)
    reverse_run = str(PipelineDir(finished).reverse)  # the same pieces, the other direction
    refused("src_lang=de", teacher_config=None, teacher_workdirs=[teachers[0], reverse_run])
    # A piece of the teachers' vocabulary is no tag.
    processor = Tokenizer(PipelineDir(finished).teacher(0).vocab).processor
    piece = next(
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not processor.is_control(i) and not processor.is_unknown(i)
    )
    corpora = f"(TrainCorpus('original'), TrainCorpus('distilled', tag={piece!r}))"
    refused(
        "is a piece",
        teacher_config=None,
        teacher_workdirs=teachers,
        reverse=None,
        student_file=student_with(corpora),
    )
    refused("--num_teachers=0", num_teachers=0)
    refused("--num_students=-1", num_students=-1)
    refused("one of the two", teacher_workdirs=teachers)


def test_a_directory_of_another_pipeline_or_of_other_files_is_refused(
    finished, teacher_file, tmp_path
):
    directory = tmp_path / "pipe"
    shutil.copytree(finished, directory)
    before = sorted(p.name for p in directory.iterdir())
    with pytest.raises(ValueError, match="another pipeline .*students.0.train.seed"):
        other = plan_of(directory, teacher_file)
        other.students[0].train.seed = 7
        run_pipeline(other, str(directory))
    with pytest.raises(ValueError, match="another pipeline"):
        run_pipeline(plan_of(directory, teacher_file, nbest=2), str(directory))
    assert sorted(p.name for p in directory.iterdir()) == before
    mine = tmp_path / "mine"
    (mine / "corpus").mkdir(parents=True)
    (mine / "corpus" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="no pipeline.json"):
        run_pipeline(plan_of(mine, teacher_file), str(mine))
    assert sorted(p.name for p in mine.rglob("*")) == ["corpus", "notes.txt"]
    # A training run is no pipeline directory, nor a place for one.
    with pytest.raises(ValueError, match="training workdir|own files"):
        plan_of(PipelineDir(finished).teacher(0).path, teacher_file)


def test_the_command_says_a_bad_flag_in_one_line(tmp_path, capsys):
    for flags, named in (
        ([], "--teacher_config"),
        (["--teacher_config=tiny", "--num_students=0"], "--num_students=0"),
        (["--teacher_config=tiny", "--config.decode.beam_size=-1"], "beam_size"),
    ):
        with pytest.raises(SystemExit) as exit_:
            cli.run(distill.main, [f"--dir={tmp_path / 'p'}", *flags])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and named in err[0], err
        assert not (tmp_path / "p").exists()


def wait_for(process, line_start: str, log: list[str]) -> bool:
    """Reads the process's stderr until a line holds `line_start`; False when it ended first."""
    for line in process.stderr:
        log.append(line)
        if line_start in line:
            return True
    return False


@pytest.mark.slow  # fresh processes, each importing JAX and compiling: about 2 minutes
def test_killed_in_every_stage_the_pipeline_gives_the_same_student(
    finished, teacher_file, tmp_path
):
    directory = tmp_path / "pipe"
    command = [
        sys.executable,
        "-m",
        "translate.distill",
        f"--dir={directory}",
        f"--teacher_config={teacher_file}",
        f"--reverse_config={teacher_file}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    stages = [
        "corpus",
        "teacher-0",
        "teacher-1",
        "reverse",
        "distilled",
        "back_translated",
        "student-0",
        "evaluations",
    ]
    rng = np.random.default_rng(0)
    for stage in stages:
        done_before = {p.stem for p in (directory / "stages").glob("*.json")}
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        log: list[str] = []
        if wait_for(process, f"{stage}: starting", log):
            time.sleep(rng.uniform(0.0, 1.5))  # somewhere in the stage, or just after it
            process.send_signal(signal.SIGKILL)
        process.wait()
        log += process.stderr.readlines()
        restarted = [s for s in done_before if any(f"{s}: starting" in line for line in log)]
        assert not restarted, (stage, restarted)
    result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    for name in ("distilled.en", "distilled.de", "back_translated.en", "back_translated.de"):
        assert sha256(directory / "corpus" / name) == sha256(finished / "corpus" / name)
    for mine, theirs in zip(student_leaves(directory), student_leaves(finished), strict=True):
        np.testing.assert_array_equal(mine, theirs)


@pytest.mark.slow(
    reason="a pipeline of its own (about 30 s on 2 cores); the stages stay in the default run "
    "with teachers trained here, and the imported kind of tokenizer in tests/test_import.py"
)
def test_a_pipeline_distils_a_teacher_with_opus_mts_kind_of_tokenizer(
    finished, teacher_file, tmp_path
):
    # The first teacher, written as translate-import writes a model with OPUS-MT's tokenizer
    # (two SentencePiece models over an id table), decodes the corpus for a student.
    original = PipelineDir(finished).teacher(0).path
    teacher = with_pair_tokenizer(original, tmp_path / "imported")
    directory = tmp_path / "pipe"
    plan = plan_of(directory, teacher_file, teacher_config=None, teacher_workdirs=[str(teacher)])
    run_pipeline(plan, str(directory))
    pipe = PipelineDir(directory)
    report = json.loads((directory / "report.json").read_text())
    assert list(report["stages"]) == [s.name for s in plan_stages(pipe, plan)]
    distilled = (pipe.corpus / "distilled.de").read_text(encoding="utf-8").splitlines()
    assert len(distilled) == len((pipe.corpus / "original.en").read_text().splitlines())
    assert any(line.strip() for line in distilled)
    assert Workdir(pipe.student(0).path).vocab.is_file()  # the student trains its own


def test_a_first_try_that_did_nothing_leaves_the_directory_to_the_corrected_command(tmp_path):
    # A try that failed before any stage wrote a file (a typo in a teacher's data directory)
    # claimed nothing: the corrected command, another plan, takes the directory. Once a stage
    # has written anything, another plan is refused.
    pipe = PipelineDir(tmp_path / "pipe")
    with pytest.raises(FileNotFoundError), claimed(pipe, {"teacher": "tpyo"}):
        pipe.corpus.mkdir()  # an empty directory is nothing done, nor a try's seconds
        pipe.stages.mkdir()
        pipe.stage("corpus").with_suffix(".tries").write_text("0.1\n")
        raise FileNotFoundError("no such data directory")
    with claimed(pipe, {"teacher": "typo"}):
        assert not list(pipe.stages.glob("*.tries"))  # the failed try's, gone with its plan
        pipe.stage("corpus").write_text("{}")
    assert json.loads(pipe.plan.read_text()) == {"teacher": "typo"}
    with pytest.raises(ValueError, match="holds another pipeline"), claimed(pipe, {"x": 1}):
        pass
    assert json.loads(pipe.plan.read_text()) == {"teacher": "typo"}
