"""Exports (translate/export.py; translate/engines/: writer.py, ctranslate2.py, huggingface.py),
checked against the engines themselves: CTranslate2 always, transformers under `interop`."""

import functools
import importlib.util
import json
import logging
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from translate import atomic, checkpoint, cli, export
from translate.data import synthetic
from translate.data.batching import Batch
from translate.data.tokenizer import BOS_ID, EOS_ID, Tokenizer, train_tokenizer
from translate.decoding.sentences import translate_sentences
from translate.decoding.settings import decode_settings
from translate.engines import (
    ctranslate2 as export_ctranslate2,
)
from translate.engines import (
    huggingface as export_huggingface,
)
from translate.engines import (
    writer as exporter,
)
from translate.models.factory import make_model
from translate.models.positions import sinusoidal_positions
from translate.trained import load_model
from translate.workdir import Workdir

ctranslate2 = pytest.importorskip("ctranslate2")

# (architecture, norm position) of every model kind CTranslate2 can run.
KINDS = [
    ("encoder_decoder", "post"),
    ("encoder_decoder", "pre"),
    ("decoder_only", "post"),
    ("decoder_only", "pre"),
]
PAIRS = synthetic.generate_pairs(7, seed=7)
# One batch of the tiny config's 8 sentences (one compilation of our search); a blank line too.
SENTENCES = [s for s, _ in PAIRS] + ["", "the dog ."]
TOLERANCE = 1e-4
# One thread: a tiny model gains nothing from more, and CTranslate2's threads spin while they
# wait for each other, which on busy shared cores slowed a test tenfold.
ENGINE = {"intra_threads": 1}


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> pathlib.Path:
    """A 64-piece BPE vocabulary of the synthetic grammar."""
    pairs = synthetic.generate_pairs(300, seed=1)
    path = tmp_path_factory.mktemp("vocab") / "vocab.model"
    train_tokenizer([s for pair in pairs for s in pair], 64, path)
    return path


def make_workdir(
    path: pathlib.Path,
    vocab: pathlib.Path,
    architecture: str,
    norm: str,
    steps=(1,),
    prefix_attention: str = "causal",
    eos_scale: float = 1.0,
    fields: dict | None = None,
) -> pathlib.Path:
    """A workdir holding a random tiny model (vocab 64, d_model 32, 2 layers) at `steps`.

    Every parameter is moved off its initial value by noise (LayerNorm scales off 1, biases
    off 0), so a parameter put in the wrong place shows; at this scale the greedy outputs differ
    from source to source. `eos_scale` multiplies EOS's embedding row, hence its logit;
    `fields` sets other model fields.
    """
    config = tiny_config()
    config.model.architecture, config.model.norm_position = architecture, norm
    config.model.prefix_attention = prefix_attention
    for name, value in (fields or {}).items():
        setattr(config.model, name, value)
    config.model.compute_dtype = "float32"
    config.train.keep_checkpoints = len(steps)
    work = Workdir(path)
    path.mkdir(parents=True)
    shutil.copyfile(vocab, work.vocab)
    work.config.write_text(json.dumps(config.to_dict()))
    tokenizer = Tokenizer(work.vocab)
    with checkpoint.make_manager(work.checkpoints, keep=len(steps)) as manager:
        for step in steps:
            model = make_model(config.model, tokenizer.vocab_size, nnx.Rngs(step))
            rng = np.random.default_rng(step)
            for _, param in nnx.iter_graph(model):
                if isinstance(param, nnx.Param):
                    noise = rng.normal(scale=0.3, size=param.shape).astype(np.float32)
                    param[...] = param[...] + noise
            model.embed.embedding[EOS_ID] = model.embed.embedding[EOS_ID] * eos_scale
            meta = {"step": step, "vocab_sha256": tokenizer.sha256}
            checkpoint.save_params(manager, step, nnx.state(model, nnx.Param), meta)
    return path


