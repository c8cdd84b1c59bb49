"""A trained encoder-decoder in Hugging Face transformers' format, and how to decode it as ours.

Two of transformers' model classes compute the paper's Transformer with our choices (ReLU,
biases, embeddings scaled by sqrt(d_model) and tied to the pre-softmax projection, sinusoidal
positions from 0 at the paper's frequencies 10000^(2i/D), Sec. 3.4-3.5):
  - post-LayerNorm (the paper's, Sec. 3.1): Marian (`MarianMTModel`);
  - pre-LayerNorm, with a final LayerNorm on each stack: Pegasus
    (`PegasusForConditionalGeneration`).
Both lay their position table out as [sines | cosines] where ours interleaves them
(positions.sinusoidal_positions), and Marian rebuilds its table when it loads. So every model
channel is renumbered: HF channel j is our channel `channel_order(D)[j]` in every vector the
residual stream carries (embeddings, LayerNorm parameters, the inputs of the Q, K, V and first
feed-forward projections, the outputs of the attention output and second feed-forward
projections). A sum, a LayerNorm and ReLU do not care how channels are numbered, and heads live
inside the projections, so the renumbered model computes the same function (exactly in real
arithmetic; the float32 sums may round differently).

One difference remains: both classes build their LayerNorms with PyTorch's default epsilon,
1e-5, and take no setting for it; ours is 1e-6 (models/norms.py). `match_layer_norm_epsilon`
sets ours on a loaded model; docs/translating.md gives what it changes on Multi30k.

The weights are written as safetensors; `torch` and `transformers` are needed only to run them.
"""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from translate.config import ModelConfig
from translate.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, PairTokenizer, Tokenizer
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
from translate.models.attention import num_kv_heads
from translate.models.positions import sinusoidal_positions
from translate.models.transformer import TranslationModel

# transformers' model type and class for each LayerNorm position.
LAYOUTS = {
    "post": ("marian", "MarianMTModel"),
    "pre": ("pegasus", "PegasusForConditionalGeneration"),
}
# The Python package the writer needs, and how a user installs it.
PACKAGE, INSTALL = "safetensors", "pip install safetensors"
# The weights are stored in float32: this format takes no quantization.
QUANTIZATIONS: tuple[str, ...] = ()
QUANTIZATION_PACKAGES: dict[str, str] = {}
# transformers' name of each activation this export implements (`model.feed_forward`): ReLU
# (Sec. 3.3), the tanh form of the GELU that models/layers.py computes, and SiLU under the
# name OPUS-MT's Marian models give it.
ACTIVATIONS = {"relu": "relu", "gelu": "gelu_pytorch_tanh", "silu": "swish"}
# The most tokens `generate` writes unless told otherwise (transformers' default is 20).
MAX_LENGTH = 512


# The model settings this export implements (shared.refusal refuses any other, and any field
# without a decision here).
IMPLEMENTS = {
    **SHARED_DECISIONS,
    "norm_position": decide(LAYOUTS, {}),
    "architecture": decide(
        ("encoder_decoder",),
        {
            "decoder_only": "transformers has no model class for the decoder-only layout "
            "(positions over `source </s> <s> target`); export a causal one with "
            "--format=ctranslate2 (a prefix LM, model.prefix_attention=bidirectional, has no "
            "engine to export to)"
        },
    ),
    # Read by the decoder-only architecture alone, which this export refuses above.
    "prefix_attention": decide(("causal", "bidirectional"), {}),
    # Marian and Pegasus are the paper's blocks; of today's, they compute the GELU and SiLU
    # alone.
    "positions": decide(
        ("sinusoidal",),
        {
            scheme: f"Marian and Pegasus add sinusoidal positions only (model.positions={scheme}"
            "); export this model with --format=ctranslate2"
            for scheme in ("rotary", "relative")
        },
    ),
    "normalization": decide(
        ("layernorm",),
        {
            "rmsnorm": "Marian and Pegasus normalise with LayerNorm only (model.normalization="
            "rmsnorm); export this model with --format=ctranslate2"
        },
    ),
    "feed_forward": decide(
        ACTIVATIONS,
        {
            gated: "Marian and Pegasus have no gated feed-forward network (model.feed_forward="
            f"{gated}); export this model with --format=ctranslate2"
            for gated in ("swiglu", "geglu")
        },
    ),
    "num_kv_heads": Decision(
        lambda config: num_kv_heads(config) == config.num_heads,
        "Marian and Pegasus have one key and value head per query head (model.num_kv_heads); "
        "export this model with --format=ctranslate2",
    ),
    "use_bias": Decision(
        (True,),
        "Marian and Pegasus have biases in every linear layer (model.use_bias); export this "
        "model with --format=ctranslate2",
    ),
    "scale_embeddings": Decision(None, "Marian's and Pegasus's scale_embedding"),
    "logits_bias": Decision(None, "Marian's and Pegasus's final_logits_bias"),
    "share_encoder_decoder_embeddings": Decision(
        # Marian takes the encoder's own matrix; Pegasus (pre-LayerNorm) has one only.
        lambda config: (
            config.share_encoder_decoder_embeddings or LAYOUTS[config.norm_position][0] == "marian"
        ),
        "Pegasus shares one embedding matrix between its stacks (model."
        "share_encoder_decoder_embeddings); export this model with --format=ctranslate2",
    ),
}


