"""Exports fail closed: every model field has a decision in each export, and others are refused."""

import dataclasses
import typing

import pytest

from translate.config import ModelConfig, choices
from translate.engines import ctranslate2, huggingface
from translate.engines.writer import FORMATS

FIELDS = [field.name for field in dataclasses.fields(ModelConfig)]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_model_field_has_an_export_decision(fmt):
    # A new model field (an attention bias, say) fails here until each export says whether
    # it implements the field's values or refuses them.
    implements = FORMATS[fmt].IMPLEMENTS
    assert sorted(implements) == sorted(FIELDS), set(FIELDS) ^ set(implements)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_model_field_the_export_does_not_know_is_refused(fmt):
    @dataclasses.dataclass
    class Grown(ModelConfig):
        attention_bias: str = "alibi"

    reason = FORMATS[fmt].unsupported_reason(Grown())
    assert reason and "model.attention_bias" in reason


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_a_value_outside_a_decision_is_refused_with_its_reason(fmt):
    implements = FORMATS[fmt].IMPLEMENTS
    assert FORMATS[fmt].unsupported_reason(ModelConfig()) is None  # the paper's model
    for name, decision in implements.items():
        if not isinstance(decision.accepted, tuple):
            continue
        config = dataclasses.replace(ModelConfig(), **{name: "something else"})
        reason = FORMATS[fmt].unsupported_reason(config)
        if decision.refused is None:
            assert reason == decision.why, name
        else:  # a value the export has not decided is refused by name
            assert f"model.{name}='something else'" in reason, name
        for value, why in (decision.refused or {}).items():
            config = dataclasses.replace(ModelConfig(), **{name: value})
            if name == "prefix_attention":
                config = dataclasses.replace(config, architecture="decoder_only")
            assert FORMATS[fmt].unsupported_reason(config) == why, f"model.{name}={value}"


# The model's choices that change no number an export computes: it writes float32 weights (or
# its quantization's) and runs its own kernels, whichever our model trained with.
EVERY_VALUE = {"compute_dtype", "matmul_dtype", "attention", "dropout_bits"}


@pytest.mark.parametrize(
    "fmt, field",
    [
        (fmt, name)
        for fmt in sorted(FORMATS)
        for name, kind in typing.get_type_hints(ModelConfig).items()
        if choices(kind) and name not in EVERY_VALUE
    ],
)
def test_each_export_decides_every_value_of_a_choice_the_model_computes(fmt, field):
    # A value added to the choice alone fails here for each export until it computes the value
    # or says why it refuses it.
    decision = FORMATS[fmt].IMPLEMENTS[field]
    values = set(choices(typing.get_type_hints(ModelConfig)[field]))
    assert decision.refused is not None, f"model.{field}: decided for every value at once"
    accepted, refused = set(decision.accepted), set(decision.refused)
    assert not accepted & refused and accepted | refused == values, f"model.{field}"


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_choices_an_export_takes_whatever_their_value_change_no_computed_number(fmt):
    implements = FORMATS[fmt].IMPLEMENTS
    kinds = typing.get_type_hints(ModelConfig)
    every_value = {name for name, d in implements.items() if d.accepted is None}
    assert {name for name in every_value if choices(kinds[name])} == EVERY_VALUE


def test_the_decoder_only_layout_is_refused_by_transformers_and_kept_by_ctranslate2():
    config = ModelConfig(architecture="decoder_only")
    assert "decoder-only" in huggingface.unsupported_reason(config)
    assert ctranslate2.unsupported_reason(config) is None
    bidirectional = dataclasses.replace(config, prefix_attention="bidirectional")
    assert "attend causally" in ctranslate2.unsupported_reason(bidirectional)


@pytest.mark.parametrize(
    "field, value",
    [
        ("positions", "rotary"),
        ("positions", "relative"),
        ("normalization", "rmsnorm"),
        ("feed_forward", "swiglu"),
        ("feed_forward", "geglu"),
        ("num_kv_heads", 2),
        ("num_kv_heads", 1),
        ("use_bias", False),
    ],
)
def test_transformers_refuses_the_blocks_marian_lacks_in_one_line_and_ctranslate2_keeps_them(
    field, value
):
    config = dataclasses.replace(ModelConfig(), **{field: value})
    reason = huggingface.unsupported_reason(config)
    assert f"model.{field}" in reason and "--format=ctranslate2" in reason
    assert "\n" not in reason
    assert ctranslate2.unsupported_reason(config) is None


def test_transformers_keeps_a_gelu_and_as_many_key_heads_as_query_heads():
    config = ModelConfig(feed_forward="gelu", num_kv_heads=ModelConfig().num_heads)
    assert huggingface.unsupported_reason(config) is None
    assert huggingface.model_config(config, 64)["activation_function"] == "gelu_pytorch_tanh"


def test_both_exports_keep_a_silu_and_unscaled_embeddings_under_their_own_names():
    config = ModelConfig(feed_forward="silu", scale_embeddings=False)
    assert huggingface.unsupported_reason(config) is None
    assert ctranslate2.unsupported_reason(config) is None
    fields = huggingface.model_config(config, 64)
    assert fields["activation_function"] == "swish" and fields["scale_embedding"] is False
    assert ctranslate2.FEED_FORWARDS["silu"] == ("SWISH", False)


def test_a_logits_bias_is_exported_to_both_engines():
    config = ModelConfig(logits_bias=True)
    assert huggingface.unsupported_reason(config) is None
    assert ctranslate2.unsupported_reason(config) is None


def test_the_encoders_own_embeddings_go_to_marian_and_ctranslate2_and_not_to_pegasus():
    untied = ModelConfig(share_encoder_decoder_embeddings=False)
    assert huggingface.unsupported_reason(untied) is None
    assert huggingface.model_config(untied, 64)["share_encoder_decoder_embeddings"] is False
    assert ctranslate2.unsupported_reason(untied) is None
    pre = dataclasses.replace(untied, norm_position="pre")
    reason = huggingface.unsupported_reason(pre)
    assert "model.share_encoder_decoder_embeddings" in reason and "--format=ctranslate2" in reason
