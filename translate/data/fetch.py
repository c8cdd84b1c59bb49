"""The public datasets the recipes and benchmarks read, fetched and checked file by file.

Each file is downloaded from the dataset's public repository at a pinned commit (or taken from
a directory of copies, offline), decompressed when it is gzipped, and checked against the sha256
recorded here before it is written, whole, into the target directory: a wrong, partial or
damaged file is refused with its name and never used. A file already there with the right
sha256 is kept as it is. Anything else already there under a dataset file's name (a file edited
by hand, another dataset's file of the same name, a symbolic link) is the user's: it stops the
command before anything is written, unless `force` says to replace it (a link itself, never the
file it points to). Every file is read and checked before the first is written, so a damaged one
leaves the directory as it was. The target directory is locked while files are written there: a
second fetch into it waits, then checks again what the first one wrote. (translate-data checks
the directory against runs first, as every command checks its outputs.)

  multi30k     Multi30k task 1 (Elliott et al. 2016): train, val, test2016, raw text, English and
               German, from github.com/multi30k/dataset at a3d2e0d (the files have not changed
               there since 2018-01-17). For non-commercial research and education (its README).
  wmt_sample   10,000 Moses-tokenized WMT training pairs, OpenNMT-py's first "toy-ende" sample
               (github.com/OpenNMT/OpenNMT-py at 3518fba): the speed benchmarks' corpus.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import http.client
import os
import pathlib
import re
import stat
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from typing import NamedTuple

from translate import atomic

# The standard library's urllib rather than a download library (pooch, TFDS's download manager):
# a file here is a pinned URL and a sha256, which needs no dependency of its own.
MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/data/task1/raw/"
OPENNMT = "https://raw.githubusercontent.com/OpenNMT/OpenNMT-py/3518fbab3092b21f12d78f9054097dffabb4025e/data/"
# Seconds a download may stall before it is given up.
TIMEOUT = 60


class DataFile(NamedTuple):
    """One file of a dataset: its name here, where it comes from, and what it must be."""

    name: str  # the file written, e.g. "train.en"
    url: str  # where it is downloaded from
    sha256: str  # of the file as written (decompressed)
    lines: int

    @property
    def source_name(self) -> str:
        """The file's name at its source (what a directory of copies may hold instead)."""
        return self.url.rsplit("/", 1)[-1]


