"""Checks that need a GPU: cuDNN attention, bfloat16 training and decoding, one compilation.

    python -m pytest -m gpu -q    # on a GPU machine (7 tests; the first 6: 141 s on one H100)

With `-m gpu` tests/conftest.py leaves the platform to JAX; every test here is skipped where
JAX's default backend is not a GPU, so the default (CPU) run collects and skips them.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from translate import search_store, sharding
from translate.config import Config, ModelConfig
from translate.data.batching import BatchLayout, make_batch, plan_epoch
from translate.data.corpus import TokenizedCorpus
from translate.data.tokenizer import EOS_ID, PAD_ID
from translate.decoding import saved_searches
from translate.decoding.search import beam_search, greedy_search
from translate.decoding.sentences import TracedSearches
from translate.decoding.settings import decode_settings
from translate.models.attention import MultiHeadAttention, attention_mask
from translate.models.factory import abstract_model, resolve_model_attention
from translate.training.optim import make_optimizer
from translate.training.steps import Packed, make_steps

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        jax.default_backend() != "gpu",
        reason=f"no GPU: JAX's default backend is {jax.default_backend()} "
        "(on a GPU machine run `pytest -m gpu`)",
    ),
]

# The base model's attention (d_model 512, 8 heads of 64) over rows of realistic length.
D_MODEL, NUM_HEADS, BATCH, SRC_LEN, TGT_LEN = 512, 8, 8, 128, 96
# bfloat16 keeps 8 significant bits, so each rounding moves a value by up to 2^-9 relative.
# Given the same bf16 inputs, the two kernels round q k^T, the probabilities and the output at
# different places (cuDNN keeps unnormalised probabilities in float32 tiles and divides at the
# end; XLA normalises whole rows first), so they differ by a few such roundings: 4e-3 in norm is
# what XLA in bf16 itself shows against float32 here. 1e-2 is that with a margin, and a kernel
# that got a mask, the scale or a gradient wrong misses it by orders of magnitude.
BF16_RTOL = 1e-2


def relative_error(a, b) -> float:
    """||a - b|| / ||b||, in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def round_to_bfloat16(tree):
    """The nearest bf16 values, kept in float32: every compute dtype then reads the same numbers."""
    return jax.tree.map(lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), tree)


