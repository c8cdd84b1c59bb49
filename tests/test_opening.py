"""Opening a run again and reading a workdir back (translate/training/opening.py and
translate/trained.py): to resume it or to decode with it, a refusal is one line and loses
nothing."""

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest

from translate import checkpoint, cli, evaluate, sample, score, translate_text
from translate import export as export_command
from translate.config import TrainCorpus
from translate.data import corpus, sources, synthetic
from translate.training import opening, trainer
from translate.workdir import Workdir

ROOT = pathlib.Path(__file__).parent.parent


@pytest.fixture
def trained(workdir, tmp_path):
    """A private copy of that run, for a test to damage."""
    path = tmp_path / "run"
    shutil.copytree(workdir, path)
    return path


def files_of(path: pathlib.Path) -> dict[pathlib.Path, bytes]:
    """Every file under `path` and its bytes, but the trainer's lock (emptied at each start)."""
    return {
        p.relative_to(path): p.read_bytes()
        for p in path.rglob("*")
        if p.is_file() and p.name != "train.lock"
    }


def test_a_resume_with_another_optimizer_and_no_config_json_is_one_line_and_writes_nothing(
    config, trained, monkeypatch
):
    workdir = Workdir(trained)
    workdir.config.unlink()
    before = files_of(trained)
    config.train.optimizer = "muon"  # the checkpoints hold Adam's moments
    with pytest.raises(ValueError) as error:
        trainer.train_and_evaluate(config, trained)
    message = cli.user_error_message(error.value)
    assert message is not None and "\n" not in message
    assert "trained with another optimizer" in message and "unreadable" not in message
    assert "--config.train.optimizer=adam" in message
    assert files_of(trained) == before, "nothing written: no config.json, nothing moved aside"
    assert not (trained / "checkpoints.corrupt").exists()

    # Past that check (a state it could not name): the restore says the same and sets nothing
    # aside, and config.json is written only once the checkpoints have been read.
    monkeypatch.setattr(opening, "other_optimizers", lambda config: [])
    with pytest.raises(checkpoint.OtherStructure) as error:
        trainer.train_and_evaluate(config, trained)
    message = cli.user_error_message(error.value)
    assert message is not None and "trained with another optimizer" in message
    # tokens/ is a cache, made again for this copy of the run (it names the data by its path).
    kept = {p: b for p, b in before.items() if p.parts[0] != "tokens"}
    assert {p: b for p, b in files_of(trained).items() if p.parts[0] != "tokens"} == kept
    assert not (trained / "checkpoints.corrupt").exists()


# Run as a program, as a user runs the command: from the save of step 3 on, writes past 20 kB
# fail (RLIMIT_FSIZE: "File too large", as a full disk fails them; the parameters take 200 kB),
# while the dev evaluation of step 3 runs beside that save's background writes.
FULL_DISK_AT_STEP_3 = """
import resource, signal, sys
from translate import checkpoint, cli, train

save = checkpoint.save

def full_from_step_3(manager, step, *args, **kwargs):
    if step == 3:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
    return save(manager, step, *args, **kwargs)

checkpoint.save = full_from_step_3
cli.run(train.main, ["--config=configs/tiny.py", "--workdir=" + sys.argv[1],
                     "--config.train.eval_every_steps=3", *sys.argv[2:]])
"""


@pytest.mark.slow  # a 6-step run in a new process for each, 15-25 s
@pytest.mark.parametrize(
    "keep_best, directory",
    [("", "checkpoints"), ("dev_bleu", "best/checkpoints")],
    ids=["checkpoint", "best"],
)
def test_a_full_disk_during_a_checkpoint_and_a_dev_evaluation_says_one_line(
    tmp_path, keep_best, directory
):
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            FULL_DISK_AT_STEP_3,
            str(tmp_path),
            f"--config.train.keep_best_by={keep_best}",
        ],
        cwd=ROOT,
        capture_output=True,  # pipes: the file size limit does not cut them short
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.splitlines()
    assert lines[-1].startswith(
        f"-c: error: could not write the checkpoint of step 3 in {tmp_path / directory}: "
        "File too large"
    ), done.stderr[-3000:]
    for noise in ("Traceback", "Event loop is closed", "Exception ignored"):
        assert noise not in done.stderr, done.stderr[:3000]
    # Every other line is the run's own progress, with a time in front.
    assert all(line[:2].isdigit() and line[2] == ":" for line in lines[:-1]), lines


