"""The regularisers and the optimizer state around them: the parameters' moving average
(train.ema_decay), AdamW's decay, the best checkpoint with its average, and the range of every
regulariser's setting (subword sampling's own tests: test_bpe_dropout.py)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import copy_of_tiny_run
from jax.sharding import Mesh

from translate import checkpoint, evaluate, sharding
from translate.trained import load_ensemble, load_model
from translate.training.opening import check_config
from translate.training.steps import make_ema_update
from translate.training.trainer import train_and_evaluate
from translate.workdir import Workdir, write_config


def test_ema_update_matches_a_hand_computed_average():
    mesh = Mesh(np.array(jax.devices()[:1]), (sharding.DATA_AXIS,))
    update = make_ema_update(0.9, mesh)
    rng = np.random.default_rng(0)
    params = [{"w": rng.normal(size=(3, 4)).astype(np.float32)} for _ in range(5)]
    ema = jax.tree.map(jnp.asarray, params[0])
    expected = params[0]["w"].copy()
    nonfinite = [0.0, 0.0, 1.0, 0.0]  # the third step was not applied: the average stays
    for step, (p, bad) in enumerate(zip(params[1:], nonfinite)):
        ema = update(ema, jax.tree.map(jnp.asarray, p), step, jnp.float32(bad))
        if not bad:
            d = np.float32(min(0.9, (1 + step) / (10 + step)))
            expected = d * expected + (np.float32(1) - d) * p["w"]
        np.testing.assert_allclose(np.asarray(ema["w"]), expected, rtol=1e-6, atol=1e-7)


def regularised(config, steps):
    """The moving average and subword sampling on both sides."""
    config.train.ema_decay = 0.9
    config.data.src_subword_alpha = 0.2
    config.data.tgt_subword_alpha = 0.1
    config.train.num_train_steps = steps
    config.train.checkpoint_every_steps = 4
    config.data.synthetic_num_train = 100  # about two steps an epoch
    return config


def arrays(workdir, params="auto"):
    return [np.asarray(x) for x in jax.tree.leaves(load_model(workdir, params=params)[1])]


@pytest.mark.slow  # three runs: 30-70 s on 2 cores; test_trainer's resume test checks the
# moving average bit for bit by default
def test_a_resumed_run_continues_the_average_bit_for_bit(config, tmp_path):
    """Straight to step 8 (past an epoch's end), against stopped at 7 and resumed."""
    train_and_evaluate(regularised(config, 8), tmp_path / "straight")
    train_and_evaluate(regularised(config, 7), tmp_path / "resumed")
    train_and_evaluate(regularised(config, 8), tmp_path / "resumed")
    for params in ("ema", "raw"):
        for a, b in zip(
            arrays(tmp_path / "straight", params), arrays(tmp_path / "resumed", params)
        ):
            np.testing.assert_array_equal(a, b)
    # The average is not the parameters, and evaluations decode it.
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(arrays(tmp_path / "straight", "ema"), arrays(tmp_path / "straight", "raw"))
    )
    lines = [
        json.loads(x)
        for x in (tmp_path / "straight" / "metrics.jsonl").read_text().split("\n")
        if x
    ]
    assert any("eval/raw_bleu" in line for line in lines) and any(
        "eval/bleu" in line for line in lines
    )
    # Checkpoint averaging composes: the mean of the newest two checkpoints' moving averages.
    manager = checkpoint.make_manager(Workdir(tmp_path / "straight").checkpoints, read_only=True)
    mean = [np.asarray(x) for x in jax.tree.leaves(load_model(tmp_path / "straight", average=2)[1])]
    e4, e8 = arrays_at(manager, 4, "ema"), arrays_at(manager, 8, "ema")
    for m, a, b in zip(mean, e4, e8):
        np.testing.assert_allclose(m, (a + b) / 2, rtol=1e-6, atol=1e-7)
    # The data position crossed into the second epoch.
    meta = checkpoint.read_meta(
        checkpoint.make_manager(Workdir(tmp_path / "straight").checkpoints, read_only=True), 8
    )
    assert meta["data_position"]["epoch"] >= 1


