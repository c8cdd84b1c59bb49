"""The trainer (translate/training/trainer.py, steps.py): sharding, compiling, resuming."""

import functools
import json
import signal

import jax
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from scripts.average_checkpoints import average_workdir
from translate import checkpoint, sharding
from translate.data import synthetic
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.corpus import TokenizedCorpus
from translate.decoding.report import translate_and_score
from translate.decoding.settings import decode_settings
from translate.trained import load_model
from translate.training import monitor
from translate.training.evaluation import final_params
from translate.training.steps import Packed, make_steps
from translate.training.trainer import train_and_evaluate
from translate.workdir import Workdir


def random_corpus(n=200, seed=0):
    rng = np.random.default_rng(seed)
    src = [list(rng.integers(4, 60, rng.integers(2, 12))) for _ in range(n)]
    tgt = [list(rng.integers(4, 60, rng.integers(2, 12))) for _ in range(n)]
    return TokenizedCorpus.from_lists(src, tgt)


def run_steps(config, mesh, batches, vocab_size=64, optimizer=None):
    steps = make_steps(config, vocab_size, mesh, optimizer)
    params, opt_state = steps.init(jax.random.key(0))
    step_fn = steps.train
    for step, batch in enumerate(batches):
        params, opt_state, metrics = step_fn(
            params, opt_state, sharding.put_batch(batch, mesh), step, jax.random.key(1)
        )
    return params, metrics, step_fn


def tiny_batches(config, num_devices, count=3):
    corpus = random_corpus()
    layout = BatchLayout.from_config(
        config.data.tokens_per_batch,
        config.data.row_len,
        config.train.grad_accum_steps,
        num_devices,
    )
    plan = plan_epoch(corpus, layout, seed=0, epoch=0)
    return [make_batch(corpus, rows, layout) for rows in plan[:count]]


def test_the_packed_train_step_computes_the_tree_step_bit_for_bit(config):
    # The trainer's step (Steps.packed_train) takes the parameters and Adam's state as Packed,
    # for less host time per call; it must be the same program as the step on the trees.
    mesh = sharding.make_mesh()
    batches = tiny_batches(config, mesh.size, count=3)
    tree_params, tree_metrics, _ = run_steps(config, mesh, batches)
    steps = make_steps(config, 64, mesh)
    params, opt_state = (Packed.of(x) for x in steps.init(jax.random.key(0)))
    for step, batch in enumerate(batches):
        params, opt_state, metrics = steps.packed_train(
            params, opt_state, sharding.put_batch(batch, mesh), step, jax.random.key(1)
        )
    assert isinstance(params, Packed) and isinstance(opt_state, Packed)
    # Each step's packed outputs have the structure of its inputs: one trace for all steps.
    assert steps.packed_train._cache_size() == 1
    assert jax.tree.structure(params.tree()) == jax.tree.structure(tree_params)
    for a, b in zip(jax.tree.leaves(params.tree()), jax.tree.leaves(tree_params), strict=True):
        np.testing.assert_array_equal(a, b)
    for name in metrics:
        np.testing.assert_array_equal(metrics[name], tree_metrics[name])


@pytest.mark.slow  # 27 s on 2 cores
def test_eight_device_train_step_matches_one_device(config):
    config.train.grad_accum_steps = 2
    assert jax.device_count() == 8
    batches = tiny_batches(config, num_devices=8, count=1)
    one, one_metrics, _ = run_steps(config, Mesh(np.array(jax.devices()[:1]), ("data",)), batches)
    eight, eight_metrics, _ = run_steps(config, sharding.make_mesh(), batches)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(eight)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one_metrics["loss_sum"], eight_metrics["loss_sum"], rtol=1e-5)


