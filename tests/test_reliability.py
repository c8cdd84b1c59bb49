"""A run survives signals, kills, numerical faults and bad input, and loses nothing."""

import contextlib
import importlib
import json
import logging
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from helpers import read_only

from translate import atomic, checkpoint, cli
from translate.data import sources as data
from translate.data import synthetic
from translate.data.tokenizer import train_tokenizer
from translate.trained import load_model
from translate.training import monitor, opening, trainer
from translate.workdir import Workdir, WorkdirBusy, lock, read_config

ROOT = pathlib.Path(__file__).parent.parent


def train_command(workdir, *overrides):
    return [
        sys.executable,
        "-m",
        "translate.train",
        "--config=configs/tiny.py",
        f"--workdir={workdir}",
        *overrides,
    ]


@pytest.mark.slow  # 10-18 s; kept out of the default run's 10 minutes
def test_sigterm_saves_a_checkpoint_at_the_next_step_and_exits(tmp_path):
    command = train_command(
        tmp_path, "--config.train.num_train_steps=100000", "--config.train.log_every_steps=1"
    )
    process = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    for line in process.stderr:
        if " step " in line:
            break
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output = process.stderr.read()
    process.wait(timeout=60)
    assert time.monotonic() - sent < 60
    assert process.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM at step" in output
    step = int(output.split("stopped by SIGTERM at step ")[1].split(";")[0])
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == step


def test_second_signal_exits_at_once(monkeypatch):
    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    stop = monitor.StopSignal()
    stop.handle(signal.SIGINT, None)
    assert stop.signum == signal.SIGINT and exits == []
    stop.handle(signal.SIGINT, None)
    assert exits == [128 + signal.SIGINT]


@pytest.mark.slow  # about 70 s; test_train's in-process stop-and-resume test is in the default run
def test_killed_and_resumed_run_matches_uninterrupted_run_bitwise(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.fault_injection",
            "--kills=1",
            "--seed=1",
            f"--workdir={tmp_path}",
            "--signals=kill",
            "--max_delay=0.3",
            "--config.train.num_train_steps=40",
            "--config.train.checkpoint_every_steps=3",
            "--config.train.eval_every_steps=40",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert "kill 1: SIGKILL aimed at train: landed" in done.stdout, done.stdout
    assert "landed: 1 of 1" in done.stdout
    assert done.stdout.strip().endswith("identical: true"), done.stdout + done.stderr[-2000:]
    assert done.returncode == 0


@pytest.mark.slow
def test_many_kills_and_terms_leave_the_run_identical(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.fault_injection",
            "--kills=6",
            "--seed=0",
            f"--workdir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    for moment in ("train", "save", "eval"):
        for name in ("SIGKILL", "SIGTERM"):
            assert f"{name} aimed at {moment}: landed" in done.stdout, done.stdout
    assert "landed: 6 of 6" in done.stdout
    assert done.stdout.strip().endswith("identical: true"), done.stdout + done.stderr[-2000:]


@pytest.fixture
def trained(workdir, tmp_path):
    """A private copy of that run, for a test to damage."""
    shutil.copytree(workdir, tmp_path, dirs_exist_ok=True)
    return tmp_path


def test_half_written_checkpoint_is_never_loaded(trained):
    partial = Workdir(trained).checkpoints / "9.orbax-checkpoint-tmp-1234567"
    partial.mkdir()
    (partial / "garbage").write_text("half a checkpoint")
    assert checkpoint.latest_step(Workdir(trained).checkpoints) == 6
    assert load_model(trained)[4] == [6]


def test_corrupt_newest_checkpoint_falls_back_to_the_previous(trained, capsys):
    newest = Workdir(trained).checkpoints / "6"
    for path in newest.rglob("*"):
        if path.is_file() and path.stat().st_size > 0 and "meta" not in str(path):
            path.write_bytes(b"\0" * 7)
    step = load_model(trained)[4]
    assert step == [3]
    said = capsys.readouterr()
    # On stderr: the text command's translations on stdout hold nothing else.
    assert "checkpoint at step 6" in said.err and not said.out


@pytest.mark.slow  # 10-18 s; kept out of the default run's 10 minutes
def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_checkpoint(config, tmp_path):
    config.train.num_train_steps = 3
    trainer.train_and_evaluate(config, tmp_path)
    config.train.num_train_steps = 9
    config.train.learning_rate_scale = 1e30  # the first update makes every later loss inf/NaN
    with pytest.raises(FloatingPointError, match=r"non-finite loss or gradient at step \d+"):
        trainer.train_and_evaluate(config, tmp_path)
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) in (3, 6)
    params = load_model(tmp_path)[1]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


@pytest.mark.slow  # 12-18 s; kept out of the default run's 10 minutes
def test_skip_policy_counts_nonfinite_steps_and_finishes(config, tmp_path):
    config.train.learning_rate_scale = 1e30
    config.train.on_nonfinite = "skip"
    trainer.train_and_evaluate(config, tmp_path)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert sum(x.get("train/skipped_steps", 0) for x in lines) > 0
    params = load_model(tmp_path)[1]
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))


