"""The training workflow (init_from, keep-best, early stopping, profiling) and what runs report."""

import contextlib
import copy
import json
import logging
import shutil
import time

import jax
import numpy as np
import pytest
from helpers import tiny_config

from translate import checkpoint
from translate.config import Config
from translate.data import synthetic
from translate.trained import load_model
from translate.training import monitor, opening, trainer
from translate.workdir import Workdir


def host_copy(tree):
    return jax.tree.map(lambda x: np.array(x), tree)


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def spy_on_train_step(monkeypatch, first_call_seconds=0.0):
    """Records host copies of the first train step's (params, opt_state, step); the first call
    may sleep, as a slow compilation would."""
    calls = []
    make_steps = trainer.make_steps

    def make_spied_steps(*args, **kwargs):
        steps = make_steps(*args, **kwargs)

        def spied(params, opt_state, batch, step, key):  # the trainer's: Packed state
            if not calls:
                calls.append((host_copy(params.tree()), host_copy(opt_state.tree()), step))
                time.sleep(first_call_seconds)
            return steps.packed_train(params, opt_state, batch, step, key)

        return steps._replace(packed_train=spied)

    monkeypatch.setattr(trainer, "make_steps", make_spied_steps)
    return calls


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory):
    """The tiny config's synthetic corpus as parallel files, so a config may leave splits out."""
    path = tmp_path_factory.mktemp("text")
    synthetic.write_splits(path, 400, 16, 16, seed=0)
    return path


def files_config(text_dir, dev=False, test=False) -> Config:
    """The tiny config on `text_dir`; without dev and test splits no decoding is done (fast)."""
    config = tiny_config()
    config.data.source, config.data.dir = "files", str(text_dir)
    config.data.dev_prefix = "dev" if dev else ""
    config.data.test_prefix = "test" if test else ""
    return config


@contextlib.contextmanager
def capture_log():
    """The `translate` logger's messages at INFO and above, while the context is open."""
    logger, messages = logging.getLogger("translate"), []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def slow_compile_run(tmp_path_factory, text_dir):
    """A tiny run of 6 steps whose first train-step call takes 5 s more, as a slow compilation
    would, profiled at steps 2 to 3 (dev BLEU faked: no decoding), and its log."""
    monkeypatch = pytest.MonkeyPatch()
    spy_on_train_step(monkeypatch, first_call_seconds=5.0)
    monkeypatch.setattr(trainer, "dev_bleu", lambda *args, **kwargs: {"eval/bleu": 1.0})
    path = tmp_path_factory.mktemp("slow_compile")
    config = files_config(text_dir, dev=True)
    config.train.profile_steps = "2:3"
    with capture_log() as messages:
        try:
            trainer.train_and_evaluate(config, path)
        finally:
            monkeypatch.undo()
    return path, messages


@pytest.fixture(scope="module")
def source_run(slow_compile_run):
    """A tiny run of 6 steps to start other runs from."""
    return slow_compile_run[0]


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory, text_dir, source_run):
    """A 2-step run started from a copy of `source_run` at step 3, and its first step's inputs."""
    path = tmp_path_factory.mktemp("tuned")
    copy = path / "source"
    shutil.copytree(source_run, copy)
    config = files_config(text_dir)
    config.train.init_from = f"{copy}@3"
    config.train.num_train_steps = 2
    monkeypatch = pytest.MonkeyPatch()
    calls = spy_on_train_step(monkeypatch)
    try:
        trainer.train_and_evaluate(config, path / "run")
    finally:
        monkeypatch.undo()
    return config, path / "run", copy, calls[0]


def test_eta_beyond_a_day_shows_days():
    assert monitor.format_duration(30 * 3600) == "1d 06:00:00"
    assert monitor.format_duration(3 * 86400 + 59) == "3d 00:00:59"
    assert monitor.format_duration(23 * 3600 + 59 * 60 + 59) == "23:59:59"
    assert monitor.format_duration(0.4) == "00:00:00"


def test_dev_bleu_history_counts_evaluations_since_the_best():
    history = monitor.DevBleuHistory([(2, 1.0), (4, 3.0), (6, 3.0)])
    assert (history.best, history.best_step, history.since_best) == (3.0, 4, 1)
    assert not history.exhausted(2) and history.exhausted(1) and not history.exhausted(0)
    assert history.add(8, 3.5) and history.since_best == 0


