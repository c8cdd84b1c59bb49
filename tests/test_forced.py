"""Forced decoding and alignments (translate/decoding/forced.py) and translate-score: right links,
refusals before decoding, memory bounds."""

import json

import jax
import numpy as np
import pytest
from flax import nnx
from helpers import copy_of_tiny_run

from translate import checkpoint, score, translate_text
from translate.config import ModelConfig
from translate.data.tokenizer import Tokenizer
from translate.decoding import forced, memory, saved_searches
from translate.decoding.search import search
from translate.decoding.settings import DecodeSettings
from translate.devices import HostMemory
from translate.models.factory import make_model
from translate.models.transformer import Transformer
from translate.streams import Outputs  # noqa: F401  (the writer translate-score uses)
from translate.trained import load_ensemble, write_params_workdir
from translate.workdir import Workdir, read_config

SENTENCES = [
    "the small dog sees the cat .",
    "a man reads .",
    "the old woman who lives in the house gives the child a red apple .",
    "the cat sleeps .",
]


def model(tokenizer, seed: int = 0):
    config = ModelConfig(num_layers=2, d_model=32, num_heads=4, d_ff=64, compute_dtype="float32")
    net = Transformer(config, tokenizer.vocab_size, rngs=nnx.Rngs(seed))
    # A larger embedding makes the untrained model's distributions peaked, so EOS is reached.
    net.embed.embedding[...] = net.embed.embedding[...] * 8.0
    return nnx.split(net, nnx.Param)


def by_prefixes(graphdef, params, tokenizer, source: str, target: str) -> float:
    """log P(target | source) summed piece by piece, each from a full pass over its prefix."""
    run = jax.jit(lambda params, batch: nnx.merge(graphdef, params)(batch))
    src = np.array([tokenizer.encode([source])[0] + [3]], np.int32)
    tgt = tokenizer.encode([target])[0] + [3]
    total = 0.0
    for t in range(len(tgt)):
        # The prefix alone, padded to one width (one compile): the decoder is causal and the
        # padding is its own segment, so position t reads the prefix and nothing after it.
        tgt_in = np.zeros((1, 32), np.int32)
        tgt_in[0, : t + 1] = [2] + tgt[:t]
        logits = run(params, forced.teacher_forced_batch(src, tgt_in))  # [1, 32, V]
        total += float(jax.nn.log_softmax(logits[0, t])[tgt[t]])
    return total


