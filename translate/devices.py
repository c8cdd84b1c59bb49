"""What the local devices are: the kernel and dtype that depend on them, their peak FLOP/s, the
host memory this process may still take, and the CPU's memory allocator kept for XLA's steps.

The attention kernel is chosen from plain facts about the device (`DeviceFacts`), so the
decision is a pure function that tests can feed any device, and a run never selects a kernel
its device cannot compile. The published peaks give model-FLOPs utilisation (MFU) in the
training log and the benchmark.
"""

from __future__ import annotations

import ctypes
import dataclasses
import importlib.metadata
import importlib.util
import os
import pathlib
import re
import resource
import sys
from typing import Any

import jax
import jax.numpy as jnp

from translate.config import Config

# A token budget per step from which a config is taken to be meant for GPUs: the paper's is
# 25,000; the CPU recipes use a few thousand.
GPU_SIZED_TOKENS_PER_BATCH = 10_000


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    """What the attention-kernel choice needs to know about the device it will run on."""

    # jax's platform name: "cpu", "gpu" (CUDA and ROCm alike) or "tpu".
    platform: str
    # For a GPU, the runtime under the platform: "cuda" or "rocm"; "" otherwise.
    runtime: str = ""
    # CUDA compute capability as (major, minor); None where there is none.
    compute_capability: tuple[int, int] | None = None
    # The device's name for messages, e.g. "NVIDIA H100 80GB HBM3".
    kind: str = ""

    @classmethod
    def of(cls, device: jax.Device | None = None) -> DeviceFacts:
        device = device or jax.local_devices()[0]
        runtime, capability = "", None
        if device.platform == "gpu":
            version = device.client.platform_version.lower()
            runtime = "cuda" if "cuda" in version else "rocm" if "rocm" in version else "unknown"
            text = getattr(device, "compute_capability", None)
            if runtime == "cuda" and text:
                capability = tuple(int(part) for part in str(text).split(".")[:2])
        return cls(device.platform, runtime, capability, device.device_kind)


def resolve_dtype(name: str) -> Any:
    """The jnp dtype of the config's `model.compute_dtype`; "auto" is bfloat16 on GPU/TPU.

    Asked here, once per run (translate/models/factory.py), never inside the model.
    """
    if name == "auto":
        return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16
    return jnp.dtype(name)


def cudnn_unfit_reason(dtype: Any, head_dim: int, facts: DeviceFacts) -> str | None:
    """Why cuDNN's fused attention cannot run here, or None when it can.

    It needs an NVIDIA GPU of compute capability 8.0 or later (Ampere on), bfloat16 or float16
    inputs, and a head size that is a multiple of 8 up to 128.
    """
    if facts.runtime != "cuda":
        return (
            f"it needs an NVIDIA GPU with CUDA, and this device is {facts.kind or facts.platform}"
        )
    if facts.compute_capability is None or facts.compute_capability < (8, 0):
        capability = ".".join(map(str, facts.compute_capability or ())) or "unknown"
        return f"it needs compute capability >= 8.0, and {facts.kind} has {capability}"
    if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
        return f"it needs bfloat16 or float16 compute, not {jnp.dtype(dtype).name}"
    if head_dim % 8 or head_dim > 128:
        return f"it needs a head size that is a multiple of 8 up to 128, not {head_dim}"
    return None


def resolve_attention(
    name: str, dtype: Any, head_dim: int, facts: DeviceFacts | None = None
) -> str:
    """The kernel of jax.nn.dot_product_attention for `model.attention` on this device.

    "auto" is cuDNN's fused kernel where it can run (`cudnn_unfit_reason`) and XLA's everywhere
    else, so the default never fails to compile; an explicit "cudnn" where it cannot run is a
    ValueError that names the device.
    """
    if name == "xla":
        return name
    reason = cudnn_unfit_reason(dtype, head_dim, facts or DeviceFacts.of())
    if name == "cudnn" and reason:
        raise ValueError(f"model.attention=cudnn cannot run here: {reason}; use auto or xla")
    return "xla" if reason else "cudnn"


def cpu_warning(config: Config, facts: DeviceFacts) -> str | None:
    """A warning for a config meant for GPUs that is about to train on a CPU, else None.

    JAX falls back to the CPU quietly when its CUDA plugin is missing or mismatched, and a
    WMT14 run would then start and crawl for weeks.
    """
    if facts.platform != "cpu":
        return None
    reasons = []
    if config.data.source == "tfds":
        reasons.append(f"it trains on {config.data.tfds_name}")
    if config.data.tokens_per_batch >= GPU_SIZED_TOKENS_PER_BATCH:
        reasons.append(f"data.tokens_per_batch is {config.data.tokens_per_batch:,}")
    if not reasons:
        return None
    return (
        f"this run is on the CPU, but its config is meant for GPUs ({'; '.join(reasons)}). "
        "If this machine has a GPU, JAX does not see it: `python -c 'import jax; "
        "print(jax.devices())'` should list it; see docs/gpus.md"
    )