def test_read_metrics_leaves_out_a_last_line_cut_short(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 2, "eval/bleu": 1.0}\n{"step": 4, "eval/bleu": 2.0}\n{"step": 6, "ev')
    assert monitor.read_metrics(path) == {"eval/bleu": ([2, 4], [1.0, 2.0])}


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("init_from", "@3", "--config.train.init_from=@3: must be WORKDIR or WORKDIR@STEP"),
        ("keep_best_by", "dev_loss", "--config.train.keep_best_by=dev_loss: must be 'dev_bleu'"),
        ("early_stopping_patience", -1, "--config.train.early_stopping_patience=-1: must be >= 0"),
        ("profile_steps", "5:3", "--config.train.profile_steps=5:3: must be A:B with 1 <= A <= B"),
        ("profile_steps", "0:3", "--config.train.profile_steps=0:3: must be A:B"),
    ],
)
def test_workflow_fields_are_range_checked_naming_the_flag(field, value, message):
    config = Config()
    setattr(config.train, field, value)
    with pytest.raises(ValueError, match=message):
        config.validate()


def test_init_from_starts_from_the_other_runs_parameters_at_step_zero(tuned_run, source_run):
    config, workdir, _, (params, opt_state, step) = tuned_run
    assert step == 0
    assert_trees_equal(params, load_model(source_run, step=3)[1])
    # A fresh optimizer: the state optax's Adam starts from (count 0, zero moments).
    steps = trainer.make_steps(config, 200, jax.sharding.Mesh(jax.devices()[:1], ("data",)))
    _, fresh = steps.init(jax.random.key(0))
    assert_trees_equal(opt_state, host_copy(fresh))
    assert (workdir / "vocab.model").read_bytes() == (source_run / "vocab.model").read_bytes()


@pytest.mark.slow  # 10-18 s; kept out of the default run's 10 minutes
def test_resumed_run_continues_from_its_own_checkpoint_not_init_from(
    tuned_run, monkeypatch, caplog
):
    config, workdir, copy, _ = tuned_run
    shutil.rmtree(copy)  # resuming must not need the run it started from
    calls = spy_on_train_step(monkeypatch)
    config.train.num_train_steps = 4
    with caplog.at_level(logging.INFO, logger="translate"):
        trainer.train_and_evaluate(config, workdir)
    assert calls[0][2] == 2 and "resumed from step 2" in caplog.text
    assert checkpoint.latest_step(Workdir(workdir).checkpoints) == 4


def test_init_from_refuses_a_different_vocabulary_before_writing(
    text_dir, source_run, tmp_path, tokenizer
):
    workdir = tmp_path / "tuned"
    workdir.mkdir()
    shutil.copyfile(tokenizer.path, workdir / "vocab.model")
    config = files_config(text_dir)
    config.train.init_from = str(source_run)
    with pytest.raises(ValueError, match="different vocabularies") as error:
        trainer.train_and_evaluate(config, workdir)
    assert str(source_run) in str(error.value) and str(workdir) in str(error.value)
    assert sorted(p.name for p in workdir.iterdir()) == ["train.lock", "vocab.model"]


def test_init_from_refuses_a_model_of_other_shapes(text_dir, source_run, tmp_path):
    config = files_config(text_dir)
    config.model.d_ff = 128
    config.train.init_from = str(source_run)
    with pytest.raises(ValueError, match="d_ff 64 there, 128 here"):
        trainer.train_and_evaluate(config, tmp_path / "tuned")
    assert not (tmp_path / "tuned" / "config.json").exists()


