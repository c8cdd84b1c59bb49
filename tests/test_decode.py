"""Greedy and beam search (translate/decode.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from translate.batching import Batch
from translate.config import ModelConfig
from translate.decode import beam_search, greedy_search, length_penalty, translate_tokens
from translate.model import Transformer
from translate.tokenizer import BOS_ID, EOS_ID, PAD_ID

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
    tokens = translate_tokens((graphdef,), (params,), src, beam_size=1, alpha=0.6, max_extra_len=6)
    expected = uncached_greedy(graphdef, params, src, max_extra_len=6)
    assert [strip(r) for r in np.asarray(tokens)] == expected


def test_length_penalty_follows_its_formula():
    for length, alpha in [(1, 0.6), (10, 0.6), (37, 1.0), (5, 0.0)]:
        np.testing.assert_allclose(
            length_penalty(length, alpha), ((5 + length) / 6) ** alpha, rtol=1e-6
        )


def sequence_log_prob(graphdef, params, src_row, out):
    model = nnx.merge(graphdef, params)
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
    log_probs = jax.nn.log_softmax(model(batch)[0])
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
        tokens = translate_tokens(
            (graphdef,), (params,), src, beam_size=beam, alpha=0.6, max_extra_len=2
        )
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


def test_bfloat16_beam_search_picks_the_hypotheses_of_a_float32_projected_reference(monkeypatch):
    """The reference multiplies the same bfloat16-rounded operands after casting them to float32."""
    import translate.model as model_module

    graphdef, params = make_model("bfloat16")
    src = sources()
    tokens, scores = beam_search(
        (graphdef,), (params,), src, beam_size=4, alpha=0.6, max_extra_len=6
    )
    greedy, _ = greedy_search((graphdef,), (params,), src, max_extra_len=6)

    fused_scores = model_module.attention_scores

    def upcast_scores(subscripts, q, k, mask):
        return fused_scores(subscripts, q.astype(jnp.float32), k.astype(jnp.float32), mask)

    def upcast_logits(self, y):
        embedding = self.embed.embedding[...].astype(self.dtype).astype(jnp.float32)
        return jnp.einsum("...d,vd->...v", y.astype(jnp.float32), embedding)

    monkeypatch.setattr(model_module, "attention_scores", upcast_scores)
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
