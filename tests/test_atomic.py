"""Atomic writing of files and directories: translate/atomic.py."""

import os
import pathlib
import re
import stat
import subprocess
import sys

import pytest

from translate import atomic


def names(path):
    return sorted(p.name for p in path.iterdir())


def test_write_bytes_creates_and_then_replaces_the_file(tmp_path):
    target = tmp_path / "out.bin"
    atomic.write_bytes(target, b"first")
    atomic.write_bytes(target, b"second", fsync=True)
    assert target.read_bytes() == b"second"
    assert names(tmp_path) == ["out.bin"]


def test_write_text_encodes_the_text_as_it_is(tmp_path):
    atomic.write_text(tmp_path / "a.txt", "Grüße\r\nzwei\n")
    assert (tmp_path / "a.txt").read_bytes() == "Grüße\r\nzwei\n".encode()
    atomic.write_text(tmp_path / "b.txt", "Grüße", encoding="latin-1")
    assert (tmp_path / "b.txt").read_bytes() == "Grüße".encode("latin-1")


def test_failed_write_leaves_the_old_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="disk full"), atomic.file(target) as tmp:
        tmp.write_text("half of the ne")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert names(tmp_path) == ["out.txt"]


def test_file_written_through_its_temporary_path_takes_the_targets_place(tmp_path):
    (tmp_path / "source").write_bytes(b"vocabulary")
    with atomic.file(tmp_path / "copy", fsync=True) as tmp:
        assert not (tmp_path / "copy").exists()
        with open(tmp, "wb") as f:
            f.write(b"vocabulary")
    assert (tmp_path / "copy").read_bytes() == b"vocabulary"
    assert names(tmp_path) == ["copy", "source"]


def test_temporary_file_is_a_hidden_unique_name_beside_the_target(tmp_path):
    first, second = atomic.AtomicFile(tmp_path / "out.txt"), atomic.AtomicFile(tmp_path / "out.txt")
    assert first.tmp.parent == second.tmp.parent == tmp_path
    for out in (first, second):
        assert re.fullmatch(r"\.out\.txt\.[0-9a-f]{8}\.tmp", out.tmp.name)
    assert first.tmp != second.tmp
    first.write(b"first")
    second.write(b"second")
    first.commit()
    second.commit()
    assert (tmp_path / "out.txt").read_bytes() == b"second"
    assert names(tmp_path) == ["out.txt"]


def test_discard_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    out = atomic.AtomicFile(target)
    out.write(b"new")
    out.flush()
    assert target.read_text() == "old"
    out.discard()
    assert target.read_text() == "old"
    assert names(tmp_path) == ["out.txt"]


def test_discard_after_commit_keeps_the_new_file(tmp_path):
    with atomic.AtomicFile(tmp_path / "out.txt") as out:
        out.write(b"new")
        out.commit()
        out.discard()
    assert (tmp_path / "out.txt").read_bytes() == b"new"
    assert names(tmp_path) == ["out.txt"]


def test_leaving_the_block_without_commit_writes_nothing(tmp_path):
    with atomic.AtomicFile(tmp_path / "out.txt") as out:
        out.write(b"new")
    assert names(tmp_path) == []