DATASETS: dict[str, list[DataFile]] = {
    "multi30k": [
        DataFile(
            "train.en",
            MULTI30K + "train.en.gz",
            "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
            29000,
        ),
        DataFile(
            "train.de",
            MULTI30K + "train.de.gz",
            "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
            29000,
        ),
        DataFile(
            "val.en",
            MULTI30K + "val.en.gz",
            "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
            1014,
        ),
        DataFile(
            "val.de",
            MULTI30K + "val.de.gz",
            "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
            1014,
        ),
        DataFile(
            "test2016.en",
            MULTI30K + "test_2016_flickr.en.gz",
            "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
            1000,
        ),
        DataFile(
            "test2016.de",
            MULTI30K + "test_2016_flickr.de.gz",
            "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
            1000,
        ),
    ],
    "wmt_sample": [
        DataFile(
            "train.en",
            OPENNMT + "src-train.txt",
            "db668a7d798bddf21d1ab8fcb403efbc724ba01b70472ad30d1e2049fd46e12b",
            10000,
        ),
        DataFile(
            "train.de",
            OPENNMT + "tgt-train.txt",
            "fe1f824a189baa650eec46269e66eef07f7304ba7572598ebbe61c55eeff7d01",
            10000,
        ),
    ],
}


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_bytes(path: pathlib.Path) -> bytes:
    """`path`'s bytes; an error reading them (permissions) is this module's, naming the file,
    and so a one-line message rather than a library's traceback."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(path)) from None


def read_source(file: DataFile, copies: pathlib.Path | None) -> tuple[bytes, str]:
    """The file's bytes as its source gives them (perhaps gzipped), and where they came from.

    Raises:
      FileNotFoundError: `copies` holds neither the file nor its source's name.
      OSError: the download failed (named with its URL).
    """
    if copies is not None:
        names = dict.fromkeys((file.source_name, file.name, file.name + ".gz"))
        for name in names:
            if (copies / name).is_file():
                return read_bytes(copies / name), str(copies / name)
        raise FileNotFoundError(f"--from={copies}: holds none of {', '.join(names)}")
    try:
        with urllib.request.urlopen(file.url, timeout=TIMEOUT) as response:
            return response.read(), file.url
    except (urllib.error.URLError, TimeoutError, OSError, http.client.HTTPException) as e:
        # HTTPException: a connection that ends before the length it announced (IncompleteRead).
        reason = getattr(e, "reason", None) or e
        raise OSError(
            f"could not download {file.url} ({reason}); offline, copy the files into a "
            "directory and give it as --from=DIR"
        ) from None


def checked(file: DataFile, data: bytes, origin: str) -> bytes:
    """The file's text: `data` decompressed when gzipped, whose sha256 must be the recorded one.

    Raises:
      ValueError: naming the file and where it came from, when it is damaged or another file.
    """
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:  # a bad header, a cut, a damaged block
            raise ValueError(
                f"{origin}: not a whole gzip file ({e}); nothing was written"
            ) from None
    found = sha256_of(data)
    if found != file.sha256:
        raise ValueError(
            f"{origin}: sha256 {found}, not the {file.sha256} of {file.name} "
            f"({file.lines} lines); a partial or other file is never used, and nothing was "
            "written"
        )
    return data


def fetch(
    name: str,
    directory: str | pathlib.Path,
    copies: str | pathlib.Path | None = None,
    log: Callable[[str], None] = print,
    datasets: dict[str, list[DataFile]] = DATASETS,
    force: bool = False,
) -> list[pathlib.Path]:
    """Writes dataset `name`'s files into `directory`, each checked; returns their paths.

    Every file already in `directory` is looked at before anything is downloaded or written: one
    with the recorded sha256 is kept; any other (edited, another dataset's, a symbolic link)
    stops the command with nothing written, unless `force`.

    Args:
      copies: a directory holding the files (their names here or at their source, gzipped
        or not) instead of downloading them.
      force: replace the files already there that are not the recorded ones, and symbolic links
        (the link itself, never the file it points to).

    Raises:
      ValueError: an unknown name, a file that is not the one recorded, or a file already in
        `directory` that is not the recorded one (without `force`).
    """
    if name not in datasets:
        raise ValueError(f"{name}: not a dataset here; one of {', '.join(sorted(datasets))}")
    directory = pathlib.Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"--dir={directory} is a file; give a directory")
    files = datasets[name]
    check_existing(name, files, directory, force, datasets)  # before the directory is made
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OSError(e.errno, e.strerror, f"--dir={directory}") from None
    with locked(directory, log):
        # Again, now that no other fetch writes here: one that held the lock may have written.
        kept = check_existing(name, files, directory, force, datasets)
        for stale in remove_stale_temporaries(directory, files):
            log(f"{stale}: removed, a temporary file that a killed run left")
        source = None if copies is None else pathlib.Path(copies)
        texts = {}
        for file in files:  # all read and checked before the first is written
            if file.name not in kept:
                data, origin = read_source(file, source)
                texts[file.name] = (checked(file, data, origin), origin)
        written = []
        for file in files:
            target = directory / file.name
            if file.name in kept:
                log(f"{target}: already there, checked")
            else:
                text, origin = texts[file.name]
                write_file(target, text)
                log(f"{target}: {file.lines} lines from {origin}, sha256 checked")
            written.append(target)
    return written


@contextlib.contextmanager
def locked(directory: pathlib.Path, log: Callable[[str], None]):
    """Holds an advisory lock on `directory` itself while a fetch checks and writes there, so
    that two fetches into one directory never interleave their files. The operating system
    drops it when the process ends, however it ends."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise OSError(e.errno, e.strerror, f"--dir={directory}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"--dir={directory}: another translate-data is writing there; waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: as before locks were taken
            pass
        yield
    finally:
        os.close(fd)


def check_existing(
    name: str,
    files: list[DataFile],
    directory: pathlib.Path,
    force: bool,
    datasets: dict[str, list[DataFile]],
) -> set[str]:
    """The names of `files` already in `directory` as recorded (to keep); refuses the others.

    A file there that is not the recorded one is someone's work, or another dataset's file (the
    datasets share names such as train.en): only `force` replaces it. A symbolic link is never
    written through, and only `force` replaces the link itself; one that points to the recorded
    file is kept. Something else (a directory, a FIFO) is never replaced.

    Raises:
      ValueError: saying why the first file is refused and naming the others, before
        anything is written.
    """
    kept, refused = set(), []  # refused: (name, why)
    for file in files:
        target = directory / file.name
        try:
            link = stat.S_ISLNK(os.lstat(target).st_mode)
        except (FileNotFoundError, NotADirectoryError):  # to be written
            continue
        try:
            regular = stat.S_ISREG(os.stat(target).st_mode)  # a link's file: only ever read
        except (FileNotFoundError, NotADirectoryError):  # a link to nothing
            regular = False
        if regular:
            found = sha256_of(read_bytes(target))
            if found == file.sha256:
                kept.add(file.name)
                continue
            whose = [
                f"{other}'s {f.name}"
                for other, others in sorted(datasets.items())
                for f in others
                if f.sha256 == found
            ]
            what = f"not {name}'s {file.name} (" + (
                f"it is {whose[0]})" if whose else f"sha256 {found[:16]}...)"
            )
        else:
            what = "not a regular file"
        why = None
        if link and not force:
            why = (
                f"a symbolic link, {what}, never written through: remove the link, or give "
                "--force to replace the link itself"
            )
        elif not link and not regular:
            why = f"{what}, never replaced: move it away"
        elif not link and not force:
            why = (
                f"already there and {what}, never replaced unasked: move it away (or give "
                "another --dir), or give --force to replace it"
            )
        if why:
            refused.append((file.name, f"{target}: {why}"))
    if refused:
        others = [other for other, _ in refused[1:]]
        likewise = f" ({', '.join(others)} likewise)" if others else ""
        raise ValueError(f"{refused[0][1]}{likewise}; nothing was written")
    return kept


# A temporary file of `write_file`: `.NAME.<8 hex digits>.tmp` (atomic.beside's names).
TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{8}\.tmp")


def write_file(target: pathlib.Path, data: bytes) -> None:
    """Replaces (or creates) `target` with `data`, whole or not at all, flushed to disk.

    Unlike atomic.write_bytes, a symbolic link at `target` is replaced itself, not written
    through: the data is written into a new temporary file beside it (created exclusively, never
    through a link) and renamed over the name. A file that was there lends the new one its
    permissions.
    """
    tmp = atomic.beside(target, "tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    except OSError as e:
        raise OSError(e.errno, e.strerror, str(target)) from None
    atomic.hold(fd)  # a lock, so that another run never takes it for a killed run's
    try:
        with os.fdopen(fd, "wb") as out:
            with contextlib.suppress(OSError):
                status = target.lstat()
                if stat.S_ISREG(status.st_mode):
                    os.chmod(out.fileno(), stat.S_IMODE(status.st_mode))
            out.write(data)
            out.flush()
            os.fsync(out.fileno())  # whole on disk before its name is, even after a crash
        os.replace(tmp, target)
    except BaseException as e:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(e, OSError) and e.filename is None and e.errno is not None:
            raise OSError(e.errno, e.strerror, str(target)) from None  # a full disk, named
        raise


def remove_stale_temporaries(directory: pathlib.Path, files: list[DataFile]) -> list[pathlib.Path]:
    """Deletes the temporary files of `write_file` for `files` that a killed run left in
    `directory` (unlocked and old: atomic.is_stale); returns them. Nothing else is touched."""
    names = {file.name for file in files}
    try:
        candidates = sorted(directory.iterdir())
    except OSError:  # not listable: writing there says why, naming the file
        return []
    removed = []
    for candidate in candidates:
        match = TEMPORARY.fullmatch(candidate.name)
        if match is None or match["name"] not in names:
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISREG(candidate.lstat().st_mode) and atomic.is_stale(candidate):
                candidate.unlink()
                removed.append(candidate)
    return removed
