"""Sampling (the draws of translate/decoding/sampling.py, run by translate/decoding/search.py),
forced target prefixes, their sentence loop, translate-sample; what a sample may hold and what
sampling refuses."""

import random
import re
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sacrebleu
from test_decode import ensembles, make_model, sources

from translate import sample as sample_command
from translate import translate_text
from translate.cli import user_error_message
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from translate.decoding import loop, mbr
from translate.decoding.sampling import NEVER_DRAWN, draw
from translate.decoding.search import NEG_INF, greedy_search, search
from translate.decoding.settings import DecodeSettings, check_values

MAX_EXTRA = 6
# Prefixes of the three sources of test_decode.sources(): two pieces, one, none.
PREFIXES = np.array([[7, 8, 0], [9, 0, 0], [0, 0, 0]], np.int32)


def streams(lines, seed=0):
    return jnp.asarray([[seed, line] for line in lines], jnp.uint32)


def sampled(settings, src, lines, prefix=None, model=None):
    graphdef, params = model or make_model()
    tokens, scores = search(
        (graphdef,), (params,), src, settings, stream=streams(lines), prefix=prefix
    )
    return np.asarray(tokens), np.asarray(scores)


# Each method costs three compilations of the search; one of the four in the default run (the
# streams that make a line's samples its own are the same for every method).
SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "method",
    ["ancestral", *(pytest.param(m, marks=SLOW) for m in ("topk", "topp", "epsilon"))],
)
def test_a_line_draws_the_same_samples_alone_or_in_any_batch(method):
    settings = DecodeSettings(
        beam_size=1,
        max_extra_len=MAX_EXTRA,
        sampling=method,
        top_k=5,
        top_p=0.9,  # with <s> and <pad> never drawn, 0.8 keeps one piece of this model
        epsilon=0.05,
        num_candidates=4,
        temperature=1.5,
    )
    src = sources()
    together, scores = sampled(settings, src, [10, 11, 12])
    for row in range(3):
        alone, alone_scores = sampled(settings, src[row : row + 1], [10 + row])
        np.testing.assert_array_equal(alone[0], together[row])
        np.testing.assert_allclose(alone_scores[0], scores[row], rtol=1e-5)
    # Another order of the batch, padded with a filler row: the same samples per line.
    shuffled = jnp.concatenate([src[2:3], src[0:1], jnp.zeros_like(src[:1]), src[1:2]])
    again, _ = sampled(settings, shuffled, [12, 10, 0, 11])
    np.testing.assert_array_equal(again[[1, 3, 0]], together)
    # Another seed or another line: other samples (a model of 24 pieces at temperature 1.5).
    other, _ = sampled(settings, src, [13, 14, 15])
    assert not np.array_equal(other, together)


def test_samples_vary_and_are_ranked_by_their_length_normalised_score():
    settings = DecodeSettings(
        beam_size=1,
        max_extra_len=MAX_EXTRA,
        sampling="ancestral",
        num_candidates=8,
        temperature=2.0,
    )
    tokens, scores = sampled(settings, sources(), [0, 1, 2])
    assert all(len({tuple(c) for c in row}) > 1 for row in tokens)
    assert (np.diff(scores, axis=1) <= 0).all()
    assert all(
        EOS_ID in list(c) for row in tokens for c in row
    )  # each ends, at the limit at the latest


def greedy_among_drawable_pieces(graphdef, params, src, max_extra_len):
    """Arg-max decoding one `decode_step` at a time, row by row, over the pieces a sample may
    hold: the outputs [EOS included] that sampling's arg-max (top-k 1) must give."""
    models = loop.merge_models((graphdef,), (params,))
    found = []
    for row in range(src.shape[0]):
        source = src[row : row + 1]
        limit = int((np.asarray(source) != PAD_ID).sum()) - 1 + max_extra_len
        length = src.shape[1] + max_extra_len + 1
        caches = [
            m.prefill(source, (source != PAD_ID).astype(jnp.int32), 1, length) for m in models
        ]
        out, last = [], BOS_ID
        while last != EOS_ID:
            log_probs, caches = loop.next_log_probs(models, jnp.array([last]), len(out), caches)
            log_probs = np.asarray(log_probs[0]).copy()
            log_probs[list(NEVER_DRAWN)] = -np.inf
            last = EOS_ID if len(out) >= limit else int(np.argmax(log_probs))
            out.append(last)
        found.append(out)
    return found


