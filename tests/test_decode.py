"""Greedy and beam search (translate/decoding/search.py)."""

import functools
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from translate.config import ModelConfig, load_config
from translate.data.batching import Batch
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from translate.decoding import loop
from translate.decoding import sampling as sampling_module
from translate.decoding import search as search_module
from translate.decoding.loop import cache_lengths
from translate.decoding.search import (
    NEG_INF,
    beam_search,
    greedy_search,
    length_penalty,
    search,
    translate_tokens,
)
from translate.decoding.settings import DecodeSettings
from translate.models.decoder_only import DecoderOnlyTransformer
from translate.models.transformer import Transformer

VOCAB = 24


def make_model(compute_dtype="float32"):
    config = ModelConfig(
        num_layers=2, d_model=32, num_heads=4, d_ff=64, compute_dtype=compute_dtype
    )
    model = Transformer(config, VOCAB, rngs=nnx.Rngs(0))
    # A larger embedding makes the untrained model's distributions peaked, so EOS is reached.
    model.embed.embedding[...] = model.embed.embedding[...] * 8.0
    return nnx.split(model, nnx.Param)


def sources():
    src = np.array(
        [
            [5, 6, 7, 8, EOS_ID, 0, 0, 0],
            [9, 10, EOS_ID, 0, 0, 0, 0, 0],
            [11, 12, 13, 14, 15, 16, 17, EOS_ID],
        ],
        np.int32,
    )
    return jnp.asarray(src)


def uncached_greedy(graphdef, params, src, max_extra_len):
    """Arg-max decoding by rerunning the full forward pass on the growing prefix.

    The prefix is padded to a fixed length (padding never changes outputs on real tokens, a
    property tested in test_model.py), so the jitted forward pass compiles once.
    """

    @jax.jit
    def next_logits(src_row, prefix, length):  # [S], [L], scalar -> [V] at position length-1
        positions = jnp.arange(prefix.shape[0])
        batch = Batch(
            src=src_row[None],
            src_segments=(src_row != PAD_ID).astype(jnp.int32)[None],
            src_positions=jnp.arange(src_row.shape[0])[None],
            tgt_in=prefix[None],
            tgt_segments=(positions < length).astype(jnp.int32)[None],
            tgt_positions=positions[None],
        )
        return nnx.merge(graphdef, params)(batch)[0, length - 1]

    outputs = []
    for row in np.asarray(src):
        n = int((row != PAD_ID).sum())
        limit = n - 1 + max_extra_len
        prefix = [BOS_ID]
        while True:
            padded = np.zeros(src.shape[1] + max_extra_len + 2, np.int32)
            padded[: len(prefix)] = prefix
            logits = next_logits(jnp.asarray(row), jnp.asarray(padded), len(prefix))
            token = EOS_ID if len(prefix) - 1 >= limit else int(jnp.argmax(logits))
            prefix.append(token)
            if token == EOS_ID:
                break
        outputs.append(prefix[1:])
    return outputs


def strip(row):
    row = [int(t) for t in row]
    return row[: row.index(EOS_ID) + 1] if EOS_ID in row else row


def test_beam_1_equals_greedy():
    graphdef, params = make_model()
    src = sources()
    tokens = translate_tokens((graphdef,), (params,), src, DecodeSettings(1, 0.6, 6))
    expected = uncached_greedy(graphdef, params, src, max_extra_len=6)
    assert [strip(r) for r in np.asarray(tokens)] == expected


def test_length_penalty_follows_its_formula():
    for length, alpha in [(1, 0.6), (10, 0.6), (37, 1.0), (5, 0.0)]:
        np.testing.assert_allclose(
            length_penalty(length, alpha), ((5 + length) / 6) ** alpha, rtol=1e-6
        )


@functools.partial(jax.jit, static_argnums=0)
def forward_log_probs(graphdef, params, batch: Batch) -> jax.Array:
    """log P of every target position [L, V], the full forward pass (jitted: eager took 4.5 s)."""
    return jax.nn.log_softmax(nnx.merge(graphdef, params)(batch)[0])


def sequence_log_prob(graphdef, params, src_row, out):
    n = int((src_row != PAD_ID).sum())
    tgt_in = jnp.array([[BOS_ID] + out[:-1]])
    batch = Batch(
        src=jnp.array([src_row[:n]]),
        src_segments=jnp.ones((1, n), jnp.int32),
        src_positions=jnp.arange(n)[None],
        tgt_in=tgt_in,
        tgt_segments=jnp.ones_like(tgt_in),
        tgt_positions=jnp.arange(len(out))[None],
    )
    log_probs = np.asarray(forward_log_probs(graphdef, params, batch))
    return float(sum(log_probs[i, t] for i, t in enumerate(out)))


