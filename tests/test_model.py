"""Properties of the Transformer in translate/models/transformer.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from translate.config import Config, ModelConfig
from translate.data.batching import Batch
from translate.models import factory
from translate.models.attention import MultiHeadAttention, attention_mask
from translate.models.dropout import dropout, hashed_words
from translate.models.factory import abstract_model
from translate.models.layers import FeedForward
from translate.models.positions import Positions, sinusoidal_positions
from translate.models.precision import bfloat16_dot_general, bfloat16_product
from translate.models.transformer import Transformer

VOCAB = 64


def make_model(seed=0, **overrides):
    config = ModelConfig(
        num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout_rate=0.1, compute_dtype="float32"
    )
    for name, value in overrides.items():
        setattr(config, name, value)
    return Transformer(config, VOCAB, rngs=nnx.Rngs(seed))


def unpacked_batch(src, tgt_in):
    """Batch dict for rows holding one sentence each (0 = padding)."""
    src, tgt_in = jnp.asarray(src), jnp.asarray(tgt_in)

    def positions(x):
        return jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape)

    return Batch(
        src=src,
        src_segments=(src > 0).astype(jnp.int32),
        src_positions=positions(src),
        tgt_in=tgt_in,
        tgt_segments=(tgt_in > 0).astype(jnp.int32),
        tgt_positions=positions(tgt_in),
    )


def random_tokens(key, shape):
    return jax.random.randint(jax.random.key(key), shape, 4, VOCAB)


def test_decoder_is_causal():
    model = make_model()
    src, tgt = random_tokens(0, (2, 7)), random_tokens(1, (2, 9))
    changed = tgt.at[:, 5:].set(random_tokens(2, (2, 4)))
    before = model(unpacked_batch(src, tgt))
    after = model(unpacked_batch(src, changed))
    np.testing.assert_allclose(before[:, :5], after[:, :5], rtol=1e-5, atol=1e-5)
    assert not np.allclose(before[:, 5:], after[:, 5:])


def test_padding_does_not_change_outputs_on_real_tokens():
    model = make_model()
    src, tgt = random_tokens(0, (2, 7)), random_tokens(1, (2, 9))
    padded_src = jnp.pad(src, ((0, 0), (0, 5)))
    padded_tgt = jnp.pad(tgt, ((0, 0), (0, 3)))
    plain = model(unpacked_batch(src, tgt))
    padded = model(unpacked_batch(padded_src, padded_tgt))
    np.testing.assert_allclose(plain, padded[:, :9], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 15 s on 2 cores; the decoder-only twin runs by default
def test_packed_rows_match_separate_rows():
    model = make_model()
    src, tgt = random_tokens(0, (2, 6)), random_tokens(1, (2, 5))
    separate = model(unpacked_batch(src, tgt))  # [2, 5, V]
    packed = Batch(
        src=src.reshape(1, 12),
        src_segments=jnp.repeat(jnp.array([[1, 2]]), 6, axis=1),
        src_positions=jnp.tile(jnp.arange(6), 2)[None],
        tgt_in=tgt.reshape(1, 10),
        tgt_segments=jnp.repeat(jnp.array([[1, 2]]), 5, axis=1),
        tgt_positions=jnp.tile(jnp.arange(5), 2)[None],
    )
    together = model(packed).reshape(2, 5, VOCAB)
    np.testing.assert_allclose(separate, together, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_cached_decode_matches_full_forward(norm_position):
    model = make_model(norm_position=norm_position)
    src = jnp.pad(random_tokens(0, (2, 6)), ((0, 0), (0, 2)))  # trailing padding
    tgt = random_tokens(1, (2, 7))
    full = model(unpacked_batch(src, tgt))  # [B, T, V]
    batch = unpacked_batch(src, tgt)
    memory = model.encode(batch.src, batch.src_segments, batch.src_positions)
    cache = model.init_cache(memory, batch.src_segments, max_len=10)
    for t in range(tgt.shape[1]):
        logits, cache = model.decode_step(tgt[:, t], jnp.array(t), cache)
        np.testing.assert_allclose(logits, full[:, t], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 13 s on 2 cores
def test_dropout_is_active_only_with_a_key():
    model = make_model()
    batch = unpacked_batch(random_tokens(0, (2, 6)), random_tokens(1, (2, 5)))
    np.testing.assert_array_equal(model(batch), model(batch))
    assert not np.allclose(model(batch), model(batch, dropout_key=jax.random.key(0)))


def test_dropout_zeroes_the_rate_and_keeps_the_mean():
    x = jnp.ones((64, 128, 256))
    y = dropout(x, 0.1, jax.random.key(0))
    dropped = float(jnp.mean(y == 0))
    # 2M draws: the standard error of the dropped fraction is 2e-4.
    assert abs(dropped - 0.1) < 1e-3
    np.testing.assert_allclose(float(jnp.mean(y)), 1.0, rtol=2e-3)
    assert dropout(x[:, :, :7], 0.1, jax.random.key(0)).shape == (64, 128, 7)  # odd width


def test_hashed_dropout_zeroes_the_rate_and_keeps_the_mean():
    x = jnp.ones((64, 128, 256))
    y = dropout(x, 0.1, jax.random.key(0), "hash")
    # 2M draws: the standard error of the dropped fraction is 2e-4.
    assert abs(float(jnp.mean(y == 0)) - 0.1) < 1e-3
    np.testing.assert_allclose(float(jnp.mean(y)), 1.0, rtol=2e-3)
    np.testing.assert_array_equal(y, dropout(x, 0.1, jax.random.key(0), "hash"))
    assert dropout(x[:, :, :7], 0.1, jax.random.key(0), "hash").shape == (64, 128, 7)


def test_hashed_words_are_balanced_and_unrelated_across_positions_keys_and_sites():
    """Each bit is a fair coin, and no two streams a training step draws move together."""
    key = jax.random.key(5)
    n = 1 << 20
    words = np.asarray(hashed_words(key, (n,)))
    bits = (words[:, None] >> np.arange(32, dtype=np.uint32)) & 1  # [n, 32]
    # Every bit position: 1M fair coins have a standard error of 5e-4 on their mean.
    assert np.all(np.abs(bits.mean(0) - 0.5) < 2.5e-3)

    def masks(k):  # the dropped elements of a [n] vector at rate 0.5, as +-1
        return 2.0 * (np.asarray(hashed_words(k, (n,))) >> 31) - 1.0

    step, site = jax.random.fold_in(key, 1), jax.random.fold_in(jax.random.fold_in(key, 0), 1)
    pairs = {
        "neighbours": (masks(key)[:-1], masks(key)[1:]),
        "the next step": (masks(key), masks(step)),
        "another site": (masks(key), masks(site)),
        "nearby seeds": (masks(jax.random.key(0)), masks(jax.random.key(1))),
    }
    for name, (a, b) in pairs.items():
        # Uncorrelated +-1 sequences of 1M have a correlation of 0 +- 1e-3.
        assert abs(float(np.mean(a * b))) < 5e-3, name


def attention_and_feed_forward(**rates):
    config = ModelConfig(num_layers=1, d_model=32, num_heads=4, d_ff=64, **rates)
    attention = MultiHeadAttention(config, jnp.float32, "xla", nnx.Rngs(0), self_attention=True)
    return lambda x, mask, key=None: attention(x, mask, key=key)[0], FeedForward(
        config, jnp.float32, nnx.Rngs(1)
    )


@pytest.mark.slow  # 18 s, options no recipe uses; rates of 0 are tested by default
def test_attention_and_activation_dropout_keep_the_mean_and_leave_evaluation_alone():
    """Inverted dropout inside a sub-layer: unbiased in training, absent without a key."""
    attention, feed_forward = attention_and_feed_forward(
        attention_dropout_rate=0.3, activation_dropout_rate=0.3
    )
    plain_attention, plain_feed_forward = attention_and_feed_forward()
    x = jax.random.normal(jax.random.key(0), (2, 6, 32))
    mask = attention_mask(jnp.ones((2, 6), jnp.int32), jnp.ones((2, 6), jnp.int32), False)
    # Evaluation (no key) is the model without these dropouts, to the bit.
    np.testing.assert_array_equal(attention(x, mask), plain_attention(x, mask))
    np.testing.assert_array_equal(feed_forward(x), plain_feed_forward(x))
    keys = jax.random.split(jax.random.key(1), 400)
    runs = {
        "attention": (lambda k: attention(x, mask, k), attention(x, mask)),
        "feed_forward": (lambda k: feed_forward(x, k), feed_forward(x)),
    }
    for run, plain in runs.values():
        dropped = jax.vmap(run)(keys)  # [400, 2, 6, 32]
        # Each key drops something, and the same key drops the same (vmap's batched products
        # round differently in the last bits).
        assert not np.allclose(dropped[0], plain)
        np.testing.assert_allclose(dropped[0], run(keys[0]), rtol=1e-5, atol=1e-6)
        assert not np.allclose(dropped[0], dropped[1])
        # Unbiased: the mean over 400 keys is the undropped output within a few standard errors.
        error = jnp.abs(dropped.mean(0) - plain) / (dropped.std(0) / 20 + 1e-6)
        assert float(jnp.mean(error)) < 1.5 and float(jnp.max(error)) < 6


def test_rates_of_zero_draw_nothing_more_in_training():
    """With both rates at 0 the training step's output is the model's without the new fields."""
    model = make_model()
    other = make_model(attention_dropout_rate=0.0, activation_dropout_rate=0.0)
    dropped = make_model(attention_dropout_rate=0.2, activation_dropout_rate=0.2)
    batch = unpacked_batch(random_tokens(0, (2, 6)), random_tokens(1, (2, 5)))
    key = jax.random.key(3)
    np.testing.assert_array_equal(model(batch, dropout_key=key), other(batch, dropout_key=key))
    assert not np.allclose(model(batch, dropout_key=key), dropped(batch, dropout_key=key))
    np.testing.assert_array_equal(model(batch), dropped(batch))


def test_sinusoidal_positions_follow_the_paper_formula():
    pe = sinusoidal_positions(jnp.arange(20), 16)
    pos, i = 13, 3
    np.testing.assert_allclose(pe[pos, 2 * i], np.sin(pos / 10000 ** (2 * i / 16)), rtol=1e-5)
    np.testing.assert_allclose(pe[pos, 2 * i + 1], np.cos(pos / 10000 ** (2 * i / 16)), rtol=1e-5)


def test_embedding_is_shared_with_the_softmax():
    model = make_model()
    y = jax.random.normal(jax.random.key(0), (3, 32))
    np.testing.assert_allclose(model.logits(y), y @ model.embed.embedding[...].T, rtol=1e-5)


def test_base_parameter_count():
    # Paper Table 3 reports 65M for the base model with a 37,000-piece shared vocabulary.
    # Embedding 37000*512 + 6 encoder layers * 3,151,872 + 6 decoder layers * 4,203,008
    # (attention 4*512*512 + 3*512 with no key bias, FFN 2*512*2048 + 2048 + 512, LayerNorms).
    _, shapes = abstract_model(Config(), vocab_size=37000)
    total = sum(x.size for x in jax.tree.leaves(shapes))
    assert total == 37000 * 512 + 6 * 3_151_872 + 6 * 4_203_008 == 63_073_280


def test_post_norm_is_the_papers_residual_formula_exactly():
    # The default model, recomposed by hand from its own sub-modules as Sec. 3.1 writes it,
    # LayerNorm(x + Sublayer(x)) with no final norm, gives the same bits.
    model = make_model()
    src = jnp.pad(random_tokens(0, (2, 6)), ((0, 0), (0, 2)))
    tgt = random_tokens(1, (2, 7))
    batch = unpacked_batch(src, tgt)
    enc_mask = attention_mask(batch.src_segments, batch.src_segments, causal=False)
    self_mask = attention_mask(batch.tgt_segments, batch.tgt_segments, causal=True)
    cross_mask = attention_mask(batch.tgt_segments, batch.src_segments, causal=False)
    x = model.embed_tokens(batch.src, batch.src_positions, None)
    src_at = Positions(batch.src_positions, batch.src_positions)
    for layer in model.encoder:
        x = layer.norm1(x + layer.self_attention(x, enc_mask, src_at)[0])
        x = layer.norm2(x + layer.feed_forward(x))
    y = model.embed_tokens(batch.tgt_in, batch.tgt_positions, None)
    tgt_at = Positions(batch.tgt_positions, batch.tgt_positions)
    for layer in model.decoder:
        y = layer.norm1(y + layer.self_attention(y, self_mask, tgt_at)[0])
        y = layer.norm2(y + layer.cross_attention(y, cross_mask, context=x)[0])
        y = layer.norm3(y + layer.feed_forward(y))
    np.testing.assert_array_equal(model(batch), model.logits(y))


def test_post_norm_parameters_are_the_papers_with_no_final_norm():
    _, params = nnx.split(make_model(), nnx.Param)
    paths = {".".join(map(str, path)) for path, _ in nnx.to_flat_state(params)}
    linear = ["kernel", "bias"]
    attention = ["query.kernel", "query.bias", "key.kernel"] + [
        f"{p}.{w}" for p in ("value", "out") for w in linear
    ]
    ffn = [f"{p}.{w}" for p in ("inner", "outer") for w in linear]
    norm = ["scale", "bias"]
    encoder = (
        [f"self_attention.{n}" for n in attention]
        + [f"feed_forward.{n}" for n in ffn]
        + [f"norm{i}.{n}" for i in (1, 2) for n in norm]
    )
    decoder = (
        [f"{a}.{n}" for a in ("self_attention", "cross_attention") for n in attention]
        + [f"feed_forward.{n}" for n in ffn]
        + [f"norm{i}.{n}" for i in (1, 2, 3) for n in norm]
    )
    expected = {"embed.embedding"}
    for i in range(2):
        expected |= {f"encoder.{i}.{n}" for n in encoder} | {f"decoder.{i}.{n}" for n in decoder}
    assert paths == expected


def test_pre_norm_adds_one_final_norm_per_stack():
    _, post = nnx.split(make_model(), nnx.Param)
    _, pre = nnx.split(make_model(norm_position="pre"), nnx.Param)
    post_paths = {path for path, _ in nnx.to_flat_state(post)}
    pre_paths = {path for path, _ in nnx.to_flat_state(pre)}
    assert pre_paths - post_paths == {
        (stack, w) for stack in ("encoder_norm", "decoder_norm") for w in ("scale", "bias")
    }
    assert post_paths <= pre_paths


def silence_sublayers(model):
    """Zeroes every sub-layer's output projection, so each sub-layer outputs exactly zero."""
    for _, module in nnx.iter_modules(model):
        for linear in (getattr(module, "out", None), getattr(module, "outer", None)):
            if isinstance(linear, nnx.Linear):
                linear.kernel[...] = jnp.zeros_like(linear.kernel[...])
                linear.bias[...] = jnp.zeros_like(linear.bias[...])