def test_swapped_vocabulary_is_a_clear_error(trained, tmp_path_factory):
    other = tmp_path_factory.mktemp("other") / "vocab.model"
    texts = [s for pair in synthetic.generate_pairs(300, seed=9) for s in pair]
    train_tokenizer(texts, 150, other)
    shutil.copy(other, trained / "vocab.model")
    with pytest.raises(ValueError, match="not the vocabulary the checkpoints"):
        load_model(trained)


@pytest.mark.slow  # 12-18 s; kept out of the default run's 10 minutes
def test_workdir_with_a_different_model_is_refused_unless_forced(config, trained):
    config.model.d_model = 64
    with pytest.raises(ValueError, match=r"config.model.d_model = 32, now 64.*--force"):
        trainer.train_and_evaluate(config, trained)
    assert checkpoint.latest_step(Workdir(trained).checkpoints) == 6, (
        "the refused run wrote nothing over"
    )
    config.train.num_train_steps = 2
    trainer.train_and_evaluate(config, trained, force=True)
    assert checkpoint.latest_step(Workdir(trained).checkpoints) == 2
    assert not Workdir(trained).previous_run.exists(), "the earlier run is gone once data loaded"


def test_missing_data_directory_is_a_clear_error(config, tmp_path):
    config.data.source = "files"
    config.data.dir = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="--config.data.dir: .*nowhere"):
        trainer.train_and_evaluate(config, tmp_path / "run")


@pytest.mark.slow  # 12-18 s; kept out of the default run's 10 minutes
def test_bad_training_file_writes_nothing_over_an_existing_run(config, tmp_path):
    data = tmp_path / "data"
    synthetic.write_splits(data, 200, 8, 8, seed=0)
    config.data.source, config.data.dir = "files", str(data)
    config.data.dev_prefix, config.data.test_prefix = "dev", "test"
    trainer.train_and_evaluate(config, tmp_path / "run")
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with open(data / "train.de", "a") as f:
        f.write("Eine Zeile zu viel.\n")
    config.train.num_train_steps = 12
    with pytest.raises(ValueError, match="train.en has 200 lines"):
        trainer.train_and_evaluate(config, tmp_path / "run")
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert after == before


def test_evaluate_without_a_checkpoint_is_a_clear_error(config, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(config.to_dict()))
    texts = [s for pair in synthetic.generate_pairs(100, seed=0) for s in pair]
    train_tokenizer(texts, 100, tmp_path / "vocab.model")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_model(tmp_path)


@pytest.mark.slow  # 15 s on 2 cores: trains twice
def test_corrupt_newest_checkpoint_is_set_aside_and_training_saves_that_step_again(config, trained):
    checkpoints = Workdir(trained).checkpoints
    for path in (checkpoints / "6").rglob("*"):
        if path.is_file() and path.stat().st_size > 0 and "meta" not in str(path):
            path.write_bytes(b"\0" * 7)
    config.train.num_train_steps = 6
    for _ in range(2):  # the second run finds a whole step 6 and only evaluates
        trainer.train_and_evaluate(config, trained)
    assert checkpoint.latest_step(checkpoints) == 6
    assert load_model(trained)[4] == [6]
    aside = checkpoints.with_name("checkpoints.corrupt") / "6"
    assert aside.is_dir() and any(aside.rglob("*")), "the corrupt step is kept, not deleted"


