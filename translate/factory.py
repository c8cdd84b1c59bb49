"""Builds the configured model: picks the architecture and resolves its attention kernel once.

`model.py` (the paper's encoder-decoder) and `decoder_only.py` (the variant built on its layers)
never import each other's builders: this module is the one place that chooses between them,
and the one place that asks the device which attention kernel `model.attention` means, so
building a model never queries the hardware.
"""

from __future__ import annotations

from flax import nnx

from translate.config import Config, ModelConfig
from translate.decoder_only import DecoderOnlyTransformer
from translate.devices import DeviceFacts, resolve_attention
from translate.model import Transformer, TranslationModel, resolve_dtype


def resolve_model_attention(config: ModelConfig, facts: DeviceFacts | None = None) -> str:
    """The kernel ("xla" or "cudnn") that `config.attention` means on this device.

    Raises ValueError when the config asks for cuDNN where it cannot run.
    """
    return resolve_attention(
        config.attention,
        resolve_dtype(config.compute_dtype),
        config.d_model // config.num_heads,
        facts,
    )


def make_model(
    config: ModelConfig, vocab_size: int, rngs: nnx.Rngs, attention: str | None = None
) -> TranslationModel:
    """The configured architecture: the paper's encoder-decoder, or the decoder-only variant.

    Args:
      attention: the kernel already resolved (`resolve_model_attention`); None resolves it.
    """
    attention = resolve_model_attention(config) if attention is None else attention
    if config.architecture == "decoder_only":
        return DecoderOnlyTransformer(config, vocab_size, rngs=rngs, attention=attention)
    return Transformer(config, vocab_size, rngs=rngs, attention=attention)


def abstract_model(config: Config, vocab_size: int) -> tuple[nnx.GraphDef, nnx.State]:
    """The model's graph and parameter shapes, with nothing allocated."""
    attention = resolve_model_attention(config.model)
    model = nnx.eval_shape(lambda: make_model(config.model, vocab_size, nnx.Rngs(0), attention))
    return nnx.split(model, nnx.Param)
