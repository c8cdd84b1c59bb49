"""What translate/engines/writer.py refuses before an export writes anything."""

import dataclasses
import re

import pytest
from helpers import tiny_config

from translate.engines import writer
from translate.engines.shared import NUM_POSITIONS


# transformers has no class for the decoder-only layout: that export is refused before.
@pytest.mark.parametrize(
    "fmt, architecture",
    [
        ("ctranslate2", "encoder_decoder"),
        ("ctranslate2", "decoder_only"),
        ("huggingface", "encoder_decoder"),
    ],
)
def test_an_export_of_sources_longer_than_its_position_table_is_refused_before_writing(
    fmt, architecture, tmp_path, monkeypatch
):
    """A model trained on data.max_len above the export's position table is refused: CTranslate2
    cut such sources silently or raised, and transformers raised IndexError."""
    config = tiny_config()
    config.model = dataclasses.replace(config.model, architecture=architecture)
    config.data = dataclasses.replace(config.data, max_len=NUM_POSITIONS + 1, row_len=2048)
    monkeypatch.setattr(writer, "read_config", lambda _: config)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text("{}")
    out = tmp_path / "export"
    message = f"--workdir={tmp_path / 'run'}: data.max_len={NUM_POSITIONS + 1}"
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        writer.export(str(tmp_path / "run"), str(out), fmt)
    assert f"{NUM_POSITIONS} positions" in str(error.value) and "\n" not in str(error.value)
    assert not out.exists()
    # data.max_len at the table's size is not refused for it (a decoder-only model with a
    # sinusoidal table needs room for a whole pair: the test below).
    config.data = dataclasses.replace(config.data, max_len=NUM_POSITIONS)
    if architecture == "decoder_only":
        config.model = dataclasses.replace(config.model, positions="rotary")
    writer.check_request(config, "run", str(out), fmt, "")


def test_a_decoder_only_export_whose_position_table_cannot_hold_a_whole_pair_is_refused(tmp_path):
    """A decoder-only model reads `x EOS BOS y` as one sequence: a source and a target of
    data.max_len tokens each (EOS included) take positions 0 .. 2 * data.max_len - 1, all of
    which a sinusoidal table must hold. Rotary and relative positions have no table, and an
    encoder-decoder numbers its source and target apart."""
    config = tiny_config()
    config.model = dataclasses.replace(config.model, architecture="decoder_only")
    longest = NUM_POSITIONS // 2  # a whole pair fills the table exactly
    config.data = dataclasses.replace(config.data, max_len=longest + 1, row_len=2048)
    out, fmt = str(tmp_path / "export"), "ctranslate2"  # transformers has no decoder-only class
    message = (
        f"--workdir=run: data.max_len={longest + 1} needs {2 * (longest + 1)} positions for a "
        f"decoder-only model's source and target together, more than the {NUM_POSITIONS}"
    )
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        writer.check_request(config, "run", out, fmt, "")
    assert "\n" not in str(error.value)
    config.data = dataclasses.replace(config.data, max_len=longest)
    writer.check_request(config, "run", out, fmt, "")
    # No table to outgrow: positions rotated or biased, or numbered per side.
    config.data = dataclasses.replace(config.data, max_len=longest + 1)
    for positions in ("rotary", "relative"):
        config.model = dataclasses.replace(config.model, positions=positions)
        writer.check_request(config, "run", out, fmt, "")
    config.model = dataclasses.replace(
        config.model, architecture="encoder_decoder", positions="sinusoidal"
    )
    writer.check_request(config, "run", out, fmt, "")
