"""Fetching the public datasets (translate/data/fetch.py): from a local HTTP server, no network."""

import functools
import gzip
import hashlib
import http.server
import threading

import pytest

from translate import translate_data
from translate.data import fetch

TEXTS = {
    "train.en": "a dog runs .\nthe cat sleeps .\n",
    "train.de": "ein Hund rennt .\ndie Katze schläft .\n",
}


@pytest.fixture
def server(tmp_path):
    """A local HTTP server over tmp_path/served, and a dataset of two gzipped files there."""
    served = tmp_path / "served"
    served.mkdir()
    for name, text in TEXTS.items():
        (served / f"{name}.gz").write_bytes(gzip.compress(text.encode()))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    dataset = [
        fetch.DataFile(name, base + f"{name}.gz", hashlib.sha256(text.encode()).hexdigest(), 2)
        for name, text in TEXTS.items()
    ]
    yield served, {"tiny": dataset}
    httpd.shutdown()


def test_files_are_downloaded_decompressed_checked_and_kept(server, tmp_path):
    _, datasets = server
    said = []
    paths = fetch.fetch("tiny", tmp_path / "out", log=said.append, datasets=datasets)
    assert [p.read_text(encoding="utf-8") for p in paths] == list(TEXTS.values())
    again = []
    fetch.fetch("tiny", tmp_path / "out", log=again.append, datasets=datasets)
    assert all("already there" in line for line in again) and len(again) == 2


@pytest.mark.parametrize("damage", ["cut short", "another file"])
def test_a_damaged_or_other_download_is_refused_and_never_written(server, tmp_path, damage):
    served, datasets = server
    data = (served / "train.de.gz").read_bytes()
    if damage == "cut short":
        (served / "train.de.gz").write_bytes(data[: len(data) // 2])
    else:
        (served / "train.de.gz").write_bytes(gzip.compress(b"something else\n"))
    out = tmp_path / "out"
    message = "not a whole gzip file" if damage == "cut short" else "sha256"
    with pytest.raises(ValueError, match=message) as error:
        fetch.fetch("tiny", out, log=lambda line: None, datasets=datasets)
    assert "train.de.gz" in str(error.value)
    # Every file is checked before the first is written: the good train.en is not either.
    assert not out.exists() or sorted(p.name for p in out.iterdir()) == []


def test_a_wrong_file_already_there_is_replaced_by_the_checked_one(server, tmp_path):
    _, datasets = server
    out = tmp_path / "out"
    out.mkdir()
    (out / "train.en").write_text("edited by hand\n")
    fetch.fetch("tiny", out, log=lambda line: None, datasets=datasets, force=True)
    assert (out / "train.en").read_text(encoding="utf-8") == TEXTS["train.en"]


def test_offline_copies_are_read_from_a_directory_gzipped_or_not(server, tmp_path):
    served, datasets = server
    copies = tmp_path / "copies"
    copies.mkdir()
    (copies / "train.en.gz").write_bytes((served / "train.en.gz").read_bytes())
    (copies / "train.de").write_text(TEXTS["train.de"], encoding="utf-8")
    bad = [
        d._replace(url="http://127.0.0.1:9/unreachable/" + d.url.rsplit("/", 1)[1])
        for d in datasets["tiny"]
    ]
    paths = fetch.fetch(
        "tiny", tmp_path / "out", copies, log=lambda line: None, datasets={"tiny": bad}
    )
    assert [p.read_text(encoding="utf-8") for p in paths] == list(TEXTS.values())
    with pytest.raises(OSError, match="could not download .*give it as --from=DIR"):
        fetch.fetch("tiny", tmp_path / "out2", log=lambda line: None, datasets={"tiny": bad})
    with pytest.raises(FileNotFoundError, match="holds none of train.en.gz, train.en"):
        fetch.fetch("tiny", tmp_path / "out3", tmp_path, log=lambda line: None, datasets=datasets)


def test_the_recorded_datasets_name_their_files_as_the_recipes_read_them():
    assert [f.name for f in fetch.DATASETS["multi30k"]] == [
        "train.en", "train.de", "val.en", "val.de", "test2016.en", "test2016.de",
    ]  # fmt: skip
    assert all(len(f.sha256) == 64 for files in fetch.DATASETS.values() for f in files)


def test_the_command_names_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="give one dataset: multi30k or wmt_sample"):
        translate_data.main([f"--dir={tmp_path}"])
    with pytest.raises(ValueError, match="--dir is required"):
        translate_data.main(["multi30k"])
    with pytest.raises(ValueError, match="nope: not a dataset here"):
        translate_data.main(["nope", f"--dir={tmp_path}"])
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        translate_data.main(["multi30k", f"--dir={tmp_path / 'afile'}"])
