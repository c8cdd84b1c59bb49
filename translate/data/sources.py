"""The trainer's data: the one place that chooses a source; the vocabulary made once; tokens cached.

`load_data(config, files)` reads parallel files (translate/data/text.py), the synthetic corpus
(generated into `files.generated_dir`), a TFDS dataset (translate/data/wmt.py) or one language's
text (a language model's: pairs with empty sources), or several training corpora of files and
TFDS splits (`data.train_corpora`); trains the shared BPE vocabulary on a sample of the training
text, with the corpora's tags reserved in it, or reuses the one at `files.vocab_path`; and
tokenizes each training corpus once into memory-mapped arrays in `files.tokens_dir`
(corpus.tokenize_once), several corpora each in a directory of its own there. The trainer gives
the paths of its workdir (translate/workdir.py names them); the data family takes paths.
Batching the pairs is translate/data/batching.py's job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
from typing import NamedTuple

from translate import atomic
from translate.config import Config, DataSource, TrainCorpus, check_choice
from translate.data import synthetic, wmt
from translate.data.batching import Mixture
from translate.data.corpus import TokenizedCorpus, concatenate, tokenize_once, tokenize_parallel
from translate.data.text import ParallelText, read_lines, read_parallel, sample_sentences
from translate.data.tokenizer import PairTokenizer, Tokenizer, reserved_ids, train_tokenizer

log = logging.getLogger("translate")


class DataFiles(NamedTuple):
    """Where a run keeps what its data makes, so that a resumed run makes it once."""

    vocab_path: pathlib.Path  # the shared SentencePiece model
    tokens_dir: pathlib.Path  # the training pairs, tokenized once
    generated_dir: pathlib.Path  # the synthetic corpus (data.source="synthetic")
    # OPUS-MT's tokenizer (source.spm, target.spm, vocab.json), which a run started from an
    # import reads in place of vocab.model; never trained here.
    pair_vocab: tuple[pathlib.Path, ...] = ()

    def held_tokenizer(self) -> Tokenizer | PairTokenizer | None:
        """The tokenizer these files hold already, or None (then training trains one)."""
        if self.vocab_path.is_file():
            return Tokenizer(self.vocab_path)
        if self.pair_vocab and all(path.is_file() for path in self.pair_vocab):
            return PairTokenizer(*self.pair_vocab)
        return None


@dataclasses.dataclass
class Data:
    """A run's vocabulary, tokenized training and dev pairs, and its dev and test text."""

    tokenizer: Tokenizer
    train: TokenizedCorpus  # several training corpora: one after another
    dev: TokenizedCorpus | None
    dev_text: tuple[list[str], list[str]] | None  # (sources, raw references)
    test_text: tuple[list[str], list[str]] | None
    # Whether the pairs are translations, to be scored with BLEU; a language model's text
    # (data.source=monolingual: empty sources) is not.
    translations: bool = True
    # How each epoch draws from data.train_corpora; None: every pair of `train` once.
    mixture: Mixture | None = None


@dataclasses.dataclass(frozen=True)
class TrainingText:
    """One training corpus as text: its name in messages, the files it is read from (none for
    TFDS), and its weight and tag."""

    name: str
    text: ParallelText
    files: list[pathlib.Path]
    weight: float = 1.0
    tag: str = ""


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
        # data.train_corpora replaces the training split (`open_corpora`).
        train = "" if d.train_corpora else d.train_prefix
        prefixes = {"train": train, "dev": d.dev_prefix, "test": d.test_prefix}
    # An empty dev or test prefix means that split is not wanted.
    return {
        split: (base / f"{p}.{d.src_lang}", base / f"{p}.{d.tgt_lang}")
        for split, p in prefixes.items()
        if p
    }


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


def open_corpora(config: Config) -> list[TrainingText]:
    """The corpora of `data.train_corpora`, each checked to hold pairs, none named twice."""
    d = config.data
    texts: list[TrainingText] = []
    builder = None
    for i, corpus in enumerate(d.train_corpora, start=1):
        named = f"corpus {i} of --config.data.train_corpora"
        if corpus.tfds_split:
            data_dir = wmt.resolve_data_dir(d.tfds_data_dir)
            builder = builder or wmt.prepare(d.tfds_name, data_dir)
            text = wmt.open_split(builder, corpus.tfds_split, d.src_lang, d.tgt_lang, data_dir)
            name = f"{d.tfds_name} {corpus.tfds_split}"
            texts.append(TrainingText(name, text, [], corpus.weight, corpus.tag))
            continue
        paths = corpus_paths(config, corpus, named)
        for earlier in texts:
            if earlier.files and os.path.samefile(earlier.files[0], paths[0]):
                raise ValueError(
                    f"{paths[0]}: {named} is {earlier.files[0]} again, a corpus named twice; "
                    "give a weight to draw a corpus more often"
                )
        text = ParallelText.from_files(*paths)
        if text.num_pairs == 0:
            raise ValueError(f"{paths[0]}: the training file of {named} holds no sentence")
        texts.append(TrainingText(corpus.prefix, text, list(paths), corpus.weight, corpus.tag))
    return texts