def unsupported_reason(config: ModelConfig) -> str | None:
    """Why this export cannot express the model, or None when it can."""
    return refusal(config, IMPLEMENTS)


def channel_order(d_model: int) -> np.ndarray:
    """[D] our channel behind each HF channel: even channels (sines), then odd ones (cosines)."""
    return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])


# How a parameter of ours is laid out among transformers' weights, whose residual stream is
# numbered by `channel_order` (the module's docstring); PyTorch's Linear weights are [out, in].
READS = "reads"  # a projection of the stream (Q, K, V, first feed-forward): inputs renumbered
WRITES = "writes"  # a projection onto the stream (attention output, second feed-forward)
STREAM = "stream"  # a vector of the stream [D]: a norm's, a WRITES projection's bias
PLAIN = "plain"  # a vector off the stream, as it is: a READS projection's bias
EMBEDDING = "embedding"  # [V, D], channels renumbered
ROW = "row"  # [V] as [1, V]: the projection's bias (final_logits_bias)


class Slot(NamedTuple):
    """One of transformers' weights and the parameter of ours it holds: None for a key
    projection's bias (ours has none: its every score of a query moves alike, which softmax
    ignores) or a projection bias the model lacks, written as zeros."""

    name: str
    param: Any
    layout: str


def weight_slots(model: TranslationModel, norm_position: str) -> list[Slot]:
    """Every weight of the Marian or Pegasus layout, by transformers' names, with ours."""
    slots: list[Slot] = []

    def linear(name: str, layer: Any, layout: str) -> None:
        slots.append(Slot(f"{name}.weight", layer.kernel, layout))
        slots.append(Slot(f"{name}.bias", layer.bias, PLAIN if layout == READS else STREAM))

    def norm(name: str, layer: Any) -> None:
        slots.append(Slot(f"{name}.weight", layer.scale, STREAM))
        slots.append(Slot(f"{name}.bias", layer.bias, STREAM))

    def attention(name: str, module: Any, layer_norm: Any) -> None:
        for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v")):
            linear(f"{name}.{theirs}_proj", getattr(module, ours), READS)
        linear(f"{name}.out_proj", module.out, WRITES)
        norm(f"{name}_layer_norm", layer_norm)

    def feed_forward(name: str, module: Any, layer_norm: Any) -> None:
        linear(f"{name}.fc1", module.inner, READS)
        linear(f"{name}.fc2", module.outer, WRITES)
        norm(f"{name}.final_layer_norm", layer_norm)

    # Sec. 3.4: one embedding matrix [V, D] for both stacks and the pre-softmax projection, or
    # the encoder's own and the decoder's, which the projection shares (Marian's
    # share_encoder_decoder_embeddings=false).
    if model.source_embed is None:
        slots.append(Slot("model.shared.weight", model.embed.embedding, EMBEDDING))
    else:
        source, target = model.source_embed.embedding, model.embed.embedding
        slots.append(Slot("model.encoder.embed_tokens.weight", source, EMBEDDING))
        slots.append(Slot("model.decoder.embed_tokens.weight", target, EMBEDDING))
    slots.append(Slot("final_logits_bias", model.logits_bias, ROW))
    for i, layer in enumerate(model.encoder):
        name = f"model.encoder.layers.{i}"
        attention(f"{name}.self_attn", layer.self_attention, layer.norm1)
        feed_forward(name, layer.feed_forward, layer.norm2)
    for i, layer in enumerate(model.decoder):
        name = f"model.decoder.layers.{i}"
        attention(f"{name}.self_attn", layer.self_attention, layer.norm1)
        attention(f"{name}.encoder_attn", layer.cross_attention, layer.norm2)
        feed_forward(name, layer.feed_forward, layer.norm3)
    if norm_position == "pre":
        norm("model.encoder.layer_norm", model.encoder_norm)
        norm("model.decoder.layer_norm", model.decoder_norm)
    return slots