@pytest.fixture(scope="module")
def scripted_run(tmp_path_factory, text_dir):
    """A run with keep-best and early stopping (patience 3) whose dev BLEU at steps 2, 4, 6, ...
    is 1, 3, 2, 2.5, 1, 1, ...; with the parameters evaluated at each step, and its log."""
    scores = iter([1.0, 3.0, 2.0, 2.5] + [1.0] * 100)
    evaluated = {}
    dev_loss = trainer.dev_loss

    def recording_dev_loss(eval_step, params, corpus, layout, mesh, row_slice):
        evaluated[len(evaluated) * 2 + 2] = host_copy(params)
        return dev_loss(eval_step, params, corpus, layout, mesh, row_slice)

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(trainer, "dev_bleu", lambda *args, **kwargs: {"eval/bleu": next(scores)})
    monkeypatch.setattr(trainer, "dev_loss", recording_dev_loss)
    config = files_config(text_dir, dev=True, test=True)
    config.train.num_train_steps = 20
    config.train.eval_every_steps = 2
    config.train.checkpoint_every_steps = 3  # so step 10 is saved because the run stops there
    config.train.keep_checkpoints = 2
    config.train.keep_best_by = "dev_bleu"
    config.train.early_stopping_patience = 3
    path = tmp_path_factory.mktemp("scripted")
    with capture_log() as messages:
        try:
            report = trainer.train_and_evaluate(config, path)
        finally:
            monkeypatch.undo()
    return config, path, report, evaluated, messages


def test_keep_best_keeps_the_best_step_beside_the_newest_n(scripted_run):
    _, path, _, evaluated, _ = scripted_run
    workdir = Workdir(path)
    manager = checkpoint.make_manager(workdir.checkpoints, read_only=True)
    assert sorted(manager.all_steps()) == [9, 10]
    _, params, _, _, steps = load_model(workdir.best)  # best/ reads as a workdir of its own
    assert steps == [4]
    assert_trees_equal(params, evaluated[4])


def test_early_stopping_stops_after_patience_evaluations_without_improvement(
    scripted_run, tmp_path, caplog
):
    config, path, report, _, messages = scripted_run
    # Best 3.0 at step 4; steps 6, 8 and 10 bring no better BLEU: stop at 10, save, test.
    assert any(m.startswith("early stopping at step 10") for m in messages)
    assert report["step"] == 10
    assert checkpoint.latest_step(Workdir(path).checkpoints) == 10
    lines = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    assert max(line["step"] for line in lines) == 10
    # The same command again trains no further.
    shutil.copytree(path, tmp_path / "again")
    with caplog.at_level(logging.INFO, logger="translate"):
        trainer.train_and_evaluate(config, tmp_path / "again")
    assert "stopped early at step 10 already" in caplog.text
    assert checkpoint.latest_step(Workdir(tmp_path / "again").checkpoints) == 10


