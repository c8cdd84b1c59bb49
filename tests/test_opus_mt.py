"""OPUS-MT's Marian models imported (translate/pretrained/marian.py), checked against
transformers' own MarianMTModel and MarianTokenizer.

The models are built by transformers from configs shaped as OPUS-MT's (the fields of
Helsinki-NLP/opus-mt-en-de's config.json, at a small width; and a tc-big one, whose encoder and
decoder embeddings are untied), with random weights moved far from their initial values, and
two SentencePiece models trained here over one id table, as OPUS-MT's folders hold them: its
pad row and bias zero, as transformers' converter writes them.
"""

import io
import json
import pathlib

import jax
import numpy as np
import pytest
import sentencepiece as spm
from test_export import (
    TOLERANCE,
    ctranslate2_greedy_outputs,
    ctranslate2_log_probs,
    decode_options,
    our_greedy_outputs,
    teacher_forced_log_probs,
)

from translate.data import synthetic
from translate.decoding import forced
from translate.decoding.sentences import translate_sentences
from translate.decoding.settings import decode_settings
from translate.engines.writer import export
from translate.pretrained.marian import import_marian
from translate.trained import load_model
from translate.workdir import Workdir

pytestmark = pytest.mark.interop

PAIRS = synthetic.generate_pairs(7, seed=7)
# The tiny config's decode batch of 8 (one compilation of our search), with a target-language
# tag as OPUS-MT's multilingual models read it, and a character neither model holds.
SENTENCES = [s for s, _ in PAIRS[:5]] + ["", ">>deu<< the dog sleeps .", "the ☃ reads ."]
TAG = ">>deu<<"