@pytest.mark.parametrize(
    "settings",
    [
        DecodeSettings(beam_size=1, sampling="topk", top_k=1, num_candidates=3),
        DecodeSettings(beam_size=1, sampling="ancestral", temperature=1e-4, num_candidates=3),
        DecodeSettings(beam_size=1, sampling="topp", top_p=1e-6, num_candidates=2),
    ],
    ids=["top-k 1", "temperature 1e-4", "top-p 1e-6"],
)
def test_sampling_that_keeps_only_the_likeliest_piece_is_greedy_decoding(settings):
    # Greedy decoding among the pieces a sample may hold: this untrained model's arg-max is
    # sometimes <s>, which sampling never draws (sampling.NEVER_DRAWN).
    settings = DecodeSettings(**{**settings.__dict__, "max_extra_len": MAX_EXTRA})
    graphdef, params = make_model()
    src = sources()
    greedy = greedy_among_drawable_pieces(graphdef, params, src, MAX_EXTRA)
    tokens, _ = sampled(settings, src, [0, 1, 2])
    for candidate in range(settings.num_candidates):
        for row, expected in enumerate(greedy):
            got = np.asarray(tokens[row, candidate])
            np.testing.assert_array_equal(got[: len(expected)], expected)
            assert (got[len(expected) :] == PAD_ID).all()


def test_draw_keeps_what_each_method_says():
    """Drawn many times from one distribution, each method draws only the pieces it keeps,
    and ancestral sampling draws each piece about as often as its probability."""
    probs = jnp.array([0.5, 0.25, 0.15, 0.07, 0.03], jnp.float32)
    log_probs = jnp.tile(jnp.log(probs), (4000, 1))
    uniform = 1.0 - jax.random.uniform(jax.random.key(0), (4000,))
    found = {
        name: np.bincount(np.asarray(draw(log_probs, uniform, *args)), minlength=5)
        for name, args in {
            "ancestral": ("ancestral",),
            "topk": ("topk", 1.0, 2),
            "topp": ("topp", 1.0, 0, 0.8),  # 0.5 + 0.25 < 0.8 <= 0.9: three pieces
            "epsilon": ("epsilon", 1.0, 0, 1.0, 0.1),
        }.items()
    }
    np.testing.assert_allclose(found["ancestral"] / 4000, probs, atol=0.03)
    assert found["topk"][2:].sum() == 0 and found["topk"][:2].all()
    assert found["topp"][3:].sum() == 0 and found["topp"][:3].all()
    assert found["epsilon"][3:].sum() == 0 and found["epsilon"][:3].all()
    # Kept pieces keep their relative odds: top-2 draws piece 0 about twice as often as 1.
    assert 1.7 < found["topk"][0] / found["topk"][1] < 2.3


def forced_reference(graphdefs, params, src, prefix, max_extra_len):
    """Greedy decoding after each row's prefix, one `decode_step` at a time, row by row:
    (tokens, log-probability of the whole output) per row, the prefix's pieces included."""
    models = loop.merge_models(graphdefs, params)
    found = []
    for row in range(src.shape[0]):
        source = src[row : row + 1]
        n = int((np.asarray(source) != PAD_ID).sum())
        limit = n - 1 + max_extra_len
        length = src.shape[1] + max_extra_len + 1
        caches = [
            m.prefill(source, (source != PAD_ID).astype(jnp.int32), 1, length) for m in models
        ]
        pieces = [int(p) for p in prefix[row] if p != PAD_ID]
        out, total, last = [], 0.0, BOS_ID
        for t in range(length):
            log_probs, caches = loop.next_log_probs(models, jnp.array([last]), t, caches)
            log_probs = np.asarray(log_probs[0])
            if t < len(pieces):
                token = pieces[t]
            elif t >= limit:
                token = EOS_ID
            else:
                token = int(np.argmax(log_probs))
            out.append(token)
            total += float(log_probs[token])
            last = token
            if token == EOS_ID:
                break
        found.append((out, total))
    return found


@pytest.mark.parametrize("name", list(ensembles()))
def test_a_prefix_search_continues_as_one_forced_step_at_a_time_would(name):
    """The one pass over the prefixes (`decode_block`) fills the cache as forced steps would."""
    graphdefs, params = ensembles()[name]
    src = sources()
    tokens, scores = greedy_search(graphdefs, params, src, MAX_EXTRA, prefix=jnp.asarray(PREFIXES))
    for row, (expected, total) in enumerate(
        forced_reference(graphdefs, params, src, PREFIXES, MAX_EXTRA)
    ):
        assert list(np.asarray(tokens[row])[: len(expected)]) == expected
        np.testing.assert_allclose(float(scores[row]), total, rtol=1e-5)