def interrupted_force_run(path: pathlib.Path) -> pathlib.Path:
    """A workdir as `kill -9` of a `--force` run leaves it while the data loads, before the new
    vocabulary is trained: the earlier run set aside in previous_run/, nothing in its place."""
    workdir = Workdir(path)
    workdir.previous_run.mkdir(parents=True)
    for name in ("config.json", "vocab.model"):
        (workdir.previous_run / name).write_text("the earlier run's\n")
    return path


def test_every_command_reading_an_interrupted_force_run_says_to_train_again(tmp_path):
    run = interrupted_force_run(tmp_path / "run")
    text = tmp_path / "in.en"
    text.write_text("a sentence\n")
    commands = {
        "translate-text": lambda: translate_text.main(
            [f"--workdir={run}", f"--input={text}", f"--output={tmp_path / 'out.de'}"]
        ),
        "translate-evaluate": lambda: evaluate.main(
            [f"--workdir={run}", f"--src={text}", f"--ref={text}"]
        ),
        "translate-score": lambda: score.main(
            [f"--workdir={run}", f"--src={text}", f"--tgt={text}"]
        ),
        "translate-sample": lambda: sample.main([f"--workdir={run}"]),
        "translate-export": lambda: export_command.main(
            [f"--workdir={run}", "--format=ctranslate2", f"--output={tmp_path / 'export'}"]
        ),
    }
    said = {}
    for name, command in commands.items():
        with pytest.raises(OSError) as error:
            command()
        said[name] = cli.user_error_message(error.value)
    for name, message in said.items():
        assert message is not None and "holds an interrupted --force run" in message, (
            name,
            message,
        )
        assert "run translate-train there again" in message
    assert sorted(p.name for p in run.iterdir()) == ["previous_run"], "nothing written"


@pytest.fixture(scope="module")
def evaluated(workdir, tmp_path_factory):
    """translate-evaluate of the tiny run on 3 sentences, one far longer than its max_len of 32
    tokens, with --matmul_dtype=compute; then again, compared with the first one's
    hypotheses as an editor saves them, behind a UTF-8 byte order mark. (first, second) reports,
    each as (report.json, report.txt)."""
    path = tmp_path_factory.mktemp("evaluated")
    long = " ".join(["the man sees a dog"] * 20)
    (path / "test.en").write_text(f"a man sees a dog\n{long}\nthe dog runs\n")
    (path / "test.de").write_text("ein Mann sieht einen Hund\nein Hund\nder Hund rennt\n")
    common = [
        f"--workdir={workdir}",
        f"--src={path / 'test.en'}",
        f"--ref={path / 'test.de'}",
        "--config.decode.beam_size=1",
    ]
    evaluate.main([*common, f"--output={path / 'first'}", "--matmul_dtype=compute"])
    hypotheses = (path / "first" / "hypotheses.txt").read_text(encoding="utf-8")
    (path / "other.txt").write_text("\ufeff" + hypotheses, encoding="utf-8")
    evaluate.main([*common, f"--output={path / 'second'}", f"--compare={path / 'other.txt'}"])
    return [
        (json.loads((path / o / "report.json").read_text()), (path / o / "report.txt").read_text())
        for o in ("first", "second")
    ]


def test_an_evaluation_report_says_how_many_sources_were_cut_to_max_len(evaluated):
    report, text = evaluated[0]
    assert report["num_sources_cut"] == 1 and report["max_len"] == 32
    assert (
        "cut       1 source longer than data.max_len=32 tokens: translated from its first 31 "
        "tokens only" in text
    )


def test_an_evaluation_report_says_the_products_dtype_it_was_given(evaluated):
    report, text = evaluated[0]
    assert report["matmul_dtype"] == "compute"
    assert "--matmul_dtype=compute" in next(line for line in text.splitlines() if "beam" in line)
    assert "matmul_dtype" not in evaluated[1][0], "said only when given"


def test_compare_with_a_byte_order_mark_finds_the_same_hypotheses_identical(evaluated):
    report, text = evaluated[1]
    assert report["comparison"]["identical"] is True
    assert "identical hypotheses" in text