def test_a_replaced_file_keeps_its_permissions_and_a_new_one_gets_the_umasks(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    target.chmod(0o640)
    atomic.write_text(target, "new")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    umask = os.umask(0)
    os.umask(umask)
    atomic.write_text(tmp_path / "new.txt", "new")
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o666 & ~umask


def test_a_symlink_is_written_through(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "out.txt"
    target.write_text("old")
    (tmp_path / "link.txt").symlink_to(target)
    atomic.write_text(tmp_path / "link.txt", "new")
    assert (tmp_path / "link.txt").is_symlink()
    assert target.read_text() == "new"
    assert names(tmp_path / "real") == ["out.txt"]


def test_directory_appears_only_whole(tmp_path):
    target = tmp_path / "cache"
    with atomic.directory(target) as new:
        (new / "a").write_text("a")
        assert not target.exists()
        (new / "b").write_text("b")
    assert names(target) == ["a", "b"]
    assert names(tmp_path) == ["cache"]


def test_directory_replaces_an_earlier_one_only_when_whole(tmp_path):
    target = tmp_path / "cache"
    target.mkdir()
    (target / "old").write_text("old")
    with atomic.directory(target) as new:
        (new / "new").write_text("new")
        assert names(target) == ["old"]
    assert names(target) == ["new"]
    assert names(tmp_path) == ["cache"]


def test_directory_replaces_an_empty_one(tmp_path):
    (tmp_path / "cache").mkdir()
    with atomic.directory(tmp_path / "cache") as new:
        (new / "new").write_text("new")
    assert names(tmp_path / "cache") == ["new"]
    assert names(tmp_path) == ["cache"]


def test_failed_directory_leaves_the_old_one_and_nothing_beside(tmp_path):
    target = tmp_path / "cache"
    target.mkdir()
    (target / "old").write_text("old")
    with pytest.raises(KeyboardInterrupt), atomic.directory(target) as new:
        (new / "half").write_text("half")
        raise KeyboardInterrupt
    assert names(target) == ["old"]
    assert names(tmp_path) == ["cache"]


def test_failed_rename_puts_the_old_directory_back(tmp_path, monkeypatch):
    target = tmp_path / "cache"
    target.mkdir()
    (target / "old").write_text("old")
    replace = os.replace

    def second_rename_fails(source, destination):
        if str(source).endswith(".new"):
            raise OSError("rename failed")
        replace(source, destination)

    monkeypatch.setattr(os, "replace", second_rename_fails)
    with pytest.raises(OSError, match="rename failed"), atomic.directory(target) as new:
        (new / "new").write_text("new")
    assert names(target) == ["old"]
    assert names(tmp_path) == ["cache"]


# Holds a temporary as a writer does, then waits to be killed.
KILLED_WRITER = """
import sys, time
from translate import atomic
kind, target = sys.argv[1:]
if kind == "file":
    holder = atomic.AtomicFile(target)
else:
    holder = atomic.directory(target)
    holder.__enter__()
print("writing", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("kind, what", [("file", "tmp"), ("directory", "new")])
def test_remove_stale_deletes_a_killed_writers_temporary_and_keeps_a_live_ones(
    tmp_path, monkeypatch, kind, what
):
    target = tmp_path / "out"
    root = pathlib.Path(__file__).resolve().parent.parent
    writer = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, kind, str(target)],
        cwd=root,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout.readline().strip() == "writing"
    monkeypatch.setattr(atomic, "STALE_SECONDS", 0.0)
    assert atomic.remove_stale(target, what) == []  # a live writer's: kept
    writer.kill()
    writer.wait(timeout=30)
    (left,) = [p for p in tmp_path.iterdir() if p.name.endswith(f".{what}")]
    live = atomic.AtomicFile(target) if kind == "file" else None
    assert atomic.remove_stale(target, what) == [left]
    assert [p.name for p in tmp_path.iterdir()] == ([live.tmp.name] if live else [])
    if live:
        live.discard()


def test_remove_stale_keeps_a_temporary_younger_than_a_writer_needs_to_lock_it(tmp_path):
    target = tmp_path / "out"
    young = tmp_path / ".out.0123abcd.tmp"
    young.write_text("just created; its writer is about to lock it")
    assert atomic.remove_stale(target, "tmp") == [] and young.exists()


def test_a_write_that_the_disk_refuses_names_the_file(tmp_path):
    """A full disk while the synthetic corpus or a report is written names the file, not only
    "No space left on device"."""
    import errno

    target = tmp_path / "report.json"
    target.write_text("earlier")

    class FullDisk:
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        flush = close = lambda self: None

    with pytest.raises(OSError) as error, atomic.AtomicFile(target) as out:
        out.file.close()
        out.file = FullDisk()
        out.write(b"new")
    assert error.value.filename == str(target.resolve())
    assert error.value.errno == errno.ENOSPC
    assert target.read_text() == "earlier"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]


def test_a_directory_that_may_not_replace_leaves_what_another_wrote_meanwhile(tmp_path):
    target = tmp_path / "run"
    with atomic.directory(target, replace=False) as new:  # absent: created
        (new / "a").write_text("first")
    assert (target / "a").read_text() == "first"
    with pytest.raises(FileExistsError):
        with atomic.directory(target, replace=False) as new:
            (new / "a").write_text("second")
    assert (target / "a").read_text() == "first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no temporary left
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic.directory(empty, replace=False) as new:  # an empty directory is filled
        (new / "b").write_text("b")
    assert (empty / "b").read_text() == "b"
