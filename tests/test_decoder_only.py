"""The decoder-only variant (translate/models/decoder_only.py): masks, packing, decoding."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh
from test_decode import sources, strip, uncached_greedy
from test_model import unpacked_batch
from test_trainer import run_steps, tiny_batches

from scripts import model_summary
from translate import sharding, translate_text
from translate.config import ModelConfig, load_config
from translate.data.batching import Batch
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from translate.decoding.search import beam_search, greedy_search, translate_tokens
from translate.decoding.settings import DecodeSettings
from translate.models.decoder_only import DecoderOnlyTransformer
from translate.models.transformer import Transformer
from translate.trained import load_model
from translate.training.trainer import train_and_evaluate

VOCAB = 64
PREFIX = ["causal", "bidirectional"]


def make_model(prefix_attention="causal", norm_position="post", seed=0, dropout_rate=0.1):
    config = ModelConfig(
        num_layers=2,
        d_model=32,
        num_heads=4,
        d_ff=64,
        dropout_rate=dropout_rate,
        compute_dtype="float32",
        architecture="decoder_only",
        prefix_attention=prefix_attention,
        norm_position=norm_position,
    )
    return DecoderOnlyTransformer(config, VOCAB, rngs=nnx.Rngs(seed))


def random_tokens(key, shape):
    return jax.random.randint(jax.random.key(key), shape, 4, VOCAB)


def stack_outputs(model, src, tgt_in):
    """The stack's output over one unpadded pair [S + T, D], source tokens first."""
    s, t = src.shape[0], tgt_in.shape[0]
    return model.stack(
        jnp.concatenate([src, tgt_in])[None],
        jnp.ones((1, s + t), jnp.int32),
        jnp.arange(s + t)[None],
        (jnp.arange(s + t) < s)[None],
    )[0]


@pytest.mark.parametrize("prefix_attention", PREFIX)
def test_target_tokens_see_the_whole_source_and_only_earlier_targets(prefix_attention):
    model = make_model(prefix_attention)
    src, tgt = random_tokens(0, (2, 7)), random_tokens(1, (2, 9))
    before = model(unpacked_batch(src, tgt))
    changed_tgt = model(unpacked_batch(src, tgt.at[:, 5:].set(random_tokens(2, (2, 4)))))
    np.testing.assert_allclose(before[:, :5], changed_tgt[:, :5], rtol=1e-5, atol=1e-5)
    assert not np.allclose(before[:, 5:], changed_tgt[:, 5:])
    # The last source token reaches every target position.
    changed_src = model(unpacked_batch(src.at[:, -1].set(random_tokens(3, (2,))), tgt))
    assert not np.any(np.all(np.isclose(before, changed_src, rtol=1e-5, atol=1e-5), axis=-1))


@pytest.mark.parametrize("prefix_attention", PREFIX)
def test_source_tokens_see_later_source_tokens_only_with_bidirectional_prefix(prefix_attention):
    model = make_model(prefix_attention)
    src, tgt = random_tokens(0, (8,)), random_tokens(1, (5,))
    before = stack_outputs(model, src, tgt)
    after = stack_outputs(model, src.at[5].set((src[5] + 1 - 4) % (VOCAB - 4) + 4), tgt)
    # Source tokens 0..4 sit before the change.
    unchanged = np.all(np.isclose(before[:5], after[:5], rtol=1e-5, atol=1e-5), axis=-1)
    if prefix_attention == "causal":
        assert unchanged.all()
    else:
        assert not unchanged.any()