@pytest.mark.slow  # two runs and two evaluations: 20-40 s on 2 cores
def test_a_run_without_an_average_resumes_with_one_and_evaluates(
    tiny_run, tmp_path_factory, config, caplog
):
    workdir = copy_of_tiny_run(tiny_run, tmp_path_factory)  # 6 steps, no average
    assert not checkpoint.holds_ema(Workdir(workdir).checkpoints, 6)
    with pytest.raises(ValueError, match="--params=ema: the checkpoint of step 6 .* holds no"):
        load_ensemble([workdir], params="ema")
    config.train.ema_decay = 0.9
    config.train.num_train_steps = 7
    with caplog.at_level("INFO", logger="translate"):
        report = train_and_evaluate(config, workdir)
    assert "step 6 holds no moving average" in caplog.text
    assert report["step"] == 7
    assert checkpoint.holds_ema(Workdir(workdir).checkpoints, 7)
    # One update from the step-6 parameters p6 with d = min(0.9, 7/16): ema = d p6 + (1-d) p7.
    manager = checkpoint.make_manager(Workdir(workdir).checkpoints, read_only=True)
    p6 = arrays_at(manager, 6, "params")
    p7, e7 = arrays_at(manager, 7, "params"), arrays_at(manager, 7, "ema")
    d = np.float32(7 / 16)
    for a, b, e in zip(p6, p7, e7):
        np.testing.assert_allclose(e, d * a + (np.float32(1) - d) * b, rtol=1e-5, atol=1e-6)
    # An average that cannot be read starts again from its step's parameters; the run goes on.
    for f in (Workdir(workdir).checkpoints / "7" / "ema").rglob("*"):
        if f.is_file():
            f.write_bytes(b"not an array")
    config.train.num_train_steps = 8
    with caplog.at_level("INFO", logger="translate"):
        assert train_and_evaluate(config, workdir)["step"] == 8
    assert (
        "moving average of the parameters in the checkpoint of step 7 is unreadable" in caplog.text
    )
    # translate-evaluate decodes the average by default and says which in its report and name.
    data = workdir / "data"
    for choice, suffix in (("auto", "ema"), ("raw", "raw")):
        evaluate.main(
            [
                "--workdir",
                str(workdir),
                "--src",
                str(data / "test.en"),
                "--ref",
                str(data / "test.de"),
            ]
            + ["--params", choice]
        )
        out = workdir / "evaluations" / f"test.en.step8.{suffix}"
        assert json.loads((out / "report.json").read_text())["parameters"] == suffix


def arrays_at(manager, step, item):
    from translate.data.tokenizer import Tokenizer
    from translate.models.factory import abstract_model
    from translate.workdir import read_config

    path = manager.directory.parent
    config = read_config(Workdir(path))
    _, shapes = abstract_model(config, Tokenizer(Workdir(path).vocab).vocab_size)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params = checkpoint.restore(manager, step, checkpoint.abstract_like(shapes, device), item=item)[
        0
    ]
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_the_choices_are_config_errors_out_of_range(config):
    for name, value in (
        ("train.ema_decay", 1.0),
        ("train.ema_decay", -0.1),
        ("data.src_subword_alpha", 1.0),
        ("data.tgt_subword_alpha", -0.5),
    ):
        section, field = name.split(".")
        bad = type(config)()
        setattr(getattr(bad, section), field, value)
        with pytest.raises(ValueError, match=name):
            bad.validate()


@pytest.mark.slow  # three tiny runs, 30-45 s; the generic resume test runs by default
def test_adamw_resumes_bit_for_bit(config, tmp_path):
    """train.weight_decay: a run stopped at step 3 and resumed ends where an uninterrupted one
    does (AdamW's state is checkpointed)."""
    config.train.weight_decay = 0.1
    resumes_bit_for_bit(config, tmp_path)


def resumes_bit_for_bit(config, tmp_path):
    """Trains the 6-step config straight, and stopped at step 3 then resumed: the parameters
    must end equal."""
    train_and_evaluate(config, tmp_path / "straight")
    config.train.num_train_steps = 3
    train_and_evaluate(config, tmp_path / "resumed")
    config.train.num_train_steps = 6
    train_and_evaluate(config, tmp_path / "resumed")
    for a, b in zip(arrays(tmp_path / "straight", "raw"), arrays(tmp_path / "resumed", "raw")):
        np.testing.assert_array_equal(a, b)


def test_adamw_cannot_be_switched_on_or_off_by_a_resume(config, tmp_path):
    """train.weight_decay's value may change at a resume, its use may not."""
    config.train.weight_decay = 0.1
    workdir = Workdir(tmp_path)
    write_config(config, workdir)  # what training writes once its data has loaded
    config.train.weight_decay = 0.2
    check_config(config, workdir, force=False)  # another value: the same optimizer state
    config.train.weight_decay = 0.0
    with pytest.raises(ValueError, match=r"config.train.weight_decay = 0.1, now 0.0 .*--force"):
        check_config(config, workdir, force=False)


@pytest.mark.slow  # one run with a dev evaluation: 15-30 s on 2 cores
def test_best_keeps_the_parameters_and_their_average_apart(config, tmp_path):
    """best/ of a run with train.ema_decay keeps the parameters and the average apart, so
    --params=raw decodes the parameters and --params=ema the average."""

    config = regularised(config, 6)
    config.train.keep_best_by = "dev_bleu"
    config.train.eval_every_steps = 6
    train_and_evaluate(config, tmp_path)
    best = Workdir(Workdir(tmp_path).best)
    for choice in ("raw", "ema"):
        kept = load_model(best.path, params=choice).params
        run = load_model(tmp_path, step=6, params=choice).params
        for a, b in zip(jax.tree.leaves(kept), jax.tree.leaves(run), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    raw, ema = (jax.tree.leaves(load_model(best.path, params=c).params) for c in ("raw", "ema"))
    assert any(not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(raw, ema))
