"""translate-import: a Marian folder read back as a workdir (translate/pretrained/marian.py)."""

import json
import pathlib
import shutil

import jax
import numpy as np
import pytest
from test_export import SENTENCES, make_workdir, our_greedy_outputs, vocab  # noqa: F401
from test_workflow import spy_on_train_step

from translate import checkpoint, cli, import_model, score, translate_text
from translate.data.tokenizer import PairTokenizer
from translate.decoding.sentences import translate_sentences
from translate.decoding.settings import decode_settings
from translate.engines.writer import export
from translate.pretrained.marian import import_marian
from translate.trained import load_model, write_params_workdir
from translate.training import trainer
from translate.workdir import Workdir, config_text, read_config

# What OPUS-MT's Marian models compute beyond the paper's blocks, all at once.
MARIAN = {
    "feed_forward": "silu",
    "scale_embeddings": False,
    "logits_bias": True,
    "share_encoder_decoder_embeddings": False,
}


@pytest.fixture(scope="module", params=["paper", "marian"])
def exported(request, vocab, tmp_path_factory):  # noqa: F811
    """(workdir, its Hugging Face export) of a random tiny model."""
    root = tmp_path_factory.mktemp(request.param)
    fields = MARIAN if request.param == "marian" else {}
    workdir = make_workdir(root / "run", vocab, "encoder_decoder", "post", fields=fields)
    export(str(workdir), str(root / "hf"), "huggingface")
    return workdir, root / "hf"


def test_an_import_of_our_export_has_its_parameters_to_the_bit(exported, tmp_path):
    workdir, folder = exported
    config = import_marian(folder, tmp_path / "imported")
    _, ours, _, saved, _ = load_model(workdir)
    _, imported, _, imported_config, steps = load_model(tmp_path / "imported")
    assert steps == [0]
    for field in ("feed_forward", "scale_embeddings", "logits_bias"):
        assert getattr(config.model, field) == getattr(saved.model, field)
    assert config.model.share_encoder_decoder_embeddings == (
        saved.model.share_encoder_decoder_embeddings
    )
    assert jax.tree.structure(imported) == jax.tree.structure(ours)
    for mine, theirs in zip(jax.tree.leaves(imported), jax.tree.leaves(ours), strict=True):
        assert np.asarray(mine).tobytes() == np.asarray(theirs).tobytes()


def test_an_import_translates_as_the_model_exported(exported, tmp_path):
    workdir, folder = exported
    import_marian(folder, tmp_path / "imported")
    ours = our_greedy_outputs(workdir, tuple(SENTENCES))
    assert len(set(ours)) > 3, ours
    # config.json does not say how the run decoded: the import decodes with the run's settings.
    config = read_config(Workdir(workdir))
    graphdef, params, tokenizer, _, _ = load_model(tmp_path / "imported")
    settings = decode_settings(config.decode, {"beam_size": 1})
    found = translate_sentences(
        (graphdef,), (params,), tokenizer, SENTENCES, settings, config.data.max_len
    )
    assert [best[0][1] for best in found] == ours


def edited(folder: pathlib.Path, tmp_path: pathlib.Path, **fields) -> pathlib.Path:
    """A copy of `folder` whose config.json has `fields` set (None removes one)."""
    copy = tmp_path / "edited"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    for name, value in fields.items():
        if value is None:
            config.pop(name)
        else:
            config[name] = value
    (copy / "config.json").write_text(json.dumps(config))
    return copy


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"model_type": "t5"}, "config.json: model_type='t5', not 'marian'"),
        ({"model_type": "bart"}, "config.json: model_type='bart', not 'marian'"),
        ({"rope_theta": 10000.0}, "config.json: field rope_theta is not one translate-import"),
        ({"activation_function": "gelu_new"}, "activation_function='gelu_new' is not one we"),
        ({"normalize_before": True}, "normalize_before=True, not False"),
        ({"decoder_layers": 3}, "decoder_layers=3 differs from encoder_layers"),
        ({"decoder_start_token_id": 7}, "decoder_start_token_id=7, not 2"),
        ({"encoder_ffn_dim": 128, "decoder_ffn_dim": 128}, "fc1.weight has shape (64, 32), not"),
        ({"vocab_size": 65, "decoder_vocab_size": 65}, "vocab_size=65, the vocabulary has 64"),
        ({"d_model": None}, "config.json: no d_model"),
    ],
)
def test_a_folder_we_do_not_compute_is_refused_naming_the_file_and_leaves_nothing(
    exported, tmp_path, fields, message
):
    _, folder = exported
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        import_marian(edited(folder, tmp_path, **fields), tmp_path / "imported")
    assert not (tmp_path / "imported").exists()