def random_segments(rng: np.random.Generator, sentences: np.ndarray, length: int) -> np.ndarray:
    """Segment ids [B, length]: row b holds sentences[b] sentences of random lengths.

    Rows after the first end in 0 to length/2 slots of padding (segment 0).
    """
    segments = np.zeros((len(sentences), length), np.int32)
    for b, count in enumerate(sentences):
        used = length if b == 0 else int(rng.integers(length // 2, length + 1))
        cuts = np.sort(rng.choice(np.arange(1, used), size=count - 1, replace=False))
        segments[b, :used] = np.searchsorted(cuts, np.arange(used), side="right") + 1
    return segments


@functools.partial(jax.jit, static_argnums=0)
@functools.partial(jax.value_and_grad, argnums=(1, 2, 3), has_aux=True)
def attention_loss(graphdef, state, x, context, mask, cotangent, real):
    """<output, cotangent> over real queries, and the output [B, Tq, D] there."""
    y = nnx.merge(graphdef, state)(x, mask, context=context)[0].astype(jnp.float32)
    # Outputs at padded queries are never read by the model, and kernels may differ there.
    y = jnp.where(real[..., None], y, 0.0)
    return jnp.sum(y * cotangent), y


def attention_module(config: ModelConfig, dtype, kernel: str, seed: int) -> MultiHeadAttention:
    """Attention over a context given to it (the keys of the self-attention cases are x)."""
    return MultiHeadAttention(
        config, jnp.dtype(dtype), kernel, nnx.Rngs(seed), self_attention=False
    )


def attention_outputs(kernel, dtype, state, inputs, num_kv_heads=0) -> dict[str, np.ndarray]:
    """Output at real queries, and gradients of <output, cotangent> there, by name."""
    config = ModelConfig(
        d_model=D_MODEL,
        num_heads=NUM_HEADS,
        compute_dtype=dtype,
        attention=kernel,
        num_kv_heads=num_kv_heads,
    )
    attention = resolve_model_attention(config)
    graphdef, _ = nnx.split(attention_module(config, dtype, attention, 0))
    # Full float32 products for the reference: GPUs default to TF32 (10 bits) for float32.
    with jax.default_matmul_precision("highest" if dtype == "float32" else "default"):
        (_, y), (params, dx, dcontext) = attention_loss(graphdef, state, *inputs)
    out = {"output": y, "d input": dx, "d context": dcontext}
    for name in ("query", "key", "value", "out"):
        # Bias gradients are left out: they are sums over all B * T positions that XLA may
        # reduce in bf16 (1.7e-2 from float32 on the CPU), whatever the attention kernel.
        out[f"d {name} kernel"] = params[name]["kernel"][...]
    return {name: np.asarray(value) for name, value in out.items()}


def assert_cudnn_attention_matches_xla(
    q_segments, k_segments, causal, self_attention, seed, num_kv_heads=0
):
    """cuDNN in bf16 against XLA in bf16 and in float32: one set of parameters, fresh inputs."""
    config = ModelConfig(
        d_model=D_MODEL, num_heads=NUM_HEADS, compute_dtype="float32", num_kv_heads=num_kv_heads
    )
    # Parameters are float32 whatever the compute dtype: all three modules get this state.
    _, state = nnx.split(attention_module(config, "float32", "xla", seed))
    keys = jax.random.split(jax.random.key(seed), 3)
    tq, tk = q_segments.shape[1], k_segments.shape[1]
    # Unit-variance inputs, as the LayerNorm before every attention gives.
    x = jax.random.normal(keys[0], (BATCH, tq, D_MODEL))
    context = x if self_attention else jax.random.normal(keys[1], (BATCH, tk, D_MODEL))
    cotangent = jax.random.normal(keys[2], (BATCH, tq, D_MODEL))
    state, x, context, cotangent = round_to_bfloat16((state, x, context, cotangent))
    mask = attention_mask(jnp.asarray(q_segments), jnp.asarray(k_segments), causal)
    inputs = (x, context, mask, cotangent, jnp.asarray(q_segments > 0))
    cudnn = attention_outputs("cudnn", "bfloat16", state, inputs, num_kv_heads)
    xla = attention_outputs("xla", "bfloat16", state, inputs, num_kv_heads)
    reference = attention_outputs("xla", "float32", state, inputs, num_kv_heads)
    for name in cudnn:
        assert relative_error(cudnn[name], xla[name]) < BF16_RTOL, f"{name}: cuDNN vs XLA, bf16"
        assert relative_error(cudnn[name], reference[name]) < BF16_RTOL, f"{name}: vs float32"
        assert relative_error(xla[name], reference[name]) < BF16_RTOL, f"{name}: XLA vs float32"


def test_cudnn_attention_matches_xla_with_padding():
    rng = np.random.default_rng(0)
    ones = np.ones(BATCH, np.int64)
    src, tgt = random_segments(rng, ones, SRC_LEN), random_segments(rng, ones, TGT_LEN)
    assert_cudnn_attention_matches_xla(src, src, False, True, seed=1)  # encoder self-attention
    assert_cudnn_attention_matches_xla(tgt, src, False, False, seed=2)  # cross-attention


def test_cudnn_attention_matches_xla_with_causal_mask():
    tgt = random_segments(np.random.default_rng(3), np.ones(BATCH, np.int64), TGT_LEN)
    assert_cudnn_attention_matches_xla(tgt, tgt, True, True, seed=4)


def test_cudnn_attention_matches_xla_with_packed_segments():
    rng = np.random.default_rng(5)
    sentences = rng.integers(1, 7, BATCH)  # sentences per row, the same on both sides
    src, tgt = random_segments(rng, sentences, SRC_LEN), random_segments(rng, sentences, TGT_LEN)
    assert_cudnn_attention_matches_xla(src, src, False, True, seed=6)
    assert_cudnn_attention_matches_xla(tgt, tgt, True, True, seed=7)
    assert_cudnn_attention_matches_xla(tgt, src, False, False, seed=8)


def test_cudnn_attention_matches_xla_with_grouped_key_and_value_heads():
    # model.num_kv_heads: fewer key and value heads than query heads, in both kernels.
    rng = np.random.default_rng(9)
    sentences = rng.integers(1, 7, BATCH)
    src, tgt = random_segments(rng, sentences, SRC_LEN), random_segments(rng, sentences, TGT_LEN)
    for num_kv_heads, seed in ((NUM_HEADS // 2, 10), (1, 11)):
        assert_cudnn_attention_matches_xla(tgt, tgt, True, True, seed, num_kv_heads)
        assert_cudnn_attention_matches_xla(tgt, src, False, False, seed + 10, num_kv_heads)


# A toy translation, word for word through a fixed dictionary (a permutation of the vocabulary),
# that the tiny model learns in some hundred steps: every held-out sentence right by step 700 on
# the CPU.
VOCAB = 32
TRAIN_STEPS = 800


def toy_pairs(rng: np.random.Generator, count: int) -> tuple[list, list]:
    """`count` pairs of 3 to 10 tokens: sources drawn by rng, targets by the dictionary."""
    dictionary = np.random.default_rng(0).permutation(np.arange(4, VOCAB))
    src = [rng.integers(4, VOCAB, rng.integers(3, 11)) for _ in range(count)]
    return src, [dictionary[s - 4] for s in src]


def with_dtype(config: Config, dtype: str) -> Config:
    return dataclasses.replace(config, model=dataclasses.replace(config.model, compute_dtype=dtype))


def copy(tree):
    """A fresh copy for a train step, which donates (and so deletes) its parameters."""
    return jax.tree.map(jnp.copy, tree)


def toy_batches(config: Config, mesh) -> list[dict[str, np.ndarray]]:
    """An epoch of 4,000 toy pairs in the config's batch layout: 62 batches for the tiny one."""
    src, tgt = toy_pairs(np.random.default_rng(1), 4000)
    corpus = TokenizedCorpus.from_lists(src, tgt)
    layout = BatchLayout.from_config(
        config.data.tokens_per_batch, config.data.row_len, config.train.grad_accum_steps, mesh.size
    )
    return [make_batch(corpus, rows, layout) for rows in plan_epoch(corpus, layout, 0, 0)]


@pytest.fixture(scope="module")
def trained():
    """The tiny config's model trained in float32 on the toy task, with its batches."""
    config = with_dtype(tiny_config(), "float32")
    # The tiny config's 10-step warmup peaks at a rate of 0.056 (d_model 32), too high for the
    # model to learn anything; 100 steps peak at 0.018.
    config.train.warmup_steps = 100
    mesh = sharding.make_mesh()
    batches = toy_batches(config, mesh)
    steps = make_steps(config, VOCAB, mesh)
    params, opt_state = steps.init(jax.random.key(0))
    step_fn = steps.train
    for step in range(TRAIN_STEPS):
        batch = sharding.put_batch(batches[step % len(batches)], mesh)
        params, opt_state, _ = step_fn(params, opt_state, batch, step, jax.random.key(1))
    return config, params, batches, mesh


def test_bfloat16_train_step_loss_matches_float32(trained):
    config, params, batches, mesh = trained
    losses = {}
    for dtype in ("bfloat16", "float32"):
        # bf16 with the config's attention ("auto"): the step a GPU runs by default.
        c = with_dtype(config, dtype)
        optimizer, _ = make_optimizer(c)
        step_fn = make_steps(c, VOCAB, mesh).train
        # Same parameters, batch, step and dropout key: the dropout masks do not depend on dtype.
        batch = sharding.put_batch(batches[0], mesh)
        _, _, metrics = step_fn(
            copy(params), optimizer.init(params), batch, TRAIN_STEPS, jax.random.key(1)
        )
        losses[dtype] = float(metrics["loss_sum"] / metrics["tokens"])
    # The loss is a float32 log-softmax of logits from bf16 activations, averaged over hundreds
    # of tokens: a few bf16 roundings (2^-9 each) of relative error, as for attention above.
    assert abs(losses["bfloat16"] - losses["float32"]) < BF16_RTOL * losses["float32"], losses


def held_out_sources(count: int, width: int) -> tuple[np.ndarray, list]:
    """Source tokens [count, width] (EOS, then PAD) of new toy pairs, and their targets."""
    src, tgt = toy_pairs(np.random.default_rng(2), count)
    rows = np.full((count, width), PAD_ID, np.int32)
    for row, s in zip(rows, src):
        row[: len(s) + 1] = [*s, EOS_ID]
    return rows, [[*t, EOS_ID] for t in tgt]


def strip(row) -> list:
    row = [int(t) for t in row]
    return row[: row.index(EOS_ID) + 1] if EOS_ID in row else row


def test_bfloat16_greedy_and_beam_outputs_equal_float32(trained):
    config, params, _, _ = trained
    src, targets = held_out_sources(32, 16)
    src = jnp.asarray(src)
    d = config.decode
    outputs = {}
    for dtype in ("bfloat16", "float32"):
        graphdef, _ = abstract_model(with_dtype(config, dtype), VOCAB)
        greedy, _ = greedy_search((graphdef,), (params,), src, max_extra_len=d.max_extra_len)
        beam, _ = beam_search(
            (graphdef,),
            (params,),
            src,
            d.beam_size,
            d.length_penalty,
            max_extra_len=d.max_extra_len,
        )
        # The best hypothesis is the output. The others of a model this sure are near-ties far
        # below it, which bf16 activations may reorder (6 of the 96 here on the CPU).
        outputs[dtype] = (np.asarray(greedy), np.asarray(beam[:, 0]))
    # Equal outputs only mean something from a model that has learned the task: near-ties
    # between its best tokens, which any rounding may flip, are then rare.
    learned = np.mean([strip(row) == t for row, t in zip(outputs["float32"][0], targets)])
    assert learned >= 0.9, f"the model translates {learned:.0%} of held-out sources correctly"
    np.testing.assert_array_equal(outputs["bfloat16"][0], outputs["float32"][0])  # greedy
    np.testing.assert_array_equal(outputs["bfloat16"][1], outputs["float32"][1])  # beam


def test_train_step_compiles_once_over_several_batches():
    # The config's own dtype and kernel ("auto": bf16, and cuDNN on a GPU that can run it),
    # started as the trainer starts it, so every step meets the shardings of the one before.
    config, mesh = tiny_config(), sharding.make_mesh()
    steps = make_steps(config, VOCAB, mesh)
    params, opt_state = (Packed.of(x) for x in steps.init(jax.random.key(0)))
    step_fn = steps.packed_train  # the trainer's
    for step, batch in enumerate(toy_batches(config, mesh)[:4]):
        params, opt_state, _ = step_fn(
            params, opt_state, sharding.put_batch(batch, mesh), step, jax.random.key(1)
        )
    assert step_fn._cache_size() == 1


def test_a_search_with_cudnn_attention_is_saved_and_read_back(trained, tmp_path):
    """translate-text's saved searches on a GPU: jax.export refuses cuDNN's attention calls by
    default (seen on an H100, 2026-11-28), so the search must be saved with them allowed, and a
    later command must run it from the saved form with no model, as the search traced here.
    (translate-text keeps no saved searches on a GPU since a crash on an H200, 2026-11-28:
    search_store.SAVED_SEARCH_PLATFORMS; this keeps the saved form right for when it does.)"""
    config, params, _, _ = trained
    config = with_dtype(config, "bfloat16")
    assert resolve_model_attention(config.model) == "cudnn"
    graphdefs, params = (abstract_model(config, VOCAB)[0],), (params,)
    settings = decode_settings(config.decode)
    leaves = jax.tree.leaves(params)
    setup = search_store.SavedEnsemble(tmp_path / "cache", "a-setup")
    setup.save(leaves, [[TRAIN_STEPS]], [])
    made = saved_searches.SavedSearches(setup, leaves, lambda: (graphdefs, params), settings)
    src, _ = held_out_sources(32, 16)
    expected = jax.device_get(TracedSearches(graphdefs, params, settings)(src))
    found = jax.device_get(made(src))
    assert made.unsaved == []
    (name,) = [n for n in made.setup.directory.iterdir() if n.name.endswith(search_store.EXPORTED)]
    exported, _ = setup.load_search(name.name)
    assert "__cudnn$fmha" in exported.mlir_module()

    def model_not_needed():
        raise AssertionError("the search was saved: no model should be loaded")

    loaded = saved_searches.SavedSearches(setup, setup.load()[0], model_not_needed, settings)
    for outputs in (found, jax.device_get(loaded(src))):
        for a, b in zip(expected, outputs, strict=True):
            np.testing.assert_array_equal(a, b)
