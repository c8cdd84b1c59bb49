"""The label-smoothed loss (translate/training/losses.py) and the schedule (optim.py)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

from translate import sharding
from translate.config import Config
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.corpus import TokenizedCorpus
from translate.training.losses import (
    correct_tokens,
    loss_keep,
    projected_cross_entropy,
    smoothed_cross_entropy,
    transposed_copy,
)
from translate.training.optim import decay_to_zero_schedule, inverse_sqrt_schedule, make_schedule
from translate.training.steps import make_steps, resolve_loss_keep


def test_label_smoothing_matches_hand_computed_value():
    logits = jnp.array([[[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 3.0, 0.0]]])  # [1, 2, 4]
    targets = jnp.array([[0, 1]])
    weights = jnp.array([[1.0, 0.0]])  # the second token is padding
    loss, nll, count = smoothed_cross_entropy(logits, targets, weights, label_smoothing=0.1)
    z = math.log(math.exp(2) + math.exp(1) + 1 + math.exp(-1))
    log_p = [2 - z, 1 - z, 0 - z, -1 - z]
    # q = 0.9 on the target plus 0.1 / 4 on every class.
    expected = -(0.9 * log_p[0] + 0.025 * sum(log_p))
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    np.testing.assert_allclose(nll, -log_p[0], rtol=1e-6)
    assert count == 1.0


def test_accuracy_counts_only_real_tokens():
    logits = jnp.array([[[5.0, 0.0], [5.0, 0.0], [0.0, 5.0]]])
    targets = jnp.array([[0, 1, 1]])
    weights = jnp.array([[1.0, 1.0, 0.0]])
    assert correct_tokens(logits, targets, weights) == 1.0


def random_loss_inputs():
    """y [3, 5, 16], embedding [50, 16], targets [3, 5] and weights [3, 5] (a few padding)."""
    keys = jax.random.split(jax.random.key(0), 4)
    y = jax.random.normal(keys[0], (3, 5, 16))  # [B, T, D]
    embedding = 0.3 * jax.random.normal(keys[1], (50, 16))  # [V, D]
    targets = jax.random.randint(keys[2], (3, 5), 0, 50)
    weights = (jax.random.uniform(keys[3], (3, 5)) > 0.3).astype(jnp.float32)
    return y, embedding, targets, weights


@pytest.mark.parametrize("keep", ["exp", "logits"])
def test_fused_projection_and_loss_match_the_unfused_loss_and_its_gradients(keep):
    y, embedding, targets, weights = random_loss_inputs()

    def unfused(y, embedding):
        logits = jnp.einsum("btd,vd->btv", y, embedding)
        loss, nll, count = smoothed_cross_entropy(logits, targets, weights, 0.1)
        return loss, nll, count, correct_tokens(logits, targets, weights)

    def fused(y, embedding):
        return projected_cross_entropy(y, embedding, targets, weights, 0.1, keep)

    np.testing.assert_allclose(fused(y, embedding), unfused(y, embedding), rtol=1e-6)
    for output in (0, 1):  # the smoothed loss and the NLL are both differentiable
        expected = jax.grad(lambda *a, i=output: unfused(*a)[i], argnums=(0, 1))(y, embedding)
        got = jax.grad(lambda *a, i=output: fused(*a)[i], argnums=(0, 1))(y, embedding)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("keep", ["exp", "logits"])
def test_a_projection_bias_is_added_to_the_logits_and_gets_their_summed_gradient(keep):
    # `model.logits_bias`: the fused loss of y @ E^T + b, its gradients for y, E and b.
    y, embedding, targets, weights = random_loss_inputs()
    bias = jax.random.normal(jax.random.key(7), (embedding.shape[0],))

    def unfused(y, embedding, bias):
        logits = jnp.einsum("btd,vd->btv", y, embedding) + bias
        loss, nll, count = smoothed_cross_entropy(logits, targets, weights, 0.1)
        return loss, nll, count, correct_tokens(logits, targets, weights)

    def fused(y, embedding, bias):
        return projected_cross_entropy(y, embedding, targets, weights, 0.1, keep, bias)

    args = (y, embedding, bias)
    np.testing.assert_allclose(fused(*args), unfused(*args), rtol=1e-6)
    for output in (0, 1):
        expected = jax.grad(lambda *a, i=output: unfused(*a)[i], argnums=(0, 1, 2))(*args)
        got = jax.grad(lambda *a, i=output: fused(*a)[i], argnums=(0, 1, 2))(*args)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_training_loss_of_a_model_with_a_projection_bias_is_that_of_its_logits():
    # The train step passes the bias to the fused loss (steps.summed_loss): its loss is the
    # one of the model's own logits, and the bias gets a gradient.
    from flax import nnx

    from translate.data.batching import Batch
    from translate.models.factory import make_model
    from translate.training.steps import summed_loss

    config = tiny_config().model
    config.logits_bias = True
    model = make_model(config, 40, nnx.Rngs(0))
    model.logits_bias[...] = jax.random.normal(jax.random.key(1), (40,))
    src, tgt = jnp.array([[5, 6, 7, 2]]), jnp.array([[1, 8, 9, 10]])
    positions = jnp.arange(4)[None]
    ones = jnp.ones_like(src)
    batch = Batch(src, ones, positions, tgt, ones, positions, tgt_out=jnp.roll(tgt, -1, axis=1))
    graphdef, params = nnx.split(model, nnx.Param)
    loss_of = jax.jit(lambda p: summed_loss(graphdef, 0.1, "exp", p, batch, None)[0])
    logits = nnx.jit(lambda m, b: m(b))(model, batch)
    expected = smoothed_cross_entropy(logits, batch.tgt_out, ones, 0.1)[0]
    np.testing.assert_allclose(loss_of(params), expected, rtol=1e-6)
    grads = jax.jit(jax.grad(loss_of))(params)
    assert np.abs(np.asarray(grads["logits_bias"][...])).sum() > 0


def test_bfloat16_logits_give_the_loss_of_the_rounded_logits_and_a_nearby_gradient():
    # keep="logits_bf16" rounds the logits to bfloat16 once: its sums are the unfused loss's on
    # those rounded logits, and its gradients (which take the rounding as the identity) lie
    # within bfloat16's rounding of the float32 path's, without being equal to them.
    y, embedding, targets, weights = random_loss_inputs()

    def rounded(y, embedding):
        logits = jnp.einsum("btd,vd->btv", y, embedding).astype(jnp.bfloat16)
        loss, nll, count = smoothed_cross_entropy(logits, targets, weights, 0.1)
        return loss, nll, count, correct_tokens(logits, targets, weights)

    def fused(y, embedding, keep):
        return projected_cross_entropy(y, embedding, targets, weights, 0.1, keep)

    np.testing.assert_allclose(fused(y, embedding, "logits_bf16"), rounded(y, embedding), rtol=1e-6)
    assert fused(y, embedding, "logits_bf16")[0] != fused(y, embedding, "logits")[0]
    for output in (0, 1):
        grads = {
            keep: jax.grad(lambda *a, i=output, k=keep: fused(*a, k)[i], argnums=(0, 1))(
                y, embedding
            )
            for keep in ("logits", "logits_bf16")
        }
        for a, b in zip(grads["logits_bf16"], grads["logits"]):
            assert not np.array_equal(a, b)
            np.testing.assert_allclose(a, b, rtol=0, atol=2**-7 * np.abs(b).max())


def test_transposed_copy_is_the_transpose():
    x = jnp.arange(12.0).reshape(3, 4)
    np.testing.assert_array_equal(jax.jit(transposed_copy)(x), x.T)


def test_bfloat16_embedding_gradient_in_row_major_products_matches_the_plain_product():
    # For bfloat16 operands the CPU's path ("exp") takes the embedding's gradient as
    # (y^T d_logits)^T with copied transposes and d_y with a float32 result rounded after; the
    # GPU's ("logits") writes d_logits^T y and a bfloat16 d_y. The same bfloat16 products
    # summed in another order: equal up to float32 rounding.
    keys = jax.random.split(jax.random.key(0), 4)
    y = jax.random.normal(keys[0], (4, 6, 32)).astype(jnp.bfloat16)  # [B, T, D]
    embedding = 0.3 * jax.random.normal(keys[1], (80, 32))  # [V, D]
    targets = jax.random.randint(keys[2], (4, 6), 0, 80)
    weights = (jax.random.uniform(keys[3], (4, 6)) > 0.3).astype(jnp.float32)
    grads = {}
    for keep in ("exp", "logits"):

        def loss(y, embedding, keep=keep):
            return projected_cross_entropy(y, embedding, targets, weights, 0.1, keep)[0]

        grads[keep] = jax.jit(jax.grad(loss, argnums=(0, 1)))(y, embedding)
    np.testing.assert_array_equal(
        grads["exp"][0].astype(jnp.float32), grads["logits"][0].astype(jnp.float32)
    )
    np.testing.assert_allclose(grads["exp"][1], grads["logits"][1], rtol=1e-5, atol=1e-6)


def synthetic_batch(config: Config, mesh):
    """The first batch of 200 random pairs of 3 to 12 tokens in the config's layout."""
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 64, rng.integers(3, 13)) for _ in range(200)]
    tgt = [rng.integers(4, 64, rng.integers(3, 13)) for _ in range(200)]
    corpus = TokenizedCorpus.from_lists(src, tgt)
    d = config.data
    layout = BatchLayout.from_config(
        d.tokens_per_batch, d.row_len, config.train.grad_accum_steps, mesh.size
    )
    return make_batch(corpus, plan_epoch(corpus, layout, 0, 0)[0], layout)


