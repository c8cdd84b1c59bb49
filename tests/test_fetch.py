"""Fetching the public datasets (translate/data/fetch.py) and translate-data: from a local HTTP
server, no network; what it did not write left alone, bad input and a gone reader survived."""

import functools
import gzip
import hashlib
import http.server
import os
import subprocess
import sys
import threading
import time
import zlib

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


# translate-data leaves alone what it did not write, and survives bad input and a gone reader.


TEXTS = {
    "train.en": "a dog runs .\nthe cat sleeps .\n",
    "train.de": "ein Hund rennt .\ndie Katze schläft .\n",
}
OTHER = {"train.en": "a bird sings .\n", "train.de": "ein Vogel singt .\n"}


def dataset(texts: dict[str, str], prefix: str = "") -> list[fetch.DataFile]:
    """Files named as TEXTS' keys whose source names are `prefix` + name + ".gz"."""
    return [
        fetch.DataFile(
            name,
            f"http://127.0.0.1:9/{prefix}{name}.gz",
            hashlib.sha256(text.encode()).hexdigest(),
            text.count("\n"),
        )
        for name, text in texts.items()
    ]


@pytest.fixture
def copies(tmp_path):
    """A directory of gzipped copies of two datasets, "tiny" (TEXTS) and "other" (OTHER), whose
    files have the same names, and the datasets themselves."""
    directory = tmp_path / "copies"
    directory.mkdir()
    for prefix, texts in (("", TEXTS), ("other-", OTHER)):
        for name, text in texts.items():
            (directory / f"{prefix}{name}.gz").write_bytes(gzip.compress(text.encode()))
    return directory, {"tiny": dataset(TEXTS), "other": dataset(OTHER, "other-")}


def quiet(line: str) -> None:
    pass


def listing(directory):
    return {
        p.name: (p.is_symlink(), p.read_bytes() if p.exists() else None)
        for p in directory.iterdir()
    }


@pytest.mark.parametrize("found", ["edited by hand", "another dataset's"])
def test_a_file_in_dir_that_is_not_the_recorded_one_is_refused_unless_forced(
    copies, tmp_path, found
):
    source, datasets = copies
    out = tmp_path / "out"
    if found == "edited by hand":
        out.mkdir()
        (out / "train.de").write_text("ein Hund läuft .\ndie Katze schläft .\n", encoding="utf-8")
    else:
        fetch.fetch("other", out, source, log=quiet, datasets=datasets)
    before = listing(out)
    with pytest.raises(ValueError, match="--force") as error:
        fetch.fetch("tiny", out, source, log=quiet, datasets=datasets)
    message = str(error.value)
    assert "\n" not in message
    if found == "edited by hand":
        assert str(out / "train.de") in message
    else:  # both named, and the first one's owner
        assert (
            f"{out / 'train.en'}: already there and not tiny's train.en (it is other's" in message
        )
        assert "(train.de likewise)" in message
    assert listing(out) == before  # not one file written before the refusal, none replaced

    paths = fetch.fetch("tiny", out, source, log=quiet, datasets=datasets, force=True)
    assert [p.read_text(encoding="utf-8") for p in paths] == list(TEXTS.values())


@pytest.mark.parametrize("link", ["to a file outside", "dangling"])
def test_a_symlink_in_dir_is_never_written_through(copies, tmp_path, link):
    source, datasets = copies
    out = tmp_path / "out"
    out.mkdir()
    outside = tmp_path / "mine.txt"
    if link == "to a file outside":
        outside.write_text("my own notes\n")
    (out / "train.en").symlink_to(outside)
    with pytest.raises(ValueError, match="symbolic link") as error:
        fetch.fetch("tiny", out, source, log=quiet, datasets=datasets)
    assert str(out / "train.en") in str(error.value) and "--force" in str(error.value)
    assert (out / "train.en").is_symlink() and not (out / "train.de").exists()
    assert (outside.read_text() if outside.exists() else None) == (
        "my own notes\n" if link == "to a file outside" else None
    )

    fetch.fetch("tiny", out, source, log=quiet, datasets=datasets, force=True)
    assert not (out / "train.en").is_symlink()  # the link itself is replaced, not its file
    assert (out / "train.en").read_text(encoding="utf-8") == TEXTS["train.en"]
    assert (outside.read_text() if outside.exists() else None) == (
        "my own notes\n" if link == "to a file outside" else None
    )


def test_a_gzip_with_a_damaged_deflate_block_is_refused_naming_it(copies, tmp_path):
    source, datasets = copies
    data = bytearray(gzip.compress(TEXTS["train.en"].encode() * 20))
    data[10] = 0xFF  # the first byte of the deflate stream: an invalid block type
    with pytest.raises(zlib.error):
        gzip.decompress(bytes(data))
    (source / "train.en.gz").write_bytes(bytes(data))
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="not a whole gzip file") as error:
        fetch.fetch("tiny", out, source, log=quiet, datasets=datasets)
    assert str(source / "train.en.gz") in str(error.value)
    assert not (out / "train.en").exists()


# Runs translate-data on the dataset "tiny" (TEXTS, from --from copies) in a fresh interpreter.
COMMAND = """
import hashlib, sys
from translate import cli, translate_data
from translate.data import fetch
texts = {texts!r}
fetch.DATASETS["tiny"] = [
    fetch.DataFile(n, "http://127.0.0.1:9/" + n + ".gz", hashlib.sha256(t.encode()).hexdigest(), 2)
    for n, t in texts.items()
]
{before}
cli.run(translate_data.main)
"""


