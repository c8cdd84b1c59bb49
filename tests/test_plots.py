"""Attention weights (translate/models/transformer.py), the plotting scripts, the report."""

import importlib
import json
import shutil
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import read_only

from translate import cli
from translate.config import ModelConfig
from translate.data.batching import Batch
from translate.decoding.report import write_report
from translate.models.transformer import Transformer
from translate.training import plots
from translate.workdir import Workdir


def png_size(path):
    """(width, height) in pixels, read from the PNG header."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG file"
    return struct.unpack(">II", data[16:24])


@pytest.mark.slow  # 13 s on 2 cores
def test_attention_weights_are_distributions_and_leave_the_model_unchanged():
    config = ModelConfig(num_layers=2, d_model=32, num_heads=4, d_ff=64, compute_dtype="float32")
    model = Transformer(config, 24, rngs=nnx.Rngs(0))
    # Two sentences packed in one row: weights must stay inside each sentence.
    batch = Batch(
        src=jnp.array([[5, 6, 3, 7, 8, 9, 3]]),
        src_segments=jnp.array([[1, 1, 1, 2, 2, 2, 2]]),
        src_positions=jnp.array([[0, 1, 2, 0, 1, 2, 3]]),
        tgt_in=jnp.array([[2, 10, 2, 11, 12]]),
        tgt_segments=jnp.array([[1, 1, 2, 2, 2]]),
        tgt_positions=jnp.array([[0, 1, 0, 1, 2]]),
    )
    before = model(batch)
    weights = model.attention_weights(batch)
    assert set(weights) == {
        f"{stack}.{i}.{kind}_attention"
        for stack, kind in [("encoder", "self"), ("decoder", "self"), ("decoder", "cross")]
        for i in range(2)
    }
    for w in map(np.asarray, weights.values()):
        np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
        assert w.shape[:2] == (1, 4)
    cross = np.asarray(weights["decoder.0.cross_attention"])[0]  # [H, T, S]
    assert np.all(cross[:, :2, 3:] == 0) and np.all(cross[:, 2:, :3] == 0)
    decoder_self = np.asarray(weights["decoder.1.self_attention"])[0]  # [H, T, T]
    assert np.all(np.triu(decoder_self[0], k=1) == 0), "the decoder attends only to the past"
    np.testing.assert_array_equal(np.asarray(model(batch)), np.asarray(before))
    assert not any(m.keep_weights for _, m in nnx.iter_modules(model) if hasattr(m, "keep_weights"))


@pytest.mark.slow  # 14 s on 2 cores
def test_explicit_attention_weights_give_the_fused_attention_output():
    config = ModelConfig(num_layers=2, d_model=32, num_heads=4, d_ff=64, compute_dtype="float32")
    model = Transformer(config, 24, rngs=nnx.Rngs(1))
    batch = Batch(
        src=jnp.array([[5, 6, 7, 3]]),
        src_segments=jnp.ones((1, 4), jnp.int32),
        src_positions=jnp.arange(4)[None],
        tgt_in=jnp.array([[2, 8, 9]]),
        tgt_segments=jnp.ones((1, 3), jnp.int32),
        tgt_positions=jnp.arange(3)[None],
    )
    explicit = nnx.clone(model)
    for _, module in nnx.iter_modules(explicit):
        if hasattr(module, "keep_weights"):
            module.keep_weights = True
    logits, _ = nnx.capture(explicit, nnx.Intermediate)(batch)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(model(batch)), rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 12-18 s; kept out of the default run's 10 minutes
def test_plot_attention_writes_pictures_of_the_expected_size(workdir, tmp_path):
    script = importlib.import_module("scripts.plot_attention")
    script.main(
        [f"--workdir={workdir}", "--src=the small dog sees the cat .", f"--output={tmp_path}"]
    )
    expected = (round(script.FIGSIZE[0] * script.DPI), round(script.FIGSIZE[1] * script.DPI))
    names = [
        "cross_layer1_head0.png",
        "cross_layer1_mean.png",
        "encoder_layer1_head0.png",
        "encoder_layer1_mean.png",
        "positions.png",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    for name in names:
        assert (tmp_path / name).stat().st_size > 1000
        assert png_size(tmp_path / name) == expected
    script.main(
        [f"--workdir={workdir}", "--src=a man .", f"--output={tmp_path}", "--layer=0", "--head=3"]
    )
    assert png_size(tmp_path / "cross_layer0_head3.png") == expected
    with pytest.raises(SystemExit, match="--head=4: this model has heads 0 to 3"):
        script.main([f"--workdir={workdir}", "--src=a man .", "--head=4"])


def test_plot_metrics_writes_pictures_of_the_expected_size(workdir, tmp_path):
    script = importlib.import_module("scripts.plot_metrics")
    written = script.main([f"--workdir={workdir}", f"--output={tmp_path}"])
    expected = (round(plots.FIGSIZE[0] * plots.DPI), round(plots.FIGSIZE[1] * plots.DPI))
    names = ["metrics_bleu.png", "metrics_learning_rate.png", "metrics_loss.png"]
    names.append("metrics_tokens_per_sec.png")
    assert sorted(p.name for p in written) == sorted(names)
    for path in written:
        assert path.stat().st_size > 1000
        assert png_size(path) == expected


def test_report_lists_the_training_curves_in_the_workdir(workdir, tmp_path):
    report = json.loads((workdir / "report.json").read_text())
    lines = ["a b c ."] * 12

    def write():
        write_report(tmp_path, report, lines, lines, lines, plots_dir=workdir)

    drawn = Workdir(workdir).metric_plots()  # by the trainer, as it ended
    for path in drawn:
        path.unlink()
    write()
    assert "metrics_loss.png" not in (tmp_path / "report.txt").read_text()
    importlib.import_module("scripts.plot_metrics").main([f"--workdir={workdir}"])
    assert drawn == Workdir(workdir).metric_plots()
    write()
    text = (tmp_path / "report.txt").read_text()
    assert "metrics_loss.png" in text and "metrics_bleu.png" in text
    assert report["signature"] in text and report["chrf_signature"] in text
    assert text.count("REF a b c .") == 5


def test_loss_picture_shows_the_nll_not_the_smoothed_loss(tmp_path):
    records = [{"step": 2, "train/loss": 5.0}, {"step": 4, "train/nll": 4.0, "eval/nll": 4.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    workdir = Workdir(tmp_path)
    assert plots.draw_training_curves(workdir) == [workdir.metric_plot("loss")]
    (tmp_path / "metrics.jsonl").write_text(json.dumps(records[0]) + "\n")
    assert plots.draw_training_curves(workdir) == []


def test_plot_attention_in_a_read_only_workdir_says_where_to_write_before_loading(
    workdir, tmp_path, monkeypatch
):
    script = importlib.import_module("scripts.plot_attention")
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy)
    shutil.rmtree(Workdir(copy).attention, ignore_errors=True)  # pictures could go in there
    loaded = []
    monkeypatch.setattr(script, "load_model", lambda *a, **k: loaded.append(1))
    with read_only(copy):
        with pytest.raises(ValueError, match=r"cannot write in .*copy.*give --output=DIR") as error:
            script.main([f"--workdir={copy}", "--src=a man ."])
    assert cli.user_error_message(error.value) is not None and not loaded
