"""The store of saved searches, beside JAX's persistent compilation cache (compilation.py).

Under `<cache>/searches/` the text command keeps what comes before XLA's compile: the
parameters a command read and the searches it traced, per "setup" (a `SavedEnsemble`: the
workdirs' files, the checkpoint choice, this package's code and the machine, hashed), and their
executables. translate/decoding/saved_searches.py says how the searches use this store.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from translate import atomic
from translate.workdir import Workdir

log = logging.getLogger("translate")

SUBDIR = "searches"
# The file that marks SUBDIR as this store's: a directory of that name without it is the user's,
# and is neither used nor cleaned (`SavedEnsemble.find`, `SavedEnsemble.evict`).
STORE_MARKER = ".translate-saved-searches"
# The size all setups are kept under together; the least recently used go first.
PROGRAMS_MAX_BYTES = 2 * 2**30
# The platforms whose text command keeps saved searches. On an H200 (2026-11-28, JAX 0.11.2,
# cuDNN attention) translate-text over test2016 crashed with a segmentation fault in the call
# of a saved search's program, in 2 of 2 warm runs (executables read back) and 1 of 3 cold ones,
# each time with 896 of 1,000 sentences done, while translate-evaluate's traced searches never
# did. Until that is understood, a GPU decodes as evaluation does, through JAX's persistent
# cache (its warm run traces the searches again but compiles nothing).
SAVED_SEARCH_PLATFORMS = ("cpu",)
# The first line of a saved search's file; the next holds the payload's SHA-256.
MAGIC = b"translate saved search 1\n"
# What a saved search is made from: the package's own source files.
PACKAGE = pathlib.Path(__file__).resolve().parent
# The suffixes of a saved search (traced and lowered) and of its executable (compiled).
EXPORTED, EXECUTABLE = ".exported", ".xla"
# The folder, beside the setups, of the executables they share (named by program and machine).
EXECUTABLES = "executables"

# A search that is kept as an executable is compiled for real, never read from JAX's persistent
# cache: one read from there cannot be kept (`SavedSearches.compile`), so every later command
# would lower it and read it from there again (about 1.4 s of a 3 s one-sentence command). So
# such searches are compiled with an XLA option at its default value (the code is the same),
# which keys them apart from the entries other commands or earlier versions left, and are not
# written to JAX's cache (`kept_out_of_jax_cache`): the executables folder is their cache.
SEARCH_OPTIONS = {"xla_embed_ir_in_executable": False}
# The JAX setting below which a compile is not written to its persistent cache, in seconds.
MIN_COMPILE_TIME = "jax_persistent_cache_min_compile_time_secs"
# The JAX setting that writes Python source lines into a program's locations.
LOCATIONS_LIMIT = "jax_traceback_in_locations_limit"


@contextlib.contextmanager
def source_lines_left_out():
    """Programs traced within carry the operations' names but not the source files and lines
    they came from: a saved search, and the name of its executable, are then the same for any
    checkout of the same code and for edits that leave the program as it was. (JAX's own cache
    keys leave the locations out too.)"""
    if not hasattr(jax.config, LOCATIONS_LIMIT):  # a JAX without the setting: kept as it is
        yield
        return
    before = getattr(jax.config, LOCATIONS_LIMIT)
    jax.config.update(LOCATIONS_LIMIT, 0)
    try:
        yield
    finally:
        jax.config.update(LOCATIONS_LIMIT, before)


@contextlib.contextmanager
def kept_out_of_jax_cache():
    """Programs compiled within are not written to JAX's persistent cache."""
    before = getattr(jax.config, MIN_COMPILE_TIME)
    jax.config.update(MIN_COMPILE_TIME, float("inf"))
    try:
        yield
    finally:
        jax.config.update(MIN_COMPILE_TIME, before)


