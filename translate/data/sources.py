"""The trainer's data: the one place that chooses a source; the vocabulary made once; tokens cached.

`load_data(config, files)` reads parallel files (translate/data/text.py), the synthetic corpus
(generated into `files.generated_dir`), a TFDS dataset (translate/data/wmt.py) or one language's
text (a language model's: pairs with empty sources); trains the shared BPE vocabulary on a
sample of the training text, or reuses the one at `files.vocab_path`; and tokenizes the training
pairs once into memory-mapped arrays in `files.tokens_dir` (corpus.tokenize_once). The trainer
gives the paths of its workdir (translate/workdir.py names them); the data family takes paths.
Batching the pairs is translate/data/batching.py's job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
from typing import NamedTuple

from translate.config import Config, DataSource, check_choice
from translate.data import synthetic, wmt
from translate.data.corpus import TokenizedCorpus, tokenize_once, tokenize_parallel
from translate.data.text import ParallelText, read_lines, read_parallel, sample_sentences
from translate.data.tokenizer import Tokenizer, train_tokenizer

log = logging.getLogger("translate")


class DataFiles(NamedTuple):
    """Where a run keeps what its data makes, so that a resumed run makes it once."""

    vocab_path: pathlib.Path  # the shared SentencePiece model
    tokens_dir: pathlib.Path  # the training pairs, tokenized once
    generated_dir: pathlib.Path  # the synthetic corpus (data.source="synthetic")


@dataclasses.dataclass
class Data:
    """A run's vocabulary, tokenized training and dev pairs, and its dev and test text."""

    tokenizer: Tokenizer
    train: TokenizedCorpus
    dev: TokenizedCorpus | None
    dev_text: tuple[list[str], list[str]] | None  # (sources, raw references)
    test_text: tuple[list[str], list[str]] | None
    # Whether the pairs are translations, to be scored with BLEU; a language model's text
    # (data.source=monolingual: empty sources) is not.
    translations: bool = True


def data_paths(config: Config, files: DataFiles) -> dict[str, tuple[pathlib.Path, ...]]:
    """(source, target) file paths per split; synthetic data is generated once, into
    `files.generated_dir`."""
    d = config.data
    check_choice(d.source, DataSource, "data.source")
    if d.source == "synthetic":
        out = files.generated_dir
        if not (out / "test.de").is_file():
            synthetic.write_splits(
                out,
                d.synthetic_num_train,
                d.synthetic_num_dev,
                d.synthetic_num_test,
                seed=config.train.seed,
            )
        base, prefixes = out, {"train": "train", "dev": "dev", "test": "test"}
    else:
        if not d.dir:
            raise ValueError("set --config.data.dir=DIR (the directory of the parallel files)")
        base = pathlib.Path(d.dir)
        if not base.is_dir():
            raise FileNotFoundError(f"--config.data.dir: {base} is not a directory")
        prefixes = {"train": d.train_prefix, "dev": d.dev_prefix, "test": d.test_prefix}
    # An empty dev or test prefix means that split is not wanted.
    return {
        split: (base / f"{p}.{d.src_lang}", base / f"{p}.{d.tgt_lang}")
        for split, p in prefixes.items()
        if p
    }


def text_files(config: Config, files: DataFiles) -> list[pathlib.Path]:
    """The files the training pairs are read from: both sides' (the language model's one);
    none for a TFDS dataset."""
    d = config.data
    if d.source == "tfds":
        return []
    if d.source == "monolingual":
        return [pathlib.Path(d.dir) / f"{d.train_prefix}.{d.tgt_lang}"]
    return list(data_paths(config, files)["train"])


def check_not_one_file(paths: dict[str, tuple[pathlib.Path, ...]], config: Config) -> None:
    """Refuses a split whose source and target are one file (a link, a hard link, a path
    spelled twice): the model would learn to copy its input, and report it as translation."""
    d = config.data
    for split, (src, tgt) in paths.items():
        if src.is_file() and tgt.is_file() and os.path.samefile(src, tgt):
            raise ValueError(
                f"{src} and {tgt} are one file (config.data.src_lang={d.src_lang} and "
                f"tgt_lang={d.tgt_lang} of --config.data.{split}_prefix): a {split} pair would be "
                "a sentence and itself; give the target language's own file"
            )


