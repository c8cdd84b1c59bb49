"""The vocabularies: special ids, our shared SentencePiece BPE model (training and loading),
and OPUS-MT's two SentencePiece models over one id table (`PairTokenizer`, loaded only).

Both kinds answer the same calls: `encode_source` and `encode_target` (the text's ids, without
BOS or EOS), `decode` (a target's text), `pieces`, `vocab_size`, `sha256`. A workdir holds one
kind (`Workdir.tokenizer` reads whichever it holds).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pathlib
import re
from collections.abc import Iterable, Sequence

import sentencepiece as spm

from translate import atomic

# Special token ids, defined here and nowhere else.
PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


class Tokenizer:
    """A loaded SentencePiece model with batch encode/decode helpers."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.processor = spm.SentencePieceProcessor(model_file=str(self.path))
        ids = (
            self.processor.pad_id(),
            self.processor.unk_id(),
            self.processor.bos_id(),
            self.processor.eos_id(),
        )
        if ids != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise ValueError(
                f"{self.path}: special ids (pad, unk, bos, eos) are {ids}, "
                f"expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}"
            )

    @property
    def sha256(self) -> str:
        """Fingerprint of the model file, stored in checkpoints to catch a swapped vocabulary."""
        return hashlib.sha256(self.path.read_bytes()).hexdigest()

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids without BOS/EOS, one list per text."""
        return self.processor.encode(list(texts), out_type=int, num_threads=os.cpu_count() or 1)

    # One model for both languages: a source and a target are encoded alike.
    encode_source = encode_target = encode

    def source_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each text's pieces' byte spans [begin, end) in its UTF-8 text, as encoded."""
        return piece_spans(self.processor, texts)

    target_spans = source_spans

    @property
    def files(self) -> tuple[pathlib.Path, ...]:
        return (self.path,)

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenized text; stops at the first EOS and skips padding."""
        out = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                out.append(i)
        return self.processor.decode(out)

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.processor.id_to_piece(int(i)) for i in ids]

    def ids_of(self, pieces: Sequence[str]) -> list[int]:
        """The ids of `pieces` (an engine's output); UNK_ID for a piece the model lacks."""
        return [self.processor.piece_to_id(piece) for piece in pieces]

    def has_piece(self, piece: str) -> bool:
        return self.processor.id_to_piece(self.processor.piece_to_id(piece)) == piece


# A target-language tag at the start of a line (`>>deu<<`, OPUS-MT's multilingual models):
# one piece of the id table, before the SentencePiece pieces of the rest of the line. As
# transformers' MarianTokenizer reads it: from a leading ">>" to the first "<<".
LANGUAGE_TAG = re.compile(r">>.*?<<", re.DOTALL)


class PairTokenizer:
    """OPUS-MT's tokenizer: a SentencePiece model for each language, over one id table.

    The id table (vocab.json: piece -> id) is in our ids: PAD, UNK, BOS and EOS are 0-3 as in
    every vocabulary here (translate-import renumbers OPUS-MT's, translate/pretrained/marian.py).
    A piece the table lacks is UNK_ID, as transformers' MarianTokenizer gives it.
    """

    def __init__(self, source: pathlib.Path, target: pathlib.Path, table: pathlib.Path):
        self.source_path, self.target_path, self.path = source, target, table
        self.ids = table = read_id_table(table)
        self.table = [""] * len(table)
        for piece, i in table.items():
            self.table[i] = piece
        self.source_processor = open_processor(self.source_path)
        self.target_processor = open_processor(self.target_path)

    @property
    def files(self) -> tuple[pathlib.Path, ...]:
        return (self.source_path, self.target_path, self.path)

    @property
    def sha256(self) -> str:
        """One fingerprint of the three files, in their order."""
        digest = hashlib.sha256()
        for path in self.files:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        return digest.hexdigest()

    @property
    def vocab_size(self) -> int:
        return len(self.table)

    def _encode(self, processor: spm.SentencePieceProcessor, text: str) -> list[int]:
        tag = LANGUAGE_TAG.match(text)
        ids = [self.ids.get(tag.group(0), UNK_ID)] if tag else []
        rest = text[tag.end() :] if tag else text
        return ids + [self.ids.get(p, UNK_ID) for p in processor.encode(rest, out_type=str)]

    def _spans(self, processor: spm.SentencePieceProcessor, text: str) -> list[tuple[int, int]]:
        tag = LANGUAGE_TAG.match(text)
        if not tag:
            return piece_spans(processor, [text])[0]
        start = len(tag.group(0).encode("utf-8"))
        rest = piece_spans(processor, [text[tag.end() :]])[0]
        return [(0, start)] + [(begin + start, end + start) for begin, end in rest]

    def source_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        """Each text's pieces' byte spans [begin, end) in its UTF-8 text, as encoded."""
        return [self._spans(self.source_processor, text) for text in texts]

    def target_spans(self, texts: Sequence[str]) -> list[list[tuple[int, int]]]:
        return [self._spans(self.target_processor, text) for text in texts]

    def encode_source(self, texts: Sequence[str]) -> list[list[int]]:
        return [self._encode(self.source_processor, text) for text in texts]

    def encode_target(self, texts: Sequence[str]) -> list[list[int]]:
        return [self._encode(self.target_processor, text) for text in texts]

    def decode(self, ids: Iterable[int]) -> str:
        """The target's text; stops at the first EOS and skips padding and BOS."""
        pieces = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i not in (PAD_ID, BOS_ID):
                pieces.append(self.table[i])
        return self.target_processor.decode_pieces(pieces)

    def pieces(self, ids: Iterable[int]) -> list[str]:
        return [self.table[int(i)] for i in ids]

    def ids_of(self, pieces: Sequence[str]) -> list[int]:
        """The ids of `pieces` (an engine's output); UNK_ID for a piece the table lacks."""
        return [self.ids.get(piece, UNK_ID) for piece in pieces]

    def has_piece(self, piece: str) -> bool:
        return piece in self.ids


def read_id_table(path: pathlib.Path) -> dict[str, int]:
    """An id table (vocab.json: piece -> id, the ids 0 to N - 1 each once); ValueError naming
    the file."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not JSON ({error})") from None
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in table.items()
    ):
        raise ValueError(f"{path}: not an object of pieces and their ids")
    if sorted(table.values()) != list(range(len(table))):
        raise ValueError(f"{path}: the ids are not 0 to {len(table) - 1}, each once")
    return table


def piece_spans(
    processor: spm.SentencePieceProcessor, texts: Sequence[str]
) -> list[list[tuple[int, int]]]:
    """Each text's pieces' byte spans [begin, end) in its UTF-8 text (through SentencePiece's
    normalization), as `processor` encodes it."""
    from sentencepiece import sentencepiece_pb2

    out = []
    for proto in processor.encode(list(texts), out_type="serialized_proto"):
        pieces = sentencepiece_pb2.SentencePieceText.FromString(proto).pieces
        out.append([(piece.begin, piece.end) for piece in pieces])
    return out


def open_processor(path: pathlib.Path) -> spm.SentencePieceProcessor:
    """A SentencePiece model, or ValueError naming the file."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as error:
        raise ValueError(f"{path}: not a SentencePiece model ({error})") from None


def train_tokenizer(
    texts: Sequence[str],
    vocab_size: int,
    out_path: str | os.PathLike,
    reserved: Sequence[str] = (),
) -> Tokenizer:
    """Trains a BPE model on every sentence of `texts` (both languages) and saves it.

    A large corpus is sampled first (text.sample_sentences, seeded, from both sides).
    The vocabulary may come out smaller than `vocab_size` on a small corpus (SentencePiece
    stops when no merge is left); the model's vocabulary size is read from the saved file.
    The file is written atomically (translate/atomic.py): either whole or absent.

    `reserved` pieces (the training corpora's tags) take the last ids: the text's pieces are
    trained with `vocab_size - len(reserved)`, so they are the ones a vocabulary without tags
    would hold, and the reserved ones are appended as control pieces, which the encoder never
    makes from text. A reserved piece that the text's pieces already hold is refused, and
    nothing is written.
    """
    out_path = pathlib.Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    try:
        train_sentencepiece(texts, vocab_size - len(reserved), model)
    except RuntimeError as e:
        raise ValueError(sentencepiece_error(str(e), vocab_size)) from None
    data = model.getvalue()
    if reserved:
        data = with_reserved_pieces(data, reserved, vocab_size)
    atomic.write_bytes(out_path, data)
    return Tokenizer(out_path)


def with_reserved_pieces(model: bytes, reserved: Sequence[str], vocab_size: int) -> bytes:
    """A serialised SentencePiece model with `reserved` appended as control pieces.

    The model records `vocab_size` as asked for, all pieces included, so that a resumed run
    checks its data.vocab_size against the same number.
    """
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    pieces = {p.piece for p in proto.pieces}
    for piece in reserved:
        if piece in pieces:
            raise ValueError(
                f"--config.data.train_corpora: the tag {piece!r} is already a piece of the "
                "vocabulary trained on this text; choose a tag that no text holds, such as "
                "<BT> (nothing was written)"
            )
        proto.pieces.add(piece=piece, score=0.0, type=proto.SentencePiece.CONTROL)
    proto.trainer_spec.vocab_size = vocab_size
    return proto.SerializeToString()


def reserved_ids(tokenizer: Tokenizer, reserved: Sequence[str]) -> list[int]:
    """The ids of `reserved` pieces (tags) in a vocabulary, each a control piece of its own.

    Raises:
      ValueError: naming the tag and the vocabulary, for a tag that is an ordinary or special
        piece, or none (a vocabulary trained without it, which cannot take it afterwards).
    """
    proc, ids = tokenizer.processor, []
    for piece in reserved:
        i = proc.piece_to_id(piece)
        flag = f"--config.data.train_corpora: the tag {piece!r}"
        if proc.id_to_piece(i) != piece:
            raise ValueError(
                f"{flag} is not a piece of the vocabulary {tokenizer.path}, which was trained "
                "without it: a tag is reserved when the vocabulary is trained, so a new tag needs "
                "a new --workdir (or --force)"
            )
        if i in (PAD_ID, UNK_ID, BOS_ID, EOS_ID) or not proc.is_control(i):
            raise ValueError(
                f"{flag} is already a piece of the vocabulary {tokenizer.path}; choose a tag "
                "that no text holds, such as <BT>"
            )
        ids.append(i)
    return ids


def sentencepiece_error(message: str, vocab_size: int) -> str:
    """SentencePiece's training error in the words of our flags."""
    found = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", message)
    if found:
        return (
            f"--config.data.vocab_size={vocab_size}: the training text needs {found.group(2)} "
            "pieces for its distinct characters and the special tokens alone; give at least "
            f"{found.group(2)} (nothing was trained, and the same command with a larger "
            "vocab_size starts in this workdir)"
        )
    last = message.strip().splitlines()[-1] if message.strip() else message
    flag = f"--config.data.vocab_size={vocab_size}"
    return f"SentencePiece could not train the vocabulary ({flag}): {last}"


def train_sentencepiece(texts: Sequence[str], vocab_size: int, model: io.BytesIO) -> None:
    """SentencePiece's BPE trainer on `texts`, writing the model into `model`."""
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,
        character_coverage=1.0,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        num_threads=os.cpu_count() or 1,
        minloglevel=2,
    )
