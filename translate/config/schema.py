"""The config: its four sections, `validate` and the form it is saved in."""

from __future__ import annotations

import dataclasses
from typing import Any

from translate.config.choices import did_you_mean
from translate.config.rules import check_choices, check_types, config_rules, flag_of
from translate.config.sections import DataConfig, DecodeConfig, ModelConfig, TrainConfig


@dataclasses.dataclass
class Config:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)

    def validate(self) -> Config:
        """Raises ValueError naming the flag of the first value that cannot work; returns self.

        The message names the flag as it is typed, with its value and the rule it breaks:
        `invalid config: --config.train.keep_checkpoints=0: must be >= 1`.
        """
        # Names first: a dataclass takes any attribute, so `c.model.d_modle = 64` in a config
        # file would otherwise be ignored and the run would train the default.
        if unknown := unknown_field(self):
            raise ValueError(f"invalid config: {unknown}")
        # Types next, so that every rule below may compare and divide: a config file can set
        # any Python value, and NaN or inf passes a range check such as `> 0`.
        check_types(self)
        check_choices(self)
        # Checked in order, so a rule may rely on one above it: d_model % num_heads needs
        # num_heads >= 1.
        for field, ok, rule in config_rules(self):
            section, name = field.split(".")
            if not ok(getattr(getattr(self, section), name)):
                raise ValueError(f"invalid config: {flag_of(self, field)}: {rule}")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The config as JSON writes it and reads it back: a tuple field (data.train_corpora)
        as a list, so that a config compares equal to its saved copy."""
        values = dataclasses.asdict(self)
        for fields in values.values():
            for name, value in fields.items():
                if isinstance(value, tuple):
                    fields[name] = list(value)
        return values


def unknown_field(config: Config) -> str | None:
    """What is wrong when a config holds an attribute that is not one of its fields, or None.

    A dataclass takes any attribute, so a misspelt name in a config file would be ignored.
    """
    sections = [f.name for f in dataclasses.fields(config)]
    for name in vars(config):
        if name not in sections:
            return f"config.{name} is not a section of the config{did_you_mean(name, sections)}"
    for field in dataclasses.fields(config):
        section, values = field.name, getattr(config, field.name)
        kind = type(getattr(Config(), section))
        if not isinstance(values, kind):
            return (
                f"config.{section} is a {type(values).__name__}, not a {kind.__name__}: set its "
                f"fields one by one (config.{section}.name = value)"
            )
        names = [f.name for f in dataclasses.fields(values)]
        for name in vars(values):
            if name not in names:
                return (
                    f"config.{section}.{name} is not a field of config.{section}"
                    f"{did_you_mean(name, names)}"
                )
    return None


# The sections of a Config, in the order --help lists them.
CONFIG_SECTIONS = ("model", "data", "train", "decode")