# Dense tensor-core peaks (FLOP/s) that NVIDIA publishes, by JAX's device_kind and compute dtype.
# Datasheets print two figures per dtype, with and without 2:4 structured sparsity; these are
# the dense ones (half the sparse ones). The first pattern that matches the device name wins;
# a device or dtype not listed (every CPU, float32, the H100/H200 NVL) has no published peak.
# Sources:
# - H100 SXM5 ("NVIDIA H100 80GB HBM3") and PCIe: NVIDIA H100 Tensor Core GPU datasheet,
#   https://www.nvidia.com/en-us/data-center/h100/ (BF16/FP16 1,979 and 1,513 TFLOPS sparse).
# - H200 SXM: NVIDIA H200 datasheet, https://www.nvidia.com/en-us/data-center/h200/ (1,979).
# - A100 (SXM4 and PCIe, 40 and 80 GB): NVIDIA A100 datasheet,
#   https://www.nvidia.com/en-us/data-center/a100/ (BF16/FP16 312 dense, 624 sparse).
# - L4: https://www.nvidia.com/en-us/data-center/l4/ (BF16/FP16 242 TFLOPS sparse).
# - L40S: https://www.nvidia.com/en-us/data-center/l40s/ (BF16/FP16 362.05 dense, 733 sparse).
# - V100 SXM2, PCIe and V100S: NVIDIA V100 datasheet, https://www.nvidia.com/en-us/data-center/v100/
#   ("Tensor Performance" 125, 112 and 130 TFLOPS, FP16; Volta has no bfloat16 tensor cores).
# - GeForce RTX 4090: NVIDIA Ada Lovelace GPU architecture whitepaper, appendix table ("Peak
#   FP16/BF16 Tensor TFLOPS with FP32 Accumulate" 165.2 dense, 330.4 sparse).
TERA = 1e12
PUBLISHED_PEAKS = [
    (r"H100.*(HBM3|SXM)", {"bfloat16": 989.4 * TERA, "float16": 989.4 * TERA}),
    (r"H100 PCIe", {"bfloat16": 756.5 * TERA, "float16": 756.5 * TERA}),
    (r"H200(?!.*NVL)", {"bfloat16": 989.4 * TERA, "float16": 989.4 * TERA}),
    (r"A100", {"bfloat16": 312.0 * TERA, "float16": 312.0 * TERA}),
    (r"\bL4\b", {"bfloat16": 121.0 * TERA, "float16": 121.0 * TERA}),
    (r"L40S", {"bfloat16": 362.05 * TERA, "float16": 362.05 * TERA}),
    (r"V100S", {"float16": 130.0 * TERA}),
    (r"V100.*PCIE", {"float16": 112.0 * TERA}),
    (r"V100", {"float16": 125.0 * TERA}),
    (r"RTX 4090", {"bfloat16": 165.2 * TERA, "float16": 165.2 * TERA}),
]


def published_peak(device_kind: str, dtype_name: str) -> float | None:
    """The maker's dense peak FLOP/s of this device in this dtype, or None if not known."""
    for pattern, peaks in PUBLISHED_PEAKS:
        if re.search(pattern, device_kind, re.IGNORECASE):
            return peaks.get(dtype_name)
    return None


@dataclasses.dataclass(frozen=True)
class HostMemory:
    """The bytes of host memory this process may still take, and the limit that says so."""

    free: int
    # For messages: "MemAvailable", "RLIMIT_AS of 3.0 GB, 1.5 GB of it mapped", ...
    limit: str


# cgroup v1 writes "no limit" as the largest page-aligned int64: anything above this is none.
_NO_CGROUP_LIMIT = 1 << 62


def _gigabytes(num_bytes: int) -> str:
    return f"{num_bytes / 1e9:.1f} GB"


