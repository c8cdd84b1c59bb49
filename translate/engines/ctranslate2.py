"""A trained model in CTranslate2's format, and how to decode it as this project's search does.

The encoder-decoder becomes CTranslate2's `TransformerSpec` (a `ctranslate2.Translator`), the
causal decoder-only model its `TransformerDecoderModelSpec` (a `ctranslate2.Generator`, fed
`source </s> <s>` as its prompt). Both are the paper's layers with our choices spelled out:
the feed-forward network's activation (Sec. 3.3's ReLU, or a GELU, SwiGLU or GeGLU), the norm
(LayerNorm or RMSNorm) after (post) or before (pre) each sub-layer with the model's own
epsilon, the key and value heads, embeddings scaled by sqrt(d_model) (Sec. 3.4) and shared by
the encoder, the decoder and the pre-softmax projection, which has no bias.

Sinusoidal positions (Sec. 3.5) are stored as a table: CTranslate2's own sinusoid puts sines and
cosines in two halves, steps its frequencies by log(10000) / (D/2 - 1) rather than / (D/2), and
counts positions from 1; ours interleave sin and cos at 10000^(2i/D) from position 0
(positions.sinusoidal_positions), so the table holds exactly what our model adds. Rotary and
relative positions are CTranslate2's own (`rotary_dim`, `relative_attention_bias`), set to
compute ours (`stack_options`).

`ctranslate2` is imported only here, and only when a function needs it.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from translate.config import ModelConfig
from translate.data.tokenizer import BOS_ID, EOS_ID, UNK_ID, Tokenizer
from translate.engines.shared import (
    NUM_POSITIONS,
    SHARED_DECISIONS,
    Decision,
    array,
    decide,
    groups_by_length,
    refusal,
    source_pieces,
)
from translate.models.attention import MultiHeadAttention, num_kv_heads
from translate.models.positions import RELATIVE_MAX_DISTANCE, ROTARY_BASE, sinusoidal_positions
from translate.models.transformer import TranslationModel

# The Python package the writer needs, and how a user installs it.
PACKAGE, INSTALL = "ctranslate2", "pip install ctranslate2"

# The packages a quantization's conversion imports beyond CTranslate2: its converter casts to
# bfloat16 with torch.
QUANTIZATION_PACKAGES = {"bfloat16": "torch", "int8_bfloat16": "torch"}
# The weight types `quantization` takes (CTranslate2's ACCEPTED_MODEL_TYPES); none keeps float32.
QUANTIZATIONS = (
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "int16",
    "float16",
    "bfloat16",
    "float32",
)


# Each choice of the model as the options of CTranslate2's Transformer specs that compute it
# (`stack_options`); the values of each table are the ones this export computes.
# `model.norm_position` -> `pre_norm`.
NORM_POSITIONS = {"post": dict(pre_norm=False), "pre": dict(pre_norm=True)}
# `model.normalization` -> `rms_norm`.
NORMS = {"layernorm": dict(rms_norm=False), "rmsnorm": dict(rms_norm=True)}
# `model.feed_forward` -> the name of its activation in `common_spec.Activation`, and whether
# a linear unit gates it (`ffn_glu`). GELU is the tanh form, as models/layers.py computes it.
FEED_FORWARDS = {
    "relu": ("RELU", False),
    "gelu": ("GELUTanh", False),
    "silu": ("SWISH", False),
    "swiglu": ("SWISH", True),
    "geglu": ("GELUTanh", True),
}
# `model.positions` -> the options that compute them: sinusoids are stored as our own table
# (`input_layers`); rotary turns all of a head's channels, in two halves, as positions.rotate;
# a relative bias is T5's, as positions.RelativeBias.
POSITIONS = {
    "sinusoidal": dict(relative_attention_bias=False),
    "rotary": dict(
        relative_attention_bias=False,
        rotary_dim=0,
        rotary_interleave=False,
        rotary_base=ROTARY_BASE,
    ),
    "relative": dict(relative_attention_bias=True),
}

# The model settings this export implements (shared.refusal refuses any other, and any field
# without a decision here).
IMPLEMENTS = {
    **SHARED_DECISIONS,
    "norm_position": decide(NORM_POSITIONS, {}),
    "architecture": decide(("encoder_decoder", "decoder_only"), {}),
    "prefix_attention": decide(
        ("causal",),
        {
            "bidirectional": "CTranslate2's decoder-only models attend causally, and this "
            "model's source tokens attend to the whole source (model.prefix_attention="
            "bidirectional)"
        },
    ),
    # Today's blocks, each an option of CTranslate2's Transformer specs (`stack_options`).
    "positions": decide(POSITIONS, {}),
    "normalization": decide(NORMS, {}),
    "feed_forward": decide(FEED_FORWARDS, {}),
    "num_kv_heads": Decision(None, "num_heads_kv"),
    "use_bias": Decision(None, "a bias is optional in every linear layer"),
    "scale_embeddings": Decision(None, "scale_embeddings"),
    "logits_bias": Decision(None, "the projection's optional bias"),
    "share_encoder_decoder_embeddings": Decision(None, "the encoder's own embeddings"),
}


def unsupported_reason(config: ModelConfig) -> str | None:
    """Why CTranslate2 cannot run this model exactly, or None when it can."""
    return refusal(config, IMPLEMENTS)


def linear(spec: Any, layer: Any) -> None:
    """Flax's kernel [in, out] becomes CTranslate2's weight [out, in]; the bias stays."""
    spec.weight = np.ascontiguousarray(array(layer.kernel).T)
    if layer.bias is not None:
        spec.bias = array(layer.bias)


def fused_linear(spec: Any, layers: Sequence[Any]) -> None:
    """One linear layer computing several (Q;K;V or K;V): weights [sum of outs, in] stacked.

    Our key projection has no bias (attention.MultiHeadAttention), so its rows of the fused
    bias are zeros; without any bias (`model.use_bias=False`) the fused layer has none.
    """
    spec.weight = np.concatenate([array(layer.kernel).T for layer in layers])
    if all(layer.bias is None for layer in layers):
        return
    spec.bias = np.concatenate(
        [
            array(layer.bias) if layer.bias is not None else np.zeros(layer.out_features, "f4")
            for layer in layers
        ]
    )


def layer_norm(spec: Any, norm: Any) -> None:
    """A LayerNorm's gain and bias, or an RMSNorm's gain (CTranslate2's `rms_norm`)."""
    spec.gamma = array(norm.scale)
    if isinstance(norm, nnx.LayerNorm):
        spec.beta = array(norm.bias)


def attention(spec: Any, module: MultiHeadAttention, norm: Any, self_attention: bool) -> None:
    """Sec. 3.2.2's projections: self-attention fuses Q, K and V; cross-attention K and V.

    Heads are consecutive slices of K = D / H output channels in both layouts, and so are
    the G key and value heads (`num_heads_kv`). A relative position bias is T5's, as
    CTranslate2's `relative_attention_bias` computes it, with our table [buckets, H].
    """
    if self_attention:
        fused_linear(spec.linear[0], [module.query, module.key, module.value])  # [D + 2GK, D]
    else:
        linear(spec.linear[0], module.query)  # [D, D]
        fused_linear(spec.linear[1], [module.key, module.value])  # [2GK, D]
    linear(spec.linear[-1], module.out)
    layer_norm(spec.layer_norm, norm)
    if module.relative is not None:
        spec.relative_attention_bias = array(module.relative.table)  # [buckets, H]
        spec.relative_attention_max_distance = np.int32(RELATIVE_MAX_DISTANCE)


def feed_forward(spec: Any, module: Any, norm: Any) -> None:
    """Sec. 3.3's two linear layers; a gated network's linear unit is `linear_0_noact`."""
    linear(spec.linear_0, module.inner)  # [F, D]
    linear(spec.linear_1, module.outer)  # [D, F]
    if module.inner_linear is not None:
        linear(spec.linear_0_noact, module.inner_linear)  # [F, D]
    layer_norm(spec.layer_norm, norm)


def input_layers(spec: Any, embedding: Any, model: TranslationModel, source=False) -> None:
    """Sec. 3.4's shared embedding [V, D] (the encoder's own for `source` where the model has
    one), scaled by sqrt(D), plus our position table [P, D] where positions are added to it
    (sinusoidal; rotary and relative ones act in attention)."""
    table = model.source_embed if source and model.source_embed is not None else model.embed
    embedding.weight = array(table.embedding)  # [V, D]
    spec.scale_embeddings = model.scales_embeddings  # CTranslate2 multiplies by sqrt(D)
    if model.adds_positions:
        table = sinusoidal_positions(jnp.arange(NUM_POSITIONS), model.d_model)  # [P, D]
        spec.position_encodings.encodings = np.array(table, np.float32)


def decoder_stack(spec: Any, model: TranslationModel, layers: Any, final_norm: Any) -> None:
    """A decoder spec from layers with or without cross-attention, and its output projection."""
    input_layers(spec, spec.embeddings, model)
    for layer_spec, layer in zip(spec.layer, layers, strict=True):
        attention(layer_spec.self_attention, layer.self_attention, layer.norm1, True)
        if hasattr(layer, "cross_attention"):
            attention(layer_spec.attention, layer.cross_attention, layer.norm2, False)
            feed_forward(layer_spec.ffn, layer.feed_forward, layer.norm3)
        else:  # a decoder-only layer: layers.EncoderLayer under a causal mask
            feed_forward(layer_spec.ffn, layer.feed_forward, layer.norm2)
    if final_norm is not None:
        layer_norm(spec.layer_norm, final_norm)
    # Sec. 3.4: the pre-softmax projection is the embedding matrix [V, D]; a bias where the
    # model has one (`model.logits_bias`).
    spec.projection.weight = array(model.embed.embedding)
    if model.logits_bias is not None:
        spec.projection.bias = array(model.logits_bias)


def stack_options(config: ModelConfig) -> dict[str, Any]:
    """The options of CTranslate2's encoder and decoder specs that compute our model's blocks:
    the norm's position and kind, the feed-forward's activation and gate, the key and value
    heads, and the positions, each read from its table above."""
    from ctranslate2.specs import common_spec

    activation, gated = FEED_FORWARDS[config.feed_forward]
    options: dict[str, Any] = dict(
        **NORM_POSITIONS[config.norm_position],
        activation=getattr(common_spec.Activation, activation),
        ffn_glu=gated,
        **NORMS[config.normalization],
        **POSITIONS[config.positions],
    )
    if num_kv_heads(config) != config.num_heads:
        options["num_heads_kv"] = num_kv_heads(config)
    return options


def make_spec(model: TranslationModel, config: ModelConfig, tokenizer: Tokenizer) -> Any:
    """The CTranslate2 model specification of `model`, with its vocabulary and special tokens.

    Raises:
      ValueError: the model is one that CTranslate2 cannot run (`unsupported_reason`).
    """
    from ctranslate2.specs import transformer_spec

    reason = unsupported_reason(config)
    if reason:
        raise ValueError(reason)
    options = stack_options(config)
    decoder_only = config.architecture == "decoder_only"
    decoder = transformer_spec.TransformerDecoderSpec(
        config.num_layers, config.num_heads, with_encoder_attention=not decoder_only, **options
    )
    pieces = tokenizer.pieces(range(tokenizer.vocab_size))
    if decoder_only:
        spec = transformer_spec.TransformerDecoderModelSpec(decoder)
        decoder_stack(spec.decoder, model, model.decoder, model.decoder_norm)
        spec.register_vocabulary(pieces)
    else:
        encoder = transformer_spec.TransformerEncoderSpec(
            config.num_layers, config.num_heads, **options
        )
        spec = transformer_spec.TransformerSpec(encoder, decoder)
        input_layers(spec.encoder, spec.encoder.embeddings[0], model, source=True)
        for layer_spec, layer in zip(spec.encoder.layer, model.encoder, strict=True):
            attention(layer_spec.self_attention, layer.self_attention, layer.norm1, True)
            feed_forward(layer_spec.ffn, layer.feed_forward, layer.norm2)
        if model.encoder_norm is not None:
            layer_norm(spec.encoder.layer_norm, model.encoder_norm)
        decoder_stack(spec.decoder, model, model.decoder, model.decoder_norm)
        spec.register_source_vocabulary(pieces)
        spec.register_target_vocabulary(pieces)
        # Our sources end in EOS and have no BOS (batching.Batch); the decoder starts from BOS.
        spec.config.add_source_eos = True
        spec.config.decoder_start_token = pieces[BOS_ID]
    spec.config.bos_token = pieces[BOS_ID]
    spec.config.eos_token = pieces[EOS_ID]
    spec.config.unk_token = pieces[UNK_ID]
    spec.config.layer_norm_epsilon = float(model.decoder[0].norm1.epsilon)
    return spec


def record_fields(config: ModelConfig) -> dict[str, Any]:
    """What the export's marker records of this format beyond the common fields: nothing."""
    return {}


def write(
    model: TranslationModel,
    config: ModelConfig,
    tokenizer: Tokenizer,
    directory: pathlib.Path,
    quantization: str = "",
) -> Any:
    """Writes the CTranslate2 model (model.bin, config.json, the vocabulary) into `directory`.

    Args:
      directory: an existing empty directory.
      quantization: one of QUANTIZATIONS for the stored weights; "" keeps float32.

    Returns:
      The specification as written (its weights quantized).
    """
    spec = make_spec(model, config, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization or None)
    spec.save(str(directory))
    return spec


def translate(
    engine: Any,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    *,
    beam_size: int,
    length_penalty: float,
    max_extra_len: int,
    max_len: int,
    batch_size: int,
) -> list[str]:
    """Detokenized translations by a `ctranslate2.Translator` or `Generator` of our export.

    Decodes as our search does where CTranslate2 allows: the same source cut, the same output
    cap per sentence, an empty output allowed (`min_decoding_length=0`). Beam search differs:
    CTranslate2 ranks finished hypotheses by log P / length^length_penalty and stops once W of
    them are finished; ours by log P / ((5 + length) / 6)^alpha with an exact bound
    (search.beam_search). A blank sentence translates to "", as in sentences.translate_sentences.
    """
    pieces = source_pieces(tokenizer, sentences, max_len)
    out = [""] * len(sentences)
    generator = not hasattr(engine, "translate_batch")
    for length, indices in groups_by_length(pieces).items():
        indices = [i for i in indices if sentences[i].strip()]
        if not indices:
            continue
        options = dict(
            max_batch_size=batch_size, beam_size=beam_size, length_penalty=length_penalty
        )
        if generator:
            separator = tokenizer.pieces([EOS_ID, BOS_ID])  # models/decoder_only.py's x EOS BOS y
            prompts = [pieces[i] + separator for i in indices]
            results = engine.generate_batch(
                prompts,
                max_length=length + max_extra_len,
                min_length=0,
                include_prompt_in_result=False,
                **options,
            )
            outputs = [r.sequences[0] for r in results]
        else:
            results = engine.translate_batch(
                [pieces[i] for i in indices],
                max_decoding_length=length + max_extra_len,
                min_decoding_length=0,
                max_input_length=0,
                **options,
            )
            outputs = [r.hypotheses[0] for r in results]
        for i, output in zip(indices, outputs):
            out[i] = tokenizer.decode(tokenizer.ids_of(output))
    return out
