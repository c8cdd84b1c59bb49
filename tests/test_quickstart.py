"""The README's quickstart, in full (slow: about 10 minutes on 2 CPU cores)."""

import json
import pathlib

import pytest

from translate.config import load_config
from translate.training.trainer import train_and_evaluate

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"


@pytest.mark.slow
def test_quickstart_reaches_bleu_95_on_held_out_synthetic_split(tmp_path):
    train_and_evaluate(load_config(CONFIGS / "quickstart.py"), tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["num_sentences"] == 1000
    assert report["bleu"] >= 95.0
