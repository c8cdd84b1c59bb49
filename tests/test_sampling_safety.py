"""What a sample may hold and what sampling refuses: the special pieces, the masks at any
temperature, the batch a line's samples do not depend on, MBR's memory over many candidates and
the sampling flags' one-line refusals."""

import random
import re
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from test_decode import make_model, sources
from test_sampling import PREFIXES, greedy_among_drawable_pieces, streams

from translate import sample as sample_command
from translate import translate_text
from translate.cli import user_error_message
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from translate.decoding import mbr
from translate.decoding.sampling import draw
from translate.decoding.search import NEG_INF, greedy_search, search
from translate.decoding.settings import DecodeSettings, check_values

MAX_EXTRA = 6
FLOAT32_MAX = float(np.finfo(np.float32).max)
SLOW = pytest.mark.slow  # each sampling method, and each temperature, compiles its own search


def sampled(settings, src, lines, prefix=None):
    graphdef, params = make_model()
    tokens, scores = search(
        (graphdef,), (params,), src, settings, stream=streams(lines), prefix=prefix
    )
    return np.asarray(tokens), np.asarray(scores)


def before_eos(row):
    row = [int(t) for t in row]
    assert EOS_ID in row, row
    return row[: row.index(EOS_ID)]


@pytest.mark.parametrize(
    "method, cut",
    [
        ("ancestral", {}),
        pytest.param("topk", {"top_k": 4}, marks=SLOW),
        pytest.param("topp", {"top_p": 0.9}, marks=SLOW),
        pytest.param("epsilon", {"epsilon": 0.02}, marks=SLOW),
    ],
)
def test_no_sample_holds_a_padding_or_start_piece(method, cut):
    """The untrained model of test_decode puts much of its mass on BOS (greedy decoding writes
    it); a sample never holds PAD or BOS before its EOS, so what is scored is what is printed."""
    graphdef, params = make_model()
    greedy, _ = greedy_search((graphdef,), (params,), sources(), max_extra_len=MAX_EXTRA)
    assert BOS_ID in np.asarray(greedy)  # the model would write one if let
    settings = DecodeSettings(
        beam_size=1, max_extra_len=MAX_EXTRA, sampling=method, num_candidates=32, **cut
    )
    tokens, scores = sampled(settings, sources(), [0, 1, 2])
    held = [before_eos(c) for row in tokens for c in row]
    assert not [c for c in held if PAD_ID in c or BOS_ID in c]
    assert (scores > NEG_INF / 2).all()


def test_sampling_that_keeps_only_the_likeliest_piece_is_greedy_among_the_drawable_ones():
    """Top-k 1 is arg-max over the pieces a sample may hold: greedy decoding's output wherever
    greedy writes no PAD or BOS, which a trained model never does (this untrained one does)."""
    graphdef, params = make_model()
    settings = DecodeSettings(
        beam_size=1, max_extra_len=MAX_EXTRA, sampling="topk", top_k=1, num_candidates=2
    )
    tokens, _ = sampled(settings, sources(), [0, 1, 2])
    expected = greedy_among_drawable_pieces(graphdef, params, sources(), MAX_EXTRA)
    for row, out in enumerate(expected):
        for candidate in tokens[row]:
            assert [int(t) for t in candidate[: len(out)]] == out


@pytest.mark.parametrize(
    "temperature",
    [1e9, FLOAT32_MAX, pytest.param(1e30, marks=SLOW), pytest.param(1e38, marks=SLOW)],
)
def test_a_high_temperature_keeps_every_prefix_and_the_length_limit(temperature):
    """Dividing by the temperature never makes a forbidden piece drawable: the prefixes are
    kept, each output ends by its limit, and no score holds a masked piece's NEG_INF (the MBR
    choice drops such candidates, and had none left to choose from)."""
    settings = DecodeSettings(
        beam_size=1,
        max_extra_len=MAX_EXTRA,
        sampling="ancestral",
        num_candidates=32,
        temperature=temperature,
    )
    src = sources()
    tokens, scores = sampled(settings, src, [0, 1, 2], prefix=jnp.asarray(PREFIXES))
    for row, prefix in enumerate(PREFIXES):
        pieces = [int(p) for p in prefix if p]
        limit = int((np.asarray(src[row]) != PAD_ID).sum()) - 1 + MAX_EXTRA
        for candidate in tokens[row]:
            held = before_eos(candidate)
            assert held[: len(pieces)] == pieces and len(held) <= limit
            assert PAD_ID not in held and BOS_ID not in held
    assert (scores > NEG_INF / 2).all()
    # A temperature at which float32 log-probabilities divided by it overflow is refused.
    with pytest.raises(ValueError, match=re.escape("--temperature=1e-40: must be a finite")):
        check_values({"temperature": 1e-40})