def test_swapped_vocabulary_stops_training_before_the_workdir_changes(config, trained):
    other = trained.parent / "other_vocab.model"
    texts = [s for pair in synthetic.generate_pairs(300, seed=9) for s in pair]
    train_tokenizer(texts, 150, other)
    shutil.copy(other, trained / "vocab.model")
    before = {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()}
    config.train.num_train_steps = 9
    with pytest.raises(ValueError, match="vocab.model was trained with vocab_size=150"):
        trainer.train_and_evaluate(config, trained)
    after = {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()}
    assert after == before, "tokens/ and config.json were left as they were"


@pytest.mark.slow  # 12-18 s; kept out of the default run's 10 minutes
def test_force_keeps_a_users_own_files_in_the_data_directory(config, trained):
    data = Workdir(trained).data
    (data / "my_corpus.en").write_text("my own sentence\n")
    trainer.train_and_evaluate(config, trained, force=True)
    assert (data / "my_corpus.en").read_text() == "my own sentence\n"


def test_force_deletes_the_generated_corpus(trained):
    workdir = Workdir(trained)
    assert workdir.holds_generated_corpus()
    assert workdir.data in workdir.generated()
    (workdir.data / "notes.txt").write_text("mine")
    assert not workdir.holds_generated_corpus() and workdir.data not in workdir.generated()


def test_a_second_trainer_on_a_busy_workdir_stops_at_once_naming_the_first(config, tmp_path):
    workdir = Workdir(tmp_path)
    with lock(workdir):
        with pytest.raises(WorkdirBusy, match=rf"in use by .*pid {os.getpid()}"):
            trainer.train_and_evaluate(config, tmp_path)
    assert not workdir.checkpoints.exists(), "the refused trainer wrote nothing"


def test_a_killed_trainers_lock_is_free_at_once(tmp_path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from translate.workdir import Workdir, lock\n"
            "with lock(Workdir(sys.argv[1])):\n    print('locked', flush=True); time.sleep(60)",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(WorkdirBusy, match=f"pid {holder.pid}"):
        with lock(Workdir(tmp_path)):
            pass
    holder.kill()
    holder.wait(timeout=30)
    with lock(Workdir(tmp_path)):  # no stale lock after SIGKILL
        pass


@pytest.mark.slow  # 16 s on 2 cores
def test_an_error_after_a_save_waits_for_that_save_to_finish(config, tmp_path, monkeypatch):
    """A non-finite stop right after a save: the run's checkpoint manager is closed (which
    finishes its background write) before the error propagates."""
    closed = []
    make_manager = checkpoint.make_manager

    def recording_manager(*args, **kwargs):
        manager = make_manager(*args, **kwargs)
        original_close = manager.close
        manager.close = lambda: (original_close(), closed.append(True))
        return manager

    monkeypatch.setattr(checkpoint, "make_manager", recording_manager)
    config.train.num_train_steps = 9
    config.train.checkpoint_every_steps = config.train.log_every_steps = 1
    config.train.learning_rate_scale = 1e30  # step 1 is finite and saved; step 2 stops the run
    with pytest.raises(FloatingPointError):
        trainer.train_and_evaluate(config, tmp_path)
    assert closed, "the manager was closed on the error path"
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) is not None
    assert not list(Workdir(tmp_path).checkpoints.glob("*.orbax-checkpoint-tmp*"))


def write_files_corpus(config, data: pathlib.Path) -> None:
    """Points the config at parallel files written from the synthetic grammar."""
    synthetic.write_splits(data, 200, 8, 8, seed=0)
    config.data.source, config.data.dir = "files", str(data)
    config.data.dev_prefix, config.data.test_prefix = "dev", "test"