@pytest.mark.parametrize("prefix_attention", PREFIX)
def test_padding_does_not_change_outputs_on_real_tokens(prefix_attention):
    model = make_model(prefix_attention)
    src, tgt = random_tokens(0, (2, 7)), random_tokens(1, (2, 9))
    plain = model(unpacked_batch(src, tgt))
    padded = model(unpacked_batch(jnp.pad(src, ((0, 0), (0, 5))), jnp.pad(tgt, ((0, 0), (0, 3)))))
    np.testing.assert_allclose(plain, padded[:, :9], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 11-20 s; the encoder-decoder's twin (test_model.py) runs by default
@pytest.mark.parametrize("prefix_attention", PREFIX)
def test_packed_rows_match_separate_rows(prefix_attention):
    model = make_model(prefix_attention)
    # Two pairs of different source lengths: the second target's positions start elsewhere.
    src = [random_tokens(0, (4,)), random_tokens(1, (7,))]
    tgt = [random_tokens(2, (6,)), random_tokens(3, (3,))]
    separate = [model(unpacked_batch(s[None], t[None]))[0] for s, t in zip(src, tgt)]
    packed = Batch(
        src=jnp.concatenate(src)[None],
        src_segments=jnp.array([[1] * 4 + [2] * 7]),
        src_positions=jnp.concatenate([jnp.arange(4), jnp.arange(7)])[None],
        tgt_in=jnp.concatenate(tgt)[None],
        tgt_segments=jnp.array([[1] * 6 + [2] * 3]),
        tgt_positions=jnp.concatenate([jnp.arange(6), jnp.arange(3)])[None],
    )
    together = model(packed)[0]
    np.testing.assert_allclose(separate[0], together[:6], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(separate[1], together[6:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("prefix_attention", PREFIX)
def test_cached_decode_matches_full_forward(prefix_attention, norm_position):
    model = make_model(prefix_attention, norm_position)
    # Sources of different lengths (trailing padding), as the search gives them.
    src = jnp.array([[5, 6, 7, 8, 9, 10, EOS_ID, 0], [11, 12, EOS_ID, 0, 0, 0, 0, 0]])
    tgt = random_tokens(1, (2, 7)).at[:, 0].set(BOS_ID)
    full = model(unpacked_batch(src, tgt))  # [B, T, V]
    cache = model.prefill(src, (src > 0).astype(jnp.int32), copies=1, max_len=10)
    for t in range(tgt.shape[1]):
        logits, cache = model.decode_step(tgt[:, t], jnp.array(t), cache)
        np.testing.assert_allclose(logits, full[:, t], rtol=1e-5, atol=1e-5)


def peaked(model):
    """An untrained model with peaked distributions, so EOS is reached (as in test_decode.py)."""
    model.embed.embedding[...] = model.embed.embedding[...] * 8.0
    return nnx.split(model, nnx.Param)


def test_greedy_search_equals_rerunning_the_full_forward_pass():
    # The search drives prefill and decode_step (their equality with the full forward pass is
    # tested above for both prefix masks); the prefix LM's prefill is the more demanding.
    graphdef, params = peaked(make_model("bidirectional", dropout_rate=0.0))
    src = sources()
    tokens = translate_tokens((graphdef,), (params,), src, DecodeSettings(1, 0.6, 6))
    expected = uncached_greedy(graphdef, params, src, max_extra_len=6)
    assert [strip(r) for r in np.asarray(tokens)] == expected


@pytest.mark.slow  # 15 s; the encoder-decoder's twin (test_forced) runs by default
def test_beam_hypotheses_score_their_full_forward_log_probability():
    # With alpha 0 a finished hypothesis's score is its log-probability; the full forward pass
    # must give the same. A cache row left with the wrong hypothesis would break this.
    graphdef, params = peaked(make_model(dropout_rate=0.0))
    src = sources()
    tokens, scores = beam_search(
        (graphdef,), (params,), src, beam_size=4, alpha=0.0, max_extra_len=6
    )  # [B, W, L], [B, W]
    b, w, length = tokens.shape
    hyps = np.asarray(tokens).reshape(b * w, length)
    tgt_in = np.concatenate([np.full((b * w, 1), BOS_ID), hyps[:, :-1]], axis=1)
    tgt_in[hyps == PAD_ID] = PAD_ID  # nothing after EOS
    logits = nnx.merge(graphdef, params)(unpacked_batch(np.repeat(src, w, axis=0), tgt_in))
    log_probs = jax.nn.log_softmax(logits)  # [B * W, L, V]
    picked = np.take_along_axis(np.asarray(log_probs), hyps[:, :, None], axis=2)[:, :, 0]
    totals = np.where(hyps != PAD_ID, picked, 0.0).sum(axis=1).reshape(b, w)
    finished = np.asarray(scores) > -1e8
    assert finished[:, 0].all()
    np.testing.assert_allclose(np.asarray(scores)[finished], totals[finished], rtol=1e-4, atol=1e-4)


def test_an_ensemble_may_mix_the_two_architectures():
    # Each model reads the source its own way; the search averages their log-probabilities.
    config = ModelConfig(num_layers=2, d_model=32, num_heads=4, d_ff=64, compute_dtype="float32")
    encoder_decoder = peaked(Transformer(config, VOCAB, rngs=nnx.Rngs(1)))
    decoder_only = peaked(make_model(dropout_rate=0.0))
    src = sources()
    both = tuple(zip(encoder_decoder, decoder_only))
    tokens, _ = greedy_search(*both, src, max_extra_len=6)
    assert all(EOS_ID in strip(row) for row in np.asarray(tokens))


def as_decoder_only(config):
    """The tiny config as a pre-LayerNorm prefix LM: the variants together."""
    config.model.architecture = "decoder_only"
    config.model.prefix_attention = "bidirectional"
    config.model.norm_position = "pre"
    return config


@pytest.mark.slow  # the encoder-decoder's twin (test_trainer.py) runs by default
def test_eight_device_train_step_matches_one_device(config):
    as_decoder_only(config).train.grad_accum_steps = 2
    assert jax.device_count() == 8
    batches = tiny_batches(config, num_devices=8, count=1)
    one, one_metrics, _ = run_steps(config, Mesh(np.array(jax.devices()[:1]), ("data",)), batches)
    eight, eight_metrics, _ = run_steps(config, sharding.make_mesh(), batches)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(eight)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one_metrics["loss_sum"], eight_metrics["loss_sum"], rtol=1e-5)


@pytest.mark.slow  # three short trainings and a decode: about a minute of CPU
def test_a_run_resumes_bit_exactly_and_translates_from_averaged_checkpoints(config, tmp_path):
    as_decoder_only(config)
    report = train_and_evaluate(config, tmp_path / "straight")
    assert report["step"] == 6 and report["num_sentences"] == 16
    config.train.num_train_steps = 3
    train_and_evaluate(config, tmp_path / "resumed")
    config.train.num_train_steps = 6
    train_and_evaluate(config, tmp_path / "resumed")
    a = load_model(tmp_path / "straight")[1]
    b = load_model(tmp_path / "resumed")[1]
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # The translate command, n-best from the mean of the checkpoints at steps 3 and 6.
    source, target = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("the cat sleeps .\n\na man reads .\n", encoding="utf-8")
    translate_text.main(
        [
            f"--workdir={tmp_path / 'straight'}",
            "--average=2",
            "--beam_size=3",
            "--nbest=2",
            f"--input={source}",
            f"--output={target}",
        ]
    )
    lines = [line.split("\t") for line in target.read_text(encoding="utf-8").splitlines()]
    assert {int(line[0]) for line in lines} == {0, 1, 2}
    for i in (0, 2):
        scores = [float(line[1]) for line in lines if int(line[0]) == i]
        assert 1 <= len(scores) <= 2 and scores == sorted(scores, reverse=True)


CONFIGS = pathlib.Path(__file__).parent.parent / "configs"


def differing_fields(a, b):
    flat = [
        {f"{section}.{k}": v for section, fields in c.to_dict().items() for k, v in fields.items()}
        for c in (a, b)
    ]
    return {k for k in flat[0] if flat[0][k] != flat[1][k]}


@pytest.mark.slow  # 7 s on 2 cores (model summaries); out of the default run
def test_multi30k_variants_change_only_their_variant_and_match_the_recipes_size(capsys):
    recipe = load_config(CONFIGS / "multi30k.py")
    postnorm = load_config(CONFIGS / "multi30k_postnorm.py")
    decoder_only = load_config(CONFIGS / "multi30k_decoder_only.py")
    assert differing_fields(recipe, postnorm) == {"model.norm_position"}
    assert differing_fields(recipe, decoder_only) == {
        "model.architecture",
        "model.num_layers",
        "model.d_ff",
    }
    model_summary.main(
        [f"--config={CONFIGS / name}.py" for name in ("multi30k", "multi30k_decoder_only")]
    )
    lines = capsys.readouterr().out.splitlines()
    totals = [int(line.split(": ")[1]) for line in lines if line.startswith("total parameters")]
    assert len(totals) == 2 and abs(totals[1] / totals[0] - 1) < 0.05
    assert lines[-1].startswith(f"{CONFIGS / 'multi30k_decoder_only.py'}: ")
