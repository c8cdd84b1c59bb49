"""A persistent compilation cache for every command: XLA compiles a program once per machine.

The commands that compile (translate-train with its dev evaluations, translate-evaluate,
translate-text, translate-sample) keep what XLA compiles in a directory on disk, JAX's
persistent compilation cache, so that the next command building the same program (the same
model shapes, batch shapes and settings) loads it in a fraction of a second instead of
compiling it again. Which directory:

  --compilation_cache=DIR | off          the flag of every such command, for that command;
  TRANSLATE_COMPILATION_CACHE=DIR | off  the environment, for every command;
  otherwise the platform's per-user cache directory: $XDG_CACHE_HOME/translate/xla
  (~/.cache/translate/xla) on Linux, ~/Library/Caches/translate/xla on macOS.

A user's own JAX setting wins: with JAX_COMPILATION_CACHE_DIR set, or jax_compilation_cache_dir
configured before the command starts, nothing here changes it. The cache holds at most
`MAX_BYTES` (the programs used least recently go first) and may be deleted at any time. Several
processes may share it: reads and writes take a file lock. A directory that cannot be made or
written is not used, and a cache entry that cannot be read or written is compiled as before;
either way the command goes on and says once why.

Beside JAX's cache, under `<cache>/searches/`, the text command keeps what comes before XLA's
compile (translate/search_store.py).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import pathlib
import sys
import tempfile
import warnings
from typing import Any

import jax

log = logging.getLogger("translate")

ENV = "TRANSLATE_COMPILATION_CACHE"
# The values of the flag and of ENV that turn the cache off.
OFF = ("off", "none", "false", "0")
# The size the cache is kept under; least recently used programs are deleted past it.
MAX_BYTES = 2 * 2**30
# JAX's warnings for an entry it could not read or write; the first is said once, in our words.
_ENTRY_ERROR = "persistent compilation cache entry"

FLAG_HELP = (
    "Where compiled programs are kept for the next command: a directory, or off. Default: "
    f"${ENV}, else the per-user cache directory (~/.cache/translate/xla); a "
    "JAX_COMPILATION_CACHE_DIR of your own is left alone."
)


def default_cache_dir() -> pathlib.Path:
    """The platform's per-user cache directory for this project's compiled programs."""
    if sys.platform == "darwin":
        return pathlib.Path.home() / "Library" / "Caches" / "translate" / "xla"
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "translate" / "xla"


def users_own_setting() -> str | None:
    """The cache directory the user gave JAX itself, if any."""
    return os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir


def chosen_dir(flag: str = "") -> pathlib.Path | None:
    """The directory the flag, else the environment, else the platform's convention names;
    None when either says off."""
    for value in (flag, os.environ.get(ENV, "")):
        if value.strip():
            return None if value.strip().lower() in OFF else pathlib.Path(value).expanduser()
    return default_cache_dir()


def unusable_reason(directory: pathlib.Path) -> str | None:
    """Why `directory` cannot hold the cache (it cannot be made, or written), or None."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-"):
            pass
    except OSError as e:
        return f"{e.strerror or type(e).__name__}: {e.filename or directory}"
    return None


def use_persistent_cache(flag: str = "") -> str | None:
    """Points JAX at the persistent cache this command should use; returns its directory.

    Call it before anything is compiled. Returns None, changing nothing, where the user's own
    JAX setting applies (then that directory is returned), the cache is off, or the directory
    cannot be used (said once as a warning).
    """
    own = users_own_setting()
    if own:
        return str(own)
    directory = chosen_dir(flag)
    if directory is None:
        return None
    if reason := unusable_reason(directory):
        log.warning("WARNING: not keeping compiled programs in %s (%s)", directory, reason)
        return None
    jax.config.update("jax_compilation_cache_dir", str(directory))
    # Every program: a command compiles a handful, and the small ones add up to seconds.
    settings = {
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": -1,
    }
    if importlib.util.find_spec("filelock") is not None:  # the bound needs JAX's file lock
        settings["jax_compilation_cache_max_size"] = MAX_BYTES
    for name, value in settings.items():
        if hasattr(jax.config, name):  # a JAX without the setting keeps its default
            jax.config.update(name, value)
    say_entry_errors_once(directory)
    return str(directory)


def say_entry_errors_once(directory: pathlib.Path) -> None:
    """Replaces JAX's warning for each cache entry it could not read or write by one line."""
    previous = warnings.showwarning
    said = False

    def show(message: Any, category: Any, filename: str, lineno: int, *args: Any) -> None:
        nonlocal said
        text = str(message)
        if _ENTRY_ERROR not in text:
            previous(message, category, filename, lineno, *args)
            return
        if not said:
            said = True
            cause = text.splitlines()[-1] if text.strip() else text
            log.warning(
                "WARNING: the compilation cache in %s could not be used for a program (%s); it "
                "is compiled as usual, and this is said once",
                directory,
                cause.strip(),
            )

    warnings.showwarning = show
    # Every such warning reaches `show` (which says the first), not only each text's first.
    warnings.filterwarnings("always", message=f".*{_ENTRY_ERROR}.*")


# How many programs this process found in JAX's persistent cache, counted by the listener below.
CACHE_HITS = [0]
_COUNTING = [False]


def _count_cache_hits(event: str, **kwargs: Any) -> None:
    if event == "/jax/compilation_cache/cache_hits":
        CACHE_HITS[0] += 1


def cache_hits() -> int:
    """How many programs this process has found in JAX's persistent cache since the first call
    (which starts counting: no listener is registered at import)."""
    if not _COUNTING[0]:
        _COUNTING[0] = True
        jax.monitoring.register_event_listener(_count_cache_hits)
    return CACHE_HITS[0]
