"""A Marian model in Hugging Face's layout (`MarianMTModel`: config.json and its weights, as
`save_pretrained` writes them and OPUS-MT publishes them) read back as a workdir of ours.

The inverse of translate/engines/huggingface.py's export, through the same weight slots
(`huggingface.weight_slots`): every channel of the residual stream renumbered back from
Marian's [sines | cosines] layout to our interleaved one, which is the same function
(exactly in real arithmetic). A key projection's bias is left out: it moves every score of a
query alike, which softmax ignores, so our model has none (models/attention.py).

Fail closed: every field of config.json is mapped to a field of ours (`MAPPED`), checked to
hold the one value we compute (`REQUIRED`), or named as not describing the model
(`NOT_THE_MODEL`); any other field, value or weight is refused in one line that names the file.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np
from flax import nnx

from translate import atomic, checkpoint
from translate.config import Config, ModelConfig
from translate.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    open_processor,
    read_id_table,
)
from translate.engines import huggingface
from translate.engines.shared import NUM_POSITIONS
from translate.models.factory import make_model
from translate.trained import write_params_workdir
from translate.workdir import Workdir, check_output_path, config_text, copy_vocabulary

# The files of a folder that `save_pretrained` wrote, and of the layout we do not read.
CONFIG, SAFETENSORS, PYTORCH = "config.json", "model.safetensors", "pytorch_model.bin"
OPUS_TOKENIZER = ("source.spm", "target.spm", "vocab.json")
# MarianTokenizer's separate target vocabulary (`separate_vocabs`), which we do not read.
TARGET_VOCAB = "target_vocab.json"
MARIAN_RELEASE = "decoder.yml"
# OPUS-MT's special pieces in vocab.json.
OPUS_EOS, OPUS_UNK, OPUS_PAD = "</s>", "<unk>", "<pad>"
# Our PAD row, which OPUS-MT's vocabulary lacks (its pad is the decoder's start): its
# projection's bias, so that no softmax gives it any probability.
NEVER = -1e9

# config.json's fields that say what the model computes -> our field and the value it takes
# (a function of config.json's value, raising ValueError for a value we do not compute).
MAPPED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "d_model": ("d_model", int),
    "encoder_layers": ("num_layers", int),
    "encoder_attention_heads": ("num_heads", int),
    "encoder_ffn_dim": ("d_ff", int),
    "activation_function": (
        "feed_forward",
        lambda v: {theirs: ours for ours, theirs in huggingface.ACTIVATIONS.items()}[v],
    ),
    "scale_embedding": ("scale_embeddings", bool),
    "share_encoder_decoder_embeddings": ("share_encoder_decoder_embeddings", bool),
    "dropout": ("dropout_rate", float),
    "attention_dropout": ("attention_dropout_rate", float),
    "activation_dropout": ("activation_dropout_rate", float),
}
# Fields whose one value here is what our model computes: field -> (value, why). Fields of the
# decoder equal to the encoder's are checked against the encoder's (`SAME_AS`).
REQUIRED: dict[str, tuple[Any, str]] = {
    "model_type": ("marian", "translate-import reads Marian models (MarianMTModel)"),
    "is_encoder_decoder": (True, "an encoder-decoder"),
    "is_decoder": (False, "an encoder-decoder, not its decoder alone"),
    "tie_word_embeddings": (True, "the projection is the decoder's embedding matrix"),
    "static_position_embeddings": (True, "sinusoidal positions"),
    "normalize_embedding": (False, "no norm on the embeddings"),
    "normalize_before": (False, "post-LayerNorm, as Marian's"),
    "add_final_layer_norm": (False, "no final norm after post-LayerNorm"),
    "add_bias_logits": (False, "the projection's bias is final_logits_bias"),
}
# The special ids of a folder with our vocab.model (our export): each is ours.
OUR_SPECIAL_IDS: dict[str, tuple[Any, str]] = {
    "pad_token_id": (PAD_ID, "our special ids (data/tokenizer.py)"),
    "bos_token_id": (BOS_ID, "our special ids (data/tokenizer.py)"),
    "eos_token_id": (EOS_ID, "our special ids (data/tokenizer.py)"),
    "decoder_start_token_id": (BOS_ID, "the decoder starts from our BOS"),
}
SAME_AS = {
    "decoder_layers": "encoder_layers",
    "decoder_attention_heads": "encoder_attention_heads",
    "decoder_ffn_dim": "encoder_ffn_dim",
    "decoder_vocab_size": "vocab_size",
    "num_hidden_layers": "encoder_layers",
}
# Fields that do not change what the model computes: the library's bookkeeping, training's
# settings, and generation's defaults (our decode section chooses those).
NOT_THE_MODEL = {
    "_name_or_path",
    "architectures",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "init_std",
    "encoder_layerdrop",
    "decoder_layerdrop",
    "gradient_checkpointing",
    "classifier_dropout",
    "classif_dropout",
    "scale_attention_softmax",
    "id2label",
    "label2id",
    "_num_labels",
    "num_labels",
    "output_past",
    "max_length",
    "min_length",
    "num_beams",
    "length_penalty",
    "bad_words_ids",
    "forced_eos_token_id",
    "max_position_embeddings",
    "vocab_size",
    # An offset of learned positions in transformers' older Marian; Marian's are sinusoids.
    "extra_pos_embeddings",
}


def read_folder(folder: pathlib.Path) -> tuple[dict[str, Any], pathlib.Path]:
    """config.json's fields and the weights' file, or ValueError naming what is missing."""
    if not folder.is_dir():
        raise ValueError(f"--from={folder}: no such directory")
    if (folder / MARIAN_RELEASE).is_file():
        raise ValueError(
            f"--from={folder}: Marian's own release files ({MARIAN_RELEASE}, the .npz model); "
            "convert them to a Hugging Face folder first with transformers' "
            "convert_marian_to_pytorch script"
        )
    path = folder / CONFIG
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(
            f"{path}: no such file; --from names a folder save_pretrained wrote"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"{path}: not a JSON object")
    for name in (SAFETENSORS, PYTORCH):
        if (folder / name).is_file():
            return fields, folder / name
    raise ValueError(f"--from={folder}: no {SAFETENSORS} or {PYTORCH}")


def model_config(
    fields: dict[str, Any], path: pathlib.Path, special_ids: dict[str, tuple[Any, str]]
) -> ModelConfig:
    """Our model config for config.json's `fields`, whose special ids must be `special_ids`;
    ValueError naming the file and the field."""
    model = ModelConfig()
    required = {**REQUIRED, **special_ids}
    for name, value in fields.items():
        if name in MAPPED:
            ours, convert = MAPPED[name]
            try:
                setattr(model, ours, convert(value))
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}: {name}={value!r} is not one we compute") from None
        elif name in required:
            expected, why = required[name]
            if value != expected:
                raise ValueError(f"{path}: {name}={value!r}, not {expected!r}: {why}")
        elif name in SAME_AS:
            other = SAME_AS[name]
            if value != fields.get(other):
                raise ValueError(f"{path}: {name}={value!r} differs from {other}")
        elif name not in NOT_THE_MODEL:
            raise ValueError(f"{path}: field {name} is not one translate-import knows")
    for name in ("model_type", "d_model", "encoder_layers", "encoder_attention_heads"):
        if name not in fields:
            raise ValueError(f"{path}: no {name}")
    model.norm_position = "post"  # Marian's layout (normalize_before=false)
    return model


def read_weights(path: pathlib.Path) -> dict[str, np.ndarray]:
    """The weights by name as float32 numpy arrays."""
    if path.name == SAFETENSORS:
        from safetensors.numpy import load_file

        return {k: np.asarray(v, np.float32) for k, v in load_file(str(path)).items()}
    try:
        import torch
    except ImportError:
        raise ValueError(f"{path}: reading it needs torch (pip install torch)") from None
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in state.items()}


def import_parameters(model: Any, weights: dict[str, np.ndarray], path: pathlib.Path) -> None:
    """Sets every parameter of `model` (ours, built from config.json) from `weights`."""
    order = huggingface.channel_order(model.d_model)
    used = set()
    for slot in huggingface.weight_slots(model, "post"):
        if slot.name not in weights:
            if slot.param is None or slot.layout == huggingface.ROW:
                continue  # a key bias, or no final_logits_bias: zeros
            raise ValueError(f"{path}: no weight {slot.name}")
        used.add(slot.name)
        if slot.param is None:
            continue  # a key projection's bias (the module's docstring)
        weight = weights[slot.name]
        expected = huggingface.to_layout(np.zeros(slot.param.shape, "f4"), slot.layout, order)
        if weight.shape != expected.shape:
            raise ValueError(
                f"{path}: {slot.name} has shape {tuple(weight.shape)}, not the "
                f"{tuple(expected.shape)} that {CONFIG} gives"
            )
        value = huggingface.from_layout(weight, slot.layout, order)
        slot.param[...] = value
    # The positions are Marian's sinusoids (static_position_embeddings), computed, not read.
    positions = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
    tied = {"lm_head.weight"}
    if model.source_embed is None:
        tied |= {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    unknown = sorted(set(weights) - used - positions - tied)
    if unknown:
        raise ValueError(f"{path}: weight {unknown[0]} is not one of the model {CONFIG} gives")


def imported_config(
    fields: dict[str, Any],
    path: pathlib.Path,
    vocab_size: int,
    special_ids: dict[str, tuple[Any, str]],
) -> Config:
    """A whole config: config.json's model, whose vocabulary has `vocab_size` pieces, and
    sources no longer than the positions Marian computes."""
    config = Config()
    if fields.get("vocab_size", vocab_size) != vocab_size:  # first: the ids depend on it
        raise ValueError(
            f"{path}: vocab_size={fields['vocab_size']}, the vocabulary has {vocab_size} pieces"
        )
    config.model = model_config(fields, path, special_ids)
    config.data.vocab_size = vocab_size
    config.decode.average_last = 1  # one checkpoint: the imported parameters
    limit = min(int(fields.get("max_position_embeddings", NUM_POSITIONS)), NUM_POSITIONS)
    config.data.max_len = min(config.data.max_len, limit)
    return config


def folder_tokenizer(folder: pathlib.Path) -> tuple[Any, dict[str, tuple[Any, str]], Any]:
    """The folder's tokenizer: (our Tokenizer, or OPUS-MT's id table; the special ids
    config.json must give; None, or for OPUS-MT's each of our ids' id there: `opus_order`)."""
    ours = folder / Workdir(folder).vocab.name
    if ours.is_file():
        return Tokenizer(ours), OUR_SPECIAL_IDS, None
    missing = [name for name in OPUS_TOKENIZER if not (folder / name).is_file()]
    if missing:
        raise ValueError(
            f"--from={folder} has no tokenizer: neither our {ours.name} (as translate-export "
            f"writes it) nor OPUS-MT's {', '.join(OPUS_TOKENIZER)} ({', '.join(missing)} missing)"
        )
    for name in OPUS_TOKENIZER[:2]:
        open_processor(folder / name)  # a SentencePiece model, or one line naming the file
    table = read_opus_table(folder)
    return table, opus_special_ids(table, folder / "vocab.json"), opus_order(table)


def import_marian(folder: str | pathlib.Path, workdir: str | pathlib.Path, languages=()) -> Config:
    """Writes the Marian model in `folder` as a workdir at step 0; returns its config.

    `languages`: (source, target) for the config's data section, which config.json does not
    say. The tokenizer is the folder's vocab.model (ours, as translate-export writes it), or
    OPUS-MT's two SentencePiece models over its vocab.json, whose ids are renumbered to ours
    (`opus_order`). The workdir must be new or empty; it is written beside its place and
    renamed in once whole, so a refusal or a failure leaves nothing behind.
    """
    folder, out = pathlib.Path(folder), pathlib.Path(workdir)
    check_output_path(out, "--workdir", [], directory=True, instead="give a new --workdir")
    if out.is_dir() and any(out.iterdir()):
        raise ValueError(f"--workdir={out} is not empty; give a new or empty directory")
    fields, weights_path = read_folder(folder)
    tokenizer, special_ids, order = folder_tokenizer(folder)
    theirs = tokenizer.vocab_size if order is None else len(tokenizer)
    config = imported_config(fields, folder / CONFIG, theirs, special_ids)
    if languages:
        config.data.src_lang, config.data.tgt_lang = languages
    weights = read_weights(weights_path)
    if order is not None:
        for name in huggingface.VOCAB_ROWS:
            if name in weights and weights[name].shape[0] != theirs:
                raise ValueError(
                    f"{weights_path}: {name} has {weights[name].shape[0]} rows, not the "
                    f"{theirs} pieces of {folder / 'vocab.json'}"
                )
        weights = renumbered(weights, order)
        config.data.vocab_size = len(order)
        config.decode.ban_start = True  # BOS is OPUS-MT's pad: a piece its softmax scores
    # config.json has no field for the projection's bias: a final_logits_bias of zeros adds
    # nothing, any other is ours (`model.logits_bias`).
    config.model.logits_bias = bool(np.any(weights.get("final_logits_bias", 0.0)))
    config.validate()
    model = make_model(config.model, config.data.vocab_size, nnx.Rngs(0))
    import_parameters(model, weights, weights_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic.directory(out, replace=False) as new:
            target = Workdir(new)
            if order is not None:
                write_opus_tokenizer(folder, tokenizer, order, target)
            else:
                copy_vocabulary(Workdir(folder), target)
            meta = {
                "step": 0,
                "vocab_sha256": target.tokenizer().sha256,
                "imported_from": str(folder.resolve()),
            }
            with checkpoint.make_manager(target.checkpoints, keep=1) as manager:
                write_params_workdir(
                    target,
                    config_text(config),
                    Workdir(folder),
                    manager,
                    0,
                    nnx.state(model, nnx.Param),
                    meta,
                )
    except FileExistsError:
        raise ValueError(
            f"--workdir={out}: another command wrote there while this one imported; it is left "
            "as it is, and nothing was imported"
        ) from None
    return config


def opus_special_ids(table: dict[str, int], path: pathlib.Path) -> dict[str, tuple[Any, str]]:
    """The special ids config.json must give for OPUS-MT's vocab.json `table`."""
    for piece in (OPUS_EOS, OPUS_UNK, OPUS_PAD):
        if piece not in table:
            raise ValueError(f"{path}: no {piece} piece, which OPUS-MT's vocabularies hold")
    why = f"OPUS-MT's special pieces ({path.name})"
    return {
        "pad_token_id": (table[OPUS_PAD], why),
        "eos_token_id": (table[OPUS_EOS], why),
        "decoder_start_token_id": (table[OPUS_PAD], "Marian's decoder starts from its pad"),
        # Marian starts from decoder_start_token_id and never reads a BOS.
        "bos_token_id": (table[OPUS_EOS], why),
    }


