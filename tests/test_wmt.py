"""WMT14 from TFDS without TensorFlow (translate/data/wmt.py), through the loader into batches."""

import io
import pathlib
import socket
import tarfile
import time

import numpy as np
import pytest

# A machine without TFDS (the bare GPU machine, for one) skips this module instead of failing
# every other test's collection.
tfds = pytest.importorskip("tensorflow_datasets")

from tensorflow_datasets.core.data_sources import array_record  # noqa: E402
from tensorflow_datasets.core.download import checksums  # noqa: E402

from translate.config import load_config  # noqa: E402
from translate.data import wmt  # noqa: E402
from translate.data.batching import BatchLayout, make_batch, plan_epoch  # noqa: E402
from translate.data.sources import load_data  # noqa: E402
from translate.training.trainer import data_files  # noqa: E402
from translate.workdir import Workdir  # noqa: E402

CONFIGS = pathlib.Path(__file__).parent.parent / "configs"


def lines(corpus: str, lang: str, n: int) -> str:
    return "".join(f"{corpus} {lang} sentence {i} about the small house\n" for i in range(n))


def sgm(lang: str, n: int) -> str:
    segments = "".join(
        f'<seg id="{i + 1}">newstest {lang} {i} &amp; a house</seg>\n' for i in range(n)
    )
    return f'<srcset setid="newstest2014">\n<doc docid="d1">\n{segments}</doc>\n</srcset>\n'


def write_tgz(path: pathlib.Path, files: dict[str, str]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def fake_wmt14(tmp_path, monkeypatch):
    """A TFDS data dir whose manual dir holds small archives laid out like the real WMT14 ones.

    TFDS checks manual archives against its registered sha256; the fake archives' own sums are
    registered in their place, so the real builder accepts them.
    """
    data_dir = tmp_path / "tfds"
    manual = data_dir / "downloads" / "manual"
    manual.mkdir(parents=True)
    write_tgz(
        manual / "training-parallel-europarl-v7.tgz",
        {
            "training/europarl-v7.de-en.de": lines("europarl", "de", 30),
            "training/europarl-v7.de-en.en": lines("europarl", "en", 30),
        },
    )
    write_tgz(
        manual / "training-parallel-commoncrawl.tgz",
        {
            "commoncrawl.de-en.de": lines("crawl", "de", 20),
            "commoncrawl.de-en.en": lines("crawl", "en", 20),
        },
    )
    write_tgz(
        manual / "training-parallel-nc-v9.tgz",
        {
            "training/news-commentary-v9.de-en.de": lines("news", "de", 10),
            "training/news-commentary-v9.de-en.en": lines("news", "en", 10),
        },
    )
    write_tgz(
        manual / "dev.tgz",
        {
            "dev/newstest2013.de": lines("newstest2013", "de", 6),
            "dev/newstest2013.en": lines("newstest2013", "en", 6),
            "dev/newstest2014-deen-src.de.sgm": sgm("de", 5),
            "dev/newstest2014-deen-ref.en.sgm": sgm("en", 5),
        },
    )
    wmt.import_builder_module("wmt14_translate")
    from tensorflow_datasets.translate.wmt14 import Wmt14Translate

    fake_infos = {}
    for url, info in Wmt14Translate.url_infos.items():
        if (manual / info.filename).is_file():
            computed = checksums.compute_url_info(manual / info.filename)
            fake_infos[url] = checksums.UrlInfo(computed.size, computed.checksum, info.filename)
    monkeypatch.setattr(Wmt14Translate, "url_infos", fake_infos)
    monkeypatch.setattr(wmt, "network_reachable", no_network)
    return data_dir


def no_network(urls, timeout=3.0):
    raise AssertionError(f"the test must not reach the network ({urls})")


def tfds_config(data_dir, src_lang="en", tgt_lang="de"):
    """configs/wmt14_base.py's data path with a tiny model, vocabulary and batch."""
    config = load_config(CONFIGS / "wmt14_base.py")
    m, d = config.model, config.data
    m.num_layers, m.d_model, m.num_heads, m.d_ff = 2, 32, 4, 64
    d.tfds_data_dir = str(data_dir)
    d.src_lang, d.tgt_lang = src_lang, tgt_lang
    d.vocab_size = 120
    d.max_len = d.row_len = 32
    d.tokens_per_batch = 32 * 8
    return config.validate()


def test_fake_wmt14_archives_prepare_through_the_real_builder_into_batches(fake_wmt14, tmp_path):
    builder = wmt.prepare("wmt14_translate/de-en", fake_wmt14)
    assert builder.is_prepared()
    assert list(pathlib.Path(builder.data_dir).glob("*train.array_record*"))
    assert {k: v.num_examples for k, v in builder.info.splits.items()} == {
        "train": 60,
        "validation": 6,
        "test": 5,
    }
    data = load_data(tfds_config(fake_wmt14), data_files(Workdir(tmp_path / "work")))
    assert len(data.train) == 60 and isinstance(data.train.src_tokens, np.memmap)
    cached = [(tmp_path / "work" / n).stat().st_mtime_ns for n in ("vocab.model", "tokens")]
    resumed = load_data(tfds_config(fake_wmt14), data_files(Workdir(tmp_path / "work")))
    assert [(tmp_path / "work" / n).stat().st_mtime_ns for n in ("vocab.model", "tokens")] == cached
    np.testing.assert_array_equal(resumed.train.src_tokens, data.train.src_tokens)
    sources, references = data.test_text
    # The raw TFDS strings, as the builder parsed them from the .sgm files, English first.
    assert sorted(sources) == sorted(f"newstest en {i} &amp; a house" for i in range(5))
    assert {s.split()[2] for s in sources} == {r.split()[2] for r in references}
    assert all(r.startswith("newstest de") for r in references)
    assert data.dev_text[0][0].startswith("newstest2013 en")
    layout = BatchLayout.from_config(32 * 8, 32, grad_accum_steps=1, num_devices=8)
    batch = make_batch(data.train, plan_epoch(data.train, layout, seed=0, epoch=0)[0], layout)
    assert batch.src.shape == (1, 8, 32) and (batch.src_segments > 0).any()
    decoded = data.tokenizer.decode(batch.src[0, 0])
    assert decoded.split()[1] == "en"


def test_german_to_english_reads_the_other_side(fake_wmt14, tmp_path):
    builder = wmt.prepare("wmt14_translate/de-en", fake_wmt14)
    src, tgt = wmt.read_split(builder, "validation", "de", "en", fake_wmt14)
    assert all(" de " in s for s in src) and all(" en " in t for t in tgt)


def test_a_language_outside_the_dataset_is_an_error(fake_wmt14):
    builder = wmt.prepare("wmt14_translate/de-en", fake_wmt14)
    with pytest.raises(ValueError, match="data.src_lang='fr'"):
        wmt.open_split(builder, "train", "fr", "de", fake_wmt14)


def test_mocked_tfds_examples_flow_through_the_loader_into_batches(tmp_path, monkeypatch):
    # mock_data replaces preparation and reading; the builder counts as prepared, so nothing
    # is fetched. Its mocked reader serves single records only (the batched `__getitems__` it
    # installs lacks `self`), so batched reads go record by record here.
    monkeypatch.setattr(tfds.core.DatasetBuilder, "is_prepared", lambda self: True)
    one_by_one = lambda self, keys: [self[k] for k in keys]  # noqa: E731
    monkeypatch.setattr(array_record.ArrayRecordDataSource, "__getitems__", one_by_one)
    monkeypatch.setattr(wmt, "network_reachable", no_network)
    with tfds.testing.mock_data(num_examples=40):
        config = tfds_config(tmp_path / "tfds")
        data = load_data(config, data_files(Workdir(tmp_path / "work")))
        direct = tfds.data_source("wmt14_translate/de-en", split="test")
        assert data.test_text[0][3] == wmt.to_text(direct[3]["en"])
        assert data.test_text[1][3] == wmt.to_text(direct[3]["de"])
    assert len(data.train) == 40 and len(data.dev_text[0]) == 40
    layout = BatchLayout.from_config(32 * 8, 32, grad_accum_steps=2, num_devices=2)
    plan = plan_epoch(data.train, layout, seed=0, epoch=0)
    assert sorted(i for b in plan for row in b for i in row) == list(range(40))
    batch = make_batch(data.train, plan[0], layout)
    assert batch.tgt_in.shape == (2, 4, 32)


def test_missing_data_offline_fails_at_once_naming_the_archives_and_manual_dir(
    tmp_path, monkeypatch
):
    for proxy in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(proxy, raising=False)

    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError) as error:
        wmt.prepare("wmt14_translate/de-en", tmp_path / "tfds")
    assert time.perf_counter() - start < 5
    message = str(error.value)
    assert str(tmp_path / "tfds" / "downloads" / "manual") in message
    for archive in ("training-parallel-europarl-v7.tgz", "training-parallel-nc-v9.tgz", "dev.tgz"):
        assert archive in message
    assert "http://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz" in message


