"""The public datasets the recipes and benchmarks read, fetched and checked file by file.

Each file is downloaded from the dataset's public repository at a pinned commit (or taken from
a directory of copies, offline), decompressed when it is gzipped, and checked against the sha256
recorded here before it is written, whole, into the target directory: a wrong, partial or
damaged file is refused with its name and never used. A file already there with the right
sha256 is kept as it is.

  multi30k     Multi30k task 1 (Elliott et al. 2016): train, val, test2016, raw text, English and
               German, from github.com/multi30k/dataset at a3d2e0d (the files have not changed
               there since 2018-01-17). For non-commercial research and education (its README).
  wmt_sample   10,000 Moses-tokenized WMT training pairs, OpenNMT-py's first "toy-ende" sample
               (github.com/OpenNMT/OpenNMT-py at 3518fba): the speed benchmarks' corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import pathlib
import urllib.error
import urllib.request
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
                return (copies / name).read_bytes(), str(copies / name)
        raise FileNotFoundError(f"--from={copies}: holds none of {', '.join(names)}")
    try:
        with urllib.request.urlopen(file.url, timeout=TIMEOUT) as response:
            return response.read(), file.url
    except (urllib.error.URLError, TimeoutError, OSError) as e:
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
        except (OSError, EOFError) as e:
            raise ValueError(
                f"{origin}: not a whole gzip file ({e}); nothing was written"
            ) from None
    found = sha256_of(data)
    if found != file.sha256:
        raise ValueError(
            f"{origin}: sha256 {found}, not the {file.sha256} of {file.name} "
            f"({file.lines} lines); a partial or other file is never used, and nothing was "
            "written for it"
        )
    return data


def fetch(
    name: str,
    directory: str | pathlib.Path,
    copies: str | pathlib.Path | None = None,
    log: Callable[[str], None] = print,
    datasets: dict[str, list[DataFile]] = DATASETS,
) -> list[pathlib.Path]:
    """Writes dataset `name`'s files into `directory`, each checked; returns their paths.

    Args:
      copies: a directory holding the files (their names here or at their source, gzipped
        or not) instead of downloading them.

    Raises:
      ValueError: an unknown name, or a file that is not the one recorded.
    """
    if name not in datasets:
        raise ValueError(f"{name}: not a dataset here; one of {', '.join(sorted(datasets))}")
    directory = pathlib.Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"--dir={directory} is a file; give a directory")
    directory.mkdir(parents=True, exist_ok=True)
    source = None if copies is None else pathlib.Path(copies)
    written = []
    for file in datasets[name]:
        target = directory / file.name
        if target.is_file() and sha256_of(target.read_bytes()) == file.sha256:
            log(f"{target}: already there, checked")
            written.append(target)
            continue
        data, origin = read_source(file, source)
        text = checked(file, data, origin)
        atomic.write_bytes(target, text, fsync=True)  # whole or absent, even if killed
        log(f"{target}: {file.lines} lines from {origin}, sha256 checked")
        written.append(target)
    return written
