"""Writing a file or a directory atomically: readers see the old one or the whole new one.

Everything is first written under a hidden, unused name beside the target (`.NAME.<hex>.tmp`
for a file, `.NAME.<hex>.new` for a directory) and renamed into place once whole. Names are
random and created exclusively, so several processes, on several hosts sharing a file system,
never write into one temporary file. The target is resolved through symlinks first, so the
rename stays on one file system and a link is written through, as `open()` would.

A writer holds an advisory lock on its temporary file or directory while it writes, which the
operating system drops however the process ends; `remove_stale` deletes those that no writer
holds, which a killed process left behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import pathlib
import secrets
import shutil
import time
from collections.abc import Iterator

# A temporary this much older than now, and unlocked, is a killed writer's (`remove_stale`):
# a writer locks its temporary just after creating it.
STALE_SECONDS = 10.0


class AtomicFile:
    """A binary file that replaces `path` only on `commit`; `discard` leaves `path` as it was.

    A file `path` that exists already lends the new one its permissions; a new file gets 0o666
    through the umask, as `open()` would give it. Used as a context manager, leaving the block
    discards what was not committed.
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        """Creates the temporary file.

        Args:
          path: the file to replace (or create) on `commit`.
          fsync: whether `commit` flushes the data to disk before the rename, so that a
            machine that crashes after it finds the new file whole.
        """
        self.path = pathlib.Path(os.path.realpath(path))
        self.tmp = beside(self.path, "tmp")
        self.fsync = fsync
        self.committed = False
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        hold(fd)
        self.file = os.fdopen(fd, "wb")
        if self.path.exists():
            with contextlib.suppress(OSError):
                shutil.copymode(self.path, self.tmp)

    @contextlib.contextmanager
    def _named(self) -> Iterator[None]:
        """Names `path` in an error that names no file (a full disk fails a write so)."""
        try:
            yield
        except OSError as e:
            if e.filename is not None or e.errno is None:
                raise
            raise OSError(e.errno, e.strerror, str(self.path)) from None

    def write(self, data: bytes) -> None:
        with self._named():
            self.file.write(data)

    def flush(self) -> None:
        with self._named():
            self.file.flush()

    def commit(self) -> None:
        """Renames the temporary file to `path`, after flushing it (to disk, with `fsync`)."""
        with self._named():
            self.file.flush()
            if self.fsync:
                os.fsync(self.file.fileno())
            self.file.close()
        os.replace(self.tmp, self.path)
        self.committed = True

    def discard(self) -> None:
        """Removes the temporary file unless `commit` has renamed it into place."""
        with contextlib.suppress(OSError):  # data that a full disk could not take: discarded
            self.file.close()
        if not self.committed:
            self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> AtomicFile:
        return self

    def __exit__(self, *exc_info) -> None:
        self.discard()


def write_bytes(path: str | os.PathLike, data: bytes, *, fsync: bool = False) -> None:
    """Replaces (or creates) the file `path` with `data`, whole or not at all.

    Args:
      path: the file to write; its directory must exist.
      data: the file's new contents.
      fsync: flush the data to disk before the rename (see `AtomicFile`).
    """
    with AtomicFile(path, fsync=fsync) as f:
        f.write(data)
        f.commit()


def write_text(
    path: str | os.PathLike, text: str, encoding: str = "utf-8", *, fsync: bool = False
) -> None:
    """Replaces (or creates) the file `path` with `text`, whole or not at all.

    Args:
      path: the file to write; its directory must exist.
      text: the file's new contents, encoded as they are (no newline is translated).
      encoding: the text's encoding.
      fsync: flush the data to disk before the rename (see `AtomicFile`).
    """
    write_bytes(path, text.encode(encoding), fsync=fsync)