def test_data_dir_comes_from_config_then_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "env"))
    assert wmt.resolve_data_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
    assert wmt.resolve_data_dir("") == tmp_path / "env"
    monkeypatch.delenv("TFDS_DATA_DIR")
    assert wmt.resolve_data_dir("") == pathlib.Path.home() / "tensorflow_datasets"


@pytest.mark.parametrize("name", ["wmt14_base.py", "wmt14_big.py"])
def test_wmt14_batch_holds_25k_tokens_per_side_on_one_gpu_or_eight(name):
    config = load_config(CONFIGS / name)
    d = config.data
    assert (d.source, d.tfds_name, d.src_lang, d.tgt_lang) == (
        "tfds",
        "wmt14_translate/de-en",
        "en",
        "de",
    )
    assert (d.vocab_size, d.tokens_per_batch, d.row_len) == (37000, 25_000, 256)
    eight = BatchLayout.from_config(d.tokens_per_batch, d.row_len, 1, num_devices=8)
    one = BatchLayout.from_config(d.tokens_per_batch, d.row_len, 8, num_devices=1)
    assert eight.rows * eight.num_micro == one.rows * one.num_micro == 96
    assert 24_000 <= 96 * d.row_len <= 25_000


def test_a_tfds_split_and_parallel_files_train_together(fake_wmt14, tmp_path):
    from translate.config import TrainCorpus

    config = tfds_config(fake_wmt14)
    (tmp_path / "bt.en").write_text(lines("bt", "en", 12))
    (tmp_path / "bt.de").write_text(lines("bt", "de", 12))
    config.data.dir = str(tmp_path)
    config.data.train_corpora = (
        TrainCorpus(tfds_split="train"),
        TrainCorpus(prefix="bt", weight=2.0, tag="<BT>"),
    )
    data = load_data(config.validate(), data_files(Workdir(tmp_path / "work")))
    assert data.mixture.sizes == (60, 12) and data.mixture.counts() == [60, 24]
    tag = data.tokenizer.processor.piece_to_id("<BT>")
    assert [data.train.src(i)[0] == tag for i in range(72)] == [False] * 60 + [True] * 12