def test_the_score_is_the_sum_of_each_pieces_log_probability(tokenizer):
    graphdef, params = model(tokenizer)
    targets = ["der kleine Hund sieht .", "", "ein Mann", "die Katze"]
    scored = forced.score_pairs((graphdef,), (params,), tokenizer, SENTENCES, targets, 3, 64)
    for source, target, pair in zip(SENTENCES, targets, scored):
        assert pair.pieces[-1] == "</s>"
        assert len(pair.pieces) == len(tokenizer.encode([target])[0]) + 1
        expected = by_prefixes(graphdef, params, tokenizer, source, target)
        np.testing.assert_allclose(pair.total, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_score_of_the_searchs_output_is_the_searchs_score(tokenizer, beam_size):
    members = [model(tokenizer, seed) for seed in (0, 1)]
    graphdefs, params = tuple(m[0] for m in members), tuple(m[1] for m in members)
    for models in [(graphdefs[:1], params[:1]), (graphdefs, params)]:  # one, and an ensemble
        settings = DecodeSettings(beam_size, 0.6, 8, nbest=1)
        src = np.zeros((4, 48), np.int32)
        for row, ids in enumerate(tokenizer.encode(SENTENCES)):
            src[row, : len(ids) + 1] = ids + [3]
        tokens, scores = jax.device_get(search(*models, src, settings))
        # The search's own pieces, up to EOS: an untrained model's output text may encode to
        # other pieces (it even writes BOS).
        outputs = [list(row[0][: list(row[0]).index(3)]) for row in tokens]
        assert any(outputs)
        scored = forced.score_pairs(*models, tokenizer, SENTENCES, outputs, 4, 64)
        for pair, normalised in zip(scored, scores[:, 0]):
            penalty = ((5 + len(pair.log_probs)) / 6) ** 0.6
            np.testing.assert_allclose(pair.total, normalised * penalty, rtol=1e-5, atol=1e-4)


def test_an_ensemble_scores_each_piece_by_the_mean_of_its_models_log_probabilities(tokenizer):
    (ga, pa), (gb, pb) = model(tokenizer, 0), model(tokenizer, 1)
    targets = ["der Hund .", "ein Mann liest ."]
    alone = [
        forced.score_pairs((g,), (p,), tokenizer, SENTENCES[:2], targets, 2, 64)
        for g, p in ((ga, pa), (gb, pb))
    ]
    both = forced.score_pairs((ga, gb), (pa, pb), tokenizer, SENTENCES[:2], targets, 2, 64)
    for n, pair in enumerate(both):
        mean = (np.array(alone[0][n].log_probs) + np.array(alone[1][n].log_probs)) / 2
        np.testing.assert_allclose(pair.log_probs, mean, rtol=1e-5, atol=1e-6)


def test_pieces_group_into_the_whitespace_words_of_the_line(tokenizer):
    pieces = ["▁Das", "▁Haus", ",", "▁das", "▁", "(", "gro", "ß", ")", "▁ist", "."]
    assert forced.word_of_pieces(pieces) == [0, 1, 1, 2, 3, 3, 3, 3, 3, 4, 4]
    assert forced.word_of_pieces(["Haus", "▁da"]) == [0, 1]  # a first piece starts a word
    assert forced.word_of_pieces([]) == []
    for line in SENTENCES + ["Der Hund, die Katze (klein) und: das Haus!", "a  b   c"]:
        ids = tokenizer.encode([line])[0]
        words = forced.word_of_pieces(tokenizer.pieces(ids))
        assert max(words) + 1 == len(line.split()), line


def test_each_target_word_links_to_the_source_word_with_most_attention():
    attention = np.array(
        [
            [0.1, 0.7, 0.2],  # target piece 0 (word 0): source piece 1 (word 0)
            [0.5, 0.0, 0.5],  # target piece 1 (word 1) ...
            [0.0, 0.1, 0.9],  # ... and piece 2 (word 1): mean [0.25, 0.05, 0.7] -> word 1
        ]
    )
    assert forced.hard_links(attention, [0, 0, 1], [0, 1, 1]) == [(0, 0), (1, 1)]
    assert forced.hard_links(attention, range(3), range(3)) == [(1, 0), (0, 1), (2, 2)]
    assert forced.hard_links(np.zeros((0, 2)), [0, 1], []) == []
    assert forced.format_links([(2, 1), (0, 0), (1, 1)]) == "0-0 1-1 2-1"


@pytest.mark.parametrize("pieces", [False, True])
def test_alignment_indices_stay_within_both_lines(tokenizer, pieces):
    graphdef, params = model(tokenizer)
    long = " ".join(["the old woman gives the child a red apple"] * 12)
    sources = ["", "cat", "the cat sleeps .", long, "a man reads ."]
    targets = ["ein Hund", "", "Katze", "die alte Frau gibt dem Kind einen roten Apfel", "Mann"]
    for cut in (False, True):
        scored = forced.score_pairs(
            (graphdef,), (params,), tokenizer, sources, targets, 2, 32,
            alignment_layer=1, alignment_pieces=pieces, cut_sources=cut,
        )  # fmt: skip
        for source, target, pair in zip(sources, targets, scored):
            units = (len(tokenizer.encode([source])[0]), len(tokenizer.encode([target])[0]))
            if not pieces:
                units = (len(source.split()), len(target.split()))
            assert pair.too_long == (source == long and not cut)
            assert len({j for _, j in pair.links}) == (units[1] if units[0] else 0)
            for i, j in pair.links:
                assert 0 <= i < units[0] and 0 <= j < units[1], (source, target, pair.links)


def test_the_default_alignment_layer_and_its_limits(config):
    config.model.num_layers = 4
    assert forced.alignment_layer(config) == 2  # the second-to-last
    assert forced.alignment_layer(config, 0) == 0
    config.decode.alignment_layer = 1  # a recipe's choice
    assert forced.alignment_layer(config) == 1
    assert forced.alignment_layer(config, 3) == 3  # the flag wins
    config.decode.alignment_layer = 4
    with pytest.raises(ValueError, match="--config.decode.alignment_layer=4: must be -1 or"):
        config.validate()
    with pytest.raises(ValueError, match=r"--alignment_layer=4: must be in \[0, 3\]"):
        forced.alignment_layer(config, 4)
    config.model.architecture = "decoder_only"
    with pytest.raises(ValueError, match="no cross-attention"):
        forced.alignment_layer(config)


def test_the_command_writes_one_line_per_pair_in_order(workdir, tmp_path, capsys):
    (tmp_path / "s.en").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    (tmp_path / "s.de").write_text("der Hund .\n\nein Mann liest .\ndie Katze\n", encoding="utf-8")
    out, per_token, align = tmp_path / "scores.tsv", tmp_path / "p.jsonl", tmp_path / "a.txt"
    score.main(
        [
            f"--workdir={workdir}",
            f"--src={tmp_path / 's.en'}",
            f"--tgt={tmp_path / 's.de'}",
            f"--output={out}",
            f"--per_token={per_token}",
            f"--alignment={align}",
            "--batch_size=2",
        ]
    )
    rows = [line.split("\t") for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(len(r) == 3 for r in rows)
    tokens = [json.loads(line) for line in per_token.read_text().splitlines()]
    assert [t["line"] for t in tokens] == [0, 1, 2, 3]
    for row, token in zip(rows, tokens):
        assert int(row[1]) == len(token["pieces"]) == len(token["log_probs"])
        assert float(row[0]) == pytest.approx(sum(token["log_probs"]), abs=1e-4)
        assert float(row[2]) == pytest.approx(float(row[0]) / int(row[1]), abs=1e-6)
    assert len(align.read_text().split("\n")) == 5  # four lines, each ended
    assert tokens[1]["pieces"] == ["</s>"]  # an empty target: its EOS alone


def test_pairs_from_tab_separated_lines_score_as_from_two_files(
    workdir, tmp_path, capsys, monkeypatch
):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a man reads .\tein Mann liest .\nthe cat .\tdie Katze .\n", encoding="utf-8")
    score.main([f"--workdir={workdir}", f"--input={pairs}"])
    from_tsv = capsys.readouterr().out
    (tmp_path / "s.en").write_text("a man reads .\nthe cat .\n", encoding="utf-8")
    (tmp_path / "s.de").write_text("ein Mann liest .\ndie Katze .\n", encoding="utf-8")
    score.main([f"--workdir={workdir}", f"--src={tmp_path / 's.en'}", f"--tgt={tmp_path / 's.de'}"])
    assert capsys.readouterr().out == from_tsv and len(from_tsv.splitlines()) == 2


def test_bad_input_is_named_and_nothing_is_written(workdir, tmp_path):
    (tmp_path / "s.en").write_text("a\nb\nc\n", encoding="utf-8")
    (tmp_path / "s.de").write_text("a\nb\n", encoding="utf-8")
    (tmp_path / "bad.tsv").write_text("a\tb\nno tab here\n", encoding="utf-8")
    (tmp_path / "empty.de").write_text("", encoding="utf-8")
    out = tmp_path / "out.tsv"
    out.write_text("earlier\n")
    base = [f"--workdir={workdir}", f"--output={out}"]
    cases = [
        (
            [f"--src={tmp_path / 's.en'}", f"--tgt={tmp_path / 's.de'}"],
            "different numbers of lines",
        ),
        ([f"--src={tmp_path / 's.en'}", f"--tgt={tmp_path / 'empty.de'}"], "--tgt ends at line 0"),
        ([f"--input={tmp_path / 'bad.tsv'}"], "bad.tsv:2: 0 tabs"),
        ([f"--src={tmp_path / 's.en'}"], "give --src and --tgt together"),
        ([f"--input={tmp_path / 'bad.tsv'}", "--alignment_pieces"], "give --alignment=FILE too"),
        ([f"--input={tmp_path / 'bad.tsv'}", "--batch_size=0"], "--batch_size=0: must be >= 1"),
        ([f"--input={tmp_path / 'missing'}"], "no such file"),
    ]
    for argv, message in cases:
        with pytest.raises(ValueError, match=message):
            score.main(base + argv)
        assert out.read_text() == "earlier\n"
    with pytest.raises(SystemExit, match="same file as --input"):
        score.main([f"--workdir={workdir}", f"--input={out}", f"--output={out}"])
    with pytest.raises(ValueError, match="are the same file"):
        score.main(
            [*base, f"--input={tmp_path / 'bad.tsv'}", f"--per_token={tmp_path / '.' / 'out.tsv'}"]
        )
    with pytest.raises(ValueError, match="is a file of --workdir"):
        score.main(
            [
                f"--workdir={workdir}",
                f"--input={tmp_path / 'bad.tsv'}",
                f"--output={workdir / 'config.json'}",
            ]
        )
    assert out.read_text() == "earlier\n"


def test_translate_text_writes_one_alignment_line_per_output_line(workdir, tmp_path):
    from translate import translate_text

    source = tmp_path / "in.en"
    source.write_text("\n".join(SENTENCES + ["", "cat"]) + "\n", encoding="utf-8")
    out, align = tmp_path / "out.de", tmp_path / "align.txt"
    argv = [f"--workdir={workdir}", f"--input={source}", f"--output={out}"]
    translate_text.main([*argv, f"--alignment={align}", "--alignment_layer=0"])
    outputs, links = out.read_text().splitlines(), align.read_text().split("\n")[:-1]
    assert len(links) == len(outputs) == 6
    for line, output, link in zip(SENTENCES + ["", "cat"], outputs, links):
        for i, j in (map(int, pair.split("-")) for pair in link.split()):
            assert 0 <= i < len(line.split()) and 0 <= j < len(output.split())
    with pytest.raises(ValueError, match="are the same file"):
        translate_text.main([*argv, f"--alignment={out}"])
    with pytest.raises(ValueError, match="--alignment_layer=7: must be in"):
        translate_text.main([*argv, f"--alignment={align}", "--alignment_layer=7"])
    with pytest.raises(ValueError, match="give --alignment=FILE too"):
        translate_text.main([*argv, "--alignment_pieces"])


def test_a_dash_is_the_standard_stream_not_a_file(workdir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("a man reads .\tein Mann liest .\n", encoding="utf-8")
    score.main([f"--workdir={workdir}", f"--input={pairs}", "--output=-"])
    assert len(capsys.readouterr().out.splitlines()) == 1
    assert not (tmp_path / "-").exists()


# Scoring and aligning (translate-score, translate-text --alignment): right links, refusals.


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
    first, plain = forced.line_piece_words(
        tokenizer.source_spans, ["It´s a dog", "the cat sleeps ."]
    )
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
    from helpers import tiny_config

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
