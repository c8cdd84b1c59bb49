"""Checkpoint averaging (paper Sec. 6.1): translate/checkpoint.py, scripts/average_checkpoints.py
and `translate.evaluate --average`."""

import importlib
import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from helpers import read_only

from translate import atomic, checkpoint, evaluate
from translate.data import synthetic
from translate.data.tokenizer import train_tokenizer
from translate.models.factory import abstract_model
from translate.trained import load_model
from translate.workdir import Workdir

STEPS = (1, 2, 3, 4)


@pytest.fixture
def run(config, tmp_path):
    """A workdir whose checkpoint at step s holds parameters `base + s`; returns (dir, base)."""
    workdir = tmp_path / "run"
    pairs = synthetic.generate_pairs(200, seed=0)
    tokenizer = train_tokenizer(
        [s for pair in pairs for s in pair], config.data.vocab_size, Workdir(workdir).vocab
    )
    Workdir(workdir).config.write_text(json.dumps(config.to_dict()))
    _, shapes = abstract_model(config, tokenizer.vocab_size)
    rng = np.random.default_rng(0)
    base = jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype), shapes)
    manager = checkpoint.make_manager(
        Workdir(workdir).checkpoints, keep=config.train.keep_checkpoints
    )
    for step in STEPS:
        params = jax.tree.map(lambda x, s=step: jax.numpy.asarray(x + s), base)
        checkpoint.save(manager, step, params, {"count": jax.numpy.asarray(step)}, {"step": step})
    manager.wait_until_finished()
    return workdir, base


def assert_params_equal_base_plus(params, base, offset):
    for got, b in zip(jax.tree.leaves(params), jax.tree.leaves(base)):
        np.testing.assert_allclose(np.asarray(got), b + offset, rtol=1e-6, atol=1e-6)


def test_steps_to_average_are_the_newest_oldest_first(run):
    manager = checkpoint.make_manager(Workdir(run[0]).checkpoints, read_only=True)
    assert checkpoint.steps_to_average(manager, 3) == [2, 3, 4]


def test_averaging_more_checkpoints_than_the_run_keeps_is_an_error(run):
    manager = checkpoint.make_manager(Workdir(run[0]).checkpoints, read_only=True)
    with pytest.raises(ValueError, match=r"needs train.keep_checkpoints >= 3.*keeps 2"):
        checkpoint.steps_to_average(manager, 3, keep_checkpoints=2)
    with pytest.raises(ValueError, match="holds only 4"):
        checkpoint.steps_to_average(manager, 5, keep_checkpoints=5)


def test_average_params_is_the_mean_of_the_given_steps(run):
    workdir, base = run
    manager = checkpoint.make_manager(Workdir(workdir).checkpoints, read_only=True)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = checkpoint.abstract_like(jax.tree.map(jax.numpy.asarray, base), device)
    averaged = checkpoint.average_params(manager, [1, 2, 4], abstract)
    assert_params_equal_base_plus(averaged, base, 7 / 3)


def test_evaluate_average_option_loads_the_mean_of_the_last_checkpoints(run):
    workdir, base = run
    _, params, _, _, steps = load_model(workdir, average=3)
    assert steps == [2, 3, 4]
    assert_params_equal_base_plus(params, base, 3.0)


def test_averaged_workdir_loads_in_evaluate_with_the_averaged_steps(run, tmp_path):
    workdir, base = run
    script = importlib.import_module("scripts.average_checkpoints")
    assert script.average_workdir(workdir, tmp_path / "avg", num=2) == [3, 4]
    _, params, _, _, steps = load_model(tmp_path / "avg")
    assert steps == [3, 4]
    assert_params_equal_base_plus(params, base, 3.5)
    assert checkpoint.latest_step(Workdir(tmp_path / "avg").checkpoints) == 4
    with pytest.raises(ValueError, match="not be the training workdir"):
        script.average_workdir(workdir, workdir, num=2)