def trained_spm(texts: list[str], size: int) -> bytes:
    """A unigram SentencePiece model, as OPUS-MT's are, with SentencePiece's own specials."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        model_type="unigram",
        vocab_size=size,
        hard_vocab_limit=False,
        character_coverage=1.0,
        minloglevel=2,
    )
    return model.getvalue()


def opus_table(models: list[bytes]) -> dict[str, int]:
    """vocab.json as OPUS-MT's: </s> and <unk> first, the pieces of both models, a language
    tag, and <pad> last."""
    pieces = ["</s>", "<unk>"]
    for model in models:
        processor = spm.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if piece not in pieces and piece != "<s>":
                pieces.append(piece)
    pieces += [TAG, "<pad>"]
    return {piece: i for i, piece in enumerate(pieces)}


def opus_fields(vocab_size: int, tc_big: bool) -> dict:
    """config.json's fields of opus-mt-en-de (a tc-big model's: ReLU, untied embeddings), at
    2 + 2 layers of width 32."""
    pad = vocab_size - 1
    return dict(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="relu" if tc_big else "swish",
        share_encoder_decoder_embeddings=not tc_big,
        scale_embedding=True,
        static_position_embeddings=True,
        normalize_before=False,
        normalize_embedding=False,
        add_final_layer_norm=False,
        add_bias_logits=False,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        bos_token_id=0,
        forced_eos_token_id=0,
        bad_words_ids=[[pad]],
        max_position_embeddings=512,
        max_length=512,
        num_beams=4,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
    )


@pytest.fixture(scope="module", params=["opus-mt-en-de", "tc-big"])
def opus(request, tmp_path_factory):
    """(folder, imported workdir, transformers model, MarianTokenizer, OPUS-MT's id table)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp(request.param)
    folder = root / "folder"
    pairs = synthetic.generate_pairs(300, seed=3)
    models = [trained_spm([p[side] for p in pairs], 90) for side in (0, 1)]
    table = opus_table(models)
    config = transformers.MarianConfig(**opus_fields(len(table), request.param == "tc-big"))
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    pad = len(table) - 1
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "embed_positions" not in name:  # sinusoids, computed
                weight.add_(torch.randn_like(weight) * 0.3)
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[0, pad] = 0.0
        embeddings = (model.get_encoder().embed_tokens, model.get_decoder().embed_tokens)
        for embedding in embeddings:  # one module twice when they are tied
            embedding.weight[pad] = 0.0
    model.eval()
    model.save_pretrained(str(folder))
    for name, data in zip(("source.spm", "target.spm"), models, strict=True):
        (folder / name).write_bytes(data)
    (folder / "vocab.json").write_text(json.dumps(table), encoding="utf-8")
    workdir = root / "run"
    import_marian(folder, workdir, ("en", "de"))
    tokenizer = transformers.MarianTokenizer(
        source_spm=str(folder / "source.spm"),
        target_spm=str(folder / "target.spm"),
        vocab=str(folder / "vocab.json"),
        source_lang="en",
        target_lang="de",
    )
    return folder, workdir, model, tokenizer, table


def theirs_of(ids, opus_ids: dict[str, int], ours) -> list[int]:
    """OPUS-MT's ids of our ids, by their pieces."""
    return [opus_ids[piece] for piece in ours.pieces(ids)]


def test_our_tokenizer_gives_marian_tokenizers_pieces(opus):
    _, workdir, _, theirs, table = opus
    ours = Workdir(workdir).tokenizer()
    for source, target in [*PAIRS, (SENTENCES[-2], SENTENCES[-1])]:
        assert (
            theirs_of(ours.encode_source([source])[0], table, ours) + [0]
            == theirs(source).input_ids
        )
        assert (
            theirs_of(ours.encode_target([target])[0], table, ours) + [0]
            == theirs(text_target=target).input_ids
        )
    # The tag is one piece; a character neither model holds, <unk>.
    tagged = ours.encode_source([SENTENCES[-2]])[0]
    assert ours.pieces(tagged)[0] == TAG
    assert "<unk>" in ours.pieces(ours.encode_source([SENTENCES[-1]])[0])


def test_log_probs_of_a_fed_target_are_transformers_own(opus):
    import torch

    _, workdir, model, _, table = opus
    ours_tok = Workdir(workdir).tokenizer()
    ours = teacher_forced_log_probs(workdir, PAIRS)
    pad = len(table) - 1
    for (source, target), mine in zip(PAIRS, ours, strict=True):
        x = theirs_of(ours_tok.encode_source([source])[0], table, ours_tok) + [0]
        y = theirs_of(ours_tok.encode_target([target])[0], table, ours_tok)
        with torch.inference_mode():
            logits = model(
                input_ids=torch.tensor([x]), decoder_input_ids=torch.tensor([[pad] + y])
            ).logits[0]  # [T, V]
        them = torch.log_softmax(logits, -1).numpy()[np.arange(len(y) + 1), y + [0]]
        np.testing.assert_allclose(mine, them, rtol=0, atol=TOLERANCE)


def marian_outputs(workdir, model, tokenizer, sentences, *, beam_size, length_penalty,
                   max_extra_len, max_len, batch_size) -> list[str]:  # fmt: skip
    """transformers' translations, one sentence at a time (no padding), capped as ours are:
    at most source length + `max_extra_len` pieces, then EOS; their ids read back by our
    tokenizer (the pieces' text is compared in the tokenizer's test)."""
    import torch

    ours = Workdir(workdir).tokenizer()
    our_id = {opus: ours.ids[piece] for piece, opus in tokenizer.get_vocab().items()}
    out = []
    for sentence in sentences:
        if not sentence.strip():
            out.append("")
            continue
        ids = tokenizer(sentence).input_ids[:-1][: max_len - 1] + [0]
        with torch.inference_mode():
            row = model.generate(
                input_ids=torch.tensor([ids]),
                num_beams=beam_size,
                # OPUS-MT's config.json bans the pad, the decoder's start, from the outputs
                # (transformers 5 no longer reads generation's fields from there).
                bad_words_ids=[[model.config.pad_token_id]],
                **({"length_penalty": length_penalty} if beam_size > 1 else {}),
                max_length=len(ids) - 1 + max_extra_len + 2,
                do_sample=False,
            )[0]
        out.append(ours.decode([our_id[int(i)] for i in row[1:]]))
    return out


def test_greedy_outputs_are_transformers_own(opus):
    _, workdir, model, tokenizer, _ = opus
    ours = our_greedy_outputs(workdir, tuple(SENTENCES))
    assert len(set(ours)) > 3, ours  # outputs that differ with the source: a real comparison
    assert marian_outputs(workdir, model, tokenizer, SENTENCES, **decode_options(workdir)) == ours


def test_beam_outputs_are_transformers_own_without_a_length_penalty(opus):
    # transformers divides by length^alpha, we by GNMT's ((5 + length) / 6)^alpha: alike at 0.
    _, workdir, model, tokenizer, _ = opus
    graphdef, params, ours_tok, config, _ = load_model(workdir)
    settings = decode_settings(config.decode, {"beam_size": 4, "length_penalty": 0.0})
    found = translate_sentences(
        (graphdef,), (params,), ours_tok, tuple(SENTENCES), settings, config.data.max_len
    )
    ours = [best[0][1] for best in found]
    options = {**decode_options(workdir), "beam_size": 4, "length_penalty": 0.0}
    assert marian_outputs(workdir, model, tokenizer, SENTENCES, **options) == ours


def test_the_import_exported_to_ctranslate2_computes_the_same(opus, tmp_path):
    pytest.importorskip("ctranslate2")
    _, workdir, _, _, _ = opus
    export(str(workdir), str(tmp_path / "ct2"), "ctranslate2")
    ours = teacher_forced_log_probs(workdir, PAIRS)
    tokenizer = Workdir(workdir).tokenizer()
    theirs = ctranslate2_log_probs(tmp_path / "ct2", tokenizer, PAIRS, "encoder_decoder")
    for mine, other in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(other, mine, rtol=0, atol=TOLERANCE)
    greedy = ctranslate2_greedy_outputs(workdir, tmp_path / "ct2", SENTENCES)
    assert greedy == our_greedy_outputs(workdir, tuple(SENTENCES))


def fed_log_probs(model, tokenizer, source: str, target: str) -> np.ndarray:
    """transformers' log P of each target piece and EOS, its own tokenizer's, fed the target."""
    import torch

    batch = tokenizer(source, text_target=target, return_tensors="pt")
    start = torch.tensor([[model.config.decoder_start_token_id]])
    with torch.inference_mode():
        logits = model(
            input_ids=batch.input_ids,
            decoder_input_ids=torch.cat([start, batch.labels[:, :-1]], 1),
        ).logits[0]  # [T, V]
    labels = batch.labels[0].numpy()
    return torch.log_softmax(logits, -1).numpy()[np.arange(len(labels)), labels]


def marian_tokenizer(folder: pathlib.Path):
    import transformers

    return transformers.MarianTokenizer(
        source_spm=str(folder / "source.spm"),
        target_spm=str(folder / "target.spm"),
        vocab=str(folder / "vocab.json"),
    )


def test_the_import_exported_to_hugging_face_is_opus_mts_model(opus, tmp_path):
    # Written as OPUS-MT writes its folders (without our PAD), it loads in transformers and
    # computes what the folder imported did, and imports back to the same parameters.
    import transformers

    folder, workdir, model, _, _ = opus
    export(str(workdir), str(tmp_path / "hf"), "huggingface")
    again = transformers.MarianMTModel.from_pretrained(str(tmp_path / "hf")).eval()
    for source, target in PAIRS:
        mine = fed_log_probs(again, marian_tokenizer(tmp_path / "hf"), source, target)
        them = fed_log_probs(model, marian_tokenizer(folder), source, target)
        np.testing.assert_allclose(mine, them, rtol=0, atol=TOLERANCE)
    back = tmp_path / "back"
    import_marian(tmp_path / "hf", back)
    leaves = [jax.tree.leaves(load_model(w).params) for w in (workdir, back)]
    for a, b in zip(*leaves, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_word_alignments_count_a_language_tag_as_its_own_word(opus):
    # The tag is one piece before the source model's pieces: its span, and the pieces' after
    # it, must name the line's words as the line has them.
    _, workdir, _, _, _ = opus
    graphdef, params, tokenizer, _, _ = load_model(workdir)
    source, target = SENTENCES[-2], PAIRS[0][1]
    (pair,) = forced.score_pairs(
        (graphdef,), (params,), tokenizer, [source], [target], 2, 64,
        alignment_layer=1, alignment_pieces=False, cut_sources=False,
    )  # fmt: skip
    words = (len(source.split()), len(target.split()))
    assert {j for _, j in pair.links} == set(range(words[1]))
    assert all(0 <= i < words[0] and 0 <= j < words[1] for i, j in pair.links), pair.links
    spans = tokenizer.source_spans([source])[0]
    assert spans[0] == (0, len(TAG)) and len(spans) == len(tokenizer.encode_source([source])[0])