@pytest.fixture(scope="module")
def workdirs(vocab, tmp_path_factory):
    """`get(architecture, norm)`: a workdir of that kind, made once for the whole module."""
    made = {}

    def get(architecture: str, norm: str) -> pathlib.Path:
        if (architecture, norm) not in made:
            root = tmp_path_factory.mktemp(f"{architecture}-{norm}")
            made[architecture, norm] = make_workdir(root / "run", vocab, architecture, norm)
        return made[architecture, norm]

    return get


@pytest.fixture(scope="module", params=KINDS, ids=lambda kind: "-".join(kind))
def exported(request, workdirs):
    """(workdir, CTranslate2 export) of each model kind."""
    workdir = workdirs(*request.param)
    exporter.export(str(workdir), str(workdir.parent / "ct2"), "ctranslate2")
    return workdir, workdir.parent / "ct2"


@functools.partial(jax.jit, static_argnums=0)
def log_softmax_of_logits(graphdef, params, batch: Batch) -> jax.Array:
    """log P [B, T, V] of our model's teacher-forced logits (translate/models/transformer.py)."""
    return jax.nn.log_softmax(nnx.merge(graphdef, params)(batch))


def teacher_forced_log_probs(workdir: pathlib.Path, pairs, average: int = 0) -> list[np.ndarray]:
    """Our model's log P of each target token and EOS, fed the reference target."""
    graphdef, params, tokenizer, config, _ = load_model(workdir, average=average)
    sources = [ids + [EOS_ID] for ids in tokenizer.encode_source([s for s, _ in pairs])]
    targets = tokenizer.encode_target([t for _, t in pairs])
    s, t = max(map(len, sources)), max(map(len, targets)) + 1

    def padded(rows, width):  # tokens [B, width], segments [B, width], positions [B, width]
        tokens = np.zeros((len(rows), width), np.int32)
        for i, row in enumerate(rows):
            tokens[i, : len(row)] = row
        segments = (np.arange(width)[None] < np.array([len(r) for r in rows])[:, None]) * 1
        return tokens, segments, np.broadcast_to(np.arange(width), tokens.shape)

    batch = Batch(*padded(sources, s), *padded([[BOS_ID] + y for y in targets], t))
    log_probs = np.asarray(log_softmax_of_logits(graphdef, params, batch))
    return [
        log_probs[i, np.arange(len(y) + 1), y + [EOS_ID]]  # [len(y) + 1]
        for i, y in enumerate(targets)
    ]


def ctranslate2_log_probs(export_dir: pathlib.Path, tokenizer: Tokenizer, pairs, architecture):
    """CTranslate2's log P of each target token and EOS, fed the same target."""
    sources = [tokenizer.pieces(ids) for ids in tokenizer.encode_source([s for s, _ in pairs])]
    targets = [tokenizer.pieces(ids) for ids in tokenizer.encode_target([t for _, t in pairs])]
    if architecture == "decoder_only":
        separator = tokenizer.pieces([EOS_ID, BOS_ID])
        generator = ctranslate2.Generator(str(export_dir), **ENGINE)
        # The generator scores every token after the first: keep the target's and EOS's.
        results = generator.score_batch(
            [x + separator + y + tokenizer.pieces([EOS_ID]) for x, y in zip(sources, targets)]
        )
        return [np.array(r.log_probs[len(x) + 1 :]) for r, x in zip(results, sources)]
    translator = ctranslate2.Translator(str(export_dir), **ENGINE)
    return [np.array(r.log_probs) for r in translator.score_batch(sources, targets)]


@functools.cache
def our_greedy_outputs(workdir: pathlib.Path, sentences: tuple[str, ...]) -> list[str]:
    """Our greedy translations (sentences.translate_sentences with beam size 1)."""
    graphdef, params, tokenizer, config, _ = load_model(workdir)
    settings = decode_settings(config.decode, {"beam_size": 1})
    found = translate_sentences(
        (graphdef,), (params,), tokenizer, sentences, settings, config.data.max_len
    )
    return [best[0][1] for best in found]


