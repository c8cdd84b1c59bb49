"""What translate/engines/writer.py refuses before an export writes anything."""

import dataclasses
import re

import pytest
from conftest import tiny_config

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
    # data.max_len at the table's size is not refused for it.
    config.data = dataclasses.replace(config.data, max_len=NUM_POSITIONS)
    writer.check_request(config, "run", str(out), fmt, "")