@pytest.mark.slow  # 12-18 s; kept out of the default run's 10 minutes
def test_beam_scores_are_length_normalised_log_probabilities():
    graphdef, params = make_model()
    src = sources()
    tokens, scores = beam_search(
        (graphdef,), (params,), src, beam_size=4, alpha=0.6, max_extra_len=6
    )
    for b in range(src.shape[0]):
        out = strip(np.asarray(tokens[b, 0]))
        assert out[-1] == EOS_ID
        expected = sequence_log_prob(graphdef, params, np.asarray(src[b]), out)
        np.testing.assert_allclose(
            scores[b, 0], expected / length_penalty(len(out), 0.6), rtol=1e-4
        )
        assert np.all(np.diff(np.asarray(scores[b])) <= 0), "hypotheses are sorted best first"


@pytest.mark.slow  # 15 s; the beam's other properties stay in the default run
def test_beam_search_scores_at_least_as_well_as_greedy():
    graphdef, params = make_model()
    src = sources()
    greedy_tokens, _ = greedy_search((graphdef,), (params,), src, max_extra_len=6)
    _, beam_scores = beam_search(
        (graphdef,), (params,), src, beam_size=4, alpha=0.6, max_extra_len=6
    )
    for b in range(src.shape[0]):
        out = strip(np.asarray(greedy_tokens[b]))
        greedy_score = sequence_log_prob(graphdef, params, np.asarray(src[b]), out)
        greedy_score /= float(length_penalty(len(out), 0.6))
        assert beam_scores[b, 0] >= greedy_score - 1e-4


def test_output_never_exceeds_source_length_plus_max_extra_len():
    graphdef, params = make_model()
    src = sources()
    for beam in (1, 4):
        tokens = translate_tokens((graphdef,), (params,), src, DecodeSettings(beam, 0.6, 2))
        for b, row in enumerate(np.asarray(tokens)):
            out = strip(row)
            source_tokens = int((np.asarray(src[b]) != PAD_ID).sum()) - 1
            assert out[-1] == EOS_ID and len(out) - 1 <= source_tokens + 2


def test_bfloat16_decoding_forms_attention_scores_and_logits_in_float32():
    graphdef, params = make_model("bfloat16")
    model = nnx.merge(graphdef, params)
    src = sources()
    segments = (src != PAD_ID).astype(jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(src.shape[1]), src.shape)
    cache = model.init_cache(model.encode(src, segments, positions), segments, max_len=10)
    tokens = jnp.full((src.shape[0],), BOS_ID)
    jaxpr = jax.make_jaxpr(lambda c: model.decode_step(tokens, jnp.array(0), c))(cache)
    products = [e.outvars[0].aval for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    logits = [a for a in products if a.shape == (src.shape[0], VOCAB)]
    scores = [a for a in products if a.ndim == 4 and a.shape[1:3] == (4, 1)]  # [B, H, 1, L]
    assert len(logits) == 1 and len(scores) == 2 * 2  # self and cross attention, 2 layers
    assert all(a.dtype == jnp.float32 for a in logits + scores)
    # The other products (projections, feed-forward) stay in the compute dtype.
    assert any(a.dtype == jnp.bfloat16 for a in products)
    log_probs, _ = jax.jit(model.decode_step)(tokens, jnp.array(0), cache)
    assert log_probs.dtype == jnp.float32


@pytest.mark.slow  # 10 s on 2 cores
def test_bfloat16_beam_search_picks_the_hypotheses_of_a_float32_projected_reference(monkeypatch):
    """The reference multiplies the same bfloat16-rounded operands after casting them to float32."""
    import translate.models.attention as attention_module

    graphdef, params = make_model("bfloat16")
    src = sources()
    tokens, scores = beam_search(
        (graphdef,), (params,), src, beam_size=4, alpha=0.6, max_extra_len=6
    )
    greedy, _ = greedy_search((graphdef,), (params,), src, max_extra_len=6)

    fused_weigh = attention_module.weigh

    def upcast_weigh(q, keys, mask, bias, layout):
        return fused_weigh(q.astype(jnp.float32), keys.astype(jnp.float32), mask, bias, layout)

    def upcast_logits(self, y):
        embedding = self.embed.embedding[...].astype(self.dtype).astype(jnp.float32)
        return jnp.einsum("...d,vd->...v", y.astype(jnp.float32), embedding)

    monkeypatch.setattr(attention_module, "weigh", upcast_weigh)
    monkeypatch.setattr(Transformer, "logits", upcast_logits)
    jax.clear_caches()  # the searches are jitted on the graph definition, which is unchanged
    ref_tokens, ref_scores = beam_search(
        (graphdef,), (params,), src, beam_size=4, alpha=0.6, max_extra_len=6
    )
    ref_greedy, _ = greedy_search((graphdef,), (params,), src, max_extra_len=6)
    jax.clear_caches()
    np.testing.assert_array_equal(tokens, ref_tokens)
    np.testing.assert_array_equal(greedy, ref_greedy)
    # Only the order of float32 additions differs from the reference.
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5)


