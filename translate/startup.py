"""Importing JAX for a command that starts often: without the file-path library it does not need.

`import jax` prefers `etils.epath` for its own file I/O (the persistent compilation cache's
directory) whenever it is installed, and Orbax installs it. Importing it costs about 0.1 s on a
2-core machine, most of it `unittest` and `unittest.mock` pulled in by `etils.epath.testing`:
7% of a one-sentence `translate-text` (BENCHMARKS.md, issue 38). JAX falls back to `pathlib`,
which serves every local directory, so the commands that read no Orbax checkpoint (translate-text)
import JAX through `import_jax()`: JAX is imported while `etils.epath` cannot be found, and then
the module can be imported again as usual by anyone who needs it (Orbax, for one).

A compilation cache that only `etils.epath` can reach (JAX_COMPILATION_CACHE_DIR=gs://...) keeps
JAX's usual import.
"""

from __future__ import annotations

import os
import sys

_EPATH = "etils.epath"


def wants_epath() -> bool:
    """Whether the user's own JAX cache setting names a non-local path (a URL)."""
    return "://" in os.environ.get("JAX_COMPILATION_CACHE_DIR", "")


def import_jax() -> None:
    """Imports JAX without `etils.epath` (see the module's docstring); a no-op once JAX is in."""
    if "jax" in sys.modules or _EPATH in sys.modules or wants_epath():
        return
    sys.modules[_EPATH] = None  # type: ignore[assignment]  # `import` raises ImportError
    try:
        import jax  # noqa: F401
    finally:
        del sys.modules[_EPATH]