def test_missing_dev_files_are_a_clear_error_and_an_empty_prefix_means_none(config, tmp_path):
    write_files_corpus(config, tmp_path / "data")
    config.data.dev_prefix = "valid"
    with pytest.raises(FileNotFoundError, match=r"valid\.en: no such file.*dev_prefix"):
        trainer.train_and_evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run" / "config.json").exists()
    config.data.dev_prefix = ""
    config.train.num_train_steps = 1
    trainer.train_and_evaluate(config, tmp_path / "run")
    assert not any("eval/loss" in line for line in (tmp_path / "run/metrics.jsonl").open())


def test_empty_training_file_is_an_error_naming_it(config, tmp_path):
    write_files_corpus(config, tmp_path / "data")
    for lang in ("en", "de"):
        (tmp_path / "data" / f"train.{lang}").write_text("")
    with pytest.raises(ValueError, match=r"train\.en: the training file holds no sentence"):
        trainer.train_and_evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run" / "config.json").exists()


def test_reversed_language_direction_on_an_existing_run_is_refused(config, trained):
    config.data.src_lang, config.data.tgt_lang = "de", "en"
    before = {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match=r"config.data.src_lang = en, now de"):
        trainer.train_and_evaluate(config, trained)
    assert {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()} == before


def test_skip_policy_stops_after_too_many_skipped_steps_in_a_row(config, tmp_path):
    config.train.num_train_steps = 12
    config.train.learning_rate_scale = 1e30  # the updates turn non-finite
    config.train.on_nonfinite = "skip"
    config.train.max_consecutive_skips = 4
    with pytest.raises(FloatingPointError, match=r"4 steps in a row \(steps \d+ to \d+\)"):
        trainer.train_and_evaluate(config, tmp_path)
    assert not (tmp_path / "report.json").exists()


SIGNALLED_AT: list[float] = []


def signal_then_work(*args, **kwargs):
    """Stands in for an evaluation: SIGTERM arrives at its start, then 60 s of work follow."""
    SIGNALLED_AT.append(time.monotonic())
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(60)
    raise AssertionError("the signal did not stop the evaluation")


def eval_steps(workdir: pathlib.Path) -> list[int]:
    lines = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [x["step"] for x in lines if "eval/loss" in x]


@pytest.mark.slow  # 20 s on 2 cores: trains, stops, trains again
def test_sigterm_during_dev_evaluation_stops_at_once_and_the_restart_redoes_it(
    config, tmp_path, monkeypatch
):
    config.train.eval_every_steps = 3
    config.train.checkpoint_every_steps = 4  # step 3 has no checkpoint of its own
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "dev_bleu", signal_then_work)
        with pytest.raises(monitor.Interrupted, match="stopped by SIGTERM at step 3"):
            trainer.train_and_evaluate(config, tmp_path)
        assert time.monotonic() - SIGNALLED_AT[-1] < 10
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == 3
    assert eval_steps(tmp_path) == []
    trainer.train_and_evaluate(config, tmp_path)
    assert eval_steps(tmp_path) == [3, 6]
    assert (tmp_path / "report.json").is_file()


@pytest.mark.slow  # 12-18 s; kept out of the default run's 10 minutes
def test_sigterm_during_test_decoding_stops_at_once_and_the_restart_decodes_again(
    config, tmp_path, monkeypatch
):
    with monkeypatch.context() as patched:
        patched.setattr(trainer, "dev_bleu", lambda *args: {})
        patched.setattr(trainer, "translate_and_score", signal_then_work)
        with pytest.raises(monitor.Interrupted, match="stopped by SIGTERM at step 6"):
            trainer.train_and_evaluate(config, tmp_path)
        assert time.monotonic() - SIGNALLED_AT[-1] < 10
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == 6
    assert not (tmp_path / "report.json").exists()
    trainer.train_and_evaluate(config, tmp_path)
    assert (tmp_path / "report.json").is_file()
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == 6


def test_force_with_bad_data_puts_the_earlier_run_back(config, trained, tmp_path_factory):
    data = tmp_path_factory.mktemp("bad_data")
    write_files_corpus(config, data)
    with open(data / "train.de", "a") as f:
        f.write("Eine Zeile zu viel.\n")
    before = {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()}
    with pytest.raises(ValueError, match="train.en has 200 lines"):
        trainer.train_and_evaluate(config, trained, force=True)
    assert {p: p.read_bytes() for p in trained.rglob("*") if p.is_file()} == before
    assert not Workdir(trained).previous_run.exists()