def test_evaluate_report_names_the_averaged_steps(run, tmp_path):
    workdir, _ = run
    pairs = synthetic.generate_pairs(4, seed=1)
    (tmp_path / "test.en").write_text("".join(en + "\n" for en, _ in pairs))
    (tmp_path / "test.de").write_text("".join(de + "\n" for _, de in pairs))
    evaluate.main(
        [
            f"--workdir={workdir}",
            f"--src={tmp_path / 'test.en'}",
            f"--ref={tmp_path / 'test.de'}",
            f"--output={tmp_path / 'out'}",
            "--average=3",
            "--config.decode.beam_size=1",
            "--config.decode.max_extra_len=2",
        ]
    )
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["checkpoint_steps"] == [2, 3, 4] and report["step"] == 4
    assert {"bleu", "tokenized_bleu", "tokenized_bleu_recipe"} <= set(report)
    text = (tmp_path / "out" / "report.txt").read_text()
    assert "mean parameters of the 3 checkpoints at steps [2, 3, 4]" in text
    assert "tokenized BLEU" in text and "sacreBLEU" in text


def files_under(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_averaging_into_another_runs_workdir_is_refused_and_changes_nothing(run, tmp_path):
    workdir, _ = run
    script = importlib.import_module("scripts.average_checkpoints")
    other = tmp_path / "other"
    shutil.copytree(workdir, other)
    Workdir(other).metrics.write_text('{"step": 4}\n')
    Workdir(other).tokens.mkdir()
    (tmp_path / "link").symlink_to(other)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    before = files_under(tmp_path)
    refusals = [
        (other, r"is a model's workdir \(checkpoints\), whose files are that run's own"),
        (tmp_path / "link", r"is a model's workdir \(checkpoints\)"),
        (mine, r"holds files this script does not write \(notes.txt\)"),
        (Workdir(workdir).checkpoints / "avg", r"inside --workdir=.*'s own files \(checkpoints/\)"),
        (Workdir(workdir).config, "not a directory"),
    ]
    for output, message in refusals:
        with pytest.raises(ValueError, match=message) as error:
            script.average_workdir(workdir, output, num=2, output_step=10)
        assert f"--output={output.resolve()}" in str(error.value)
        with pytest.raises(SystemExit, match=message):
            script.main([f"--workdir={workdir}", "--num=2", f"--output={output}"])
    # Only config.json, vocab.model and checkpoints/, as an average holds; but a run's steps.
    shutil.rmtree(Workdir(other).tokens)
    Workdir(other).metrics.unlink()
    before = files_under(tmp_path)
    with pytest.raises(ValueError, match=r"is a model's workdir \(checkpoints\)"):
        script.average_workdir(workdir, other, num=2, output_step=10)
    assert files_under(tmp_path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "mine", "other", "run"]


def test_averaging_again_replaces_an_earlier_average_only_once_the_new_one_is_whole(
    run, tmp_path, monkeypatch
):
    workdir, base = run
    script = importlib.import_module("scripts.average_checkpoints")
    avg = tmp_path / "avg"
    avg.mkdir()  # an empty directory is written to
    assert script.average_workdir(workdir, avg, num=2) == [3, 4]
    assert script.average_workdir(workdir, avg, steps=[1, 2]) == [1, 2]  # an older output step
    _, params, _, _, steps = load_model(avg)
    assert steps == [1, 2]
    assert_params_equal_base_plus(params, base, 1.5)
    assert checkpoint.make_manager(Workdir(avg).checkpoints, read_only=True).all_steps() == [2]
    before = files_under(avg)

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(checkpoint, "save_params", disk_full)
    with pytest.raises(OSError, match="No space left"):
        script.average_workdir(workdir, avg, num=2)
    assert files_under(avg) == before
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg", "run"]  # nothing left beside

    # translate.evaluate's report of the earlier average would describe the wrong model.
    (avg / "report.json").write_text("{}")
    with pytest.raises(ValueError, match=r"translate.evaluate's report \(report.json\)"):
        script.average_workdir(workdir, avg, num=2)
    assert files_under(avg) == {**before, pathlib.Path("report.json"): b"{}"}


def save_steps(manager, steps, base):
    for step in steps:
        params = jax.tree.map(lambda x, s=step: jax.numpy.asarray(x + s), base)
        checkpoint.save(manager, step, params, {"count": jax.numpy.asarray(step)}, {"step": step})
        manager.wait_until_finished()


def test_a_stops_step_off_the_grid_never_pushes_a_grid_step_out(run, tmp_path):
    """A stop at step 10 must leave the same steps as no stop at all."""
    _, base = run
    grid = checkpoint.KeepOnGrid(keep=3, every=3, last=12)
    straight = checkpoint.make_manager(tmp_path / "straight", grid=grid)
    save_steps(straight, [3, 6, 9, 12], base)
    stopped = checkpoint.make_manager(tmp_path / "stopped", grid=grid)
    save_steps(stopped, [3, 6, 9, 10], base)
    assert sorted(stopped.all_steps()) == [6, 9, 10]  # training resumes from 10
    save_steps(stopped, [11], base)  # stopped again: 11 takes 10's place, not 6's
    assert sorted(stopped.all_steps()) == [6, 9, 11]
    save_steps(stopped, [12], base)
    assert sorted(stopped.all_steps()) == sorted(straight.all_steps()) == [6, 9, 12]


def test_average_retries_when_the_trainer_deletes_a_step_meanwhile(run, monkeypatch):
    """`--average` on a workdir that is still training, whose trainer saves a new step and
    deletes the oldest while the average reads them."""
    workdir, base = run
    restore = checkpoint.restore
    calls = []

    def trainer_moves_on(manager, step, *args, **kwargs):
        calls.append(step)
        if len(calls) == 1:  # while the first step is read, the trainer saves 5 and deletes 3
            writer = checkpoint.make_manager(Workdir(workdir).checkpoints, keep=2)
            save_steps(writer, [5], base)
            writer.close()
            assert 3 not in checkpoint.make_manager(manager.directory, read_only=True).all_steps()
        return restore(manager, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "restore", trainer_moves_on)
    _, params, _, _, steps = load_model(workdir, average=2)
    assert steps == [4, 5]
    assert_params_equal_base_plus(params, base, 4.5)


def test_the_newest_is_chosen_again_when_the_trainer_deletes_it_meanwhile(run, monkeypatch):
    """A reader of the newest checkpoint of a workdir still training, whose trainer (keeping
    one checkpoint) saves a new step and deletes every older one while it is read."""
    workdir, base = run
    restore = checkpoint.restore
    calls, said = [], []

    def trainer_moves_on(manager, step, *args, **kwargs):
        calls.append(step)
        if len(calls) == 1:  # while step 4 is read, the trainer saves 5 and deletes 1-4
            writer = checkpoint.make_manager(Workdir(workdir).checkpoints, keep=1)
            save_steps(writer, [5], base)
            writer.close()
            assert checkpoint.make_manager(manager.directory, read_only=True).all_steps() == [5]
        return restore(manager, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "restore", trainer_moves_on)
    _, params, _, _, steps = load_model(workdir, log=said.append)
    assert calls[0] == 4 and steps == [5]
    assert_params_equal_base_plus(params, base, 5)
    assert said == [
        f"the checkpoint of step 4 in {Workdir(workdir).checkpoints} was deleted while it was "
        "read (a run is training there): reading the newest again"
    ], "said once, and a deleted step is not called unreadable"


def test_averaging_in_a_read_only_workdir_says_where_to_write_before_reading(run, monkeypatch):
    workdir, _ = run
    script = importlib.import_module("scripts.average_checkpoints")
    read = []
    monkeypatch.setattr(script, "load_model", lambda *a, **k: read.append(1))
    with read_only(workdir):
        with pytest.raises(SystemExit, match=r"cannot write in .*run .*give --output=DIR"):
            script.main([f"--workdir={workdir}", "--num=2"])
    assert not read, "refused before any checkpoint was read"


def test_averaging_again_removes_what_a_killed_average_left_beside_its_output(
    run, tmp_path, monkeypatch
):
    workdir, _ = run
    script = importlib.import_module("scripts.average_checkpoints")
    left = tmp_path / ".avg.0123abcd.new"  # SIGKILL during the write: nothing removed it
    (left / "checkpoints").mkdir(parents=True)
    monkeypatch.setattr(atomic, "STALE_SECONDS", 0.0)
    assert script.average_workdir(workdir, tmp_path / "avg", num=2) == [3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["avg", "run"]


def test_average_checkpoints_names_the_flag_of_a_bad_number(run):
    workdir, _ = run
    script = importlib.import_module("scripts.average_checkpoints")
    with pytest.raises(SystemExit, match=r"--steps: cannot parse 'abc' as int"):
        script.main([f"--workdir={workdir}", "--steps=abc"])
    with pytest.raises(SystemExit, match=r"--num=0: the number of checkpoints to average"):
        script.main([f"--workdir={workdir}", "--num=0"])


def test_checkpoints_of_which_only_some_hold_an_average_are_never_mixed(tmp_path):
    """With the moving average switched on by a resume, --average must not mix the parameters
    of some steps with the averages of others under the name "the moving average"."""
    import jax.numpy as jnp

    from translate import checkpoint
    from translate.trained import mean_params

    manager = checkpoint.make_manager(tmp_path / "checkpoints", keep=5)
    tree = lambda v: {"w": jnp.full((2,), v, jnp.float32)}  # noqa: E731
    checkpoint.save(manager, 3, tree(1.0), tree(0.0), {"step": 3})
    checkpoint.save(manager, 6, tree(3.0), tree(0.0), {"step": 6}, ema=tree(100.0))
    manager.wait_until_finished()
    said = []
    mean = mean_params(manager, [3, 6], tree(0.0), "auto", log=said.append)
    assert float(mean["w"][0]) == 2.0  # the parameters of both, not 1.0 and 100.0
    assert "only some hold a moving average" in said[0]
    assert float(mean_params(manager, [6], tree(0.0), "auto")["w"][0]) == 100.0


def test_a_step_unreadable_while_a_live_run_saves_a_newer_one_is_chosen_again(
    tmp_path, monkeypatch
):
    """translate-evaluate beside a run keeping one checkpoint, when the step it reads is being
    replaced (its directory still there, its files going), lists the steps again rather than
    failing "no readable checkpoint": the newer step saved meanwhile is read."""
    import jax.numpy as jnp

    from translate import checkpoint

    manager = checkpoint.make_manager(tmp_path / "checkpoints", keep=5)
    tree = {"w": jnp.ones((2,), jnp.float32)}
    checkpoint.save(manager, 3, tree, tree, {"step": 3})
    manager.wait_until_finished()
    reader = checkpoint.make_manager(tmp_path / "checkpoints", read_only=True)
    read_meta = checkpoint.read_meta

    def being_replaced(manager, step):
        (tmp_path / "checkpoints" / "6").mkdir()  # the live run's next step, saved meanwhile
        raise FileNotFoundError("its files are being deleted")

    monkeypatch.setattr(checkpoint, "read_meta", being_replaced)
    with pytest.raises(checkpoint.StepDeleted):
        checkpoint.restore_latest(reader, tree)
    monkeypatch.setattr(checkpoint, "read_meta", read_meta)
    (tmp_path / "checkpoints" / "6").rmdir()
    step, params, _, _ = checkpoint.restore_latest(reader, tree)  # a whole step: read as ever
    assert step == 3 and float(params["w"][0]) == 1.0