@pytest.mark.parametrize(
    "settings",
    [
        DecodeSettings(beam_size=1),
        pytest.param(
            DecodeSettings(beam_size=3, nbest=3),
            marks=pytest.mark.slow(
                reason="15 s of compiling on 2 cores: the beam search's prefixes stay in the "
                "default run in test_a_prefix_search_continues_as_one_forced_step_at_a_time_would"
            ),
        ),
        # The greedy search in the default run; these are slow.
        pytest.param(DecodeSettings(beam_size=3, beam_stop="finished", nbest=2), marks=SLOW),
        pytest.param(
            DecodeSettings(beam_size=1, sampling="ancestral", num_candidates=5, temperature=2.0),
            marks=SLOW,
        ),
        pytest.param(
            DecodeSettings(beam_size=1, sampling="topk", top_k=3, num_candidates=5), marks=SLOW
        ),
    ],
    ids=["greedy", "beam n-best", "beam finished", "ancestral", "top-k"],
)
def test_every_output_starts_with_its_prefix(settings):
    settings = DecodeSettings(**{**settings.__dict__, "max_extra_len": MAX_EXTRA})
    for graphdefs, params in ensembles().values():
        tokens, scores = search(
            graphdefs,
            params,
            sources(),
            settings,
            stream=streams([0, 1, 2]),
            prefix=jnp.asarray(PREFIXES),
        )
        tokens, scores = np.asarray(tokens), np.asarray(scores)
        for row, prefix in enumerate(PREFIXES):
            pieces = [int(p) for p in prefix if p]
            for hypothesis, score in zip(tokens[row], scores[row]):
                if score > loop.NEG_INF / 2:
                    assert list(hypothesis[: len(pieces)]) == pieces
                    assert EOS_ID in list(hypothesis[len(pieces) :])


def test_a_prefix_as_long_as_the_limit_ends_there():
    """A prefix of exactly `limit` pieces leaves room for EOS alone."""
    graphdef, params = make_model()
    src = sources()[1:2]  # two pieces + EOS: limit 2 + MAX_EXTRA
    prefix = jnp.asarray([[5] * (2 + MAX_EXTRA)], jnp.int32)
    tokens, _ = greedy_search((graphdef,), (params,), src, MAX_EXTRA, prefix=prefix)
    assert list(np.asarray(tokens[0])[: 3 + MAX_EXTRA]) == [5] * (2 + MAX_EXTRA) + [EOS_ID]


# The text command: the sentence loop, flags and files (the tiny run, made to vary its outputs).
from test_translate_text import run  # noqa: E402

from translate.decoding.mbr import mbr_order  # noqa: E402

SENTENCES = [
    "the small dog sees the cat .",
    "",
    "a man reads .",
    "the old woman who lives in the house gives the child a red apple .",
    "the cat sleeps .",
    "a dog .",
]


SAMPLE = ["--sampling=ancestral", "--temperature=2.0", "--num_candidates=4", "--seed=7"]


@pytest.mark.slow  # 35 s; a line's samples alone or in any batch stay in the default run
def test_samples_do_not_depend_on_batches_in_flight_or_where_the_input_was_cut(
    workdir, tmp_path, varied_outputs
):
    one = run(
        tmp_path,
        SENTENCES,
        f"--workdir={workdir}",
        *SAMPLE,
        "--nbest=4",
        "--batch_size=1",
        "--parallel_batches=1",
        name="one.txt",
    )
    many = run(
        tmp_path,
        SENTENCES,
        f"--workdir={workdir}",
        *SAMPLE,
        "--nbest=4",
        "--batch_size=4",
        "--parallel_batches=3",
        name="many.txt",
    )
    assert one == many and len(one) == 4 * 5 + 1  # four samples per line; a blank line's one
    # A restart from line 3: the lines from there draw what they drew in the whole run.
    tail = run(
        tmp_path, SENTENCES[3:], f"--workdir={workdir}", *SAMPLE, "--nbest=4", name="tail.txt"
    )
    whole = [line.split("\t", 1)[1] for line in one if int(line.split("\t")[0]) >= 3]
    assert [line.split("\t", 1)[1] for line in tail] != whole  # its lines count from 0 again...
    # ...so the same lines at the same places draw the same samples:
    shifted = run(
        tmp_path,
        ["", "", "", *SENTENCES[3:]],
        f"--workdir={workdir}",
        *SAMPLE,
        "--nbest=4",
        name="shifted.txt",
    )
    assert [line.split("\t", 1)[1] for line in shifted if int(line.split("\t")[0]) >= 3] == whole
    other_seed = run(
        tmp_path,
        SENTENCES,
        f"--workdir={workdir}",
        *SAMPLE[:-1],
        "--seed=8",
        "--nbest=4",
        name="other.txt",
    )
    assert other_seed != one