def files_of(path: pathlib.Path) -> dict[pathlib.Path, bytes]:
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_a_force_run_killed_while_its_data_loads_leaves_the_earlier_run_to_the_next(
    config, trained
):
    """SIGKILL after --force set the earlier run aside: the next start puts it back."""
    workdir = Workdir(trained)
    before = files_of(trained)
    opening.check_config(config, workdir, force=True)  # what --force does first
    assert workdir.previous_run.is_dir() and not workdir.checkpoints.exists()
    # The killed run had trained its vocabulary (the same data and seed give the same one).
    shutil.copy(workdir.previous_run / workdir.vocab.name, workdir.vocab)
    trainer.open_run(config, workdir, force=False)
    assert not workdir.previous_run.exists()
    # tokens/ is a cache that this copy of the run rebuilds (it names the data by its path).
    kept = [p for p in before if p.parts[0] not in ("train.lock", "tokens")]
    after = files_of(trained)
    assert {p: after.get(p) for p in kept} == {p: before[p] for p in kept}


def signal_self(signum):
    def stand_in(*args, **kwargs):
        os.kill(os.getpid(), signum)
        time.sleep(60)
        raise AssertionError("the signal did not stop the data loading")

    return stand_in


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_data_loads_stops_cleanly_and_force_puts_the_earlier_run_back(
    signum, config, trained, monkeypatch
):
    before = files_of(trained)
    monkeypatch.setattr(trainer, "load_data", signal_self(signum))
    started = time.monotonic()
    with pytest.raises(monitor.Interrupted, match=f"stopped by {signum.name} while loading"):
        trainer.train_and_evaluate(config, trained, force=True)
    assert time.monotonic() - started < 30
    after = files_of(trained)
    assert {p: b for p, b in after.items() if p.name != "train.lock"} == {
        p: b for p, b in before.items() if p.name != "train.lock"
    }
    assert not Workdir(trained).previous_run.exists()


def test_force_sets_aside_the_earlier_runs_reports_plots_and_evaluations(config, trained):
    workdir = Workdir(trained)
    (workdir.evaluations / "test.en.step6").mkdir(parents=True)
    (workdir.evaluations / "test.en.step6" / "report.json").write_text("{}")
    workdir.profile.mkdir()
    workdir.metric_plot("loss").write_bytes(b"png")
    opening.check_config(config, workdir, force=True)
    left = sorted(p.name for p in trained.iterdir())
    assert left == ["previous_run", "train.lock"] or left == ["previous_run"], left
    aside = sorted(p.name for p in workdir.previous_run.iterdir())
    for name in ("report.json", "report.txt", "hypotheses.txt", "metrics_loss.png", "profile"):
        assert name in aside
    assert "evaluations" in aside and "config.json" in aside


def test_a_resume_with_another_model_shape_and_no_config_json_is_refused_naming_shapes(
    config, trained
):
    workdir = Workdir(trained)
    workdir.config.unlink()
    before = files_of(trained)
    config.model.d_model, config.model.d_ff = 64, 128
    with pytest.raises(ValueError, match=r"holds checkpoints of a model of another shape"):
        trainer.train_and_evaluate(config, trained)
    assert not workdir.config.exists(), "config.json was not written for a run that cannot resume"
    assert files_of(trained).keys() - {pathlib.Path("train.lock")} == before.keys() - {
        pathlib.Path("train.lock")
    }


def test_the_refusal_of_another_model_names_only_the_fields_that_differ(config, trained):
    config.model.d_model = 64
    with pytest.raises(ValueError) as error:
        trainer.open_run(config, Workdir(trained), force=False)
    message = str(error.value)
    assert "config.model.d_model = 32, now 64" in message
    assert "num_layers" not in message and "{" not in message


def test_a_config_json_that_is_not_json_is_an_error_naming_it(trained):
    Workdir(trained).config.write_text('{"model": {"d_model": 32,')
    with pytest.raises(ValueError, match=r"config.json: not valid JSON \(line 1"):
        load_model(trained)


