"""Config loading and command-line overrides (translate/config.py)."""

import json
import pathlib

import pytest

from translate.config import config_from_dict, load_config, parse_flags

CONFIGS = sorted((pathlib.Path(__file__).parent.parent / "configs").glob("*.py"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_config_file_loads(path):
    config = load_config(path)
    assert config.model.d_model % config.model.num_heads == 0


def test_base_config_is_the_paper_base_model():
    config = load_config(CONFIGS[0].parent / "base.py")
    m, t = config.model, config.train
    assert (m.num_layers, m.d_model, m.num_heads, m.d_ff, m.dropout_rate) == (6, 512, 8, 2048, 0.1)
    assert (t.adam_beta1, t.adam_beta2, t.adam_eps, t.warmup_steps) == (0.9, 0.98, 1e-9, 4000)
    assert t.label_smoothing == 0.1


def test_override_sets_a_typed_field():
    config = load_config(
        CONFIGS[0].parent / "base.py", {"model.num_layers": "2", "train.learning_rate_scale": "0.5"}
    )
    assert config.model.num_layers == 2 and config.train.learning_rate_scale == 0.5


def test_unknown_field_is_an_error_naming_the_flag():
    with pytest.raises(ValueError, match=r"--config.model.num_layer\b.*unknown field"):
        load_config(CONFIGS[0].parent / "base.py", {"model.num_layer": "2"})


def test_wrong_type_is_an_error_naming_the_flag():
    with pytest.raises(ValueError, match="--config.model.d_model.*int"):
        load_config(CONFIGS[0].parent / "base.py", {"model.d_model": "wide"})


def test_parse_flags_separates_overrides():
    flags, overrides = parse_flags(
        ["--workdir=/tmp/x", "--config.train.seed=3", "--force"], {"workdir": "", "force": False}
    )
    assert flags == {"workdir": "/tmp/x", "force": True}
    assert overrides == {"train.seed": "3"}


def test_unknown_flag_is_an_error():
    with pytest.raises(ValueError, match="unknown flag --wrkdir"):
        parse_flags(["--wrkdir=/tmp/x"], {"workdir": ""})


def test_config_round_trips_through_its_dict_with_backslashes_and_quotes():
    config = load_config(CONFIGS[0].parent / "base.py")
    config.data.dir = 'C:\\data\\"wmt" 14'
    config.train.learning_rate_scale = 0.36
    config.data.src_lang = "en"
    assert config_from_dict(json.loads(json.dumps(config.to_dict()))) == config