def test_pre_norm_zero_sublayers_leave_the_residual_stream_untouched():
    # x + Sublayer(LayerNorm(x)) with Sublayer = 0 is x: both stacks pass their embeddings
    # through to the final LayerNorm unchanged. (Post-LN would normalise after every sub-layer.)
    model = make_model(norm_position="pre")
    silence_sublayers(model)
    src = jnp.pad(random_tokens(0, (2, 6)), ((0, 0), (0, 2)))
    batch = unpacked_batch(src, random_tokens(1, (2, 7)))
    memory = model.encode(batch.src, batch.src_segments, batch.src_positions)
    embedded_src = model.embed_tokens(batch.src, batch.src_positions, None)
    np.testing.assert_array_equal(memory, model.encoder_norm(embedded_src))
    y = model.decode(
        batch.tgt_in, batch.tgt_segments, batch.tgt_positions, memory, batch.src_segments
    )
    embedded_tgt = model.embed_tokens(batch.tgt_in, batch.tgt_positions, None)
    np.testing.assert_array_equal(y, model.decoder_norm(embedded_tgt))
    # The same model with post-LN is not the identity on its stream.
    post = make_model()
    silence_sublayers(post)
    post_memory = post.encode(batch.src, batch.src_segments, batch.src_positions)
    post_embedded = post.embed_tokens(batch.src, batch.src_positions, None)
    assert not np.allclose(post_memory, post_embedded, atol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_mask_has_no_empty_row_and_keeps_real_tokens_to_their_sentence(causal):
    # Packed rows with padding at the end and in a row of padding alone: every query sees some
    # key (cuDNN's backward gives NaN on empty rows), a real query sees exactly the
    # earlier-or-all keys of its own sentence, and a padding query sees every key.
    q = jnp.array([[1, 1, 2, 2, 2, 0], [0, 0, 0, 0, 0, 0], [3, 3, 3, 3, 3, 3]])
    k = q if causal else jnp.array([[1, 2, 2, 0], [0, 0, 0, 0], [3, 3, 3, 3]])
    mask = np.asarray(attention_mask(q, k, causal))[:, 0]  # [B, Tq, Tk]
    assert mask.any(axis=-1).all()
    qn, kn = np.asarray(q), np.asarray(k)
    tq, tk = qn.shape[1], kn.shape[1]
    order = np.arange(tq)[:, None] >= np.arange(tk)[None, :] if causal else True
    expected = (qn[:, :, None] == kn[:, None, :]) & order
    real = qn > 0
    np.testing.assert_array_equal(mask[real], expected[real])
    assert mask[~real].all()


def test_the_factory_resolves_the_compute_dtype_and_the_model_only_takes_it(monkeypatch):
    config = ModelConfig(num_layers=1, d_model=32, num_heads=4, d_ff=64)  # compute_dtype "auto"
    # Built directly, nothing asks the device: "auto" computes in float32, a named dtype in it.
    assert Transformer(config, VOCAB, rngs=nnx.Rngs(0)).dtype == jnp.float32
    config.compute_dtype = "bfloat16"
    assert Transformer(config, VOCAB, rngs=nnx.Rngs(0)).dtype == jnp.bfloat16
    assert Transformer(config, VOCAB, rngs=nnx.Rngs(0), dtype="float32").dtype == jnp.float32
    # The factory asks once (translate/devices.py) and passes its answer: on a GPU, bfloat16.
    config.compute_dtype = "auto"
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    model = factory.make_model(config, VOCAB, nnx.Rngs(0), attention="xla")
    assert model.dtype == jnp.bfloat16
    assert model.encoder[0].self_attention.query.dtype == jnp.bfloat16


def bf16(x):
    """x rounded to bfloat16, as float64 for exact reference products."""
    return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def test_bfloat16_product_rounds_its_operands_in_both_passes():
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (2, 5, 16))  # [..., I]
    w = jax.random.normal(keys[1], (16, 8))  # [I, O]
    g = jax.random.normal(keys[2], (2, 5, 8))  # the incoming gradient
    y, vjp = jax.vjp(bfloat16_product, x, w)
    dx, dw = vjp(g)
    assert y.dtype == dx.dtype == dw.dtype == jnp.float32
    # Each product is the float32-accumulated product of the bfloat16-rounded operands.
    np.testing.assert_allclose(y, bf16(x) @ bf16(w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx, bf16(g) @ bf16(w).T, rtol=1e-5, atol=1e-5)
    expected_dw = bf16(x).reshape(-1, 16).T @ bf16(g).reshape(-1, 8)
    np.testing.assert_allclose(dw, expected_dw, rtol=1e-5, atol=1e-5)
    # And the rounding is real: the float32 product differs beyond float32's own error.
    exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
    assert np.abs(y - exact).max() > 1e-3
    np.testing.assert_allclose(y, exact, rtol=0.05, atol=0.05)


def linears(model):
    return [m for _, m in nnx.iter_graph(model) if isinstance(m, nnx.Linear)]


def test_bfloat16_products_change_only_the_products():
    plain, rounded = make_model(), make_model(matmul_dtype="bfloat16")
    # The same parameters (float32) from the same seed; only the products' operands differ.
    for a, b in zip(jax.tree.leaves(nnx.state(plain)), jax.tree.leaves(nnx.state(rounded))):
        np.testing.assert_array_equal(a, b)
    assert all(m.dot_general is jax.lax.dot_general for m in linears(plain))
    assert all(m.dot_general is bfloat16_dot_general for m in linears(rounded))
    assert (plain.product_dtype, rounded.product_dtype) == (jnp.float32, jnp.bfloat16)
    assert rounded.dtype == jnp.float32  # activations, norms and softmax stay float32
    batch = unpacked_batch(random_tokens(0, (2, 7)), random_tokens(1, (2, 9)))
    a, b = plain(batch), rounded(batch)
    assert b.dtype == jnp.float32
    assert not np.allclose(a, b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(a, b, rtol=0.05, atol=0.05)


def test_bfloat16_products_are_the_compute_dtypes_own_under_bfloat16_compute():
    config = ModelConfig(num_layers=1, d_model=32, num_heads=4, d_ff=64, compute_dtype="bfloat16")
    config.matmul_dtype = "bfloat16"
    model = Transformer(config, VOCAB, rngs=nnx.Rngs(0))
    assert model.product_dtype == jnp.bfloat16
    assert all(m.dot_general is jax.lax.dot_general for m in linears(model))


def test_a_relative_position_bias_runs_on_xla_attention_and_refuses_cudnn_in_one_line():
    config = ModelConfig(positions="relative")
    assert factory.resolve_model_attention(config) == "xla"
    with pytest.raises(ValueError, match=r"model.attention=cudnn: .*model.positions=relative"):
        factory.resolve_model_attention(ModelConfig(positions="relative", attention="cudnn"))


@pytest.mark.parametrize(
    "fields, rule",
    [
        ({"num_kv_heads": 3}, "model.num_kv_heads=3: must be 0"),
        ({"num_kv_heads": -1}, "model.num_kv_heads=-1: must be 0"),
        ({"num_kv_heads": 16}, "model.num_kv_heads=16: must be 0"),
        ({"positions": "rotary", "d_model": 36, "num_heads": 4}, "rotary needs an even head"),
        ({"positions": "alibi"}, "model.positions"),
        ({"feed_forward": "swish"}, "model.feed_forward"),
    ],
)
def test_impossible_block_settings_are_refused_naming_the_flag(fields, rule):
    config = Config()
    for name, value in fields.items():
        setattr(config.model, name, value)
    with pytest.raises(ValueError, match=rule):
        config.validate()


def test_a_gated_network_at_two_thirds_the_width_keeps_the_parameter_count():
    # Shazeer 2020: three D x F matrices at F = 2/3 of the ungated width match two at F.
    def feed_forward_parameters(**fields):
        config = Config()
        config.model = ModelConfig(num_layers=1, d_model=48, num_heads=4, use_bias=False, **fields)
        _, params = abstract_model(config, VOCAB)
        flat = nnx.to_flat_state(params)
        return sum(int(np.prod(p.shape)) for path, p in flat if "feed_forward" in path)

    ungated = feed_forward_parameters(d_ff=192)
    gated = feed_forward_parameters(d_ff=128, feed_forward="swiglu")
    assert ungated == gated


def test_todays_blocks_count_their_own_flops():
    from translate.models.flops import forward_flops

    src, tgt = [5, 9], [7, 4]
    base = forward_flops(ModelConfig(), 100, src, tgt)
    gated = forward_flops(ModelConfig(feed_forward="swiglu"), 100, src, tgt)
    d, f, n = 512, 2048, 6
    # One more D x F matrix per feed-forward, on every token of both stacks.
    assert gated - base == n * 2 * d * f * (sum(src) + sum(tgt))
    grouped = forward_flops(ModelConfig(num_kv_heads=2), 100, src, tgt)
    # K and V project to 2 of 8 heads: 3/4 of their 4 D^2 per key saved, in three attentions.
    keys = sum(src) + sum(tgt) + sum(src)  # encoder self, decoder self, cross (source keys)
    assert base - grouped == n * 4 * d * d * 3 / 4 * keys
    assert forward_flops(ModelConfig(positions="rotary"), 100, src, tgt) == base