@pytest.mark.parametrize("where", ["workdir", "parent"])
def test_a_workdir_that_is_a_file_or_under_a_file_is_an_error_naming_it(config, tmp_path, where):
    blocker = tmp_path / "afile"
    blocker.write_text("mine")
    path = blocker if where == "workdir" else blocker / "run"
    with pytest.raises(ValueError, match=rf"--workdir={path}: {blocker} is a file"):
        trainer.train_and_evaluate(config, path)
    assert blocker.read_text() == "mine"


@pytest.mark.parametrize("name", ["tensorboard", "checkpoints", "tokens", "metrics.jsonl"])
def test_a_workdir_entry_of_the_wrong_kind_is_an_error_naming_it(config, trained, name):
    path = trained / name
    if path.is_dir():
        shutil.rmtree(path)
        path.write_text("a file where the run keeps a directory")
    else:
        path.unlink()
        path.mkdir()
    with pytest.raises(ValueError, match=re.escape(str(path))):
        trainer.train_and_evaluate(config, trained)


def test_a_metrics_line_cut_short_is_dropped_and_the_run_resumes_again_and_again(config, trained):
    metrics = Workdir(trained).metrics
    text = metrics.read_text()
    metrics.write_text(text[: len(text) - 20])  # killed while writing the last line
    writer = monitor.MetricWriter(Workdir(trained))
    writer.write(7, {"train/loss": 1.0})
    writer.close()
    lines = metrics.read_text().splitlines()
    assert [json.loads(line) for line in lines]  # every line is whole JSON
    assert json.loads(lines[-1]) == {"step": 7, "train/loss": 1.0}
    assert monitor.DevBleuHistory.of_run(metrics, 7) is not None


def test_a_metrics_file_damaged_by_an_earlier_version_still_resumes(trained):
    metrics = Workdir(trained).metrics
    lines = metrics.read_text().splitlines()
    lines.insert(1, lines[1][:15] + lines[2])  # a cut line that an older writer appended to
    metrics.write_text("\n".join(lines) + "\n")
    assert "train/loss" in monitor.read_metrics(metrics)


def test_a_dev_set_with_no_pair_within_max_len_is_refused_before_training(config, tmp_path):
    write_files_corpus(config, tmp_path / "data")
    long = " ".join(["word"] * 80) + "\n"
    for lang in ("en", "de"):
        (tmp_path / "data" / f"dev.{lang}").write_text(long * 3)
    with pytest.raises(ValueError, match=r"dev\.en.*no dev pair.*--config.data.max_len=32"):
        trainer.train_and_evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.parametrize("split", ["dev", "test"])
def test_an_empty_dev_or_test_file_is_an_error_naming_it(config, tmp_path, split):
    write_files_corpus(config, tmp_path / "data")
    for lang in ("en", "de"):
        (tmp_path / "data" / f"{split}.{lang}").write_text("")
    with pytest.raises(ValueError, match=rf"{split}\.en.*holds no sentence.*{split}_prefix"):
        trainer.train_and_evaluate(config, tmp_path / "run")