def code_digest() -> str:
    """SHA-256 over this package's Python sources: a change to any of them is a new setup."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


@functools.cache
def machine() -> dict[str, Any]:
    """What makes a program compiled here differ from one compiled elsewhere, or run wrong."""
    device = jax.local_devices()[0]
    facts: dict[str, Any] = {
        "jax": jax.__version__,
        "jaxlib": importlib.metadata.version("jaxlib"),
        "platform": device.platform,
        "device_kind": device.device_kind,
        "local_devices": jax.local_device_count(),
        "x64": bool(jax.config.jax_enable_x64),
        "matmul_precision": str(jax.config.jax_default_matmul_precision),
        "XLA_FLAGS": os.environ.get("XLA_FLAGS", ""),
    }
    # XLA compiles for the host's instruction set: a cache shared between machines (a home
    # directory on a network disk) must not run one machine's code on another.
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        facts["cpu_flags"] = next((line for line in f if line.startswith("flags")), "")
    return facts


def files_digest(workdir: Workdir) -> dict[str, Any]:
    """A workdir's identity as decoding reads it: its files' contents or identities.

    Every file under checkpoints/ is named by its path there, the file it resolves to (a step
    that is a link to another run's is that run's), its size and modification time, and its
    inode and change time: a file replaced in place, or whose permissions changed (an unreadable
    step made readable again), is another setup.
    """
    listing = []
    for root, dirs, files in os.walk(workdir.checkpoints, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            status = os.stat(path)
            identity = (status.st_size, status.st_mtime_ns, status.st_ino, status.st_ctime_ns)
            relative = os.path.relpath(path, workdir.checkpoints)
            listing.append((relative, os.path.realpath(path), *identity))
    return {
        "path": os.path.realpath(workdir.path),
        "config": hashlib.sha256(workdir.config.read_bytes()).hexdigest(),
        "vocab": [
            hashlib.sha256(path.read_bytes()).hexdigest() for path in workdir.tokenizer_files()
        ],
        "checkpoints": listing,
    }


def setup_name(
    workdirs: Sequence[str],
    step: int | None,
    average: int,
    params: str = "auto",
    matmul_dtype: str = "",
) -> str:
    """The hash that names a setup (module docstring); raises OSError if a file is missing."""
    facts = {
        "workdirs": [files_digest(Workdir(path)) for path in workdirs],
        "step": step,
        "average": average,
        "params": params,
        "matmul_dtype": matmul_dtype,
        "code": code_digest(),
        "machine": machine(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def claim_store(root: pathlib.Path) -> bool:
    """Whether `root` is (or now becomes) the store's own: it holds the marker, or did not
    exist, was empty or held only what the store writes (setups, executables; an earlier
    version's store), and is marked now. False for a directory of someone else's."""
    marker = root / STORE_MARKER
    try:
        if marker.is_file():
            return True
        # Unmarked: empty, or holding only what the store writes (an earlier version's).
        ours = {".lock", EXECUTABLES}
        if root.exists() and not all(
            p.name in ours or (p.is_dir() and is_setup_name(p.name)) for p in root.iterdir()
        ):
            return False
        root.mkdir(parents=True, exist_ok=True)
        marker.write_text("Saved searches of translate (translate/search_store.py).\n")
        return True
    except OSError:
        return False


def is_setup_name(name: str) -> bool:
    """Whether `name` is one `setup_name` gives: 32 lowercase hexadecimal digits."""
    return len(name) == 32 and all(c in "0123456789abcdef" for c in name)


class SavedEnsemble:
    """An ensemble kept under the cache, one setup's directory: the parameters a command read
    for these workdirs and this checkpoint choice, and the searches it traced with them."""

    def __init__(self, root: str | os.PathLike, name: str):
        self.root = pathlib.Path(root) / SUBDIR
        self.directory = self.root / name
        self.params = self.directory / "params.npz"
        self.record = self.directory / "setup.json"
        # Executables depend on the program alone, not on the parameters: setups share them.
        self.executables = self.root / EXECUTABLES
        self._said = False

    @classmethod
    def find(
        cls,
        cache: str | None,
        workdirs: Sequence[str],
        step: int | None,
        average: int,
        params: str = "auto",
        matmul_dtype: str = "",
    ) -> SavedEnsemble | None:
        """The setup of these workdirs and choice, or None with the cache off or unusable, or
        on a platform where saved searches are not used (`SAVED_SEARCH_PLATFORMS`)."""
        if cache is None:
            return None
        if jax.default_backend() not in SAVED_SEARCH_PLATFORMS:
            log.debug("no saved searches on %s: JAX's cache alone", jax.default_backend())
            return None
        root = pathlib.Path(cache) / SUBDIR
        if not claim_store(root):
            log.warning(
                "WARNING: not keeping saved searches in %s: it holds files that translate did "
                "not write (no %s); move them, or give another --compilation_cache",
                root,
                STORE_MARKER,
            )
            return None
        try:
            return cls(cache, setup_name(workdirs, step, average, params, matmul_dtype))
        except OSError as e:  # a file of a workdir is missing: loading says which
            log.debug("no saved searches: %s", e)
            return None

    def say_once(self, what: str, error: BaseException) -> None:
        if not self._said:
            self._said = True
            log.warning(
                "WARNING: %s in %s could not be used (%s: %s); it is made again, and this is "
                "said once",
                what,
                self.directory,
                type(error).__name__,
                error,
            )

    def load(self) -> tuple[list[np.ndarray], list[list[int]], list[str]] | None:
        """(parameter leaves, steps per model, lines loading said), or None when not saved or
        unreadable for any reason (then it is made again, said once)."""
        if not self.record.is_file():
            return None
        try:
            record = json.loads(self.record.read_text(encoding="utf-8"))
            with np.load(self.params) as arrays:
                if sorted(arrays.files) != sorted(f"leaf{i}" for i in range(record["leaves"])):
                    raise ValueError("params.npz holds other leaves than setup.json counts")
                leaves = [arrays[f"leaf{i}"] for i in range(record["leaves"])]
            os.utime(self.record)  # recently used: evicted last
            return leaves, record["steps"], record["said"]
        except Exception as e:  # noqa: BLE001 - whatever is wrong with it, it is made again
            self.say_once("the saved parameters", e)
            return None

    def save(self, leaves: Sequence[Any], steps: Sequence[list[int]], said: Sequence[str]):
        """Keeps the parameters (then the record that says they are whole); never raises.

        Both are flushed to disk before they are renamed into place: a crash leaves them whole
        or absent."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with atomic.file(self.params, fsync=True) as tmp, open(tmp, "wb") as f:
                np.savez(f, **{f"leaf{i}": np.asarray(x) for i, x in enumerate(leaves)})
            record = {"leaves": len(leaves), "steps": [list(s) for s in steps], "said": list(said)}
            atomic.write_text(self.record, json.dumps(record) + "\n", fsync=True)
            self.evict()
        except OSError as e:
            self.say_once("the directory for saved searches", e)

    def read(self, path: pathlib.Path, what: str) -> bytes | None:
        """The payload of the file `path` if it is there and whole, else None."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            self.say_once(what, e)
            return None
        head, digest = data[: len(MAGIC)], data[len(MAGIC) : len(MAGIC) + 65]
        payload = data[len(MAGIC) + 65 :]
        if head != MAGIC or digest != hashlib.sha256(payload).hexdigest().encode() + b"\n":
            self.say_once(what, ValueError(f"{path.name} is not whole"))
            return None
        return payload

    def write(self, path: pathlib.Path, payload: bytes) -> None:
        """Keeps `payload` as the file `path`, with the digest `read` checks; never raises."""
        digest = hashlib.sha256(payload).hexdigest().encode() + b"\n"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # A file made unreadable would lend its mode to its replacement (`AtomicFile`),
            # which would then be made again on every run: the new file gets the default mode.
            path.unlink(missing_ok=True)
            atomic.write_bytes(path, MAGIC + digest + payload, fsync=True)
        except OSError as e:
            self.say_once("the directory for saved searches", e)

    def load_search(self, name: str):
        """(the search saved under `name`, a `jax.export.Exported`, and its bytes), or None."""
        payload = self.read(self.directory / name, "a saved search")
        try:
            return None if payload is None else (jax.export.deserialize(payload), payload)
        except Exception as e:  # noqa: BLE001 - whatever the reader says, trace it again
            self.say_once("a saved search", e)
            return None

    def save_search(self, name: str, exported) -> bytes | None:
        """Keeps a search (`jax.export.Exported`) and returns its bytes; never raises."""
        try:
            payload = bytes(exported.serialize())
        except Exception as e:  # noqa: BLE001 - cannot be serialized here: not kept
            log.debug("a search cannot be kept: %s", e)
            return None
        self.write(self.directory / name, payload)
        return payload

    def load_executable(self, key: str, in_tree, out_tree):
        """The executable kept under `key`, loaded for the first local device, or None."""
        path = self.executables / f"{key}{EXECUTABLE}"
        payload = self.read(path, "a saved executable")
        if payload is None:
            return None
        from jax.experimental import serialize_executable

        try:
            loaded = serialize_executable.deserialize_and_load(
                payload, in_tree, out_tree, execution_devices=jax.local_devices()[:1]
            )
        except Exception as e:  # noqa: BLE001 - whatever the loader says, compile it again
            self.say_once("a saved executable", e)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: evicted last
        return loaded

    def save_executable(self, key: str, compiled) -> None:
        """Keeps a compiled search (`jax.stages.Compiled`) under `key`; never raises."""
        from jax.experimental import serialize_executable

        try:
            payload, _, _ = serialize_executable.serialize(compiled)
        except Exception as e:  # noqa: BLE001 - a backend that cannot serialize: not kept
            log.debug("an executable cannot be kept: %s", e)
            return
        self.write(self.executables / f"{key}{EXECUTABLE}", payload)

    def evict(self) -> None:
        """Deletes the least recently used setups and executables until all fit in
        `PROGRAMS_MAX_BYTES`; never this setup."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = []  # (last used, bytes, path): only what this store made
            for path in self.root.iterdir():
                if path.name == EXECUTABLES and path.is_dir():
                    for file in path.iterdir():
                        if file.is_file() and file.suffix == EXECUTABLE:
                            status = file.stat()
                            entries.append((status.st_mtime, status.st_size, file))
                    continue
                record = path / "setup.json"
                if not (path.is_dir() and not path.is_symlink() and is_setup_name(path.name)):
                    continue
                used = record.stat().st_mtime if record.exists() else 0.0
                size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
                entries.append((used, size, path))
            total = sum(size for _, size, _ in entries)
            for _, size, path in sorted(entries, key=lambda entry: entry[0]):
                if total <= PROGRAMS_MAX_BYTES or path == self.directory:
                    continue
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                total -= size
