"""Scoring and aligning (translate-score, translate-text --alignment) give right links and stay
within memory: alignment words are the whitespace tokens of each line as given, an ensemble
that cannot align is refused before anything is decoded, a pair or a batch too large for the
device is refused before it is allocated, and an export given as a workdir is named as one."""

import json

import pytest
from conftest import copy_of_tiny_run
from flax import nnx

from translate import checkpoint, score, translate_text
from translate.config import ModelConfig
from translate.data.tokenizer import Tokenizer
from translate.decoding import forced, memory, saved_searches
from translate.devices import HostMemory
from translate.models.factory import make_model
from translate.models.transformer import Transformer
from translate.trained import load_ensemble, write_params_workdir
from translate.workdir import Workdir, read_config


def untrained(tokenizer):
    config = ModelConfig(num_layers=2, d_model=32, num_heads=4, d_ff=64, compute_dtype="float32")
    net = Transformer(config, tokenizer.vocab_size, rngs=nnx.Rngs(0))
    net.embed.embedding[...] = net.embed.embedding[...] * 8.0
    return nnx.split(net, nnx.Param)


@pytest.fixture(scope="module")
def runs(tiny_run, tmp_path_factory):
    """The tiny run, and two models of its vocabulary that cannot align with it in one
    ensemble: a decoder-only one and an encoder-decoder of 4 layers (untrained, saved as a
    parameters-only workdir, as an average is)."""
    tiny = copy_of_tiny_run(tiny_run, tmp_path_factory)
    made = {"tiny": tiny}
    for name in ("decoder_only", "deep"):
        config = read_config(Workdir(tiny))
        if name == "decoder_only":
            config.model.architecture = "decoder_only"
        else:
            config.model.num_layers = 4
        vocab_size = Tokenizer(Workdir(tiny).vocab).vocab_size
        model = make_model(config.model, vocab_size, nnx.Rngs(1))
        params = nnx.split(model, nnx.Param)[1]
        path = Workdir(tmp_path_factory.mktemp(name) / "run")
        with checkpoint.make_manager(path.checkpoints, keep=1) as manager:
            meta = {"step": 1}
            write_params_workdir(
                path, json.dumps(config.to_dict()), Workdir(tiny), manager, 1, params, meta
            )
        made[name] = path.path
    return made


def calls_of(monkeypatch, module, name) -> list:
    """Records each call of `module.name` (which still runs)."""
    calls, original = [], getattr(module, name)

    def recorded(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, recorded)
    return calls


def test_alignment_words_are_the_whitespace_tokens_of_the_line_as_given(tokenizer):
    # NFKC makes "´", "¨" and U+FDFA a space and more ("It´s": "It ́s"), and SentencePiece
    # drops or keeps control characters that str.split() splits at: the pieces' word-start
    # marks then count other words than the line holds.
    sources = [
        "It´s a dog .",
        "the cat\x1csleeps now .",
        "x \ufdfa y",
        "a\x0bman\x0creads\x85now",
        "the small dog sees the cat .",
    ]
    targets = [
        "ein Hund¨s ist .",
        "die\x85Katze schläft",
        "ein \ufdfa Mann",
        "Es´s gut \x1c.",
        "der kleine Hund sieht die Katze .",
    ]
    graphdef, params = untrained(tokenizer)
    scored = forced.score_pairs(
        (graphdef,), (params,), tokenizer, sources, targets, 2, 64, alignment_layer=1
    )
    for source, target, pair in zip(sources, targets, scored):
        words = len(source.split()), len(target.split())
        # Each target word linked once, to a word of the source line.
        assert sorted(j for _, j in pair.links) == list(range(words[1])), (target, pair.links)
        assert all(0 <= i < words[0] for i, _ in pair.links), (source, pair.links)
    # A piece belongs to the word of the line its characters were encoded from.
    first, plain = forced.line_piece_words(tokenizer, ["It´s a dog", "the cat sleeps ."])
    assert sorted({w for piece in first for w in piece}) == [0, 1, 2]
    assert [w[0] for w in first] == sorted(w[0] for w in first)
    # Where the line and its normalization agree, words are the pieces' word starts.
    ids = tokenizer.encode(["the cat sleeps ."])[0]
    assert [w for (w,) in plain] == forced.word_of_pieces(tokenizer.pieces(ids))