@contextlib.contextmanager
def file_size_limit(size: int):
    """Writes past `size` bytes fail with EFBIG ("File too large"), as a full disk fails them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def test_a_full_disk_while_writing_the_vocabulary_names_it_and_changes_nothing(config, tmp_path):
    workdir = Workdir(tmp_path / "run")
    data.data_paths(config, trainer.data_files(workdir))  # the generated corpus, 23 kB a file
    before = files_of(workdir.path)
    with file_size_limit(100_000), pytest.raises(OSError) as error:  # the vocabulary: 240 kB
        trainer.train_and_evaluate(config, workdir.path)
    message = cli.user_error_message(error.value)
    assert message.startswith(f"could not write the vocabulary {workdir.vocab}: File too large")
    assert {p: b for p, b in files_of(workdir.path).items() if p.name != "train.lock"} == before
    assert not any(p.name.startswith(".vocab") for p in workdir.path.iterdir())


@pytest.mark.slow  # a 6-step run, 10-15 s
def test_a_full_disk_while_writing_a_checkpoint_names_it_and_keeps_the_earlier_ones(
    config, tmp_path, monkeypatch
):
    save = checkpoint.save

    def disk_full_at_step_6(manager, step, *args):
        if step == 6:
            with file_size_limit(20_000):  # the parameters take 200 kB
                save(manager, step, *args)
                manager.wait_until_finished()
        else:
            save(manager, step, *args)

    monkeypatch.setattr(checkpoint, "save", disk_full_at_step_6)
    with pytest.raises(OSError) as error:
        trainer.train_and_evaluate(config, tmp_path)
    message = cli.user_error_message(error.value)
    assert message.startswith(
        f"could not write the checkpoint of step 6 in {Workdir(tmp_path).checkpoints}: "
        "File too large; the checkpoints of steps [3] there are whole"
    )
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == 3
    # Once there is room, the same command resumes: in a process of its own, as a user runs
    # it (this one may still hold Orbax's threads of the failed save).
    done = subprocess.run(train_command(tmp_path), cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resumed from step 3" in done.stderr
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == 6


def test_a_stop_signal_while_drawing_the_curves_is_not_swallowed(tmp_path, monkeypatch):
    from translate.training import plots

    monkeypatch.setattr(plots, "draw_training_curves", signal_self(signal.SIGTERM))
    stop = monitor.StopSignal()
    with stop, pytest.raises(monitor.StopRequested):
        with stop.abandonable():
            trainer.draw_training_curves(Workdir(tmp_path))


# Run as a program: SIGINT while the final test decoding compiles a batch shape. XLA compiles in
# threads of its own and JAX gives up waiting for them on a signal; a process that then tears
# its interpreter down under the running compile died of a segmentation fault.
INTERRUPTED_COMPILE = """
import os, signal, sys, threading
import jax, jax.numpy as jnp
from translate import cli, train
from translate.training import trainer

def compile_slowly(*args, **kwargs):
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    def slow(x):
        for i in range(400):
            x = jnp.sin(x) @ x + i
        return x
    jax.jit(slow)(jnp.ones((8, 8))).block_until_ready()
    raise AssertionError("the signal did not stop the decoding")

trainer.translate_and_score = compile_slowly
trainer.dev_bleu = lambda *args: {}
cli.run(train.main, ["--config=configs/tiny.py", "--workdir=" + sys.argv[1]])
"""


@pytest.mark.slow  # a 6-step run in a new process, 20-30 s
def test_sigint_while_the_test_decoding_compiles_stops_cleanly(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_COMPILE, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 128 + signal.SIGINT, done.stderr[-3000:]
    assert "stopped by SIGINT at step 6" in done.stderr
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == 6


def test_a_run_removes_what_a_process_killed_while_writing_left_in_its_workdir(
    config, trained, monkeypatch
):
    left = [trained / ".vocab.model.0123abcd.tmp", trained / ".config.json.89abcdef.tmp"]
    for path in left:
        path.write_text("half written")
    (trained / ".tokens.01234567.new").mkdir()
    monkeypatch.setattr(atomic, "STALE_SECONDS", 0.0)
    trainer.open_run(config, Workdir(trained), force=False)
    assert not [p.name for p in trained.iterdir() if p.name.startswith(".")]


def test_an_evaluations_output_or_an_average_is_refused_as_a_training_workdir(config, trained):
    """Found in a new user's pass: training there overwrote the evaluation's report, or
    crashed on a checkpoint without Adam's state."""
    evaluation = trained / "evaluations" / "test.en.step6"
    evaluation.mkdir(parents=True)
    for name in ("report.json", "report.txt", "hypotheses.txt"):
        (evaluation / name).write_text("an evaluation\n")
    with pytest.raises(ValueError, match=r"holds report.json, report.txt, hypotheses.txt but no"):
        trainer.train_and_evaluate(config, evaluation)
    assert (evaluation / "report.json").read_text() == "an evaluation\n"
    average = trained / "average_1"
    script = importlib.import_module("scripts.average_checkpoints")
    script.average_workdir(trained, average, num=1)
    with pytest.raises(ValueError, match=rf"parameters alone .*init_from={average}"):
        trainer.train_and_evaluate(config, average)


