"""The trainer's data from several training corpora: translate/data/sources.py."""

import dataclasses
import json
import math
import os
import pathlib

import numpy as np
import pytest

from translate.config import Config, TrainCorpus, load_config
from translate.data import synthetic
from translate.data.batching import BatchLayout, DataPosition, iterate_batches, plan_epoch
from translate.data.sources import DataFiles, load_data

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"


def write_corpus(directory: pathlib.Path, prefix: str, n: int, seed: int) -> None:
    src, tgt = zip(*synthetic.generate_pairs(n, seed=seed))
    (directory / f"{prefix}.en").write_text("\n".join(src) + "\n")
    (directory / f"{prefix}.de").write_text("\n".join(tgt) + "\n")


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory) -> pathlib.Path:
    """train (120 pairs), bt (80), val and test (10 each) of the synthetic grammar."""
    directory = tmp_path_factory.mktemp("text")
    for prefix, n, seed in (("train", 120, 1), ("bt", 80, 2), ("val", 10, 3), ("test", 10, 4)):
        write_corpus(directory, prefix, n, seed)
    return directory


def files_config(text_dir: pathlib.Path, *corpora: TrainCorpus) -> Config:
    config = Config()
    d = config.data
    d.dir, d.vocab_size, d.max_len, d.row_len, d.tokens_per_batch = str(text_dir), 120, 64, 64, 512
    d.train_corpora = tuple(corpora)
    return config.validate()


def files_of(workdir: pathlib.Path) -> DataFiles:
    return DataFiles(workdir / "vocab.model", workdir / "tokens", workdir / "data")


def batches(config: Config, data, num_steps: int, start: DataPosition | None = None):
    start = start or DataPosition()
    layout = BatchLayout.from_config(config.data.tokens_per_batch, config.data.row_len, 1, 1)
    stream = iterate_batches(data.train, layout, config.train.seed, start, mixture=data.mixture)
    return [next(stream) for _ in range(num_steps)]


def num_batches_an_epoch(config: Config, data) -> int:
    layout = BatchLayout.from_config(config.data.tokens_per_batch, config.data.row_len, 1, 1)
    return len(plan_epoch(data.train, layout, config.train.seed, 0, data.mixture))


def sentence_starts(batch) -> np.ndarray:
    """The first source token of every sentence in a batch."""
    return batch.src[(batch.src_positions == 0) & (batch.src_segments > 0)]


def test_one_corpus_at_weight_1_gives_the_batches_of_train_prefix_bit_for_bit(text_dir, tmp_path):
    alone = files_config(text_dir)  # data.train_prefix="train", today's default
    named = files_config(text_dir, TrainCorpus(prefix="train", weight=1.0))
    data_alone = load_data(alone, files_of(tmp_path / "alone"))
    data_named = load_data(named, files_of(tmp_path / "named"))
    assert data_alone.mixture is None
    assert data_named.tokenizer.sha256 == data_alone.tokenizer.sha256
    num_steps = 3 * num_batches_an_epoch(alone, data_alone) + 1  # past three epochs
    for (a, pos_a), (b, pos_b) in zip(
        batches(alone, data_alone, num_steps), batches(named, data_named, num_steps)
    ):
        assert pos_a == pos_b
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_batches_draw_each_corpus_by_its_weight_and_tag_only_its_sources(text_dir, tmp_path):
    config = files_config(
        text_dir,
        TrainCorpus(prefix="train", weight=1.0),
        TrainCorpus(prefix="bt", weight=2.5, tag="<BT>"),
    )
    data = load_data(config, files_of(tmp_path / "run"))
    tag = data.tokenizer.processor.piece_to_id("<BT>")
    assert data.tokenizer.processor.is_control(tag)
    num_train, num_bt = data.mixture.sizes  # the pairs kept of each (max_len drops a few)
    assert len(data.train) == num_train + num_bt and num_bt == 80
    one_epoch = []
    for batch, position in batches(config, data, 10_000):
        one_epoch.append(batch)
        if position.epoch == 1:
            break
    starts = np.concatenate([sentence_starts(b) for b in one_epoch])
    # Per epoch: every train pair once, and each bt pair twice plus half of them once more.
    assert (starts == tag).sum() == round(2.5 * num_bt)
    assert (starts != tag).sum() == num_train
    # The tag opens the tagged corpus's sources and is nowhere else: no target holds it.
    for batch in one_epoch:
        assert ((batch.src == tag) == ((batch.src_positions == 0) & (batch.src == tag))).all()
        assert not (batch.tgt_in == tag).any() and not (batch.tgt_out == tag).any()