def command(*args: str, before: str = "") -> list[str]:
    return [sys.executable, "-c", COMMAND.format(texts=TEXTS, before=before), "tiny", *args]


def test_a_killed_runs_temporary_file_is_removed_by_the_next_run_and_no_other(copies, tmp_path):
    source, _ = copies
    out = tmp_path / "out"
    out.mkdir()
    # Killed (SIGKILL: no cleanup runs) while its first file is being flushed to disk.
    die = "import os, signal; os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)"
    done = subprocess.run(
        command(f"--dir={out}", f"--from={source}", before=die), capture_output=True, text=True
    )
    assert done.returncode == -9, done.stderr
    left = [p for p in out.iterdir() if p.name.startswith(".")]
    assert len(left) == 1 and left[0].name.startswith(".train.en.") and left[0].is_file()
    old = time.time() - 3600
    os.utime(left[0], (old, old))
    mine = [out / ".train.en.notes.tmp", out / ".train.en.tmp", out / "train.en.0123abcd.tmp"]
    for path in mine:
        path.write_text("the user's\n")
        os.utime(path, (old, old))

    done = subprocess.run(
        command(f"--dir={out}", f"--from={source}"), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["train.en", "train.de", *(p.name for p in mine)]
    )
    assert all(path.read_text() == "the user's\n" for path in mine)


def test_dir_and_from_take_their_value_after_a_space(copies, tmp_path, monkeypatch, capsys):
    source, datasets = copies
    monkeypatch.setitem(fetch.DATASETS, "tiny", datasets["tiny"])
    out = tmp_path / "out"
    translate_data.main(["tiny", "--dir", str(out), "--from", str(source)])
    assert [(out / n).read_text(encoding="utf-8") for n in TEXTS] == list(TEXTS.values())
    translate_data.main(["--from", str(source), "tiny", "--dir", str(out), "--force"])
    assert "already there" in capsys.readouterr().out
    with pytest.raises(ValueError, match="--dir needs a value"):
        translate_data.main(["tiny", "--dir"])


def test_a_gone_reader_of_standard_output_loses_messages_and_no_file(copies, tmp_path):
    source, _ = copies
    out = tmp_path / "out"
    run = subprocess.Popen(
        command(f"--dir={out}", f"--from={source}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    run.stdout.close()  # `| head -0`: no reader before the first line is written
    _, errors = run.communicate(timeout=300)
    assert run.returncode == 0 and errors == b"", errors.decode()
    assert [(out / n).read_text(encoding="utf-8") for n in TEXTS] == list(TEXTS.values())


def test_a_damaged_later_gzip_leaves_dir_as_it_was(copies, tmp_path):
    source, _ = copies
    texts = {**TEXTS, "dev.en": "a bird .\n"}
    (source / "dev.en.gz").write_bytes(gzip.compress(texts["dev.en"].encode())[:-6])  # cut
    out = tmp_path / "out"
    with pytest.raises(ValueError, match="not a whole gzip file") as error:
        fetch.fetch("three", out, source, log=quiet, datasets={"three": dataset(texts)})
    assert str(source / "dev.en.gz") in str(error.value) and "nothing was written" in str(
        error.value
    )
    assert list(out.iterdir()) == [], "train.en and train.de, read first, were not written"


@pytest.mark.parametrize("where", ["data", "checkpoints", "best", ""])
def test_dir_inside_a_runs_own_files_or_a_run_itself_is_refused_even_with_force(
    copies, tmp_path, where, monkeypatch
):
    source, datasets = copies
    monkeypatch.setitem(fetch.DATASETS, "tiny", datasets["tiny"])
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    (run / "train.lock").write_text("")
    (run / "data" / "train.en").write_text("the run's own corpus\n")
    out = run / where if where else run
    before = sorted(run.rglob("*"))
    with pytest.raises(ValueError) as error:
        translate_data.main(["tiny", f"--dir={out}", f"--from={source}", "--force"])
    message = str(error.value)
    assert message.startswith(f"--dir={out}") and "\n" not in message, message
    assert sorted(run.rglob("*")) == before
    assert (run / "data" / "train.en").read_text() == "the run's own corpus\n"
    # Beside the run's own files, a directory of the user's takes the data.
    translate_data.main(["tiny", f"--dir={run / 'corpus'}", f"--from={source}"])
    assert (run / "corpus" / "train.en").read_text(encoding="utf-8") == TEXTS["train.en"]


def test_two_fetches_into_one_dir_at_once_never_interleave(copies, tmp_path, monkeypatch):
    source, datasets = copies
    out = tmp_path / "out"
    reading = fetch.read_source

    def slow(file, copies):  # both fetches pass their first check before either writes
        time.sleep(0.3)
        return reading(file, copies)

    monkeypatch.setattr(fetch, "read_source", slow)
    outcomes, said = {}, []

    def run(name):
        try:
            fetch.fetch(name, out, source, log=said.append, datasets=datasets)
            outcomes[name] = "written"
        except ValueError as e:
            outcomes[name] = str(e)

    threads = [threading.Thread(target=run, args=(name,)) for name in ("tiny", "other")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    written = [name for name, outcome in outcomes.items() if outcome == "written"]
    assert len(written) == 1, outcomes
    texts = TEXTS if written == ["tiny"] else OTHER
    assert {p.name: p.read_text(encoding="utf-8") for p in out.iterdir()} == texts
    refused = outcomes["other" if written == ["tiny"] else "tiny"]
    assert "nothing was written" in refused and "--force" in refused
    assert any("waiting for it" in line for line in said)