def _read(path: pathlib.Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _fields(text: str | None, unit: int = 1) -> dict[str, int]:
    """'name value' (or 'Name:  value kB') lines as {name: value * unit}; others skipped."""
    found = {}
    for line in (text or "").splitlines():
        parts = line.replace(":", " ").split()
        if len(parts) >= 2 and parts[1].isdigit():
            found[parts[0]] = int(parts[1]) * unit
    return found


def _cgroup_limits(root: pathlib.Path) -> list[tuple[int, str]]:
    """(free bytes, what) under each memory limit of the process's cgroup and its parents:
    cgroup v2's memory.max and v1's memory.limit_in_bytes, less the group's use without its
    reclaimable page cache (inactive_file, as `docker stats` counts it). A group's path that is
    not under the mount (inside a container) leaves the mount's root, the container's group."""
    found = []
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and not parts[1]:
            mount, files, cache = root / "sys/fs/cgroup", ("memory.max", "memory.current"), ""
        elif "memory" in parts[1].split(","):
            mount = root / "sys/fs/cgroup/memory"
            files, cache = ("memory.limit_in_bytes", "memory.usage_in_bytes"), "total_"
        else:
            continue
        group = mount / parts[2].lstrip("/")
        for path in [group, *group.parents]:
            if path == mount.parent:
                break
            limit, used = (_read(path / name) for name in files)
            if limit is None or not limit.strip().isdigit() or int(limit) >= _NO_CGROUP_LIMIT:
                continue
            use = int(used) if used and used.strip().isdigit() else 0
            use -= _fields(_read(path / "memory.stat")).get(cache + "inactive_file", 0)
            free = int(limit) - max(use, 0)
            found.append((free, f"cgroup {files[0]} of {_gigabytes(int(limit))} ({path})"))
    return found


def host_memory(root: str | os.PathLike = "/") -> HostMemory:
    """The host memory this process may still take: the least of Linux's MemAvailable (else the
    machine's memory), what the process's RLIMIT_AS and RLIMIT_DATA leave (less what it has mapped:
    VmSize, VmData), and what its cgroups' limits leave (v1 and v2; `_cgroup_limits`).

    Under `prlimit --as=3G` MemAvailable alone read 12.6 GB free, and a batch sized by it ended
    in XLA's RESOURCE_EXHAUSTED; the limit is what a refusal must name.

    Args:
      root: where /proc and /sys are found (tests give a tree of their own).
    """
    root = pathlib.Path(root)
    found = []
    meminfo = _fields(_read(root / "proc/meminfo"), 1024)
    if "MemAvailable" in meminfo:
        found.append((meminfo["MemAvailable"], "MemAvailable"))
    else:  # no /proc (macOS): all of the machine's memory
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            found.append((total, f"the machine's {_gigabytes(total)}"))
        except (OSError, ValueError):
            pass
    status = _fields(_read(root / "proc/self/status"), 1024)
    for name, which, mapped in (
        ("RLIMIT_AS", resource.RLIMIT_AS, "VmSize"),
        ("RLIMIT_DATA", resource.RLIMIT_DATA, "VmData"),
    ):
        soft = resource.getrlimit(which)[0]
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        used = status.get(mapped, 0)
        what = f"{name} of {_gigabytes(soft)}, {_gigabytes(used)} of it mapped ({mapped})"
        found.append((soft - used, what))
    found += _cgroup_limits(root)
    if not found:
        return HostMemory(0, "no memory found in /proc")
    free, limit = min(found, key=lambda item: item[0])
    return HostMemory(max(free, 0), limit)


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
# Environment variables by which a user sets glibc's malloc: then `keep_freed_memory` does not.
_MALLOC_SETTINGS = (
    "GLIBC_TUNABLES",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
)


def cpu_only() -> bool:
    """Whether JAX will run on the CPU alone: `JAX_PLATFORMS=cpu`, or no GPU or TPU plugin
    installed. On an accelerator, the steps' buffers are device memory, not malloc's."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if platforms:
        return platforms.strip().lower() == "cpu"
    plugins = importlib.metadata.entry_points(group="jax_plugins")
    return not plugins and importlib.util.find_spec("libtpu") is None


def keep_freed_memory() -> bool:
    """Asks glibc's malloc to keep the memory XLA frees for the next step; whether it did.

    On the CPU, each call of a compiled step allocates its buffers (XLA assigns 347 MiB to
    configs/multi30k.py's train step) and frees them at the end. By default glibc gives such
    blocks of worker threads back to the kernel at once (mmap and munmap, or a thread arena's
    heap shrunk), so the next step faults every page in again: 80,000 page faults a step, a
    quarter of the process's CPU time spent in the kernel. With one arena (the main heap, which
    can grow), blocks up to 2 GiB served from it and not trimmed, the step ran 1.2x as fast
    (BENCHMARKS.md). The results are the same: only where memory comes from changes.

    Done only on glibc, where JAX can run on nothing but the CPU (`cpu_only`), and not when the
    environment sets malloc itself (`_MALLOC_SETTINGS`).
    """
    if not sys.platform.startswith("linux") or any(v in os.environ for v in _MALLOC_SETTINGS):
        return False
    if not cpu_only():
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    most = 2**31 - 1  # mallopt takes an int
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, most), (_M_TRIM_THRESHOLD, most))
    return all([mallopt(param, value) == 1 for param, value in settings])