def open_text(
    config: Config, files: DataFiles
) -> tuple[ParallelText, tuple[list[str], list[str]] | None, tuple[list[str], list[str]] | None]:
    """Training pairs (read on demand) and raw dev and test text from the configured source."""
    d = config.data
    if d.source == "monolingual":
        base = pathlib.Path(d.dir)
        if not d.dir or not base.is_dir():
            raise FileNotFoundError(f"--config.data.dir={d.dir}: not a directory of text files")
        train_path = base / f"{d.train_prefix}.{d.tgt_lang}"
        if not train_path.is_file():
            raise FileNotFoundError(
                f"--config.data.dir={d.dir}: no {train_path.name} (data.train_prefix "
                "+ data.tgt_lang), the language model's text"
            )
        train = ParallelText.monolingual(train_path)
        dev_path = base / f"{d.dev_prefix}.{d.tgt_lang}"
        dev = None
        if dev_path.is_file():
            lines = read_lines(dev_path)
            if not lines:
                raise ValueError(
                    f"{dev_path}: the dev file holds no sentence (remove it, or set "
                    "--config.data.dev_prefix to another, for no dev set)"
                )
            dev = ([""] * len(lines), lines)
        return train, dev, None  # a language model has no translations to score
    if d.source == "tfds":
        data_dir = wmt.resolve_data_dir(d.tfds_data_dir)
        builder = wmt.prepare(d.tfds_name, data_dir)
        train = wmt.open_split(builder, d.tfds_train_split, d.src_lang, d.tgt_lang, data_dir)
        dev, test = (
            wmt.read_split(builder, split, d.src_lang, d.tgt_lang, data_dir) if split else None
            for split in (d.tfds_dev_split, d.tfds_test_split)
        )
        return train, dev, test
    paths = data_paths(config, files)
    for split in ("train", "dev", "test"):
        for path in paths.get(split, ()):
            if not path.is_file():
                prefix = f"--config.data.{split}_prefix"
                none = "" if split == "train" else f" (set {prefix}= for no {split} set)"
                raise FileNotFoundError(f"{path}: no such file, named by {prefix}{none}")
    check_not_one_file(paths, config)
    dev, test = (
        read_parallel(*paths[split]) if split in paths else None for split in ("dev", "test")
    )
    for split, text in (("dev", dev), ("test", test)):
        if text is not None and not text[0]:
            raise ValueError(
                f"{paths[split][0]}: the {split} file holds no sentence (set "
                f"--config.data.{split}_prefix= for no {split} set)"
            )
    train = ParallelText.from_files(*paths["train"])
    if train.num_pairs == 0:
        raise ValueError(f"{paths['train'][0]}: the training file holds no sentence")
    return train, dev, test


def load_data(config: Config, files: DataFiles) -> Data:
    """Opens the text, trains (or reuses) the shared BPE vocabulary and tokenizes training data.

    The vocabulary and the training tokens are kept (`files`), so a resumed run neither reads
    the training text again nor tokenizes it.
    """
    d = config.data
    train_text, dev_text, test_text = open_text(config, files)
    if files.vocab_path.is_file():
        tokenizer = Tokenizer(files.vocab_path)
    else:
        sample = sample_sentences(train_text, d.vocab_sample_size, config.train.seed)
        log.info(
            "training a %d-piece BPE vocabulary on %d sentences sampled from %d pairs",
            d.vocab_size,
            len(sample),
            train_text.num_pairs,
        )
        with naming_what_was_written(f"the vocabulary {files.vocab_path}"):
            tokenizer = train_tokenizer(sample, d.vocab_size, files.vocab_path)
        del sample
    with naming_what_was_written(f"the training tokens in {files.tokens_dir}"):
        train, dropped = tokenize_once(
            train_text, tokenizer, d.max_len, files.tokens_dir, files=text_files(config, files)
        )
    if len(train) == 0:
        raise ValueError(
            f"all {dropped} training pairs are longer than --config.data.max_len={d.max_len} "
            "tokens on one side: raise data.max_len (and data.row_len)"
        )
    log.info(
        "train: %d pairs kept, %d longer than data.max_len=%d dropped; vocabulary %d",
        len(train),
        dropped,
        d.max_len,
        tokenizer.vocab_size,
    )
    dev = None
    if dev_text:
        dev, dropped = tokenize_parallel(tokenizer, *dev_text, d.max_len)
        if len(dev) == 0:
            raise ValueError(
                f"{dev_source(config, files)}: no dev pair is at most "
                f"--config.data.max_len={d.max_len} tokens on both sides (all {dropped} are "
                "longer), so there is no dev loss to measure: raise data.max_len (and "
                "data.row_len), or shorten the dev set"
            )
    translations = d.source != "monolingual"
    return Data(tokenizer, train, dev, dev_text, test_text, translations)


def dev_source(config: Config, files: DataFiles) -> str:
    """The dev set's name for a message: its source file, or the TFDS split."""
    d = config.data
    if d.source == "tfds":
        return f"{d.tfds_name} {d.tfds_dev_split}"
    if d.source == "monolingual":
        return str(pathlib.Path(d.dir) / f"{d.dev_prefix}.{d.tgt_lang}")
    return str(data_paths(config, files)["dev"][0])


@contextlib.contextmanager
def naming_what_was_written(what: str):
    """Turns a failed write (a full disk) into an OSError that names `what` was being written.

    The vocabulary and the token cache are written whole or not at all, so the rest of the
    workdir is as it was.
    """
    try:
        yield
    except OSError as e:
        if e.errno is None:
            raise
        raise OSError(
            f"could not write {what}: {e.strerror}; it is written whole or not at all, and the "
            "rest of the workdir is as it was"
        ) from e