def to_layout(value: np.ndarray, layout: str, order: np.ndarray) -> np.ndarray:
    """Our float32 parameter as transformers' weight of `layout`."""
    if layout == READS:
        return np.ascontiguousarray(value[order].T)  # [D, out] -> [out, D]
    if layout == WRITES:
        return np.ascontiguousarray(value[:, order].T)  # [in, D] -> [D, in]
    if layout == STREAM:
        return value[order]
    if layout == EMBEDDING:
        return np.ascontiguousarray(value[:, order])
    if layout == ROW:
        return value[None]
    return value  # PLAIN


def from_layout(weight: np.ndarray, layout: str, order: np.ndarray) -> np.ndarray:
    """transformers' weight of `layout` as our parameter: the inverse of `to_layout`."""
    inverse = np.argsort(order)
    if layout == READS:
        return np.ascontiguousarray(weight.T[inverse])
    if layout == WRITES:
        return np.ascontiguousarray(weight.T[:, inverse])
    if layout == STREAM:
        return weight[inverse]
    if layout == EMBEDDING:
        return np.ascontiguousarray(weight[:, inverse])
    if layout == ROW:
        return weight[0]
    return weight  # PLAIN


def state_dict(model: TranslationModel, norm_position: str) -> dict[str, np.ndarray]:
    """The weights by transformers' names (`weight_slots`), zeros where ours has none."""
    order = channel_order(model.d_model)
    out: dict[str, np.ndarray] = {}
    for slot in weight_slots(model, norm_position):
        if slot.param is None:  # a key projection's bias; a projection bias the model lacks
            size = model.embed.embedding.shape[0] if slot.layout == ROW else out_size(slot, out)
            value = np.zeros(size, "f4")
        else:
            value = array(slot.param)
        out[slot.name] = to_layout(value, slot.layout, order)
    if norm_position == "pre":
        # Pegasus keeps its position tables among the weights: ours, in its channel order.
        positions = sinusoidal_positions(jnp.arange(NUM_POSITIONS), model.d_model)  # [P, D]
        positions = np.ascontiguousarray(np.asarray(positions, np.float32)[:, order])
        out["model.encoder.embed_positions.weight"] = positions
        out["model.decoder.embed_positions.weight"] = positions
    return out


def out_size(slot: Slot, weights: dict[str, np.ndarray]) -> int:
    """The size of a missing bias: its projection's outputs, written just before it."""
    return weights[slot.name.removesuffix(".bias") + ".weight"].shape[0]


def model_config(
    config: ModelConfig, vocab_size: int, ids: dict[str, Any] | None = None
) -> dict[str, Any]:
    """config.json: the architecture, the special `ids` (`special_ids`; ours by default), and
    no dropout (inference)."""
    model_type, architecture = LAYOUTS[config.norm_position]
    fields = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "d_model": config.d_model,
        "encoder_layers": config.num_layers,
        "decoder_layers": config.num_layers,
        "encoder_attention_heads": config.num_heads,
        "decoder_attention_heads": config.num_heads,
        "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff,
        "activation_function": ACTIVATIONS[config.feed_forward],
        "scale_embedding": config.scale_embeddings,  # Sec. 3.4: sqrt(d_model)
        "max_position_embeddings": NUM_POSITIONS,
        "dropout": 0.0,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "tie_word_embeddings": True,
        "is_encoder_decoder": True,
        "dtype": "float32",
        **(special_ids() if ids is None else ids),
    }
    if model_type == "marian":
        fields["decoder_vocab_size"] = vocab_size
        fields["share_encoder_decoder_embeddings"] = config.share_encoder_decoder_embeddings
    return fields


def special_ids(opus: bool = False) -> dict[str, Any]:
    """Our ids (data/tokenizer.py); the decoder starts from BOS, as ours does.

    `opus`: a model with OPUS-MT's tokenizer, written as OPUS-MT's are (`without_our_pad`):
    our ids less one, BOS (OPUS-MT's pad, its decoder's start) the padding, and generate told
    never to write it, as OPUS-MT's configs tell it (our search never does, search.choosable).
    """
    if opus:
        start, eos = BOS_ID - 1, EOS_ID - 1
        return {
            "pad_token_id": start,
            "bos_token_id": eos,
            "eos_token_id": eos,
            "decoder_start_token_id": start,
            "forced_eos_token_id": eos,
            "bad_words_ids": [[start]],
        }
    return {
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "decoder_start_token_id": BOS_ID,
        # At the length cap only EOS may follow, as in our search (search.greedy_search).
        "forced_eos_token_id": EOS_ID,
    }