@pytest.mark.parametrize("temperature", [8.5e37, 1e38, FLOAT32_MAX])
@pytest.mark.parametrize(
    "method, cut",
    [("ancestral", {}), ("topk", {"top_k": 2}), ("epsilon", {"epsilon": 0.02}), ("topp", {})],
)
def test_a_draw_never_takes_a_masked_piece_at_any_temperature(temperature, method, cut):
    """Where 1 / temperature is below float32's smallest normal number, XLA flushes it to 0
    and a masked -inf times it is NaN; the masked pieces keep weight 0 all the same, and the
    pieces left are drawn (all about equally likely: the distribution is flat there)."""
    log_probs = jnp.log(jnp.array([0.0, 0.0, 0.5, 0.3, 0.2], jnp.float32))  # PAD, BOS masked
    log_probs = jnp.tile(log_probs, (400, 1))
    uniform = 1.0 - jax.random.uniform(jax.random.key(0), (400,))
    for run in (draw, jax.jit(draw, static_argnums=(2, 3, 4, 5, 6))):
        args = (method, temperature, cut.get("top_k", 0), 1.0, cut.get("epsilon", 0.0))
        found = np.bincount(np.asarray(run(log_probs, uniform, *args)), minlength=5)
        assert found[:2].sum() == 0 and found[2:].all(), found


def test_with_float32_products_a_lines_samples_do_not_depend_on_its_batch_shape():
    """With float32 products, this line draws the same samples alone or padded into a wider
    batch beside longer lines. Not every line does: a draw whose random number falls within the
    last bits that another shape sums differently changes (6 and 3 of 800 lines between batches
    of 32 and 7, docs/translating.md); bfloat16 operands round those bits larger."""
    settings = DecodeSettings(
        beam_size=1, max_extra_len=MAX_EXTRA, sampling="ancestral", num_candidates=8
    )
    src = np.asarray(sources())
    alone, alone_scores = sampled(settings, jnp.asarray(src[1:2, :3]), [5])  # [1, 3]: no padding
    wide = np.zeros((4, 12), np.int32)  # row 1: a batch filler
    wide[0] = [*range(11, 22), EOS_ID]
    wide[2, :3], wide[3, :8] = src[1, :3], src[0]
    together, scores = sampled(settings, jnp.asarray(wide), [0, 1, 5, 3])
    np.testing.assert_array_equal(
        [before_eos(c) for c in alone[0]], [before_eos(c) for c in together[2]]
    )
    np.testing.assert_allclose(alone_scores[0], scores[2], rtol=1e-5)


WORDS = (
    "Ein Hund läuft über die grüne Wiese , zwei Männer und eine Frau spielen Fußball im Park "
    "während ein kleines Kind mit einem roten Ball am Ufer des Flusses sitzt und lacht ."
).split()


def many_candidates(count, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(12, 24))) for _ in range(count)]


@pytest.mark.parametrize("metric", mbr.METRICS)
def test_mbr_over_many_candidates_holds_no_candidates_by_candidates_by_ngrams_array(
    metric, monkeypatch
):
    """The pairwise statistics come in blocks: memory grows with the candidates' pairs and
    n-grams, never with their product (1,000 candidates took 38 GiB); the scores stay
    sacreBLEU's, and are the same however the blocks are cut."""
    candidates = many_candidates(100)
    tracemalloc.start()
    try:
        utility = mbr.expected_utilities(candidates, metric)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 24 * 2**20, f"{peak / 2**20:.0f} MiB"
    score = sacrebleu.sentence_chrf if metric == "chrf" else sacrebleu.sentence_bleu
    pairs = mbr.utility_matrix(candidates, metric)
    for i, j in [(0, 1), (5, 40), (99, 3), (17, 17)]:
        np.testing.assert_allclose(pairs[i, j], score(candidates[i], [candidates[j]]).score)
    np.testing.assert_allclose(utility, (pairs.sum(1) - np.diag(pairs)) / 99)
    monkeypatch.setattr(mbr, "BLOCK_ELEMENTS", 97)  # blocks of one row, one column at times
    np.testing.assert_array_equal(mbr.utility_matrix(candidates, metric), pairs)
    np.testing.assert_array_equal(mbr.expected_utilities(candidates, metric), utility)