@contextlib.contextmanager
def file(path: str | os.PathLike, *, fsync: bool = False) -> Iterator[pathlib.Path]:
    """Yields a temporary file's path, renamed to `path` when the block ends without error.

    For a writer that takes a path (`shutil.copyfile`, a library's save function): it must
    write the file in place (open it for writing) and close it before the block ends, not
    put another file at its name. An error in the block removes the temporary file and leaves
    `path` as it was.

    Args:
      path: the file to replace (or create); its directory must exist.
      fsync: flush the data to disk before the rename (see `AtomicFile`).
    """
    with AtomicFile(path, fsync=fsync) as out:
        yield out.tmp
        out.commit()  # fsync through this handle syncs what the writer wrote: the same file


@contextlib.contextmanager
def directory(path: str | os.PathLike, replace: bool = True) -> Iterator[pathlib.Path]:
    """Yields a new empty directory that takes the place of `path` when the block ends.

    What `path` held before (an earlier version) is moved aside to a hidden `.NAME.<hex>.old`
    beside it, the new directory renamed into place, and the old one deleted: a process killed
    between the two renames leaves the old version under that name and no `path`. An error in
    the block deletes the new directory and leaves `path` as it was.

    Args:
      path: the directory to create or replace; its parent must exist.
      replace: False: `path` is created, or an empty directory there filled, never replaced;
        one that another process filled meanwhile raises FileExistsError and stays as it is
        (one rename, which the kernel refuses over a directory that holds anything).
    """
    target = pathlib.Path(os.path.realpath(path))
    new = beside(target, "new")
    new.mkdir()
    fd = os.open(new, os.O_RDONLY | os.O_DIRECTORY)
    hold(fd)
    try:
        yield new
        if replace:
            replace_directory(new, target)
        else:
            try:
                os.rename(new, target)
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
                message = "written meanwhile by another command"
                raise FileExistsError(e.errno, message, str(path)) from None
    finally:
        os.close(fd)
        shutil.rmtree(new, ignore_errors=True)  # gone already after the rename


def replace_directory(new: pathlib.Path, target: pathlib.Path) -> None:
    """Renames directory `new` to `target`, first moving aside and then deleting what was there."""
    if not target.exists() or (target.is_dir() and not any(target.iterdir())):
        os.replace(new, target)  # one rename, which replaces an empty directory too
        return
    old = beside(target, "old")
    os.replace(target, old)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(old, target)
        raise
    if old.is_dir():
        shutil.rmtree(old)
    else:
        old.unlink()


def hold(fd: int) -> None:
    """Locks a temporary file or directory as its writer's (best effort: some network file
    systems refuse locks, and then `remove_stale` leaves its temporaries alone)."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def remove_stale(path: str | os.PathLike, what: str) -> list[pathlib.Path]:
    """Deletes the temporaries beside `path` (`.NAME.<hex>.WHAT`, WHAT "tmp" or "new") that a
    killed writer left: those no writer holds, at least `STALE_SECONDS` old. Returns them.

    A temporary that another process is writing is locked and stays; so does one that cannot be
    locked to check (a file system without locks).
    """
    target = pathlib.Path(os.path.realpath(path))
    try:
        candidates = list(target.parent.glob(f".{glob.escape(target.name)}.*.{what}"))
    except OSError:
        return []
    removed = []
    for candidate in candidates:
        if not is_stale(candidate):
            continue
        if candidate.is_dir() and not candidate.is_symlink():
            shutil.rmtree(candidate, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                candidate.unlink()
        removed.append(candidate)
    return removed


def is_stale(candidate: pathlib.Path) -> bool:
    try:
        if time.time() - candidate.lstat().st_mtime < STALE_SECONDS:
            return False
        flags = os.O_RDONLY | (os.O_DIRECTORY if candidate.is_dir() else 0)
        fd = os.open(candidate, flags | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:  # held by a writer, or not lockable here
        return False
    finally:
        os.close(fd)


def beside(path: pathlib.Path, what: str) -> pathlib.Path:
    """A random hidden name in `path`'s directory: `.NAME.<8 hex digits>.WHAT`."""
    return path.with_name(f".{path.name}.{secrets.token_hex(4)}.{what}")
