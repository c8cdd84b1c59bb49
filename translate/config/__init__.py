"""Typed experiment configuration: dataclasses whose defaults are the paper's base model.

A config file is Python with a `get_config()` that returns a `Config`, built from the sections
below or from a shipped config (`load_config("multi30k")`); entry points load it with
`load_config(path_or_name, overrides)`, the overrides coming from `--config.SECTION.FIELD=value`
flags. Dataclasses and flags of our own rather than ml_collections and absl flags: the fields
are typed and checked by `Config.validate`, and `--help` is written from the comment above each
field, the one a reader sees in sections.py.

    choices.py    each choice a field offers (a Literal), declared once
    sections.py   ModelConfig, DataConfig (and TrainCorpus), TrainConfig, DecodeConfig
    rules.py      the rules of the values, each naming its flag; SEARCH_RULES
    schema.py     Config: the four sections, validate, to_dict
    loading.py    config files, the flags' overrides, config.json read back, --help's text

Everything a config file or the package needs is imported from here: `from translate.config
import Config, TrainCorpus, load_config`.
"""

from translate.config.choices import (
    Architecture,
    AttentionKernel,
    BeamStop,
    ComputeDtype,
    DataSource,
    DropoutBits,
    FeedForwardKind,
    KeepBestBy,
    LossKeep,
    LrDecay,
    MatmulDtype,
    Normalization,
    NormPosition,
    OnNonfinite,
    Optimizer,
    PositionScheme,
    PrefixAttention,
    check_choice,
    choice_rule,
    choices,
)
from translate.config.loading import (
    apply_override,
    config_field_type,
    config_from_dict,
    field_descriptions,
    find_config,
    load_config,
    packaged_config_names,
    packaged_configs_dir,
    parse_value,
)
from translate.config.rules import (
    MAX_EXTRA_LEN,
    SEARCH_RULES,
    split_init_from,
    split_profile_steps,
)
from translate.config.schema import CONFIG_SECTIONS, Config, unknown_field
from translate.config.sections import (
    DataConfig,
    DecodeConfig,
    ModelConfig,
    TrainConfig,
    TrainCorpus,
)

__all__ = [
    "Architecture",
    "AttentionKernel",
    "BeamStop",
    "CONFIG_SECTIONS",
    "ComputeDtype",
    "Config",
    "DataConfig",
    "DataSource",
    "DecodeConfig",
    "DropoutBits",
    "FeedForwardKind",
    "KeepBestBy",
    "LossKeep",
    "LrDecay",
    "MAX_EXTRA_LEN",
    "MatmulDtype",
    "ModelConfig",
    "NormPosition",
    "Normalization",
    "OnNonfinite",
    "Optimizer",
    "PositionScheme",
    "PrefixAttention",
    "SEARCH_RULES",
    "TrainConfig",
    "TrainCorpus",
    "apply_override",
    "check_choice",
    "choice_rule",
    "choices",
    "config_field_type",
    "config_from_dict",
    "field_descriptions",
    "find_config",
    "load_config",
    "packaged_config_names",
    "packaged_configs_dir",
    "parse_value",
    "split_init_from",
    "split_profile_steps",
    "unknown_field",
]
