"""How much memory a decoding batch may take, and about how much it will.

`memory_bound` is what one batch may take of the device's free memory (`device_memory`), and
`search_bytes` what a search's batch takes, about (forced.py's `forced_bytes` is the same for
forced decoding): the commands refuse a --batch_size over the bound before they decode, and
`over_bound` says why in words that name the limit.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from translate.decoding.settings import DecodeSettings
from translate.devices import HostMemory, host_memory, resolve_dtype

# The share of the device's free memory that one batch's estimated need may take
# (`memory_bound`); the rest is for what the estimates leave out. They are upper estimates
# (`search_bytes`, forced.forced_bytes).
MEMORY_SHARE = 0.8


def device_memory() -> HostMemory:
    """The memory free for decoding on the device that runs it, and the limit that says so: on
    an accelerator what JAX may still allocate there (its `bytes_limit` less its
    `bytes_in_use`), on the CPU what the process may still take on the host
    (`devices.host_memory`: MemAvailable, RLIMIT_AS and RLIMIT_DATA, cgroup v1 and v2)."""
    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:  # a backend without memory statistics
        stats = None
    if stats and stats.get("bytes_limit"):
        limit, used = int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0))
        return HostMemory(limit - used, f"JAX's bytes_limit of {size_text(limit)}")
    return host_memory()


def memory_bound() -> int:
    """The most memory (bytes) one batch may be estimated to need: MEMORY_SHARE of what the
    device has free (`device_memory`)."""
    return int(device_memory().free * MEMORY_SHARE)


def size_text(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:.1f} GB" if num_bytes >= 1e9 else f"{num_bytes / 1e6:.0f} MB"


def over_bound(need: int) -> str:
    """The words for a need over `memory_bound`, naming the limit it is under: "about 13.1 GB
    of memory, more than the 2.4 GB a batch may take (80% of the 3.0 GB free on this cpu, by
    RLIMIT_AS of 4.0 GB, 1.0 GB of it mapped (VmSize))"."""
    free, platform = device_memory(), jax.local_devices()[0].platform
    return (
        f"about {size_text(need)} of memory, more than the {size_text(free.free * MEMORY_SHARE)}"
        f" a batch may take ({MEMORY_SHARE:.0%} of the {size_text(free.free)} free on this "
        f"{platform}, by {free.limit})"
    )


def search_bytes(
    models: Sequence, vocab_size: int, settings: DecodeSettings, rows: int, src_width: int
) -> int:
    """About the most memory (bytes) the search of one batch of `rows` sentences of
    `src_width` source tokens takes: for each hypothesis and model, the float32 keys and values
    of every layer over the output's S + max_extra_len + 1 steps and the source's S (the
    cross-attention's, or a decoder-only model's prefix), in the compute dtype, 2.5 times over
    as XLA holds them (the cache is copied as it grows and as the beam reorders it), and its
    float32 logits a few times.

    XLA's own memory analysis of the compiled search on the CPU stayed within this for greedy
    search and beams of 4 and 8, models of 2 to 6 layers and 200 to 8,000 pieces, and batches
    of 32 to 16,384 sentences: the cache is what grows with the batch.

    Args:
      models: the ensemble's model configs (`config.model`).
    """
    width = settings.num_candidates if settings.sampling else settings.beam_size
    steps = src_width + settings.max_extra_len + 1
    per_hypothesis = sum(
        compute_bytes(model) * 5 * model.num_layers * model.d_model * (steps + src_width)
        + 4 * 8 * vocab_size
        for model in models
    )
    return rows * width * per_hypothesis


def compute_bytes(model) -> int:
    """The bytes of one number in the model's compute dtype on this device (its activations,
    its cache; the logits are float32 whatever it is)."""
    return jnp.dtype(resolve_dtype(model.compute_dtype)).itemsize