def decode_options(workdir: pathlib.Path) -> dict:
    """The keyword arguments that make an engine's greedy search ours (the workdir's limits)."""
    config = json.loads(Workdir(workdir).config.read_text())
    return dict(
        beam_size=1,
        length_penalty=config["decode"]["length_penalty"],
        max_extra_len=config["decode"]["max_extra_len"],
        max_len=config["data"]["max_len"],
        batch_size=8,
    )


def ctranslate2_greedy_outputs(workdir, export_dir, sentences) -> list[str]:
    config = json.loads(Workdir(workdir).config.read_text())
    if config["model"]["architecture"] == "decoder_only":
        engine = ctranslate2.Generator(str(export_dir), **ENGINE)
    else:
        engine = ctranslate2.Translator(str(export_dir), **ENGINE)
    tokenizer = Workdir(workdir).tokenizer()
    return export_ctranslate2.translate(engine, tokenizer, sentences, **decode_options(workdir))


def test_ctranslate2_log_probs_of_a_fed_target_match_ours(exported):
    workdir, export_dir = exported
    config = json.loads(Workdir(workdir).config.read_text())
    ours = teacher_forced_log_probs(workdir, PAIRS)
    theirs = ctranslate2_log_probs(
        export_dir, Tokenizer(Workdir(workdir).vocab), PAIRS, config["model"]["architecture"]
    )
    for mine, other in zip(ours, theirs, strict=True):
        assert mine.shape == other.shape
        np.testing.assert_allclose(other, mine, rtol=0, atol=TOLERANCE)


def test_ctranslate2_greedy_output_is_ours(exported):
    workdir, export_dir = exported
    ours = our_greedy_outputs(workdir, tuple(SENTENCES))
    assert len(set(ours)) > 3, ours  # outputs that differ with the source: a real comparison
    assert ctranslate2_greedy_outputs(workdir, export_dir, SENTENCES) == ours


# Today's blocks (models/attention.py, positions.py, layers.py), each alone and together as
# T5Gemma combines them, on both architectures: (architecture, norm position, model fields).
TODAYS_BLOCKS = {
    "rotary": ("encoder_decoder", "post", {"positions": "rotary"}),
    "relative": ("encoder_decoder", "post", {"positions": "relative"}),
    "rmsnorm": ("encoder_decoder", "post", {"normalization": "rmsnorm"}),
    "gelu": ("encoder_decoder", "post", {"feed_forward": "gelu"}),
    "swiglu": ("encoder_decoder", "post", {"feed_forward": "swiglu"}),
    "geglu": ("encoder_decoder", "post", {"feed_forward": "geglu"}),
    "grouped": ("encoder_decoder", "post", {"num_kv_heads": 2}),
    "multi-query": ("encoder_decoder", "post", {"num_kv_heads": 1}),
    "no-bias": ("encoder_decoder", "post", {"use_bias": False}),
    # What OPUS-MT's Marian models compute beyond the paper's blocks.
    "marian": (
        "encoder_decoder",
        "post",
        {
            "feed_forward": "silu",
            "scale_embeddings": False,
            "logits_bias": True,
            "share_encoder_decoder_embeddings": False,
        },
    ),
    "all-pre": (
        "encoder_decoder",
        "pre",
        {
            "positions": "rotary",
            "normalization": "rmsnorm",
            "feed_forward": "geglu",
            "num_kv_heads": 2,
            "use_bias": False,
        },
    ),
    "relative-swiglu-pre": (
        "encoder_decoder",
        "pre",
        {"positions": "relative", "feed_forward": "swiglu", "num_kv_heads": 1},
    ),
    "decoder-only-rotary": ("decoder_only", "post", {"positions": "rotary"}),
    "decoder-only-relative": ("decoder_only", "post", {"positions": "relative"}),
    "decoder-only-all-pre": (
        "decoder_only",
        "pre",
        {
            "positions": "rotary",
            "normalization": "rmsnorm",
            "feed_forward": "swiglu",
            "num_kv_heads": 2,
            "use_bias": False,
            "scale_embeddings": False,
            "logits_bias": True,
        },
    ),
}


