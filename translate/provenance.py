"""What produced a result: the checkout's git commit and the versions of the packages used.

Standard library only, so that a script can record it before it knows whether JAX and the rest
import at all (scripts/gpu_check.py on a bare machine).
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import platform
import subprocess
from typing import Any


def git_commit() -> dict[str, Any] | None:
    """The commit of the checkout this package runs from, and whether files differ from it.

    None when the package is not a git checkout's (an installed wheel) or git is missing.
    """
    checkout = pathlib.Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30
        )
        if done.returncode != 0:
            raise OSError(done.stderr)
        return done.stdout.strip()

    try:
        if pathlib.Path(git("rev-parse", "--show-toplevel")).resolve() != checkout:
            return None
        return {
            "commit": git("rev-parse", "HEAD"),
            "modified": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    except (OSError, subprocess.SubprocessError):
        return None


# The distributions whose versions can change a score or a translation.
PACKAGES = (
    "translate",
    "jax",
    "jaxlib",
    "flax",
    "optax",
    "orbax-checkpoint",
    "numpy",
    "sentencepiece",
    "sacrebleu",
    "sacremoses",
)


def package_versions() -> dict[str, str | None]:
    """Versions of `PACKAGES` (None when one is not installed as a distribution) and Python."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def host() -> dict[str, Any]:
    """The machine's processor and how many CPUs this process may use.

    A CPU run's numbers depend on them: XLA compiles for the processor's instruction set, so
    another processor (or another thread count) rounds differently and trains another model
    from the same seed, and it sets the speed. `cpu` is Linux's model name (/proc/cpuinfo),
    else what `platform.processor()` says, else the architecture.
    """
    name = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            line = next((line for line in f if line.startswith("model name")), "")
        name = line.partition(":")[2].strip()
    except OSError:
        pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 0
    return {"cpu": name or platform.processor() or platform.machine(), "cpus": cpus}
