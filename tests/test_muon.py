"""Muon for the linear layers' kernels (`train.optimizer=muon`, translate/training/optim.py)."""

import jax
import numpy as np
import pytest
from helpers import tiny_config
from test_losses_optim import first_step
from test_regularisers import resumes_bit_for_bit

from translate import sharding
from translate.training.opening import check_config
from translate.training.optim import (
    MUON_RMS,
    make_schedule,
    muon_params,
    orthogonalize,
)
from translate.training.steps import make_steps
from translate.workdir import Workdir, write_config


@pytest.mark.parametrize("shape", [(32, 96), (96, 32), (64, 64)])
def test_orthogonalize_takes_every_singular_value_near_one_in_the_same_directions(shape):
    g = np.asarray(jax.random.normal(jax.random.key(0), shape)) * 7.0
    o = np.asarray(orthogonalize(g))
    assert o.shape == g.shape
    # The quintic iteration leaves the singular values in about [0.7, 1.2], not at 1 exactly.
    s = np.linalg.svd(o, compute_uv=False)
    assert 0.6 < s.min() and s.max() < 1.25, s
    u, _, vt = np.linalg.svd(g, full_matrices=False)
    polar = u @ vt  # the exact semi-orthogonal factor
    cosine = np.sum(o * polar) / (np.linalg.norm(o) * np.linalg.norm(polar))
    assert cosine > 0.95


def test_muon_moves_the_kernels_and_leaves_the_embedding_biases_and_norms_to_adam():
    params, _ = make_steps(tiny_config(), 64, sharding.make_mesh()).init(jax.random.key(0))
    labels = muon_params(params)
    flat = jax.tree_util.tree_flatten_with_path(labels)[0]
    names = {jax.tree_util.keystr(path): on for path, on in flat}
    assert any(on for on in names.values())
    for name, on in names.items():
        assert on == ("kernel" in name), name  # the embedding, biases and LayerNorms: Adam


def test_muon_leaves_a_relative_position_bias_table_to_adam():
    config = tiny_config()
    config.model.positions = "relative"
    params, _ = make_steps(config, 64, sharding.make_mesh()).init(jax.random.key(0))
    flat = jax.tree_util.tree_flatten_with_path(muon_params(params))[0]
    names = {jax.tree_util.keystr(path): on for path, on in flat}
    assert any("table" in name for name in names)
    for name, on in names.items():
        assert on == ("kernel" in name), name


def test_muons_first_step_is_an_orthogonal_matrix_at_adamws_rate_and_adam_elsewhere():
    # The trainer's own step from the same parameters and batch, once with Adam and once with
    # Muon (no weight decay): every parameter Adam keeps moves as in the Adam run exactly; each
    # kernel moves by -lr * MUON_RMS * sqrt(max(fan_in, fan_out)) times a matrix whose singular
    # values are near 1.
    config = tiny_config()
    out = {}
    for name in ("adam", "muon"):
        config.train.optimizer = name
        before, out[name], metrics = first_step(config)
        assert metrics["nonfinite"] == 0
    lr = float(make_schedule(config)(0))
    labels = jax.tree.leaves(muon_params(before))
    leaves = zip(labels, *(jax.tree.leaves(t) for t in (before, out["adam"], out["muon"])))
    kernels = 0
    for is_kernel, p, adam, muon in leaves:
        if not is_kernel:
            np.testing.assert_array_equal(muon, adam)
            continue
        kernels += 1
        step = (np.asarray(p, np.float64) - np.asarray(muon, np.float64)) / (
            lr * MUON_RMS * max(p.shape) ** 0.5
        )
        s = np.linalg.svd(step, compute_uv=False)
        # Directions where the gradient is (almost) zero stay small: a tiny batch's gradient may
        # be short of full rank. None above the band, most within it.
        assert s.max() < 1.25, s
        assert np.mean((0.6 < s) & (s < 1.25)) >= 0.8, s
        assert not np.allclose(muon, adam)
    assert kernels >= 6


def test_the_optimizer_cannot_be_switched_by_a_resume(config, tmp_path):
    workdir = Workdir(tmp_path)
    write_config(config, workdir)  # Adam, as training writes it once its data has loaded
    config.train.optimizer = "muon"
    with pytest.raises(ValueError, match=r"config.train.optimizer = adam, now muon .*--force"):
        check_config(config, workdir, force=False)


@pytest.mark.slow  # three tiny runs, 30-45 s
def test_muon_resumes_bit_for_bit(config, tmp_path):
    """A run stopped at step 3 and resumed ends where an uninterrupted one does (Muon's
    momentum is checkpointed)."""
    config.train.optimizer = "muon"
    config.train.weight_decay = 0.1
    resumes_bit_for_bit(config, tmp_path)