def test_mbr_output_is_the_mbr_choice_among_the_printed_candidates(
    workdir, tmp_path, varied_outputs
):
    flags = [f"--workdir={workdir}", *SAMPLE]
    listed = run(tmp_path, SENTENCES, *flags, "--nbest=4", name="all.txt")
    chosen = run(tmp_path, SENTENCES, *flags, "--mbr=chrf", name="mbr.txt")
    for line, sentence in enumerate(SENTENCES):
        rows = [r.split("\t") for r in listed if int(r.split("\t")[0]) == line]
        if not sentence.strip():
            assert chosen[line] == ""
            continue
        texts, scores = [r[2] for r in rows], [float(r[1]) for r in rows]
        order, _ = mbr_order(texts, scores, "chrf")
        assert chosen[line] == texts[order[0]]
    # Over the beam's n-best too, and --nbest then ranks by expected utility.
    ranked = run(
        tmp_path,
        SENTENCES,
        f"--workdir={workdir}",
        "--beam_size=4",
        "--num_candidates=4",
        "--mbr=bleu",
        "--nbest=2",
        name="beam.txt",
    )
    utilities = [float(r.split("\t")[1]) for r in ranked if r.split("\t")[2]]
    assert all(0.0 <= u <= 100.0 for u in utilities)


@pytest.mark.slow  # a sampling compile of the tiny run's model: about 15 s
def test_mbr_at_the_largest_temperature_translates_every_line(workdir, tmp_path, varied_outputs):
    """At float32's largest temperature the samples are drawn flat over the drawable pieces,
    end at EOS with finite scores, and --mbr chooses among them (every sample was PAD, left
    unfinished, and the choice among none an IndexError)."""
    flags = ["--sampling=ancestral", "--temperature=3.4e38", "--num_candidates=4"]
    chosen = run(tmp_path, SENTENCES, f"--workdir={workdir}", *flags, "--mbr=chrf")
    assert len(chosen) == len(SENTENCES)
    assert all(chosen[line] for line, sentence in enumerate(SENTENCES) if sentence.strip())


@pytest.mark.slow  # 25 s; the search's prefixes and the file's refusals stay by default
def test_prefixes_start_the_outputs_and_an_empty_line_has_none(workdir, tmp_path, varied_outputs):
    prefixes = tmp_path / "prefixes.txt"
    wanted = ["the small", "", "a", "the old woman", "", "dog"]
    prefixes.write_text("".join(p + "\n" for p in wanted), encoding="utf-8")
    plain = run(tmp_path, SENTENCES, f"--workdir={workdir}", name="plain.txt")
    for flags in ([], ["--beam_size=1"], ["--nbest=3"], SAMPLE + ["--nbest=4"]):
        out = run(tmp_path, SENTENCES, f"--workdir={workdir}", f"--prefix={prefixes}", *flags)
        texts = [line.split("\t")[-1] for line in out]
        lines = [int(line.split("\t")[0]) for line in out] if "--nbest" in str(flags) else range(6)
        for line, text in zip(lines, texts):
            if wanted[line]:
                assert text.startswith(wanted[line]), (flags, line, text)
        if not flags:  # lines without a prefix translate as they do without the flag
            assert [texts[i] for i in (1, 4)] == [plain[i] for i in (1, 4)]


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num_candidates=0"], "--num_candidates=0: must be >= 1"),
        (["--sampling=topp", "--top_p=0"], "--top_p=0.0: must be in (0, 1]"),
        (["--sampling=topp", "--top_p=1.5"], "--top_p=1.5: must be in (0, 1]"),
        (["--sampling=epsilon", "--epsilon=-0.1"], "--epsilon=-0.1: must be in [0, 1)"),
        (["--sampling=beam"], "--sampling=beam: must be one of ancestral, topk, topp, epsilon"),
        (["--sampling=ancestral", "--temperature=0"], "--temperature=0.0: must be a finite"),
        (["--top_k=5"], "--top_k=5 needs --sampling=topk"),
        (["--sampling=topk"], "--sampling=topk needs --top_k >= 1"),
        (["--mbr=comet"], "--mbr=comet: must be one of chrf, bleu"),
        (["--mbr=chrf"], "--mbr=chrf needs --num_candidates >= 2"),
        (["--seed=3"], "--seed=3 needs --sampling"),
        (["--sampling=ancestral", "--num_candidates=2", "--nbest=3"], "--nbest=3 needs --num_c"),
        (["--num_candidates=9", "--beam_size=4"], "--num_candidates=9 needs --beam_size >= 9"),
    ],
)
def test_sampling_values_that_cannot_work_are_one_line_errors_before_anything_loads(
    workdir, tmp_path, flags, message, monkeypatch
):
    from translate import cli
    from translate.decoding import saved_searches

    loaded = []
    monkeypatch.setattr(saved_searches, "load_ensemble", lambda *a, **k: loaded.append(1))
    target = tmp_path / "never.txt"
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        translate_text.main([f"--workdir={workdir}", f"--output={target}", *flags])
    assert cli.user_error_message(error.value) is not None and not loaded
    assert not target.exists()