# The weights with a row per piece of the vocabulary (final_logits_bias: [1, V]).
VOCAB_ROWS = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)


def without_our_pad(weights: dict[str, np.ndarray], tokenizer: PairTokenizer, directory) -> None:
    """The weights and the id table of a model with OPUS-MT's tokenizer, as OPUS-MT writes
    them: without our PAD (translate-import adds it, with a projection bias that gives it no
    probability, so nothing it computes changes), every other id one less."""
    for name in (*VOCAB_ROWS, "final_logits_bias"):
        if name in weights:
            axis = 1 if name == "final_logits_bias" else 0
            weights[name] = np.ascontiguousarray(np.delete(weights[name], PAD_ID, axis=axis))
    table = {piece: i - 1 for piece, i in tokenizer.ids.items() if i != PAD_ID}
    text = json.dumps(table, ensure_ascii=False, indent=1) + "\n"
    (pathlib.Path(directory) / tokenizer.path.name).write_text(text, encoding="utf-8")


def record_fields(config: ModelConfig) -> dict[str, Any]:
    """What the export's marker records of this format beyond the common fields: the class."""
    return {"model_class": LAYOUTS[config.norm_position][1]}


def write(
    model: TranslationModel,
    config: ModelConfig,
    tokenizer: Tokenizer,
    directory,
    quantization: str = "",
) -> None:
    """Writes config.json, generation_config.json and model.safetensors into `directory`.

    Raises:
      ValueError: a model this format cannot express (`unsupported_reason`), or a
        quantization (this format stores float32 only).
    """
    from safetensors.numpy import save_file

    if quantization:
        raise ValueError(f"quantization={quantization}: the huggingface format stores float32")
    reason = unsupported_reason(config)
    if reason:
        raise ValueError(reason)
    directory = pathlib.Path(directory)
    opus = isinstance(tokenizer, PairTokenizer)
    state = state_dict(model, config.norm_position)
    if opus:
        without_our_pad(state, tokenizer, directory)
    ids = special_ids(opus)
    fields = model_config(config, tokenizer.vocab_size - opus, ids)
    (directory / "config.json").write_text(json.dumps(fields, indent=2) + "\n")
    generation = {**ids, "max_length": MAX_LENGTH, "num_beams": 1}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    weights = directory / "model.safetensors"
    save_file(state, str(weights), metadata={"format": "pt"})
    # safetensors creates its file readable by its owner alone; give it config.json's mode, so
    # that whoever may read the export may load it.
    shutil.copymode(directory / "config.json", weights)


def match_layer_norm_epsilon(hf_model: Any, epsilon: float) -> int:
    """Sets `epsilon` on every LayerNorm of a loaded transformers model; returns how many."""
    import torch

    norms = [m for m in hf_model.modules() if isinstance(m, torch.nn.LayerNorm)]
    for m in norms:
        m.eps = epsilon
    return len(norms)


def translate(
    hf_model: Any,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    *,
    beam_size: int,
    length_penalty: float,
    max_extra_len: int,
    max_len: int,
    batch_size: int,
) -> list[str]:
    """Detokenized translations by a loaded transformers model of our export.

    As ctranslate2.translate: our source cut (EOS appended), one output cap per source
    length, the cap's last token forced to EOS as in our search. transformers' beam search
    ranks by log P / length^length_penalty, not our GNMT penalty (search.beam_search).
    """
    import torch

    pieces = source_pieces(tokenizer, sentences, max_len)
    out = [""] * len(sentences)
    for length, indices in groups_by_length(pieces).items():
        indices = [i for i in indices if sentences[i].strip()]
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            ids = [tokenizer.ids_of(pieces[i]) + [EOS_ID] for i in chunk]
            with torch.inference_mode():
                outputs = hf_model.generate(
                    input_ids=torch.tensor(ids),  # [B, S]: one length, so no padding
                    attention_mask=torch.ones(len(ids), length + 1, dtype=torch.long),
                    num_beams=beam_size,
                    # transformers warns of a length penalty given to greedy search.
                    **({"length_penalty": length_penalty} if beam_size > 1 else {}),
                    # BOS, at most `length + max_extra_len` tokens, then EOS (forced at the cap).
                    max_length=length + max_extra_len + 2,
                    do_sample=False,
                )  # [B, 1 + T]: BOS first
            for i, row in zip(chunk, outputs.tolist()):
                out[i] = tokenizer.decode(row)
    return out