def make_decoder_only(prefix_attention: str, seed: int = 0):
    config = ModelConfig(
        num_layers=2,
        d_model=32,
        num_heads=4,
        d_ff=64,
        compute_dtype="float32",
        architecture="decoder_only",
        prefix_attention=prefix_attention,
        norm_position="pre",
    )
    model = DecoderOnlyTransformer(config, VOCAB, rngs=nnx.Rngs(seed))
    model.embed.embedding[...] = model.embed.embedding[...] * 8.0
    return nnx.split(model, nnx.Param)


def ensembles() -> dict[str, tuple[tuple, tuple]]:
    """(graphdefs, params) of each architecture alone, and of a mixed ensemble of two."""
    encoder_decoder = make_model()
    causal, prefix_lm = make_decoder_only("causal", 1), make_decoder_only("bidirectional", 2)
    return {
        "encoder_decoder": ((encoder_decoder[0],), (encoder_decoder[1],)),
        "decoder_only_causal": ((causal[0],), (causal[1],)),
        "decoder_only_prefix_lm": ((prefix_lm[0],), (prefix_lm[1],)),
        "ensemble": tuple(zip(encoder_decoder, prefix_lm)),
    }


def test_cache_lengths_double_up_to_the_search_limit():
    assert cache_lengths(200, 64, 32) == [32, 64, 128, 200]
    assert cache_lengths(99, 64, 32) == [32, 64, 99]
    assert cache_lengths(67, 64, 32) == [32, 67]  # 64 would leave 3 steps for the last loop
    assert cache_lengths(40, 64, 32) == [40]
    assert cache_lengths(15, 64, 32) == [15]
    # A batch of at most min_rows rows keeps one cache of the limit.
    assert cache_lengths(99, 32, 32) == [99]
    assert cache_lengths(67, 4, 32) == [67]


def test_a_one_sentence_search_is_one_loop_and_a_larger_batch_grows_its_cache():
    graphdefs, params = ensembles()["encoder_decoder"]
    one = jnp.zeros((1, 16), jnp.int32)
    many = jnp.zeros((16, 16), jnp.int32)  # 64 rows at beam 4: 32, then the limit 67
    for src, loops in ((one, 1), (many, 2)):  # (a quarter of 16 sentences is too few rows)
        text = beam_search.lower(graphdefs, params, src, 4, 0.6, 50).as_text()
        assert text.count("stablehlo.while") == loops, (src.shape, text.count("stablehlo.while"))


# (beam_size, nbest, stop): greedy, beam search under both stopping rules, and beam search's
# n-best scores at width 1.
SEARCHES = [(1, False, "exact"), (4, False, "exact"), (4, False, "finished"), (1, True, "exact")]


@pytest.mark.parametrize(
    "name",
    # The mixed ensemble runs both architectures' caches in one search; each alone (20-35 s on
    # 2 busy cores) runs with the slow tests.
    [  # 35 s each on 2 cores: all in the slow set
        pytest.param(name, marks=pytest.mark.slow)
        for name in ("encoder_decoder", "ensemble", "decoder_only_causal", "decoder_only_prefix_lm")
    ],
)
def test_fast_search_gives_the_hypotheses_and_scores_of_the_plain_search(name, monkeypatch):
    # The plain search is one loop over the whole batch with a cache of the longest allowed
    # output from the first step. The fast one grows its cache (a first length of 4 grows it
    # twice) and, with min_level_rows=1, goes on with the last live sentence of the 4 alone.
    graphdefs, params = ensembles()[name]
    src = jnp.concatenate([sources(), jnp.array([[18, EOS_ID, 0, 0, 0, 0, 0, 0]])])
    assert cache_lengths(src.shape[1] + 6 + 1, 16, 1) == [15]
    assert loop.batch_levels(4, 4, min_rows=1) == [4, 1]
    results = {}
    for first, min_rows in ((4, 1), (10**6, 10**6)):
        monkeypatch.setattr(loop, "FIRST_CACHE_LENGTH", first)
        jax.clear_caches()  # the searches are jitted on the graph definitions, which are unchanged
        results[first] = [
            search(
                graphdefs,
                params,
                src,
                DecodeSettings(beam, 0.6, 6, stop, nbest=int(nbest)),
                min_level_rows=min_rows,
            )
            for beam, nbest, stop in SEARCHES
        ]
    jax.clear_caches()
    for (beam, nbest, stop), fast, plain in zip(SEARCHES, results[4], results[10**6]):
        # n-best: every hypothesis of the beam, in order, not only the best.
        message = f"beam {beam}, nbest {nbest}, stop {stop}"
        np.testing.assert_array_equal(fast[0], plain[0], err_msg=message)
        np.testing.assert_allclose(fast[1], plain[1], rtol=1e-5, err_msg=message)
        assert np.all(np.asarray(fast[1])[:, 0] > NEG_INF / 2), "the best hypothesis finished"
    # Greedy search went on after all but one sentence had ended.
    lengths = sorted(len(strip(row)) for row in np.asarray(results[4][0][0])[:, 0])
    assert lengths[-1] > lengths[-2], lengths