def test_a_prefix_file_that_does_not_fit_the_input_is_refused_and_nothing_is_written(
    workdir, tmp_path, varied_outputs
):
    source = tmp_path / "in.txt"
    source.write_text("a dog .\nthe cat .\n", encoding="utf-8")
    target = tmp_path / "out.txt"
    target.write_text("earlier output\n", encoding="utf-8")
    prefixes = tmp_path / "prefixes.txt"
    for text, message in [
        ("a\n", "has 1 lines and --input="),
        ("a\nb\nc\n", "has 3 lines and --input="),
        ("a\n" + "dog " * 80 + "\n", "--prefix line 2: "),
    ]:
        prefixes.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=re.escape(message)):
            translate_text.main(
                [
                    f"--workdir={workdir}",
                    f"--input={source}",
                    f"--output={target}",
                    f"--prefix={prefixes}",
                ]
            )
        assert target.read_text(encoding="utf-8") == "earlier output\n"
    with pytest.raises(ValueError, match="--prefix=.*: no such file"):
        translate_text.main([f"--workdir={workdir}", f"--prefix={tmp_path / 'missing'}"])
    with pytest.raises(SystemExit, match="is the same file as --prefix="):
        translate_text.main(
            [
                f"--workdir={workdir}",
                f"--input={source}",
                f"--output={prefixes}",
                f"--prefix={prefixes}",
            ]
        )


# What a sample may hold and what sampling refuses: the special pieces, the masks at any
# temperature, the batch, the prompt.


FLOAT32_MAX = float(np.finfo(np.float32).max)


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
    for drawn in (draw, jax.jit(draw, static_argnums=(2, 3, 4, 5, 6))):
        args = (method, temperature, cut.get("top_k", 0), 1.0, cut.get("epsilon", 0.0))
        found = np.bincount(np.asarray(drawn(log_probs, uniform, *args)), minlength=5)
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
    sacreBLEU's, and are the same however the blocks are cut.

    The smallest cut (blocks of one row and one column, thousands of them) is checked on 10 of
    the candidates, each pair's score being that pair's alone: on all 100 it took 25 s on 2
    cores, for the same arithmetic."""
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
    few = candidates[:10]
    few_utility = mbr.expected_utilities(few, metric)
    monkeypatch.setattr(mbr, "BLOCK_ELEMENTS", 1000)  # blocks of 10 rows, of 10 columns
    np.testing.assert_array_equal(mbr.utility_matrix(candidates, metric), pairs)
    np.testing.assert_array_equal(mbr.expected_utilities(candidates, metric), utility)
    monkeypatch.setattr(mbr, "BLOCK_ELEMENTS", 9)  # blocks of one row, of one column
    np.testing.assert_array_equal(mbr.utility_matrix(few, metric), pairs[:10, :10])
    np.testing.assert_array_equal(mbr.expected_utilities(few, metric), few_utility)


def test_translate_sample_continues_the_prompt_at_the_largest_temperature(
    tokenizer, monkeypatch, capsys
):
    """At float32's largest temperature the draw is flat over the drawable pieces: the samples
    go on past the prompt (they printed the prompt alone, every piece drawn being PAD)."""
    from flax import nnx
    from helpers import tiny_config

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