def test_a_workdir_that_cannot_be_made_is_a_one_line_error(config, tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    with read_only(parent), pytest.raises(ValueError, match=r"--workdir=.*cannot write") as error:
        trainer.train_and_evaluate(config, parent / "run")
    assert cli.user_error_message(error.value) is not None


def test_a_reader_of_an_interrupted_force_run_is_told_to_train_again(tmp_path):
    """After kill -9 of a --force run while its data loaded, config.json is set aside in
    previous_run/; a reader is told to train again, not that the workdir "holds no
    config.json"."""
    run = Workdir(tmp_path / "run")
    run.previous_run.mkdir(parents=True)
    (run.previous_run / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="interrupted --force run.*run translate-train"):
        read_config(run)


@pytest.mark.slow  # a 6-step run with a dev evaluation, 10-20 s
def test_a_full_disk_while_keeping_the_first_best_checkpoint_is_one_line(
    config, tmp_path, monkeypatch, caplog
):
    """One line of error, not hundreds of lines with a traceback."""
    config.train.keep_best_by = "dev_bleu"
    config.train.eval_every_steps = 3
    save_params = checkpoint.save_params

    def disk_full(manager, step, *args, **kwargs):
        with file_size_limit(20_000):  # the parameters take 200 kB
            save_params(manager, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_params", disk_full)
    cli.quiet_libraries()  # as every command does
    with caplog.at_level(logging.ERROR), pytest.raises(OSError) as error:
        trainer.train_and_evaluate(config, tmp_path)
    message = cli.user_error_message(error.value)
    assert not [r for r in caplog.records if r.name in ("asyncio", "absl")], caplog.text[:2000]
    best = Workdir(Workdir(tmp_path).best)
    assert message.startswith(f"could not write the checkpoint of step 3 in {best.checkpoints}")
    assert "\n" not in message


@pytest.mark.parametrize("given", ["--output=-", None])
def test_two_outputs_on_standard_output_name_it_as_standard_output(given, tmp_path):
    """`--output=-` (or no --output) with `--alignment=-`: both named as standard output, never
    `--output` "left out" when it was given as -."""
    from translate import streams

    flags = {"output": "-" if given else "", "input": ""}
    streams.dash_is_standard(flags)
    with pytest.raises(ValueError) as error:
        streams.check_output_files({"--output": flags["output"], "--alignment": "-"}, {}, [])
    message = str(error.value)
    assert "left out" not in message
    assert message.startswith("--output (standard output) and --alignment=- would both write")


# A command that streams to standard output: through `Outputs` as translate-text and
# translate-score write, or a line printed at a time as translate-sample does.
STREAMING_COMMAND = """
import sys
from translate import cli
from translate.streams import Outputs

def write_through_outputs(argv):
    with Outputs({"--output": ""}) as out:
        for n in range(20_000):
            out.write("--output", f"line {n}\\n")
        out.commit()

def print_lines(argv):
    for n in range(20_000):
        print(f"line {n}", flush=True)

main = {"outputs": write_through_outputs, "print": print_lines}[sys.argv[1]]
cli.run(main, teardown=sys.argv[2] == "teardown")
"""


@pytest.mark.parametrize(
    "writer, teardown", [("outputs", "no-teardown"), ("outputs", "teardown"), ("print", "teardown")]
)
def test_a_gone_reader_of_standard_output_ends_the_command_quietly_as_sigpipe(writer, teardown):
    """`translate-text ... | head -1`: the reader takes its line and goes; the command ends
    with the status of a process ended by SIGPIPE, nothing on stderr."""
    command = subprocess.Popen(
        [sys.executable, "-c", STREAMING_COMMAND, writer, teardown],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    first = command.stdout.readline()
    command.stdout.close()  # more lines than a pipe holds are still to be written
    errors = command.stderr.read()
    assert command.wait(timeout=120) == 128 + signal.SIGPIPE, errors
    assert errors == ""
    assert first == "line 0\n"