def opus_order(table: dict[str, int]) -> np.ndarray:
    """For each of our ids, OPUS-MT's id of the same piece; -1 for our PAD, which it lacks.

    Our specials first (PAD, UNK, BOS, EOS: data/tokenizer.py), BOS being OPUS-MT's pad, from
    which its decoder starts; then every other piece in OPUS-MT's order.
    """
    specials = {UNK_ID: table[OPUS_UNK], BOS_ID: table[OPUS_PAD], EOS_ID: table[OPUS_EOS]}
    order = [-1] * 4
    for ours, theirs in specials.items():
        order[ours] = theirs
    taken = set(specials.values())
    order += [i for i in range(len(table)) if i not in taken]
    return np.asarray(order)


def read_opus_table(folder: pathlib.Path) -> dict[str, int]:
    """OPUS-MT's vocab.json (piece -> id), checked; ValueError naming the file."""
    path = folder / "vocab.json"
    if (folder / TARGET_VOCAB).is_file():
        raise ValueError(
            f"--from={folder}: {TARGET_VOCAB}, a separate target vocabulary, is not one we read "
            "(our model has one id table for both languages)"
        )
    return read_id_table(path)


def renumbered(weights: dict[str, np.ndarray], order: np.ndarray) -> dict[str, np.ndarray]:
    """OPUS-MT's weights with their vocabulary's rows in our order (`opus_order`): our PAD row
    of zeros, and a projection bias that never gives it any probability."""
    out = dict(weights)
    missing = order < 0
    for name in huggingface.VOCAB_ROWS:
        if name in weights:
            rows = weights[name][np.maximum(order, 0)]
            rows[missing] = 0.0
            out[name] = rows
    bias = weights.get("final_logits_bias")
    bias = np.zeros((1, int(np.max(order)) + 1), np.float32) if bias is None else bias
    bias = bias[:, np.maximum(order, 0)]
    bias[:, missing] = NEVER
    out["final_logits_bias"] = bias
    return out


def write_opus_tokenizer(folder: pathlib.Path, table: dict[str, int], order, new: Workdir) -> None:
    """OPUS-MT's two SentencePiece models, and its id table in our ids, into `new`."""
    pieces = {theirs: piece for piece, theirs in table.items()}
    # Our PAD is new: a name no piece has (an engine's vocabulary maps names to ids). The
    # others keep OPUS-MT's names, BOS its pad's.
    pad = next(name for name in ("<blank>", "<translate-pad>", "<translate-pad-0>") if
               name not in table)  # fmt: skip
    ours = {pad if theirs < 0 else pieces[int(theirs)]: i for i, theirs in enumerate(order)}
    source, target, id_table = new.pair_vocab
    for name, path in zip(OPUS_TOKENIZER[:2], (source, target), strict=True):
        atomic.write_bytes(path, (folder / name).read_bytes())
    atomic.write_text(id_table, json.dumps(ours, ensure_ascii=False, indent=1) + "\n")
