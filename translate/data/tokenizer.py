"""The shared SentencePiece BPE vocabulary: special ids, training and loading."""

from __future__ import annotations

import hashlib
import io
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