def test_several_corpora_resume_mid_epoch_with_the_batches_of_an_uninterrupted_run(
    text_dir, tmp_path
):
    config = files_config(
        text_dir, TrainCorpus(prefix="train"), TrainCorpus(prefix="bt", weight=0.5, tag="<BT>")
    )
    data = load_data(config, files_of(tmp_path / "run"))
    steps = 2 * num_batches_an_epoch(config, data) + 2
    uninterrupted = batches(config, data, steps)
    per_epoch = num_batches_an_epoch(config, data)
    stop = per_epoch + per_epoch // 2  # in the second epoch, which draws another half of bt
    saved = uninterrupted[stop][1]
    assert saved.epoch == 1 and saved.index > 0
    reloaded = load_data(config, files_of(tmp_path / "run"))  # from the token caches
    resumed = batches(config, reloaded, steps - stop - 1, start=DataPosition(**vars(saved)))
    for (expected, _), (got, _) in zip(uninterrupted[stop + 1 :], resumed):
        for x, y in zip(expected, got):
            np.testing.assert_array_equal(x, y)


def test_each_corpus_is_cached_once_in_its_own_directory(text_dir, tmp_path):
    config = files_config(text_dir, TrainCorpus(prefix="train"), TrainCorpus(prefix="bt"))
    load_data(config, files_of(tmp_path / "run"))
    manifests = sorted((tmp_path / "run" / "tokens").glob("*/manifest.json"))
    assert [p.parent.name for p in manifests] == ["corpus-1", "corpus-2"]
    stamps = [p.stat().st_mtime_ns for p in manifests]
    load_data(config, files_of(tmp_path / "run"))
    assert [p.stat().st_mtime_ns for p in manifests] == stamps


def corpora_flag(*entries: dict) -> dict[str, str]:
    return {"data.train_corpora": json.dumps(list(entries)), "data.dir": "/nonexistent"}


@pytest.mark.parametrize(
    "entries",
    [
        [{"prefix": "train", "weight": 0}],
        [{"prefix": "train", "weight": -1}],
        [{"prefix": "train", "weight": math.nan}],
        [{"prefix": "train", "weight": math.inf}],
        [{"prefix": "train"}, {"prefix": "train", "weight": 2}],
        [{"prefix": "train", "tag": "<BT>"}, {"prefix": "bt", "tag": "<BT>"}],
    ],
    ids=["zero", "negative", "nan", "inf", "same_corpus_twice", "same_tag_twice"],
)
def test_bad_corpora_are_refused_in_one_line_naming_the_flag(entries):
    with pytest.raises(ValueError) as refused:
        load_config(CONFIGS / "base.py", corpora_flag(*entries))
    message = str(refused.value)
    assert message.startswith("invalid config: --config.data.train_corpora=")
    assert "\n" not in message


@pytest.mark.parametrize("tag", ["<s>", "▁the", "e"])
def test_a_tag_that_is_already_a_piece_is_refused_and_nothing_is_written(text_dir, tmp_path, tag):
    config = files_config(text_dir, TrainCorpus(prefix="train"), TrainCorpus("bt", tag=tag))
    with pytest.raises(ValueError, match="already a piece") as refused:
        load_data(config, files_of(tmp_path / "run"))
    assert str(refused.value).startswith("--config.data.train_corpora: the tag")
    assert "\n" not in str(refused.value)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_tag_the_existing_vocabulary_lacks_is_refused_before_tokenizing(text_dir, tmp_path):
    load_data(files_config(text_dir), files_of(tmp_path / "run"))  # a vocabulary without tags
    before = sorted(p.name for p in (tmp_path / "run").rglob("*"))
    config = files_config(text_dir, TrainCorpus("train"), TrainCorpus("bt", tag="<BT>"))
    with pytest.raises(ValueError, match="trained without it"):
        load_data(config, files_of(tmp_path / "run"))
    assert sorted(p.name for p in (tmp_path / "run").rglob("*")) == before


def test_the_same_files_under_two_prefixes_are_refused(text_dir, tmp_path):
    for lang in ("en", "de"):
        os.symlink(text_dir / f"train.{lang}", tmp_path / f"copy.{lang}")
        os.symlink(text_dir / f"train.{lang}", tmp_path / f"train.{lang}")
    config = files_config(tmp_path, TrainCorpus("train"), TrainCorpus("copy", weight=2))
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, dev_prefix=""))
    config.data.test_prefix = ""
    with pytest.raises(ValueError, match="named twice"):
        load_data(config, files_of(tmp_path / "run"))
