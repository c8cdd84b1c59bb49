"""The one decoding settings value (translate/decoding/settings.py)."""

import dataclasses

import pytest

from translate.config import Config, DecodeConfig
from translate.decoding.settings import DecodeSettings, check_values, decode_settings


def test_settings_take_the_config_and_the_given_values_over_it():
    decode = DecodeConfig(beam_size=5, length_penalty=1.0, batch_size=7, beam_stop="finished")
    settings = decode_settings(decode, {"beam_size": 2, "parallel_batches": 1}, nbest=2)
    assert settings == DecodeSettings(2, 1.0, 50, "finished", 2, 7, 1)
    assert decode.beam_size == 5  # the config is left as it was


def test_the_defaults_are_the_configs():
    assert decode_settings(DecodeConfig()) == DecodeSettings()


@pytest.mark.parametrize(
    "name, value",
    [
        ("beam_size", 0),
        ("length_penalty", float("nan")),
        ("length_penalty", -0.5),
        ("max_extra_len", -1),
        ("beam_stop", "early"),
        ("batch_size", 0),
        ("parallel_batches", -2),
    ],
)
def test_a_given_value_breaks_the_same_rule_as_in_a_config(name, value):
    with pytest.raises(ValueError) as given:
        decode_settings(DecodeConfig(), {name: value})
    config = Config()
    setattr(config.decode, name, value)
    with pytest.raises(ValueError) as configured:
        config.validate()
    rule = str(given.value).partition(": ")[2]
    assert str(given.value).startswith(f"--{name}={value}: ")
    if name != "length_penalty" or value == value:  # NaN: the config's type check says it first
        assert str(configured.value).endswith(f"--config.decode.{name}={value}: {rule}")


def test_the_flag_is_named_as_the_command_spells_it():
    with pytest.raises(ValueError, match="^--config.decode.beam_size=0: must be >= 1"):
        check_values({"beam_size": 0}, flag="--config.decode.{name}")


def test_nbest_must_fit_in_the_beam_and_not_be_negative():
    with pytest.raises(ValueError, match="--nbest=5 needs --beam_size >= 5"):
        decode_settings(DecodeConfig(beam_size=4), nbest=5)
    with pytest.raises(ValueError, match="--nbest=-1: must be >= 0"):
        decode_settings(DecodeConfig(), nbest=-1)


def test_settings_are_frozen_and_hashable():
    settings = DecodeSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.beam_size = 2  # type: ignore[misc]
    assert {settings: 1}[DecodeSettings()] == 1


def test_the_program_name_follows_the_search_fields_and_not_the_loops():
    base = DecodeSettings()
    name = base.program_name((4, 9))
    assert name.endswith("-4x9") and "/" not in name
    for field, other in [
        ("beam_size", 2),
        ("length_penalty", 1.0),
        ("max_extra_len", 10),
        ("beam_stop", "finished"),
        ("nbest", 1),
    ]:
        assert dataclasses.replace(base, **{field: other}).program_name((4, 9)) != name, field
    # The loop's settings and how many of the n-best are kept change no program.
    for field, other in [("batch_size", 8), ("parallel_batches", 1)]:
        assert dataclasses.replace(base, **{field: other}).program_name((4, 9)) == name, field
    assert dataclasses.replace(base, nbest=3).program_name((4, 9)) == (
        dataclasses.replace(base, nbest=1).program_name((4, 9))
    )
    assert base.program_name((4, 10)) != name
