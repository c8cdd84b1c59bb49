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
from translate.engines import ctranslate2
from translate.flags import format_help
from translate.models import decoder_only, factory, layers, norms, positions, precision
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


# Each model choice and the tables keyed by its values. Every place that acts on a value reads
# one of these tables (or, for an export, its decision: tests/test_export_decisions.py), so a
# value added to the choice's Literal alone fails here once for each table that has not decided
# it, and never falls through a comparison into another value's behaviour.
CHOICE_TABLES = {
    "positions": {
        "models.positions.POSITIONS": positions.POSITIONS,
        "engines.ctranslate2.POSITIONS": ctranslate2.POSITIONS,
    },
    "normalization": {
        "models.norms.NORMS": norms.NORMS,
        "engines.ctranslate2.NORMS": ctranslate2.NORMS,
    },
    "norm_position": {
        "models.norms.PRE_NORM": norms.PRE_NORM,
        "engines.ctranslate2.NORM_POSITIONS": ctranslate2.NORM_POSITIONS,
    },
    "feed_forward": {
        "models.layers.ACTIVATIONS": layers.ACTIVATIONS,
        "engines.ctranslate2.FEED_FORWARDS": ctranslate2.FEED_FORWARDS,
    },
    "architecture": {"models.factory.ARCHITECTURES": factory.ARCHITECTURES},
    "prefix_attention": {"models.decoder_only.SEES_WHOLE_SOURCE": decoder_only.SEES_WHOLE_SOURCE},
    "matmul_dtype": {"models.precision.ROUNDED_OPERANDS": precision.ROUNDED_OPERANDS},
}
# The model choices that no table holds: the code that acts on them names each value and
# refuses any other, so a new value fails the test below until that code decides it.
BRANCHED = {
    # devices.resolve_dtype and precision.compute_dtype: "auto" or a dtype's own name.
    "compute_dtype": ("auto", "float32", "bfloat16", "float16"),
    # devices.resolve_attention and factory.resolve_model_attention.
    "attention": ("auto", "xla", "cudnn"),
    # dropout.dropout.
    "dropout_bits": ("threefry", "hash"),
}
MODEL_CHOICES = {name: values for section, name, values in CHOICE_FIELDS if section == "model"}


def test_every_model_choice_is_read_from_tables_or_named_where_it_branches():
    assert sorted(MODEL_CHOICES) == sorted([*CHOICE_TABLES, *BRANCHED])


@pytest.mark.parametrize(
    "field, table",
    [
        pytest.param(field, table, id=f"{field}-{name}")
        for field, tables in CHOICE_TABLES.items()
        for name, table in tables.items()
    ],
)
def test_each_choice_table_is_keyed_by_the_choice_values(field, table):
    assert sorted(table) == sorted(MODEL_CHOICES[field]), f"model.{field}"


@pytest.mark.parametrize("field", sorted(BRANCHED))
def test_a_branched_choice_has_the_values_its_code_names(field):
    assert MODEL_CHOICES[field] == BRANCHED[field]


def test_a_kernel_outside_a_position_scheme_s_is_never_chosen(monkeypatch):
    # The kernel rule reads the scheme's row: "auto" keeps to the kernels a scheme has been
    # run through, whatever the device offers.
    monkeypatch.setitem(
        positions.POSITIONS, "rotary", positions.POSITIONS["rotary"]._replace(kernels=("xla",))
    )
    monkeypatch.setattr(factory, "resolve_attention", lambda *args: "cudnn")
    assert factory.resolve_model_attention(ModelConfig(positions="rotary")) == "xla"
    assert factory.resolve_model_attention(ModelConfig(positions="sinusoidal")) == "cudnn"
    with pytest.raises(ValueError, match="model.attention=cudnn: model.positions=rotary"):
        factory.resolve_model_attention(ModelConfig(positions="rotary", attention="cudnn"))