def corpus_paths(
    config: Config, corpus: TrainCorpus, named: str
) -> tuple[pathlib.Path, pathlib.Path]:
    """A corpus's (source, target) files in data.dir, checked to exist and to be two files."""
    d = config.data
    if not d.dir:
        raise ValueError(f"{named} names files: set --config.data.dir=DIR, their directory")
    base = pathlib.Path(d.dir)
    if not base.is_dir():
        raise FileNotFoundError(f"--config.data.dir: {base} is not a directory")
    paths = (base / f"{corpus.prefix}.{d.src_lang}", base / f"{corpus.prefix}.{d.tgt_lang}")
    for path in paths:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file, named by {named}")
    if os.path.samefile(*paths):
        raise ValueError(
            f"{paths[0]} and {paths[1]} are one file ({named}): a pair would be a sentence and "
            "itself; give the target language's own file"
        )
    return paths


def open_text(
    config: Config, files: DataFiles
) -> tuple[
    list[TrainingText], tuple[list[str], list[str]] | None, tuple[list[str], list[str]] | None
]:
    """Training corpora (read on demand) and raw dev and test text from the configured source.

    One training corpus, or those of `data.train_corpora`.
    """
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
        # A language model has no translations to score.
        return [TrainingText(d.train_prefix, train, [train_path])], dev, None
    if d.source == "tfds":
        data_dir = wmt.resolve_data_dir(d.tfds_data_dir)
        builder = wmt.prepare(d.tfds_name, data_dir)
        dev, test = (
            wmt.read_split(builder, split, d.src_lang, d.tgt_lang, data_dir) if split else None
            for split in (d.tfds_dev_split, d.tfds_test_split)
        )
        if d.train_corpora:
            return open_corpora(config), dev, test
        train = wmt.open_split(builder, d.tfds_train_split, d.src_lang, d.tgt_lang, data_dir)
        return [TrainingText(f"{d.tfds_name} {d.tfds_train_split}", train, [])], dev, test
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
    if d.train_corpora:
        return open_corpora(config), dev, test
    train = ParallelText.from_files(*paths["train"])
    if train.num_pairs == 0:
        raise ValueError(f"{paths['train'][0]}: the training file holds no sentence")
    return [TrainingText(d.train_prefix, train, list(paths["train"]))], dev, test


def load_data(config: Config, files: DataFiles) -> Data:
    """Opens the text, trains (or reuses) the shared BPE vocabulary and tokenizes training data.

    The vocabulary and the training tokens are kept (`files`), so a resumed run neither reads
    the training text again nor tokenizes it.
    """
    d = config.data
    train_texts, dev_text, test_text = open_text(config, files)
    tags = [t.tag for t in train_texts if t.tag]
    tokenizer = files.held_tokenizer()
    if tokenizer is not None and tags and isinstance(tokenizer, PairTokenizer):
        raise ValueError(
            f"--config.data.train_corpora: tags ({', '.join(tags)}) are pieces reserved when "
            "our vocabulary is trained; OPUS-MT's tokenizer, imported, holds none: train "
            "these corpora without tags"
        )
    if tokenizer is None:
        every = [t.text for t in train_texts]
        train_text = every[0] if len(every) == 1 else ParallelText.concatenated(every)
        sample = sample_sentences(train_text, d.vocab_sample_size, config.train.seed)
        log.info(
            "training a %d-piece BPE vocabulary on %d sentences sampled from %d pairs",
            d.vocab_size,
            len(sample),
            train_text.num_pairs,
        )
        with naming_what_was_written(f"the vocabulary {files.vocab_path}"):
            tokenizer = train_tokenizer(sample, d.vocab_size, files.vocab_path, reserved=tags)
        del sample
    tag_ids = dict(zip(tags, reserved_ids(tokenizer, tags))) if tags else {}
    corpora = []
    for i, text in enumerate(train_texts, start=1):
        # One corpus keeps the cache where a run without data.train_corpora keeps it.
        cache = files.tokens_dir if len(train_texts) == 1 else files.tokens_dir / f"corpus-{i}"
        atomic.remove_stale(cache, "new")
        prefix = [tag_ids[text.tag]] if text.tag else []
        with naming_what_was_written(f"the training tokens in {cache}"):
            corpus, dropped = tokenize_once(
                text.text, tokenizer, d.max_len, cache, files=text.files, src_prefix=prefix
            )
        if len(corpus) == 0:
            raise ValueError(
                f"all {dropped} training pairs of {text.name} are longer than "
                f"--config.data.max_len={d.max_len} tokens on one side: raise data.max_len "
                "(and data.row_len)"
            )
        corpora.append(corpus)
        log.info(
            "train: %s: %d pairs kept, %d longer than data.max_len=%d dropped; vocabulary %d",
            text.name,
            len(corpus),
            dropped,
            d.max_len,
            tokenizer.vocab_size,
        )
    train = corpora[0] if len(corpora) == 1 else concatenate(corpora)
    mixture = None
    if d.train_corpora:
        mixture = Mixture(tuple(map(len, corpora)), tuple(t.weight for t in train_texts))
        total = sum(mixture.counts())
        for text, count in zip(train_texts, mixture.counts()):
            log.info(
                "train: %s: weight %g, tag %r: %d pairs an epoch (%.1f%%)",
                text.name,
                text.weight,
                text.tag,
                count,
                100.0 * count / total,
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
    return Data(tokenizer, train, dev, dev_text, test_text, translations, mixture)


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