def test_a_training_file_edited_in_place_with_its_time_set_back_is_tokenized_again(
    config, tmp_path
):
    write_files_corpus(config, tmp_path / "data")
    files = trainer.data_files(Workdir(tmp_path / "run"))
    first = sources.load_data(config, files)
    target = tmp_path / "data" / "train.de"
    before = target.stat()
    text = target.read_text()
    # The same size, the same modification time: two kept pairs' targets swapped.
    lines = text.split("\n")
    sources_text = (tmp_path / "data" / "train.en").read_text().split("\n")[:-1]
    src_ids, tgt_ids = (first.tokenizer.encode(t) for t in (sources_text, lines[:-1]))
    fit = [
        i
        for i in range(len(src_ids))
        if corpus.fits(len(src_ids[i]), len(tgt_ids[i]), config.data.max_len)
    ]
    i, j = fit[0], next(j for j in fit if lines[j] != lines[fit[0]])
    lines[i], lines[j] = lines[j], lines[i]
    target.write_text("\n".join(lines))
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert target.stat().st_size == before.st_size
    again = sources.load_data(config, files)
    expected, _ = corpus.tokenize_parallel(
        again.tokenizer, sources_text, lines[:-1], config.data.max_len
    )
    assert list(expected.tgt_tokens) != list(first.train.tgt_tokens), "the edit changes tokens"
    for name in ("src_tokens", "src_offsets", "tgt_tokens", "tgt_offsets"):
        assert list(getattr(again.train, name)) == list(getattr(expected, name)), name


def write_files_corpus(config, data: pathlib.Path) -> None:
    """Points the config at parallel files written from the synthetic grammar."""
    synthetic.write_splits(data, 200, 8, 8, seed=0)
    config.data.source, config.data.dir = "files", str(data)
    config.data.dev_prefix, config.data.test_prefix = "dev", "test"


def test_a_finished_run_resumed_on_another_data_dir_says_so(config, trained, tmp_path, caplog):
    workdir = Workdir(trained)
    # The tiny run, as if trained from its corpus's files: data.source "files" in data.dir.
    saved = json.loads(workdir.config.read_text())
    saved["data"].update(source="files", dir=str(workdir.data), dev_prefix="dev")
    saved["data"]["test_prefix"] = "test"
    workdir.config.write_text(json.dumps(saved))
    moved = tmp_path / "elsewhere"
    shutil.copytree(workdir.data, moved)
    config.data.source, config.data.dir = "files", str(moved)
    config.data.dev_prefix, config.data.test_prefix = "dev", "test"
    with caplog.at_level(logging.INFO, logger="translate"):
        trainer.open_run(config, workdir, force=False)
    said = [r.getMessage() for r in caplog.records if "trained on other text" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0]
    assert f"config.data.dir {workdir.data.resolve()} -> {moved.resolve()}" in said[0]
    assert "its evaluations and report are of the new text" in said[0]


def test_init_from_with_another_vocab_size_is_refused_before_anything_is_written(
    config, trained, tmp_path
):
    config.train.init_from = str(trained)
    config.data.vocab_size = 300  # the tiny run's vocabulary: 200
    run = Workdir(tmp_path / "tuned")
    with pytest.raises(ValueError) as error:
        trainer.open_run(config, run, force=False)
    message = cli.user_error_message(error.value)
    assert message.startswith("--config.data.vocab_size=300: --config.train.init_from=")
    assert message.endswith("give --config.data.vocab_size=200")
    assert not run.path.exists()


def test_one_file_as_source_and_target_is_refused(config, tmp_path):
    write_files_corpus(config, tmp_path / "data")
    target = tmp_path / "data" / "train.de"
    target.unlink()
    target.symlink_to("train.en")
    run = Workdir(tmp_path / "run")
    with pytest.raises(ValueError, match=r"train\.en and .*train\.de are one file") as error:
        trainer.open_run(config, run, force=False)
    assert cli.user_error_message(error.value) is not None
    assert not run.vocab.exists()


