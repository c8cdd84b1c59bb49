"""Searches kept on disk, traced, with the parameters they read: the text command's warm start.

The persistent compilation cache (translate/compilation.py) spares XLA's compile, but a command
still imports Flax and Orbax, builds the model, reads the checkpoint and traces and lowers the
search before that cache is even asked: about 4 s of a 5 s one-sentence `translate-text` on 2
cores. The text command keeps what those steps produce for the next command with the same
inputs (one "setup"):

  <cache>/searches/<setup>/params.npz   the parameters: every model's leaves, in order
  <cache>/searches/<setup>/setup.json   the steps they are and what loading them said
  <cache>/searches/<setup>/<search>.exported   one search per decoding settings and batch
                                        shape, traced and lowered (`jax.export`)
  <cache>/searches/<setup>/<search>.xla its executable, as XLA compiled it

A setup is named by a hash of everything its files depend on: each workdir's path, config.json
and vocab.model, and the name, size and modification time of every file under its checkpoints/
(a checkpoint saved, deleted or changed is another setup); the checkpoint choice (--step,
--average); this package's source code; the JAX version, the devices and the host's instruction
set, the JAX settings that change a program and XLA_FLAGS. A later command that finds its setup
complete reads the parameters and loads the executables: no Flax, no Orbax, no tracing, no
compiling. A search without its executable is compiled from the saved search, for real, and
its executable kept; a batch shape not yet there loads the model, traces that shape and keeps
it. Only an executable compiled in the process can be kept (on the CPU one that JAX read from
its own cache serializes without its code, JAX 0.10, and would fail when run), so the searches
are kept out of JAX's persistent cache (`SEARCH_OPTIONS`); were one read from there, each later
command would lower it and read it again. A search is traced without source lines in its
locations, so its saved form, and the name of its executable (a hash of that form and of the
machine), are the same for any checkout of the same code.

`<cache>` is the compilation cache's directory, and the searches go with it: the flag and the
environment variable that move the cache or turn it off do the same here. The setups are kept
under `MAX_BYTES` together, the least recently used deleted first. Files are written whole
(a temporary file renamed into place), so processes may share the directory; a saved search or
executable is checked against its digest before it is read, and anything unreadable is made
again as if it were not there, said once. Like JAX's own cache, an executable is code that runs
when loaded: the directory must be the user's own.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import pathlib
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from translate import atomic
from translate.decoding.search import search
from translate.workdir import Workdir

log = logging.getLogger("translate")

SUBDIR = "searches"
# The size all setups are kept under together; the least recently used go first.
MAX_BYTES = 2 * 2**30
# The first line of a saved search's file; the next holds the payload's SHA-256.
MAGIC = b"translate saved search 1\n"
# What a saved search is made from: the package's own source files.
PACKAGE = pathlib.Path(__file__).resolve().parents[1]
# The suffixes of a saved search (traced and lowered) and of its executable (compiled).
EXPORTED, EXECUTABLE = ".exported", ".xla"
# The folder, beside the setups, of the executables they share (named by program and machine).
EXECUTABLES = "executables"
# How many programs this process found in JAX's persistent cache, counted by the listener below.
CACHE_HITS = [0]


def _count_cache_hits(event: str, **kwargs: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        CACHE_HITS[0] += 1


jax.monitoring.register_event_listener(_count_cache_hits)


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
    """A workdir's identity as decoding reads it: its files' contents or sizes and times."""
    listing = []
    for root, dirs, files in os.walk(workdir.checkpoints):
        dirs.sort()
        for name in sorted(files):
            status = os.stat(os.path.join(root, name))
            relative = os.path.relpath(os.path.join(root, name), workdir.checkpoints)
            listing.append((relative, status.st_size, status.st_mtime_ns))
    return {
        "path": os.path.realpath(workdir.path),
        "config": hashlib.sha256(workdir.config.read_bytes()).hexdigest(),
        "vocab": hashlib.sha256(workdir.vocab.read_bytes()).hexdigest(),
        "checkpoints": listing,
    }


def setup_name(
    workdirs: Sequence[str], step: int | None, average: int, params: str = "auto"
) -> str:
    """The hash that names a setup (module docstring); raises OSError if a file is missing."""
    facts = {
        "workdirs": [files_digest(Workdir(path)) for path in workdirs],
        "step": step,
        "average": average,
        "params": params,
        "code": code_digest(),
        "machine": machine(),
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:32]


def search_name(args: tuple, shape: tuple[int, int]) -> str:
    """The file name (less its suffix) of a saved search: its settings (`search`'s arguments)
    and shape."""
    beam_size, alpha, max_extra_len, nbest, stop = args
    return (
        f"beam{beam_size}-alpha{alpha!r}-extra{max_extra_len}-{stop}"
        f"{'-nbest' if nbest else ''}-{shape[0]}x{shape[1]}"
    )


class Setup:
    """One setup's directory under the cache: its parameters and saved searches."""

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
    ) -> Setup | None:
        """The setup of these workdirs and choice, or None with the cache off or unusable."""
        if cache is None:
            return None
        try:
            return cls(cache, setup_name(workdirs, step, average, params))
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
        """(parameter leaves, steps per model, lines loading said), or None when not saved."""
        if not self.record.is_file():
            return None
        try:
            record = json.loads(self.record.read_text(encoding="utf-8"))
            with np.load(self.params) as arrays:
                leaves = [arrays[f"leaf{i}"] for i in range(record["leaves"])]
            os.utime(self.record)  # recently used: evicted last
            return leaves, record["steps"], record["said"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.say_once("the saved parameters", e)
            return None

    def save(self, leaves: Sequence[Any], steps: Sequence[list[int]], said: Sequence[str]):
        """Keeps the parameters (then the record that says they are whole); never raises."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with atomic.file(self.params) as tmp, open(tmp, "wb") as f:
                np.savez(f, **{f"leaf{i}": np.asarray(x) for i, x in enumerate(leaves)})
            record = {"leaves": len(leaves), "steps": [list(s) for s in steps], "said": list(said)}
            atomic.write_text(self.record, json.dumps(record) + "\n")
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
            atomic.write_bytes(path, MAGIC + digest + payload)
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
        `MAX_BYTES`; never this setup."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "a+b") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            entries = []  # (last used, bytes, path)
            for path in self.root.iterdir():
                if path.name.startswith(".") or not path.is_dir():
                    continue
                if path.name == EXECUTABLES:
                    for file in path.iterdir():
                        status = file.stat()
                        entries.append((status.st_mtime, status.st_size, file))
                    continue
                record = path / "setup.json"
                used = record.stat().st_mtime if record.exists() else 0.0
                size = sum(p.stat().st_size for p in path.iterdir() if p.is_file())
                entries.append((used, size, path))
            total = sum(size for _, size, _ in entries)
            for _, size, path in sorted(entries, key=lambda entry: entry[0]):
                if total <= MAX_BYTES or path == self.directory:
                    continue
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                total -= size


class SavedSearches:
    """`search` at one decoding setting for one ensemble, traced once per batch shape.

    Each shape's search is read from the setup when an earlier command saved it there, else it
    is traced here (the model is loaded then, once, through `load_model`) and saved. Either way
    the search runs as that saved program (`jax.export`): its executable kept beside the setups,
    or compiled from it and kept, so a warm command runs what the cold one ran. Calls take
    source batches [B, S] and give what `search` gives.

    Args:
      setup: where the searches are kept; None keeps nothing (traced in this process only).
      leaves: the ensemble's parameter leaves, in `jax.tree.leaves(params)` order.
      load_model: gives (graphdefs, params) of the ensemble whose leaves these are.
      args: `search`'s arguments after `src` (sentences.search_args).
    """

    def __init__(
        self,
        setup: Setup | None,
        leaves: Sequence[Any],
        load_model: Callable[[], tuple[tuple, tuple]],
        args: tuple,
    ):
        device = jax.local_devices()[0]
        self.leaves = [jax.device_put(x, device) for x in leaves]
        self.setup, self.load_model, self.args = setup, load_model, args
        self.programs: dict[tuple[int, int], Callable] = {}

    def compile(self, shape: tuple[int, int]) -> None:
        """Makes the program for batches of `shape` ready: its executable loaded, or compiled
        from the saved or newly traced search (XLA's persistent cache may hold it)."""
        if shape in self.programs:
            return
        name = search_name(self.args, shape) + EXPORTED
        found = self.setup.load_search(name) if self.setup is not None else None
        if found is not None:
            exported, payload = found
        else:
            exported = self._export(shape)
            payload = self.setup.save_search(name, exported) if self.setup is not None else None
        key = None
        if payload is not None:
            key = hashlib.sha256(payload + json.dumps(machine()).encode()).hexdigest()[:32]
            in_tree = jax.tree.structure(((list(range(len(self.leaves))), 0), {}))
            loaded = self.setup.load_executable(key, in_tree, jax.tree.structure((0, 0)))
            if loaded is not None:
                self.programs[shape] = loaded
                return
        spec = jax.ShapeDtypeStruct(shape, np.int32)
        hits = CACHE_HITS[0]
        lowered = jax.jit(exported.call).lower(self.leaves, spec)
        if key is None:  # nothing can be kept here: JAX's cache may hold it
            compiled = lowered.compile()
        else:
            with kept_out_of_jax_cache():
                compiled = lowered.compile(SEARCH_OPTIONS)
            # Only an executable compiled here is kept: on the CPU one that JAX read from its
            # cache serializes without its code (JAX 0.10), and would fail when run.
            if CACHE_HITS[0] == hits:
                self.setup.save_executable(key, compiled)
        self.programs[shape] = compiled

    def _export(self, shape: tuple[int, int]):
        graphdefs, params = self.load_model()
        treedef = jax.tree.structure(params)
        if treedef.num_leaves != len(self.leaves):
            raise RuntimeError("the loaded model's parameters are not the saved ones")
        args = self.args

        def run(leaves, src):
            return search(graphdefs, jax.tree.unflatten(treedef, leaves), src, *args)

        spec = jax.ShapeDtypeStruct(shape, np.int32)
        with source_lines_left_out():
            return jax.export.export(jax.jit(run))(self.leaves, spec)

    def __call__(self, src: np.ndarray):
        self.compile(src.shape)
        return self.programs[src.shape](self.leaves, src)


def said_lines() -> tuple[list[str], Callable[[str], None]]:
    """A list and a logger that writes each line to stderr and keeps it in the list."""
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        sys.stderr.write(line + "\n")

    return lines, say