def test_alignment_by_an_ensemble_that_cannot_align_is_refused_before_decoding(
    runs, tmp_path, monkeypatch
):
    source, target = tmp_path / "in.en", tmp_path / "in.de"
    source.write_text("the cat sleeps .\na man reads .\n", encoding="utf-8")
    target.write_text("die Katze\nein Mann\n", encoding="utf-8")
    out, align = tmp_path / "out", tmp_path / "align"
    decoded = calls_of(monkeypatch, saved_searches.OpenedModels, "translate")
    decoded += calls_of(monkeypatch, forced, "score_pairs")
    tiny, deep, decoder_only = runs["tiny"], runs["deep"], runs["decoder_only"]
    cases = [
        ([tiny, decoder_only], [], f"--workdir={decoder_only} is a decoder_only model"),
        ([deep, tiny], [], f"decoder layer 2 (the second-to-last of --workdir={deep})"),
        ([deep, tiny], ["--alignment_layer=3"], f"--alignment_layer=3: --workdir={tiny} has 2"),
    ]
    for workdirs, more, message in cases:
        flags = [f"--workdir={w}" for w in workdirs] + [f"--alignment={align}", *more]
        commands = [
            (translate_text.main, [f"--input={source}", f"--output={out}"]),
            (score.main, [f"--src={source}", f"--tgt={target}", f"--output={out}"]),
        ]
        for main, files in commands:
            with pytest.raises(ValueError, match="--alignment") as error:
                main(flags + files)
            assert message in str(error.value) and "\n" not in str(error.value)
            assert not decoded and not out.exists() and not align.exists()
    # A layer every member has aligns the deeper ensemble.
    score.main([f"--workdir={deep}", f"--workdir={tiny}", "--alignment_layer=1", f"--src={source}",
                f"--tgt={target}", f"--output={out}", f"--alignment={align}"])  # fmt: skip
    links = [line.split() for line in align.read_text().splitlines()]
    assert [len(line) for line in links] == [2, 2]


def test_a_pair_or_a_batch_too_large_for_memory_is_refused_before_it_is_allocated(
    runs, tmp_path, monkeypatch
):
    # A device with 40 MiB free: a batch may take 32 MiB. Scoring a pair of 1,024-piece sides
    # whole takes about 70 MB (each attention's weights are 4 heads of 1,024 x 1,024 floats).
    free = HostMemory(40 << 20, "a test's 40 MiB")
    monkeypatch.setattr(memory, "device_memory", lambda: free, raising=False)
    tiny = runs["tiny"]
    long_en = " ".join(["the old woman gives the child a red apple ."] * 40)
    long_de = " ".join(["die alte Frau gibt dem Kind einen roten Apfel ."] * 40)
    source, target = tmp_path / "in.en", tmp_path / "in.de"
    source.write_text(f"the cat sleeps .\n{long_en}\na man reads .\n", encoding="utf-8")
    target.write_text(f"die Katze\n{long_de}\nein Mann\n", encoding="utf-8")
    out = tmp_path / "scores.tsv"
    out.write_text("earlier\n")
    passes = calls_of(monkeypatch, forced, "forced_log_probs")
    decoded = calls_of(monkeypatch, saved_searches.OpenedModels, "translate")
    pair = [f"--workdir={tiny}", f"--src={source}", f"--tgt={target}", f"--output={out}"]
    with pytest.raises(ValueError, match=r"^pair 2: .*memory") as error:
        score.main(pair)
    assert "\n" not in str(error.value) and "by a test's 40 MiB)" in str(error.value)
    assert not passes and out.read_text() == "earlier\n"
    # A --batch_size whose batches would not fit is refused before anything is read.
    short = tmp_path / "short.en"
    short.write_text("the cat sleeps .\na man reads .\n", encoding="utf-8")
    for main, argv in [
        (score.main, [f"--src={short}", f"--tgt={short}"]),
        (translate_text.main, [f"--input={short}"]),
    ]:
        with pytest.raises(ValueError, match=r"^--batch_size=100000: .*memory") as error:
            main([f"--workdir={tiny}", f"--output={out}", "--batch_size=100000", *argv])
        assert "\n" not in str(error.value)
        assert not passes and not decoded and out.read_text() == "earlier\n"
    # Long pairs that fit one at a time (18 MB each) are scored whole, in batches of one, each
    # as it would be alone.
    halves = [" ".join(["the old woman gives the child a red apple ."] * 20)] * 2
    targets = [" ".join(["die alte Frau gibt dem Kind einen roten Apfel ."] * 20)] * 2
    halves[1] += " ."
    models = [read_config(Workdir(tiny)).model]
    graphdefs, params, tokenizer, _, _ = load_ensemble([tiny])
    both = forced.score_pairs(graphdefs, params, tokenizer, halves, targets, 2, 32, models=models)
    assert len(passes) == 2
    for n, pair in enumerate(both):
        alone = forced.score_pairs(
            graphdefs, params, tokenizer, halves[n : n + 1], targets[n : n + 1], 1, 32
        )[0]
        assert pair.too_long and pair.log_probs == alone.log_probs