def test_argmax_is_the_first_index_of_the_maximum():
    x = np.array(jax.random.normal(jax.random.key(0), (6, 50)))
    x[1, [3, 7, 40]] = 9.0  # ties: the first wins, as in jnp.argmax
    x[2, :] = -1.0e9  # a row masked down to one value
    x[3, [0, 49]] = 9.0
    token, best = sampling_module.argmax(jnp.asarray(x))
    np.testing.assert_array_equal(token, np.argmax(x, axis=-1))
    np.testing.assert_array_equal(best, np.max(x, axis=-1))


def test_exact_stop_scores_at_least_as_well_as_stopping_at_beam_size_finished():
    # Both follow the same live beams; "finished" drops EOS outside the W best extensions and
    # stops sooner, so its best hypothesis can only be worse or the same.
    graphdef, params = make_model()
    src = sources()
    kwargs = dict(beam_size=4, alpha=1.2, max_extra_len=6)
    _, exact = beam_search((graphdef,), (params,), src, stop="exact", **kwargs)
    tokens, finished = beam_search((graphdef,), (params,), src, stop="finished", **kwargs)
    assert np.all(np.asarray(finished) > NEG_INF / 2), "it stops with W finished hypotheses"
    assert np.all(np.diff(np.asarray(finished), axis=1) <= 0), "sorted best first"
    assert np.all(np.asarray(exact)[:, 0] >= np.asarray(finished)[:, 0] - 1e-6)
    for row in np.asarray(tokens).reshape(-1, tokens.shape[-1]):
        assert strip(row)[-1] == EOS_ID


def test_an_unknown_beam_stop_is_an_error_naming_its_flag():
    with pytest.raises(ValueError, match="--config.decode.beam_stop=greedy: must be 'exact'"):
        load_config(
            pathlib.Path(__file__).parents[1] / "configs" / "base.py",
            {"decode.beam_stop": "greedy"},
        )


def test_blockwise_top_k_gives_the_values_and_indices_of_lax_top_k():
    x = np.round(np.array(jax.random.normal(jax.random.key(1), (6, 5003))) * 8) / 8  # many ties
    x[1] = 0.5  # a row of one value: the first k indices win
    x[2, 4990:] = 9.0  # the largest values in the last, partial block
    x[3, ::700] = -np.inf
    x[4, :] = NEG_INF
    x[4, [7, 4000]] = 0.0
    for k, block in ((1, 16), (8, 16), (8, 128), (3, 37)):
        values, index = search_module.top_k(jnp.asarray(x), k, block)
        expected_values, expected_index = jax.lax.top_k(jnp.asarray(x), k)
        np.testing.assert_array_equal(values, expected_values, err_msg=f"k {k}, block {block}")
        np.testing.assert_array_equal(index, expected_index, err_msg=f"k {k}, block {block}")


def test_batch_levels_quarter_the_batch_down_to_the_fewest_rows():
    assert loop.batch_levels(64, 4) == [64, 16]  # 16 sentences x 4 beams = 64 rows
    assert loop.batch_levels(256, 4) == [256, 64, 16]
    assert loop.batch_levels(64, 1) == [64]  # a quarter would be 16 rows
    assert loop.batch_levels(60, 4, 1) == [60, 15]
    assert loop.batch_levels(3, 4, 1) == [3]


@pytest.mark.parametrize("beam_size", [1, 4])
def test_search_gives_the_same_hypotheses_with_64_bit_types_enabled(beam_size):
    # JAX_ENABLE_X64=1, which some users export globally, made untyped constants float64 and
    # beam search's loop carry changed dtype (a TypeError in every beam search).
    graphdef, params = make_model()
    expected = search((graphdef,), (params,), sources(), DecodeSettings(beam_size, 0.6, 6))
    with jax.enable_x64(True):
        got = search((graphdef,), (params,), sources(), DecodeSettings(beam_size, 0.6, 6))
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