# Each switch alone is slow; the combinations and the feed-forwards no combination holds stay.
ALONE = pytest.mark.slow(
    reason="each switch alone, compiled and run by both engines (about 4 s each on 2 cores): "
    "the combinations in the default run hold every one of these switches; alone, a failure "
    "names the switch"
)
IN_COMBINATIONS = {
    "rotary", "relative", "rmsnorm", "swiglu", "grouped", "multi-query", "no-bias",
    "decoder-only-rotary", "decoder-only-relative",
}  # fmt: skip


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=ALONE) if name in IN_COMBINATIONS else name
        for name in TODAYS_BLOCKS
    ],
)
def exported_blocks(request, vocab, tmp_path_factory):
    """(workdir, CTranslate2 export) of a model with some of today's blocks."""
    architecture, norm, fields = TODAYS_BLOCKS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    workdir = make_workdir(root / "run", vocab, architecture, norm, fields=fields)
    exporter.export(str(workdir), str(root / "ct2"), "ctranslate2")
    return workdir, root / "ct2"


def test_ctranslate2_computes_todays_blocks_as_ours(exported_blocks):
    # CTranslate2's own rotary, T5 bias, RMSNorm, gated networks and grouped heads, fed our
    # weights, give our log-probabilities and our greedy outputs.
    test_ctranslate2_log_probs_of_a_fed_target_match_ours(exported_blocks)
    test_ctranslate2_greedy_output_is_ours(exported_blocks)


def test_ctranslate2_allows_an_empty_output_as_ours_does(vocab, tmp_path):
    # CTranslate2's min_decoding_length is 1 unless told otherwise; ours allows EOS at once.
    workdir = make_workdir(tmp_path / "run", vocab, "encoder_decoder", "post", eos_scale=10.0)
    exporter.export(str(workdir), str(tmp_path / "ct2"), "ctranslate2")
    ours = our_greedy_outputs(workdir, tuple(SENTENCES))
    assert ours == [""] * len(SENTENCES)
    assert ctranslate2_greedy_outputs(workdir, tmp_path / "ct2", SENTENCES) == ours


def test_export_directory_holds_the_vocabulary_and_the_marker(exported):
    workdir, export_dir = exported
    assert (export_dir / "vocab.model").read_bytes() == Workdir(workdir).vocab.read_bytes()
    record = json.loads((export_dir / exporter.MARKER).read_text())
    assert record["format"] == "ctranslate2" and record["steps"] == [1]
    assert record["workdir"] == str(workdir.resolve())
    assert record["parameters"] == "raw"  # which parameters (no moving average here)


def test_int8_quantization_stores_every_projection_in_8_bits(workdirs, tmp_path, monkeypatch):
    workdir = workdirs("encoder_decoder", "post")
    written = []
    write = export_ctranslate2.write
    monkeypatch.setattr(export_ctranslate2, "write", lambda *a: written.append(write(*a)))
    exporter.export(str(workdir), str(tmp_path / "int8"), "ctranslate2", quantization="int8")
    variables = written[0].variables().items()  # a str value names the variable it aliases
    dtypes = {name: value.dtype for name, value in variables if not isinstance(value, str)}
    weights = [name for name in dtypes if name.endswith("/weight")]
    assert len(weights) > 10 and all(dtypes[name] == "int8" for name in weights), dtypes
    translator = ctranslate2.Translator(str(tmp_path / "int8"), **ENGINE)
    assert translator.translate_batch([["▁the", "▁dog"]], max_decoding_length=4)[0].hypotheses


def test_average_exports_the_mean_of_the_newest_checkpoints(vocab, tmp_path):
    workdir = make_workdir(tmp_path / "run", vocab, "encoder_decoder", "pre", steps=(1, 2))
    record = exporter.export(str(workdir), str(tmp_path / "ct2"), "ctranslate2", average=2)
    assert record["steps"] == [1, 2]
    tokenizer = Tokenizer(Workdir(workdir).vocab)
    theirs = ctranslate2_log_probs(tmp_path / "ct2", tokenizer, PAIRS[:2], "encoder_decoder")
    mean = teacher_forced_log_probs(workdir, PAIRS[:2], average=2)
    newest = teacher_forced_log_probs(workdir, PAIRS[:2])
    for other, mine, last in zip(theirs, mean, newest, strict=True):
        np.testing.assert_allclose(other, mine, rtol=0, atol=TOLERANCE)
        assert np.abs(other - last).max() > 100 * TOLERANCE  # not the newest checkpoint's