def test_an_export_given_as_a_workdir_is_named_as_one(runs, tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text('{"add_source_bos": false}')
    (export / "translate-export.json").write_text(
        json.dumps({"format": "ctranslate2", "workdir": str(runs["tiny"])})
    )
    (export / "vocab.model").write_bytes(Workdir(runs["tiny"]).vocab.read_bytes())
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a\tb\n", encoding="utf-8")
    with pytest.raises(ValueError) as error:
        score.main([f"--workdir={export}", f"--input={pairs}"])
    message = str(error.value)
    assert "--average" not in message
    assert f"--workdir={export}" in message and "ctranslate2 export" in message
    assert str(runs["tiny"]) in message


def allocated_by_xla(lowered) -> int:
    """What XLA allocates to run a compiled pass: its temporaries and its outputs (the
    parameters and the batch are the caller's, held already)."""
    analysis = lowered.compile().memory_analysis()
    return analysis.temp_size_in_bytes + analysis.output_size_in_bytes


@pytest.mark.parametrize(
    "architecture, dtype",
    [
        ("encoder_decoder", "bfloat16"),
        pytest.param("encoder_decoder", "float32", marks=pytest.mark.slow),
        pytest.param("decoder_only", "bfloat16", marks=pytest.mark.slow),
        pytest.param("decoder_only", "float32", marks=pytest.mark.slow),
    ],
)
def test_the_scoring_estimate_bounds_xla_memory_analysis_up_to_the_longest_pair_allowed(
    architecture, dtype
):
    """forced_bytes bounds what XLA's buffer assignment gives the compiled pass (the forced
    log-probabilities and the alignment's cross-attention), from 256-piece sides to the longest
    pair the memory bound lets be scored whole on this machine, sides of equal and of unequal
    widths. With bfloat16 compute the estimate was half of it: the attention weights were
    counted in bfloat16, and the softmax keeps them float32."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    from conftest import tiny_config

    from translate.data.batching import Batch, decode_width
    from translate.models.factory import abstract_model

    config, vocab = tiny_config(), 200
    config.model = dataclasses.replace(config.model, compute_dtype=dtype, architecture=architecture)
    graphdef, params = abstract_model(config, vocab)
    param_bytes = forced.parameter_bytes(params)

    def estimate(s, t):
        return forced.forced_bytes([config.model], vocab, 1, s, t, param_bytes)

    widths = sorted({decode_width(n) for n in range(1, 1 << 17, 8)})
    longest = max(w for w in widths if estimate(w, w) <= memory.memory_bound())
    assert longest >= 4096  # long pairs are reached (a machine of a few GB free)
    for s, t in [(256, 256), (longest, longest), (longest, 256), (256, longest)]:
        src, tgt = (jax.ShapeDtypeStruct((1, n), jnp.int32) for n in (s, t))
        batch = Batch(src, src, src, tgt, tgt, tgt)
        passes = [forced.forced_log_probs.lower((graphdef,), (params,), batch, tgt)]
        if architecture == "encoder_decoder":
            passes.append(forced.cross_attention.lower((graphdef,), (params,), batch, layer=0))
        for lowered in passes:
            allocated = allocated_by_xla(lowered)
            assert allocated <= estimate(s, t), (s, t, allocated, estimate(s, t))