@pytest.mark.slow  # 12-18 s; kept out of the default run's 10 minutes
def test_gradient_accumulation_matches_one_large_batch(config):
    mesh = sharding.make_mesh()
    config.train.grad_accum_steps = 2
    # Micro-batches draw their own dropout masks, so compare the deterministic computation.
    config.model.dropout_rate = 0.0
    accumulated = tiny_batches(config, 8, count=1)
    whole = [jax.tree.map(lambda v: v.reshape(1, -1, v.shape[-1]), b) for b in accumulated]
    # Compare the gradients themselves: SGD with rate 1 moves parameters by minus the mean
    # gradient. (Adam's first update is g / (|g| + eps), about +-lr for any gradient well above
    # eps, so it turns summation-order rounding in near-zero gradients into visible steps.)
    sgd = optax.sgd(1.0)
    init, _ = make_steps(config, 64, mesh, sgd).init(jax.random.key(0))  # run_steps' parameters
    a, _, _ = run_steps(config, mesh, accumulated, optimizer=sgd)
    b, _, _ = run_steps(config, mesh, whole, optimizer=sgd)
    for p0, x, y in zip(*map(jax.tree.leaves, (init, a, b))):
        np.testing.assert_allclose(np.asarray(p0 - x), np.asarray(p0 - y), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # 13 s on 2 cores
def test_train_step_is_traced_once_over_several_steps(config):
    _, _, step_fn = run_steps(config, sharding.make_mesh(), tiny_batches(config, 8, count=4))
    assert step_fn._cache_size() == 1


def test_short_train_and_evaluate_writes_report(config, tmp_path):
    report = train_and_evaluate(config, tmp_path)
    saved = json.loads((tmp_path / "report.json").read_text())
    for key in (
        "bleu",
        "chrf",
        "signature",
        "num_sentences",
        "decode_seconds",
        "sentences_per_second",
        "beam_size",
        "length_penalty",
        "step",
    ):
        assert key in saved
    assert saved == report
    assert saved["step"] == 6 and saved["num_sentences"] == 16
    assert saved["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert (tmp_path / "hypotheses.txt").read_text().count("\n") == 16
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"train/loss", "train/tokens_per_sec", "train/learning_rate"} <= set(lines[0])
    # Model FLOP/s is logged everywhere; MFU only against a published peak, which no CPU has.
    assert lines[0]["train/model_flops_per_sec"] > 0 and "train/mfu" not in lines[0]
    assert any("eval/bleu" in line for line in lines)
    assert checkpoint.latest_step(Workdir(tmp_path).checkpoints) == 6


# Without the moving average is slow: 0.9 runs the same steps and the average's scan besides.
@pytest.mark.parametrize("ema_decay", [pytest.param(0.0, marks=pytest.mark.slow), 0.9])
def test_the_trainers_step_and_several_steps_per_call_compute_the_single_steps(config, ema_decay):
    # With train.ema_decay the trainer calls one program a step (Steps.packed_train_ema): it
    # must compute bit for bit what the step and then the average's own update (Steps.ema) do.
    # Steps.packed_train_many runs K steps in one call (a scan over K stacked batches), for a
    # step whose host time bounds it; it must compute what K calls of the trainer's step do,
    # to float32 rounding: XLA compiles the step inside the loop otherwise, and the parameters
    # were 1.3e-6 apart after two steps (measured), so not bit for bit.
    same = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5)
    config.train.ema_decay = ema_decay
    config.model.dropout_rate = 0.1
    mesh = sharding.make_mesh()
    batches = tiny_batches(config, mesh.size, count=4)
    steps = make_steps(config, 64, mesh, steps_per_call=2)
    assert (steps.packed_train_ema is None) == (not ema_decay)  # no average, no such step
    single = steps.packed_train_ema or steps.packed_train

    def start():  # buffers of its own for each state: every call donates those it takes
        params, opt_state = steps.init(jax.random.key(0))
        average = [Packed.of(steps.init(jax.random.key(0))[0])] if ema_decay else []
        return [Packed.of(params), Packed.of(opt_state), *average]

    one, many, apart = start(), start(), start()
    single_metrics = []
    for step, batch in enumerate(batches):
        placed = sharding.put_batch(batch, mesh)
        *one, metrics = single(*one, placed, step, jax.random.key(1))
        single_metrics.append(metrics)
        if ema_decay:  # the trainer's step with the average: the step, then the average's update
            p, o, apart_metrics = steps.packed_train(*apart[:2], placed, step, jax.random.key(1))
            apart = [p, o, steps.ema(apart[2], p, step, apart_metrics["nonfinite"])]
            for name in metrics:
                np.testing.assert_array_equal(metrics[name], apart_metrics[name])
    if ema_decay:  # ... bit for bit
        for a, b in zip(apart, one, strict=True):
            for x, y in zip(jax.tree.leaves(a.tree()), jax.tree.leaves(b.tree()), strict=True):
                np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert not np.array_equal(  # the average moved apart from the parameters
            jax.tree.leaves(one[2].tree())[0], jax.tree.leaves(one[0].tree())[0]
        )
    many_metrics = []
    for first in (0, 2):
        placed = sharding.put_batches(batches[first : first + 2], mesh)
        *many, metrics = steps.packed_train_many(*many, placed, first, jax.random.key(1))
        many_metrics.append(metrics)
    assert steps.packed_train_many._cache_size() == 1
    for name in single_metrics[0]:
        stacked = np.concatenate([np.asarray(m[name]) for m in many_metrics])
        assert stacked.shape == (4,)
        same(stacked, [float(m[name]) for m in single_metrics])
    assert len(one) == len(many) == (3 if ema_decay else 2)
    for a, b in zip(one, many, strict=True):
        for x, y in zip(jax.tree.leaves(a.tree()), jax.tree.leaves(b.tree()), strict=True):
            same(np.asarray(x), np.asarray(y))
    assert make_steps(config, 64, mesh).packed_train_many is None  # one step a call