def test_translate_sample_continues_the_prompt_at_the_largest_temperature(
    tokenizer, monkeypatch, capsys
):
    """At float32's largest temperature the draw is flat over the drawable pieces: the samples
    go on past the prompt (they printed the prompt alone, every piece drawn being PAD)."""
    from conftest import tiny_config
    from flax import nnx

    from translate.models.transformer import Transformer

    model = Transformer(tiny_config().model, tokenizer.vocab_size, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)
    monkeypatch.setattr(
        sample_command, "load_ensemble", lambda *a, **k: ((graphdef,), (params,), tokenizer, 0, 0)
    )
    sample_command.main(
        [
            "--workdir=unused",
            "--prompt=the dog",
            "--num_samples=4",
            f"--temperature={FLOAT32_MAX!r}",
            "--max_new_tokens=8",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and all(line.startswith("the dog") for line in lines), lines
    assert all(len(line) > len("the dog") for line in lines), lines


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--temperature=inf", "--temperature=inf: must be a finite number"),
        ("--temperature=1e-40", "--temperature=1e-40: must be a finite number"),
        # Above float32's largest it overflowed to inf as the search took it, with numpy's
        # overflow warning.
        ("--temperature=1e39", "--temperature=1e+39: must be a finite number"),
        ("--seed=-1", "--seed=-1: must be in [0, 2**32)"),
        ("--seed=18446744073709551616", "--seed=18446744073709551616: must be in [0, 2**32)"),
        ("--max_new_tokens=1000000000", "--max_new_tokens=1000000000: must be in [1, 1024]"),
        ("--max_new_tokens=0", "--max_new_tokens=0: must be in [1, 1024]"),
        ("--top_k=-2", "--top_k=-2: must be >= 0"),
    ],
)
def test_translate_sample_refuses_what_cannot_sample_before_loading(
    flag, message, tmp_path, monkeypatch
):
    def load_ensemble(*args, **kwargs):
        raise AssertionError(f"{flag} was let through to loading the model")

    monkeypatch.setattr(sample_command, "load_ensemble", load_ensemble)
    with pytest.raises((SystemExit, ValueError), match=re.escape(message)) as error:
        sample_command.main([f"--workdir={tmp_path}", "--prompt=Ein", flag])
    assert user_error_message(error.value) is not None


@pytest.mark.parametrize("flag", ["--beam_size=4", "--beam_size=1", "--beam_stop=finished"])
def test_a_beam_flag_with_sampling_is_refused_before_anything_loads(flag, tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"{flag} does nothing with --sampling")):
        translate_text.main([f"--workdir={tmp_path}", "--sampling=ancestral", flag])


def test_a_prompt_outside_the_vocabulary_is_named_on_stderr(tokenizer, monkeypatch, capsys):
    """Its characters are forced as <unk>, as tokenized; stderr says so, naming the prompt."""
    monkeypatch.setattr(
        sample_command, "load_ensemble", lambda *a, **k: ((), (), tokenizer, None, None)
    )
    prompts = []

    def sample_search(graphdefs, params, src, stream, prefix, **settings):
        prompts.append(tokenizer.decode(prefix[0]))
        return np.asarray([[[EOS_ID]]]), None

    monkeypatch.setattr(sample_command, "sample_search", sample_search)
    sample_command.main(["--workdir=unused", "--prompt=the dog"])
    assert "outside the vocabulary" not in capsys.readouterr().err
    sample_command.main(["--workdir=unused", "--prompt=the Ω dog"])
    assert "--prompt='the Ω dog' has characters outside the vocabulary" in capsys.readouterr().err
    assert prompts == ["the dog", "the  ⁇  dog"]  # SentencePiece spaces its "⁇"
