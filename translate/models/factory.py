"""Builds the configured model: picks the architecture, resolves its dtype and kernel once.

`transformer.py` (the paper's encoder-decoder) and `decoder_only.py` (the variant built on its
layers) never import each other's builders: this module is the one place that chooses between
them (`architecture`), and the one place that asks the device what `model.compute_dtype` and
`model.attention` mean there, so building a model never queries the hardware.
"""

from __future__ import annotations

from typing import Any

from flax import nnx

from translate.config import (
    Architecture,
    AttentionKernel,
    ComputeDtype,
    Config,
    ModelConfig,
    check_choice,
)
from translate.devices import DeviceFacts, resolve_attention, resolve_dtype
from translate.models.decoder_only import DecoderOnlyTransformer
from translate.models.positions import position_scheme
from translate.models.transformer import Transformer, TranslationModel

# `model.architecture` -> the class that builds it (config/rules.py validates the name).
ARCHITECTURES: dict[str, type[TranslationModel]] = {
    "encoder_decoder": Transformer,
    "decoder_only": DecoderOnlyTransformer,
}


def architecture(config: ModelConfig) -> type[TranslationModel]:
    """The class of `config.architecture`: what builds it and counts its FLOPs."""
    return ARCHITECTURES[check_choice(config.architecture, Architecture, "model.architecture")]


def resolve_model_dtype(config: ModelConfig) -> Any:
    """The jnp dtype that `config.compute_dtype` means on this device ("auto": bfloat16 on
    GPUs and TPUs, float32 on CPUs)."""
    return resolve_dtype(check_choice(config.compute_dtype, ComputeDtype, "model.compute_dtype"))


def resolve_model_attention(config: ModelConfig, facts: DeviceFacts | None = None) -> str:
    """The kernel ("xla" or "cudnn") that `config.attention` means on this device.

    Raises ValueError when the config asks for cuDNN where it cannot run. A position scheme
    runs on the kernels it has been run through (positions.POSITIONS): where cuDNN's is not one
    of them (a relative bias), "auto" picks XLA and "cudnn" is refused in one line.
    """
    kernel = check_choice(config.attention, AttentionKernel, "model.attention")
    if "cudnn" not in position_scheme(config).kernels:
        if kernel == "cudnn":
            raise ValueError(
                f"model.attention=cudnn: model.positions={config.positions} runs on XLA's "
                "attention; use auto or xla"
            )
        return "xla"
    return resolve_attention(
        kernel,
        resolve_model_dtype(config),
        config.d_model // config.num_heads,
        facts,
    )


def make_model(
    config: ModelConfig, vocab_size: int, rngs: nnx.Rngs, attention: str | None = None
) -> TranslationModel:
    """The configured architecture, computing in the dtype the config means on this device.

    Args:
      attention: the kernel already resolved (`resolve_model_attention`); None resolves it.
    """
    attention = resolve_model_attention(config) if attention is None else attention
    return architecture(config)(
        config, vocab_size, rngs=rngs, dtype=resolve_model_dtype(config), attention=attention
    )


def abstract_model(config: Config, vocab_size: int) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's graph and parameter shapes, with nothing allocated."""
    attention = resolve_model_attention(config.model)
    model = nnx.eval_shape(lambda: make_model(config.model, vocab_size, nnx.Rngs(0), attention))
    return nnx.split(model, nnx.Param)