def test_stopped_and_resumed_run_matches_uninterrupted_run(config, tmp_path):
    """The parameters and their moving average (train.ema_decay, which never feeds back into
    training: the parameters are those of a run without it) bit for bit. The tiny config's
    corpus as files without dev and test splits: no run decodes, which is not what is compared
    (the three runs' evaluations took 7 s of the test's 37 s on 2 cores)."""
    synthetic.write_splits(tmp_path / "data", 400, 16, 16, seed=0)
    config.data.source, config.data.dir = "files", str(tmp_path / "data")
    config.data.dev_prefix = config.data.test_prefix = ""
    config.train.ema_decay = 0.9
    train_and_evaluate(config, tmp_path / "straight")
    config.train.num_train_steps = 3
    train_and_evaluate(config, tmp_path / "resumed")
    config.train.num_train_steps = 6
    train_and_evaluate(config, tmp_path / "resumed")
    for params in ("raw", "ema"):
        a = load_model(tmp_path / "straight", params=params)[1]
        b = load_model(tmp_path / "resumed", params=params)[1]
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow  # three runs of the tiny config: kept out of the default run's 10 minutes
def test_a_run_with_two_steps_a_call_trains_what_single_steps_train(config, tmp_path, caplog):
    """train.steps_per_call: the trainer runs two steps a call where the step count allows it
    and single steps elsewhere (a remainder at the end, a resume off the grid: here 0-2 in one
    call, 2 alone to end the 3-step run, 3 alone on resuming, then 4-6 in two calls). It must
    train what a run of single steps trains, to float32 rounding: the scanned steps are not bit
    for bit (test_the_trainers_step_and_several_steps_per_call_compute_the_single_steps), and
    Adam's normalised update grows a rounding difference step by step where a gradient is near
    zero (measured here: 3e-7 of the parameters' norm after the first call, 3e-4 after six
    steps, 2e-4 for the average). A wrong batch, step number or dropout key would put them a
    step's movement apart instead: 12% of the norm for the last call. So the parameters must
    agree to 1e-3 of their norm, and the logged losses of the same windows to 1e-5."""
    same = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5)
    config.train.ema_decay = 0.9
    config.train.checkpoint_every_steps = 2
    config.train.eval_every_steps = 100
    train_and_evaluate(config, tmp_path / "single")
    config.train.steps_per_call = 2
    config.train.num_train_steps = 3
    with caplog.at_level("INFO", logger="translate"):
        train_and_evaluate(config, tmp_path / "paired")
        config.train.num_train_steps = 6
        train_and_evaluate(config, tmp_path / "paired")
    compiled = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled")]
    assert [m.split(" in ")[0] for m in compiled] == [
        "compiled the train steps, 2 a call,",
        "compiled the train step",
        "compiled the train step",
        "compiled the train steps, 2 a call,",
    ]
    for params in ("raw", "ema"):
        a, b = (
            np.concatenate(
                [np.ravel(x) for x in jax.tree.leaves(load_model(path, params=params)[1])]
            )
            for path in (tmp_path / "single", tmp_path / "paired")
        )
        assert np.linalg.norm(a - b) < 1e-3 * np.linalg.norm(a), params

    def losses(run):
        lines = [json.loads(x) for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
        return {x["step"]: x["train/loss"] for x in lines if "train/loss" in x}

    single, paired = losses("single"), losses("paired")
    assert sorted(single) == [2, 4, 6] and sorted(paired) == [2, 3, 4, 6]
    same([paired[k] for k in (2, 6)], [single[k] for k in (2, 6)])  # the same windows


def test_the_profiler_traces_the_calls_that_hold_its_steps(monkeypatch, tmp_path):
    """With several steps a call, steps 3 to 5 of train.profile_steps fall inside calls: the
    trace starts before the call holding step 3 and stops after the one holding step 5."""
    said = []
    monkeypatch.setattr(jax.profiler, "start_trace", lambda *a, **k: said.append("start"))
    monkeypatch.setattr(jax.profiler, "stop_trace", lambda: said.append("stop"))
    profiler = monitor.StepProfiler((3, 5), tmp_path)
    for done in (0, 2, 4, 6):  # calls of steps 1-2, 3-4, 5-6, 7-8
        profiler.before(done, 2)
        said.append(done + 2)
        profiler.after(done + 2, None)
    assert said == [2, "start", 4, 6, "stop", 8]


def test_intervals_off_the_steps_per_call_are_refused_by_name(config):
    config.train.steps_per_call = 4
    config.train.log_every_steps = 6
    with pytest.raises(ValueError, match=r"train\.log_every_steps.*multiple of.*steps_per_call"):
        config.validate()
    config.train.steps_per_call = 0
    with pytest.raises(ValueError, match=r"train\.steps_per_call"):
        config.validate()


@pytest.mark.slow  # trains and averages: 17 s on 2 cores
def test_final_report_decodes_the_average_that_average_checkpoints_writes(config, tmp_path):
    config.decode.average_last = 3
    config.train.checkpoint_every_steps = 2  # steps 2, 4 and 6
    run = Workdir(tmp_path / "run")
    report = train_and_evaluate(config, run.path)
    assert report["checkpoint_steps"] == [2, 4, 6] and report["step"] == 6
    assert "mean parameters of the 3 checkpoints at steps [2, 4, 6]" in run.report_txt.read_text()
    lines = [json.loads(line) for line in run.metrics.read_text().splitlines()]
    assert any(line["step"] == 6 and "eval/averaged_bleu" in line for line in lines)

    assert average_workdir(run.path, tmp_path / "average", num=3) == [2, 4, 6]
    graphdef, averaged, tokenizer, _, steps = load_model(tmp_path / "average")
    assert steps == [2, 4, 6]
    manager = checkpoint.make_manager(run.checkpoints, read_only=True)
    abstract = checkpoint.abstract_like(averaged, sharding.replicated(sharding.make_mesh()))
    trainers, trainer_steps = final_params(config, manager, None, 6, abstract)
    assert trainer_steps == [2, 4, 6]
    for x, y in zip(jax.tree.leaves(trainers), jax.tree.leaves(averaged), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    sources = (run.data / "test.en").read_text().splitlines()
    references = (run.data / "test.de").read_text().splitlines()
    again, hypotheses = translate_and_score(
        (graphdef,),
        (averaged,),
        tokenizer,
        config,
        decode_settings(config.decode),
        sources,
        references,
        6,
        steps,
    )
    assert run.hypotheses.read_text().splitlines() == hypotheses
    assert again["bleu"] == report["bleu"]


@pytest.mark.slow  # two 12-step runs, 30-40 s
def test_a_stop_off_the_checkpoint_grid_averages_the_same_steps_as_no_stop(
    config, tmp_path, monkeypatch
):
    """A SIGTERM saves step 10, off the grid of every 3 steps; the final
    average must still be of [6, 9, 12], the uninterrupted run's, not [9, 10, 12]."""
    config.train.num_train_steps, config.train.checkpoint_every_steps = 12, 3
    config.train.keep_checkpoints = config.decode.average_last = 3
    straight = train_and_evaluate(config, tmp_path / "straight")
    agreed = monitor.StopSignal.agreed
    monkeypatch.setattr(
        monitor.StopSignal,
        "agreed",
        lambda self, step: signal.SIGTERM if step == 10 else agreed(self, step),
    )
    with pytest.raises(monitor.Interrupted, match="at step 10"):
        train_and_evaluate(config, tmp_path / "stopped")
    monkeypatch.undo()
    resumed = train_and_evaluate(config, tmp_path / "stopped")
    assert straight["checkpoint_steps"] == resumed["checkpoint_steps"] == [6, 9, 12]
    assert resumed["bleu"] == straight["bleu"]
    for run in ("straight", "stopped"):
        manager = checkpoint.make_manager(Workdir(tmp_path / run).checkpoints, read_only=True)
        assert sorted(manager.all_steps()) == [6, 9, 12]