def test_first_window_speed_excludes_compile_time(slow_compile_run):
    path, messages = slow_compile_run
    compiled = [m for m in messages if m.startswith("compiled the train step in")]
    # "compiled the train step in 5.1 s", and "(N program(s) read from the persistent
    # compilation cache)" after it when the cache held the step.
    assert len(compiled) == 1 and float(compiled[0].split()[5]) >= 5.0
    first = json.loads((path / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 2
    # Two tiny steps take well under the 5 s the first call spent before it returned.
    assert 2 / first["train/steps_per_sec"] < 5.0


def test_the_same_training_again_says_it_read_its_train_step_from_the_cache(tmp_path, text_dir):
    # Two identical runs in one process: the second traces the step again and finds the
    # program the first compiled in the persistent cache (tests/conftest.py gives the tests
    # one), and its log says so; the first run may or may not have found it there already.
    config = files_config(text_dir)
    config.train.num_train_steps = 2
    said = []
    for name in ("first", "second"):
        with capture_log() as messages:
            trainer.train_and_evaluate(config, tmp_path / name)
        said.append([m for m in messages if m.startswith("compiled the train step in")])
    assert [len(s) for s in said] == [1, 1]
    assert said[1][0].endswith("program(s) read from the persistent compilation cache)")


def test_profile_steps_writes_a_trace_into_the_workdir(slow_compile_run):
    path, messages = slow_compile_run
    profile = Workdir(path).profile
    assert list(profile.rglob("*.xplane.pb")) and list(profile.rglob("perfetto_trace.json.gz"))
    assert any(m.startswith(f"profiled steps 2 to 3 into {profile}") for m in messages)


def test_training_ends_by_drawing_its_curves_into_the_workdir(slow_compile_run):
    path, messages = slow_compile_run
    names = ["metrics_bleu.png", "metrics_learning_rate.png", "metrics_loss.png"]
    names.append("metrics_tokens_per_sec.png")
    assert sorted(p.name for p in Workdir(path).metric_plots()) == names
    assert any(m.startswith("training curves: ") for m in messages)


def test_a_plotting_failure_is_a_warning_not_a_failed_run(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="translate"):
        trainer.draw_training_curves(Workdir(tmp_path))  # no metrics.jsonl to draw from
    assert "WARNING: could not draw the training curves" in caplog.text


def test_grad_norm_averages_over_the_steps_that_were_applied():
    def step(grad_norm, nonfinite):
        return {
            "loss_sum": 2.0,
            "nll_sum": 2.0,
            "tokens": 4.0,
            "correct": 1.0,
            "grad_norm": grad_norm,
            "nonfinite": nonfinite,
        }

    window = [step(2.0, False), step(float("inf"), True), step(4.0, False)]
    logged = monitor.summarize(window, seconds=1.0, steps=3)
    assert logged["train/grad_norm"] == 3.0 and logged["train/skipped_steps"] == 1.0


def resume_warnings(config, saved, step, tmp_path, monkeypatch, caplog) -> str:
    """What `warn_of_schedule_change` logs for `config` on a workdir `saved` trained to `step`."""
    workdir = Workdir(tmp_path)
    workdir.config.write_text(json.dumps(saved.to_dict()))
    monkeypatch.setattr(checkpoint, "latest_step", lambda directory: step)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="translate"):
        opening.warn_of_schedule_change(config, workdir)
    return caplog.text


def test_more_steps_for_a_decaying_rate_warn_that_the_rate_jumps(tmp_path, monkeypatch, caplog):
    saved = tiny_config()
    saved.train.lr_decay, saved.train.warmup_steps = "linear", 2
    config = copy.deepcopy(saved)
    config.train.num_train_steps = 12
    text = resume_warnings(config, saved, 6, tmp_path, monkeypatch, caplog)  # a finished run
    assert "WARNING: the learning rate of step 7 is" in text
    assert "config.train.num_train_steps 6 -> 12" in text
    saved.train.lr_decay = config.train.lr_decay = "rsqrt"  # the paper's: no end to move
    config.train.num_train_steps = 24
    assert "WARNING" not in resume_warnings(config, saved, 6, tmp_path, monkeypatch, caplog)


def test_a_checkpoint_past_the_configs_last_step_warns_that_nothing_is_trained(
    tmp_path, monkeypatch, caplog
):
    saved, config = tiny_config(), tiny_config()
    config.train.num_train_steps = 6
    text = resume_warnings(config, saved, 8, tmp_path, monkeypatch, caplog)  # trained further
    assert "WARNING: the newest checkpoint in" in text
    assert "is step 8, past config.train.num_train_steps 6: nothing is trained" in text
    config.train.num_train_steps = 8  # a finished run run again: nothing to say
    assert "WARNING" not in resume_warnings(config, saved, 8, tmp_path, monkeypatch, caplog)


@pytest.mark.slow  # trains twice: 26 s on 2 cores
def test_keep_best_turned_on_by_a_resume_keeps_the_best_from_then_on(text_dir, tmp_path):
    """keep_best_by added on resume, after a better dev BLEU was logged, keeps the best from
    then on instead of leaving best/ empty (the history's best is not kept)."""
    scores = iter([3.0, 1.0, 2.0, 2.5, 1.0])
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(trainer, "dev_bleu", lambda *args, **kwargs: {"eval/bleu": next(scores)})
    config = files_config(text_dir, dev=True)
    config.train.num_train_steps = 4
    config.train.eval_every_steps = 2
    config.train.checkpoint_every_steps = 2
    try:
        trainer.train_and_evaluate(config, tmp_path / "run")  # dev BLEU 3 at step 2, 1 at 4
        config.train.num_train_steps = 10
        config.train.keep_best_by = "dev_bleu"
        trainer.train_and_evaluate(config, tmp_path / "run")  # 2 at 6, 2.5 at 8, 1 at 10
    finally:
        monkeypatch.undo()
    _, _, _, _, steps = load_model(Workdir(tmp_path / "run").best)
    assert steps == [8]