def test_benchmark_times_ctranslate2_beside_our_decoder(workdir, tmp_path):
    from scripts import benchmark

    (tmp_path / "src.txt").write_text("\n".join(s for s, _ in PAIRS) + "\n")
    argv = ["--skip_training", f"--decode_workdir={workdir}", f"--decode_src={tmp_path}/src.txt"]
    argv.append("--engine_threads=1")  # as ENGINE
    with pytest.raises(SystemExit) as stopped:
        cli.run(benchmark.main, [*argv, f"--json={tmp_path}/out.json"])
    assert stopped.value.code == 0
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["engines"] == ["ctranslate2_float32", "ctranslate2_int8"]
    for engine in result["engines"]:
        for search in ("beam4", "greedy"):
            assert result[f"{engine}_sentences_per_sec_{search}"] > 0
    assert result["ctranslate2_float32_same_as_ours_greedy"] == 1.0


def run_command(argv, capsys) -> tuple[int, str]:
    """translate-export's exit status and what it wrote to stderr."""
    with pytest.raises(SystemExit) as stopped:
        cli.run(export.main, argv)
    return stopped.value.code, capsys.readouterr().err


def files_under(path: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def workdir(workdirs) -> pathlib.Path:
    return workdirs("encoder_decoder", "post")


def test_command_exports_and_a_second_export_replaces_the_first(workdir, tmp_path, capsys):
    out = tmp_path / "ct2"
    argv = [f"--workdir={workdir}", "--format=ctranslate2", f"--output={out}"]
    code, err = run_command(argv, capsys)
    assert code == 0, err
    first = files_under(out)
    code, err = run_command([*argv, "--quantization=int8"], capsys)
    assert code == 0, err
    assert json.loads((out / exporter.MARKER).read_text())["quantization"] == "int8"
    assert files_under(out)["model.bin"] != first["model.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # nothing left beside it


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--average=-2"], "must be >= 0"),
        (["--step=-5"], "must be >= 0"),
        (["--step=1", "--average=1"], "not both"),
        (["--step=7"], "no checkpoint at step 7"),
        (["--average=3"], "averaging 3 checkpoints"),
        (["--format=onnx"], "--format=onnx: give --format=ctranslate2 or --format=huggingface"),
        (["--quantization=int4"], "--quantization=int4: one of int8"),
    ],
)
def test_command_mistakes_are_one_line_and_status_2(workdir, tmp_path, capsys, flags, expected):
    argv = [f"--workdir={workdir}", f"--output={tmp_path / 'out'}"]
    if not any(flag.startswith("--format") for flag in flags):
        argv.append("--format=ctranslate2")
    code, err = run_command(argv + flags, capsys)
    assert code == 2
    assert err.count("\n") == 1 and expected in err, err
    assert not (tmp_path / "out").exists()


def test_huggingface_refuses_quantization_in_one_line(workdir, tmp_path, capsys):
    argv = [f"--workdir={workdir}", "--format=huggingface", f"--output={tmp_path / 'out'}"]
    code, err = run_command([*argv, "--quantization=int8"], capsys)
    assert code == 2 and err.count("\n") == 1 and "only --format=ctranslate2 takes it" in err


def test_an_empty_output_directory_is_written_into(workdir, tmp_path):
    (tmp_path / "ct2").mkdir()
    exporter.export(str(workdir), str(tmp_path / "ct2"), "ctranslate2")
    assert (tmp_path / "ct2" / "model.bin").is_file() and (
        tmp_path / "ct2" / exporter.MARKER
    ).is_file()