def first_step(config: Config) -> tuple:
    """The trainer's own first step on `synthetic_batch`, from the parameters of key 0:
    (parameters before, parameters after, metrics), on the host."""
    mesh = sharding.make_mesh()
    steps = make_steps(config, 64, mesh)
    params, opt_state = steps.init(jax.random.key(0))
    before = jax.device_get(params)
    batch = sharding.put_batch(synthetic_batch(config, mesh), mesh)
    params, _, metrics = steps.train(params, opt_state, batch, 0, jax.random.key(1))
    return before, jax.device_get(params), jax.device_get(metrics)


@pytest.mark.slow  # 30 s: the GPU's default residual, trained by `pytest -m gpu`
def test_the_two_loss_residuals_give_the_same_training_step_on_the_cpu():
    # The GPU's default ("logits") against the CPU's ("exp"), through the trainer's own step:
    # equal up to float32 rounding, in the loss and in every parameter after the update.
    config = tiny_config()
    out = {}
    for keep in ("exp", "logits"):
        config.train.loss_keep = keep
        _, params, metrics = first_step(config)
        out[keep] = (params, metrics)
    np.testing.assert_allclose(out["exp"][1]["loss_sum"], out["logits"][1]["loss_sum"], rtol=1e-6)
    np.testing.assert_allclose(out["exp"][1]["grad_norm"], out["logits"][1]["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(out["exp"][0]), jax.tree.leaves(out["logits"][0])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # 20 s; the product's rounding in both passes is tested in test_model
def test_bfloat16_products_give_a_nearby_training_step():
    # model.matmul_dtype=bfloat16 through the trainer's own step: the loss and gradient norm
    # within bfloat16's rounding of float32's, and not equal to them (the products did round).
    config = tiny_config()
    out = {}
    for matmul in ("compute", "bfloat16"):
        config.model.matmul_dtype = matmul
        out[matmul] = first_step(config)[2]
    a, b = out["compute"], out["bfloat16"]
    assert a["loss_sum"] != b["loss_sum"]
    np.testing.assert_allclose(b["loss_sum"], a["loss_sum"], rtol=1e-2)
    np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=5e-2)


def test_weight_decay_moves_matrices_by_learning_rate_times_decay_and_leaves_vectors():
    # AdamW (train.weight_decay) against Adam through the trainer's own step, from the same
    # parameters and batch: Adam's update is the same, and each matrix and embedding then
    # also moves by -lr * decay * itself (its value before the step); biases and LayerNorm do not.
    config = tiny_config()
    decay = 0.5
    out = {}
    for wd in (0.0, decay):
        config.train.weight_decay = wd
        before, out[wd], metrics = first_step(config)
        assert metrics["nonfinite"] == 0
    lr = float(make_schedule(config)(0))
    assert lr > 0
    moved = 0
    leaves = zip(*(jax.tree.leaves(t) for t in (before, out[0.0], out[decay])))
    for p, adam, adamw in leaves:
        p, adam, adamw = (np.asarray(a, np.float64) for a in (p, adam, adamw))
        shift = lr * decay * p if p.ndim >= 2 else 0.0 * p
        np.testing.assert_allclose(adamw, adam - shift, rtol=0, atol=1e-6)
        moved += p.ndim >= 2 and np.abs(shift).max() > 1e-4  # far above the tolerance
    assert moved >= 3  # the embedding and the layers' matrices


def test_loss_keep_auto_is_exp_on_cpus_and_logits_elsewhere():
    assert loss_keep("cpu") == "exp"
    assert loss_keep("gpu") == "logits"
    assert resolve_loss_keep("auto", sharding.make_mesh()) == "exp"  # tests run on CPUs
    assert resolve_loss_keep("logits", sharding.make_mesh()) == "logits"


def test_schedule_matches_formula():
    schedule = inverse_sqrt_schedule(d_model=512, warmup_steps=4000, scale=1.0)
    for step in (1, 100, 3999, 4000, 4001, 100_000):
        expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
        # optax counts updates from 0; update number `step - 1` uses the paper's `step`.
        np.testing.assert_allclose(schedule(step - 1), expected, rtol=1e-6)
    peak = 512**-0.5 * 4000**-0.5
    np.testing.assert_allclose(schedule(3999), peak, rtol=1e-6)


@pytest.mark.parametrize("shape", ["linear", "cosine"])
def test_decay_schedules_warm_up_like_the_paper_then_fall_towards_zero(shape):
    paper = inverse_sqrt_schedule(d_model=256, warmup_steps=100, scale=0.5)
    decay = decay_to_zero_schedule(256, 100, 1000, 0.5, shape=shape)
    for count in (0, 10, 98, 99):  # the warm-up and the peak are the paper's
        np.testing.assert_allclose(decay(count), paper(count), rtol=1e-6)
    peak = 0.5 * 256**-0.5 * 100**-0.5
    rates = np.array([float(decay(c)) for c in range(99, 1000)])
    assert np.all(np.diff(rates) < 0), "the rate falls at every step after the peak"
    # Halfway through the decay: half the peak (linear), and cos(pi / 2) = 0 gives half too.
    p_half = (550 - 100) / (1000 - 100 + 1)
    expected = (1 - p_half) if shape == "linear" else 0.5 * (1 + math.cos(math.pi * p_half))
    np.testing.assert_allclose(decay(549), peak * expected, rtol=1e-5)
    assert 0 < rates[-1] < peak * 1e-2, "the last step's rate is small, never 0"


def test_make_schedule_follows_train_lr_decay():
    config = Config()
    config.train.num_train_steps, config.train.warmup_steps = 1000, 100
    assert float(make_schedule(config)(999)) == float(inverse_sqrt_schedule(512, 100)(999))
    config.train.lr_decay = "linear"
    # The last step falls 900 of the 901 steps of the decay: 1/901 of the peak is left.
    peak = float(make_schedule(config)(99))
    np.testing.assert_allclose(make_schedule(config)(999), peak / 901, rtol=1e-4)
    config.train.lr_decay = "step"
    with pytest.raises(ValueError, match="train.lr_decay"):
        config.validate()
    config.train.lr_decay, config.train.warmup_steps = "cosine", 1000
    with pytest.raises(ValueError, match="train.warmup_steps") as error:
        config.validate()
    # Each flag is named once with its value.
    assert str(error.value).endswith(
        "must be below --config.train.num_train_steps=1000 when --config.train.lr_decay=cosine"
    )