def test_a_weight_the_config_does_not_give_is_refused(exported, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, folder = exported
    copy = edited(folder, tmp_path)
    weights = load_file(str(copy / "model.safetensors"))
    weights["model.encoder.layers.2.fc1.weight"] = weights["model.encoder.layers.0.fc1.weight"]
    save_file(weights, str(copy / "model.safetensors"))
    with pytest.raises(ValueError, match="weight model.encoder.layers.2.fc1.weight is not one"):
        import_marian(copy, tmp_path / "imported")


def run(argv, capsys) -> tuple[int, str]:
    """translate-import's exit status and what it wrote to stderr."""
    with pytest.raises(SystemExit) as stopped:
        cli.run(import_model.main, argv)
    return stopped.value.code, capsys.readouterr().err


def test_a_tokenizer_missing_or_not_one_and_the_release_layout_are_one_line_each(
    exported, tmp_path, capsys
):
    _, folder = exported
    opus = edited(folder, tmp_path)
    (opus / "vocab.model").unlink()
    for name in ("source.spm", "target.spm"):
        (opus / name).write_text("")
    code, err = run([f"--from={opus}", f"--workdir={tmp_path / 'a'}"], capsys)
    assert (
        code == 2 and "nor OPUS-MT's source.spm, target.spm, vocab.json (vocab.json missing)" in err
    )
    (opus / "vocab.json").write_text("{}")
    code, err = run([f"--from={opus}", f"--workdir={tmp_path / 'a'}"], capsys)
    assert code == 2 and f"{opus / 'source.spm'}: not a SentencePiece model" in err
    assert err.count("\n") == 1 and not (tmp_path / "a").exists()
    release = tmp_path / "release"
    release.mkdir()
    (release / "decoder.yml").write_text("models: [model.npz]\n")
    code, err = run([f"--from={release}", f"--workdir={tmp_path / 'b'}"], capsys)
    assert code == 2 and "convert_marian_to_pytorch" in err
    assert err.count("\n") == 1 and not (tmp_path / "a").exists()


def test_an_import_never_writes_into_a_workdir_that_holds_anything(exported, tmp_path, capsys):
    workdir, folder = exported
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me\n")
    code, err = run([f"--from={folder}", f"--workdir={tmp_path / 'notes'}"], capsys)
    assert code == 2 and "is not empty" in err
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me\n"
    before = sorted(p.name for p in workdir.iterdir())
    code, err = run([f"--from={folder}", f"--workdir={workdir}"], capsys)
    assert code == 2 and sorted(p.name for p in workdir.iterdir()) == before


def with_pair_tokenizer(workdir: pathlib.Path, path: pathlib.Path) -> pathlib.Path:
    """`workdir`'s model written as translate-import writes one with OPUS-MT's kind of
    tokenizer: the model's own SentencePiece model as source.spm and target.spm, over a table
    of its own ids; so it encodes and decodes, hence translates and scores, as the original."""
    source = Workdir(workdir)
    _, params, tokenizer, config, (step,) = load_model(workdir)
    copy = Workdir(path)
    path.mkdir()
    processor = tokenizer.processor
    table = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())}
    for spm_file in copy.pair_vocab[:2]:
        shutil.copyfile(source.vocab, spm_file)
    copy.pair_vocab[2].write_text(json.dumps(table), encoding="utf-8")
    meta = {"step": step, "vocab_sha256": copy.tokenizer().sha256}
    with checkpoint.make_manager(copy.checkpoints, keep=1) as manager:
        write_params_workdir(copy, config_text(config), source, manager, step, params, meta)
    return path


@pytest.fixture(scope="module")
def marian_run(vocab, tmp_path_factory):  # noqa: F811
    """A random tiny model computing what OPUS-MT's do (`MARIAN`)."""
    root = tmp_path_factory.mktemp("marian_run")
    return make_workdir(root / "run", vocab, "encoder_decoder", "post", fields=MARIAN)


def test_the_commands_read_a_workdir_with_two_sentencepiece_models_as_its_own(marian_run, tmp_path):
    workdir = marian_run
    pair = with_pair_tokenizer(workdir, tmp_path / "pair")
    assert isinstance(Workdir(pair).tokenizer(), PairTokenizer)
    (tmp_path / "in.en").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    (tmp_path / "in.de").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    src, tgt = f"--src={tmp_path / 'in.en'}", f"--tgt={tmp_path / 'in.de'}"
    for run_dir, out in ((workdir, tmp_path / "ours"), (pair, tmp_path / "pairs")):
        out.mkdir()
        text = [f"--input={tmp_path / 'in.en'}", f"--output={out / 'text'}", "--beam_size=1"]
        translate_text.main([f"--workdir={run_dir}", *text, f"--alignment={out / 'links'}"])
        score.main([f"--workdir={run_dir}", src, tgt, f"--output={out / 'scores'}"])
    for name in ("text", "links", "scores"):
        ours = (tmp_path / "ours" / name).read_text()
        assert (tmp_path / "pairs" / name).read_text() == ours and ours.strip()


def test_a_run_fine_tunes_from_a_model_with_two_sentencepiece_models(
    marian_run, tmp_path, monkeypatch
):
    # From the imported parameters at step 0, on its tokenizer (copied in), then it resumes and
    # its report decodes the mean of its newest checkpoints, as any run's does.
    pair = with_pair_tokenizer(marian_run, tmp_path / "pair")
    config = read_config(Workdir(pair))
    config.train.init_from = str(pair)
    config.train.num_train_steps, config.train.checkpoint_every_steps = 2, 1
    config.train.keep_checkpoints, config.decode.average_last = 3, 2
    calls = spy_on_train_step(monkeypatch)
    run = tmp_path / "tuned"
    trainer.train_and_evaluate(config, run)
    params, _, step = calls[0]
    assert step == 0
    imported = load_model(pair).params
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(imported), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    held = Workdir(run).tokenizer_files()
    assert [p.name for p in held] == ["source.spm", "target.spm", "vocab.json"]
    assert all(p.read_bytes() == (pair / p.name).read_bytes() for p in held)
    report = json.loads(Workdir(run).report_json.read_text())
    assert report["checkpoint_steps"] == [1, 2], report
    config.train.num_train_steps = 3
    trainer.train_and_evaluate(config, run)
    assert checkpoint.latest_step(Workdir(run).checkpoints) == 3