@pytest.mark.parametrize(
    "where", ["workdir", "parent", "checkpoints", "foreign", "file", "under_a_file"]
)
def test_output_that_is_not_a_new_directory_or_an_export_is_refused(
    workdir, tmp_path, capsys, where
):
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    (tmp_path / "a_file").write_text("mine")
    output = {
        "workdir": workdir,
        "parent": workdir.parent,
        "checkpoints": Workdir(workdir).checkpoints / "export",
        "foreign": foreign,
        "file": tmp_path / "a_file",
        "under_a_file": tmp_path / "a_file" / "ct2",
    }[where]
    before = files_under(workdir.parent), files_under(tmp_path)
    code, err = run_command(
        [f"--workdir={workdir}", "--format=ctranslate2", f"--output={output}"], capsys
    )
    assert code == 2 and err.count("\n") == 1, err
    assert f"--output={output}" in err
    assert (files_under(workdir.parent), files_under(tmp_path)) == before


def test_workdir_without_checkpoints_is_one_line_and_status_2(workdir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for name in ("config.json", "vocab.model"):
        shutil.copyfile(workdir / name, empty / name)
    code, err = run_command(
        [f"--workdir={empty}", "--format=ctranslate2", f"--output={tmp_path / 'out'}"], capsys
    )
    assert code == 2 and "no checkpoint" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_an_export_given_as_workdir_is_one_line_and_status_2(workdir, tmp_path, capsys):
    exporter.export(str(workdir), str(tmp_path / "ct2"), "ctranslate2")
    code, err = run_command(
        [f"--workdir={tmp_path / 'ct2'}", "--format=ctranslate2", f"--output={tmp_path / 'x'}"],
        capsys,
    )
    assert code == 2 and err.count("\n") == 1 and "is an export" in err, err


def test_missing_package_is_one_line_and_status_2(workdir, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(export_ctranslate2, "PACKAGE", "no_such_package_x")
    monkeypatch.setattr(export_ctranslate2, "INSTALL", "pip install x")
    code, err = run_command(
        [f"--workdir={workdir}", "--format=ctranslate2", f"--output={tmp_path / 'out'}"], capsys
    )
    assert code == 2 and err.count("\n") == 1 and "needs the no_such_package_x package" in err


def test_a_failed_export_leaves_the_earlier_one_as_it_was(workdir, tmp_path, monkeypatch):
    out = tmp_path / "ct2"
    exporter.export(str(workdir), str(out), "ctranslate2")
    before = files_under(out)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_ctranslate2, "write", disk_full)
    with pytest.raises(OSError):
        exporter.export(str(workdir), str(out), "ctranslate2")
    assert files_under(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


@pytest.mark.parametrize("fmt", ["ctranslate2", "huggingface"])
def test_a_prefix_lm_is_refused_with_the_reason(vocab, tmp_path, capsys, fmt):
    workdir = make_workdir(
        tmp_path / "run", vocab, "decoder_only", "pre", prefix_attention="bidirectional"
    )
    code, err = run_command(
        [f"--workdir={workdir}", f"--format={fmt}", f"--output={tmp_path / 'out'}"], capsys
    )
    assert code == 2 and err.count("\n") == 1, err
    assert ("attend causally" if fmt == "ctranslate2" else "decoder-only") in err
    assert not (tmp_path / "out").exists()


def test_position_table_renumbered_is_the_one_marian_and_pegasus_build():
    """[sin | cos] halves at 10000^(2i/D) from position 0, written out independently."""
    d, positions = 32, np.arange(40)[:, None]
    angles = positions / 10000.0 ** (2 * np.arange(d // 2) / d)  # [P, D/2]
    theirs = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    ours = np.asarray(sinusoidal_positions(jnp.arange(40), d))
    np.testing.assert_allclose(ours[:, export_huggingface.channel_order(d)], theirs, atol=1e-5)


@pytest.mark.parametrize("norm, model_type", [("post", "marian"), ("pre", "pegasus")])
def test_huggingface_export_picks_marian_for_post_and_pegasus_for_pre(
    workdirs, tmp_path, norm, model_type
):
    exporter.export(str(workdirs("encoder_decoder", norm)), str(tmp_path / "hf"), "huggingface")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == model_type
    assert config["decoder_start_token_id"] == BOS_ID and config["eos_token_id"] == EOS_ID


def test_huggingface_weights_are_as_readable_as_the_config(workdir, tmp_path):
    exporter.export(str(workdir), str(tmp_path / "hf"), "huggingface")
    modes = {p.name: p.stat().st_mode for p in (tmp_path / "hf").iterdir()}
    assert modes["model.safetensors"] == modes["config.json"], modes  # not the owner's alone


# The models exported to transformers: (norm position, model fields).
HUGGINGFACE_MODELS = {
    "post": ("post", {}),
    "pre": ("pre", {}),
    "post-gelu": ("post", {"feed_forward": "gelu"}),
    "pre-gelu": ("pre", {"feed_forward": "gelu"}),
    # What OPUS-MT's Marian models compute beyond the paper's blocks.
    "post-marian": (
        "post",
        {
            "feed_forward": "silu",
            "scale_embeddings": False,
            "logits_bias": True,
            "share_encoder_decoder_embeddings": False,
        },
    ),
    # Unscaled embeddings are checked after post-LayerNorm: this random pre-LayerNorm model
    # would end every output at once, and greedy decoding would compare nothing.
    "pre-marian": ("pre", {"feed_forward": "silu", "logits_bias": True}),
}


@pytest.fixture(scope="module", params=list(HUGGINGFACE_MODELS))
def huggingface_export(request, workdirs, vocab, tmp_path_factory):
    """(workdir, loaded transformers model with our LayerNorm epsilon) of each norm position,
    with the paper's ReLU, a GELU, and what OPUS-MT's Marian models compute."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    norm, fields = HUGGINGFACE_MODELS[request.param]
    if fields:
        root = tmp_path_factory.mktemp(request.param)
        workdir = make_workdir(root / "run", vocab, "encoder_decoder", norm, fields=fields)
    else:
        workdir = workdirs("encoder_decoder", norm)
    exporter.export(str(workdir), str(workdir.parent / "hf"), "huggingface")
    model, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        str(workdir.parent / "hf"), output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    model.eval()
    export_huggingface.match_layer_norm_epsilon(model, 1e-6)
    return workdir, model


@pytest.mark.interop
def test_transformers_log_probs_of_a_fed_target_match_ours(huggingface_export):
    import torch

    workdir, model = huggingface_export
    tokenizer = Tokenizer(Workdir(workdir).vocab)
    ours = teacher_forced_log_probs(workdir, PAIRS)
    for (source, target), mine in zip(PAIRS, ours, strict=True):
        x = tokenizer.encode([source])[0] + [EOS_ID]
        y = tokenizer.encode([target])[0]
        with torch.inference_mode():
            logits = model(
                input_ids=torch.tensor([x]), decoder_input_ids=torch.tensor([[BOS_ID] + y])
            ).logits[0]  # [T, V]
        theirs = torch.log_softmax(logits, -1).numpy()[np.arange(len(y) + 1), y + [EOS_ID]]
        np.testing.assert_allclose(theirs, mine, rtol=0, atol=TOLERANCE)


@pytest.mark.interop
def test_transformers_greedy_output_is_ours(huggingface_export):
    workdir, model = huggingface_export
    ours = our_greedy_outputs(workdir, tuple(SENTENCES))
    assert len(set(ours)) > 3, ours
    tokenizer = Tokenizer(Workdir(workdir).vocab)
    theirs = export_huggingface.translate(model, tokenizer, SENTENCES, **decode_options(workdir))
    assert theirs == ours


@pytest.mark.parametrize("quantization", ["bfloat16", "int8_bfloat16"])
def test_a_quantization_that_needs_torch_is_refused_before_writing_when_it_is_missing(
    quantization, workdir, tmp_path, capsys, monkeypatch
):
    # CTranslate2's converter casts to bfloat16 with torch; without it the export ended in
    # a traceback. Refused first in one line, nothing written.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else real_find_spec(name, *a),
    )
    output = tmp_path / "out"
    code, err = run_command(
        [
            f"--workdir={workdir}",
            "--format=ctranslate2",
            f"--quantization={quantization}",
            f"--output={output}",
        ],
        capsys,
    )
    assert code == 2 and err.count("\n") == 1, err
    assert f"--quantization={quantization} needs the torch package" in err
    assert "int8_float16" in err  # the ones that need nothing more are named
    assert not output.exists()


def test_the_partial_copy_of_a_killed_export_is_removed_by_the_next(workdir, tmp_path, monkeypatch):
    # SIGKILL runs no cleanup: the directory being written stays beside --output.
    output = tmp_path / "ct2"
    left = tmp_path / ".ct2.0123abcd.new"
    left.mkdir()
    (left / "model.bin").write_bytes(b"half a model")
    monkeypatch.setattr(atomic, "STALE_SECONDS", 0.0)
    exporter.export(str(workdir), str(output), "ctranslate2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


def test_a_re_export_keeps_what_a_user_added_to_the_export(workdir, tmp_path, capsys, caplog):
    out = tmp_path / "ct2"
    argv = [f"--workdir={workdir}", "--format=ctranslate2", f"--output={out}"]
    assert run_command(argv, capsys)[0] == 0
    (out / "README.md").write_text("how we serve this model\n")
    (out / "scripts").mkdir()
    (out / "scripts" / "serve.py").write_text("print('serve')\n")
    with caplog.at_level(logging.WARNING, logger="translate"):
        code, err = run_command([*argv, "--quantization=int8"], capsys)
    assert code == 0, err
    assert (out / "README.md").read_text() == "how we serve this model\n"
    assert (out / "scripts" / "serve.py").read_text() == "print('serve')\n"
    assert "kept what the earlier export did not write: README.md, scripts" in caplog.text
    marker = json.loads((out / exporter.MARKER).read_text())
    assert marker["quantization"] == "int8" and "README.md" not in marker["files"]
    assert {"model.bin", "vocab.model", exporter.MARKER} <= set(marker["files"])


def test_an_export_that_a_run_has_trained_into_is_not_replaced(workdir, tmp_path, capsys):
    out = tmp_path / "ct2"
    argv = [f"--workdir={workdir}", "--format=ctranslate2", f"--output={out}"]
    assert run_command(argv, capsys)[0] == 0
    (out / "checkpoints").mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    before = files_under(out)
    code, err = run_command(argv, capsys)
    assert code == 2
    assert "a training run has written into since (checkpoints, metrics.jsonl)" in err, err
    assert files_under(out) == before and (out / "checkpoints").is_dir()


@pytest.mark.parametrize("force", [False, True])
def test_training_into_an_export_is_refused_and_changes_nothing(workdir, tmp_path, capsys, force):
    from translate.training.trainer import train_and_evaluate

    out = tmp_path / "ct2"
    assert (
        run_command([f"--workdir={workdir}", "--format=ctranslate2", f"--output={out}"], capsys)[0]
        == 0
    )
    before = sorted(out.iterdir()), files_under(out)
    with pytest.raises(ValueError, match="is an export that translate-export wrote"):
        train_and_evaluate(tiny_config(), out, force=force)
    assert (sorted(out.iterdir()), files_under(out)) == before


def test_a_full_disk_while_exporting_is_one_line_and_keeps_the_earlier_export(
    workdir, tmp_path, capsys, monkeypatch
):
    """One line, not a raw traceback from inside the engine's converter."""
    import errno

    out = tmp_path / "ct2"
    argv = [f"--workdir={workdir}", "--format=ctranslate2", f"--output={out}"]
    assert run_command(argv, capsys)[0] == 0
    before = files_under(out)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(exporter.FORMATS["ctranslate2"], "write", full_disk)
    code, err = run_command([*argv, "--quantization=int8"], capsys)
    assert code == 2
    assert err.strip().endswith(
        f"--output={out}: could not write the export (No space left on device); nothing at "
        "--output changed"
    ), err
    assert files_under(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]
