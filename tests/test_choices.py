"""Every choice declared once: validation, --help and the code that acts on it read one Literal."""

import dataclasses
import pathlib
import typing

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from translate.config import (
    Config,
    ModelConfig,
    TrainConfig,
    check_choice,
    choice_rule,
    choices,
)
from translate.data.sources import data_paths
from translate.flags import format_help
from translate.models.dropout import dropout
from translate.models.factory import make_model
from translate.training.optim import decay_to_zero_schedule, make_optimizer, make_schedule

CHOICE_FIELDS = [
    (section, name, choices(kind))
    for section, cls in typing.get_type_hints(Config).items()
    for name, kind in typing.get_type_hints(cls).items()
    if choices(kind)
]


def test_the_choices_are_found():
    names = {f"{s}.{n}" for s, n, _ in CHOICE_FIELDS}
    assert {"model.norm_position", "train.lr_decay", "train.optimizer", "data.source"} <= names


@pytest.mark.parametrize("section, name, values", CHOICE_FIELDS)
def test_validation_refuses_an_unknown_choice_naming_the_values(section, name, values):
    config = Config()
    setattr(getattr(config, section), name, "not-a-choice")
    with pytest.raises(ValueError) as error:
        config.validate()
    assert str(error.value) == (
        f"invalid config: --config.{section}.{name}=not-a-choice: {choice_rule(values)}"
    )


def test_help_lists_the_values_of_every_choice():
    text = format_help("doc", {}, ("model", "data", "train", "decode"))
    for section, name, values in CHOICE_FIELDS:
        shown = ",".join(v or "''" for v in values)
        assert f"--config.{section}.{name}={{{shown}}}" in text


def test_config_writes_no_choice_as_a_membership_rule():
    # A choice written as `lambda v: v in ("a", "b")` beside its field would be a second source
    # of truth; the Literal types are the only one.
    package = pathlib.Path(__file__).parent.parent / "translate" / "config"
    for path in package.glob("*.py"):
        assert 'lambda v: v in ("' not in path.read_text(), path.name


def unchecked(section, **values):
    """A config holding values validate would refuse, as code reached past it would see them."""
    config = Config()
    for name, value in values.items():
        setattr(getattr(config, section), name, value)
    return config


# Every choice of the model section, found from its type, so a new one is tested by itself.
@pytest.mark.parametrize(
    "field", [name for section, name, _ in CHOICE_FIELDS if section == "model"]
)
def test_building_a_model_refuses_an_unknown_choice(field):
    config = dataclasses.replace(
        ModelConfig(num_layers=1, d_model=8, num_heads=2, d_ff=8), **{field: "something"}
    )
    if field == "prefix_attention":
        config = dataclasses.replace(config, architecture="decoder_only")
    with pytest.raises(ValueError, match=f"model.{field}='something'"):
        make_model(config, 16, nnx.Rngs(0))


def test_training_code_refuses_an_unknown_choice(tmp_path):
    with pytest.raises(ValueError, match="train.lr_decay='step'"):
        make_schedule(unchecked("train", lr_decay="step"))
    with pytest.raises(ValueError, match="train.lr_decay='step'"):
        decay_to_zero_schedule(8, 2, 10, shape="step")
    with pytest.raises(ValueError, match="train.optimizer='sgd'"):
        make_optimizer(unchecked("train", optimizer="sgd"))
    with pytest.raises(ValueError, match="model.dropout_bits='philox'"):
        dropout(jnp.ones((2, 4)), 0.1, jax.random.key(0), "philox")
    with pytest.raises(ValueError, match="data.source='web'"):
        data_paths(unchecked("data", source="web"), None)


@pytest.mark.parametrize("lr_decay", choices(typing.get_type_hints(TrainConfig)["lr_decay"]))
@pytest.mark.parametrize("optimizer", choices(typing.get_type_hints(TrainConfig)["optimizer"]))
def test_every_schedule_and_optimizer_choice_builds(lr_decay, optimizer):
    config = unchecked("train", lr_decay=lr_decay, optimizer=optimizer, num_train_steps=100)
    config.train.warmup_steps = 10
    config.decode.average_last = 1
    optimizer_, schedule = make_optimizer(config.validate())
    assert float(schedule(50)) > 0.0 and optimizer_ is not None


def test_check_choice_returns_a_known_value():
    assert check_choice("pre", typing.Literal["post", "pre"], "model.norm_position") == "pre"