def test_force_deletes_only_the_runs_own_files_and_names_what_it_keeps(config, trained, caplog):
    workdir = Workdir(trained)
    report = workdir.evaluations / "test.en.step6" / "report.json"
    report.parent.mkdir(parents=True)
    report.write_text("{}")
    mine = workdir.path / "translations.txt"
    mine.write_text("ein Hund .\n")
    with caplog.at_level(logging.INFO, logger="translate"):
        trainer.open_run(config, workdir, force=True)
    said = [r.getMessage() for r in caplog.records if "deleted the earlier run" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert "checkpoints/" in said[0] and "config.json" in said[0]
    assert "kept what is not the run's: evaluations/ (1 evaluation of that model)" in said[0]
    assert "translations.txt" in said[0]
    assert report.read_text() == "{}" and mine.read_text() == "ein Hund .\n"
    assert not workdir.checkpoints.exists()


def test_force_refuses_a_users_file_in_best_before_moving_anything(config, tmp_path):
    workdir = Workdir(tmp_path / "run")
    (workdir.best / "checkpoints" / "3").mkdir(parents=True)
    workdir.best.joinpath("config.json").write_text("{}")
    workdir.best.joinpath("mine.txt").write_text("my notes\n")
    workdir.config.write_text("{}")
    workdir.lock.write_text("")
    before = files_of(workdir.path)
    with pytest.raises(ValueError) as error:
        opening.check_config(config, workdir, force=True)
    message = str(error.value)
    assert message.startswith(f"--force: {workdir.best / 'mine.txt'} is not the run's")
    assert "\n" not in message
    assert files_of(workdir.path) == before and not workdir.previous_run.exists()


def test_a_run_resumes_with_other_product_and_compute_precision_saying_so_in_one_line(
    config, trained, caplog
):
    workdir = Workdir(trained)
    saved = json.loads(workdir.config.read_text())["model"]
    assert (saved["compute_dtype"], saved["matmul_dtype"]) == ("auto", "compute")
    config.model.compute_dtype, config.model.matmul_dtype = "float32", "bfloat16"
    with caplog.at_level(logging.INFO, logger="translate"):
        trainer.open_run(config, workdir, force=False)
    said = [r.getMessage() for r in caplog.records if "resumes with" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0], caplog.text
    assert "config.model.compute_dtype auto -> float32" in said[0]
    assert "config.model.matmul_dtype compute -> bfloat16" in said[0]
    assert workdir.checkpoints.is_dir() and not workdir.previous_run.exists()


def test_a_compute_dtype_this_device_cannot_run_is_refused_before_anything_is_written(
    config, tmp_path
):
    assert jax.default_backend() == "cpu"  # XLA's CPU backend has no float16 attention
    config.model.compute_dtype = "float16"
    run = tmp_path / "run"
    with pytest.raises(ValueError) as error:
        trainer.train_and_evaluate(config, run)
    message = cli.user_error_message(error.value)
    assert message is not None and "\n" not in message
    assert message.startswith("--config.model.compute_dtype=float16: this cpu device cannot")
    assert not run.exists(), "no config.json, no lock: the corrected command starts afresh"


def test_a_resume_with_another_seed_is_refused_naming_it(config, trained):
    workdir = Workdir(trained)
    before = files_of(trained)
    config.train.seed += 1
    with pytest.raises(ValueError) as error:
        opening.check_config(config, workdir, force=False)
    message = str(error.value)
    assert f"config.train.seed = {config.train.seed - 1}, now {config.train.seed}" in message
    assert "\n" not in message and files_of(trained) == before


def test_a_resume_with_other_training_corpora_is_refused_naming_them(config, trained):
    workdir = Workdir(trained)
    before = files_of(trained)
    config.data.train_corpora = (TrainCorpus(prefix="train", weight=2.0),)
    with pytest.raises(ValueError) as error:
        opening.check_config(config, workdir, force=False)
    message = str(error.value)
    assert "config.data.train_corpora = " in message and "weight" in message
    assert "\n" not in message and files_of(trained) == before


def test_init_from_an_export_says_it_is_an_export(config, trained, tmp_path):
    exported = tmp_path / "exported"
    exported.mkdir()
    marker = {"workdir": str(trained), "files": ["model.bin", "vocab.model"]}
    (exported / "translate-export.json").write_text(json.dumps(marker))
    (exported / "model.bin").write_bytes(b"weights")
    shutil.copyfile(trained / "vocab.model", exported / "vocab.model")
    config.train.init_from = str(exported)
    run = Workdir(tmp_path / "tuned")
    with pytest.raises(ValueError) as error:
        trainer.open_run(config, run, force=False)
    message = cli.user_error_message(error.value)
    assert message.startswith(f"--config.train.init_from={exported}: {exported} is an export")
    assert message.endswith(f"exported from ({trained})") and "checkpoints" not in message
    assert not run.path.exists()


def test_a_config_json_edited_to_another_vocab_size_is_refused_naming_the_vocabulary(
    config, trained
):
    workdir = Workdir(trained)
    saved = json.loads(workdir.config.read_text())
    saved["data"]["vocab_size"] = 300  # the tiny run's vocabulary: 200
    workdir.config.write_text(json.dumps(saved))
    before = files_of(trained)
    config.data.vocab_size = 300
    with pytest.raises(ValueError) as error:
        trainer.open_run(config, workdir, force=False)
    message = cli.user_error_message(error.value)
    assert message.startswith(f"--config.data.vocab_size=300: {workdir.vocab} was trained with")
    assert "give --config.data.vocab_size=200" in message and "\n" not in message
    assert files_of(trained) == before
