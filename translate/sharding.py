"""Hosts and devices: joining a multi-host job, the mesh, shardings of parameters and batches."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

if TYPE_CHECKING:  # for annotations only: data/batching.py builds on this module, not the reverse
    from translate.data.batching import Batch


DATA_AXIS = "data"


def initialize_distributed() -> None:
    """Joins a multi-host job when the environment describes one (SLURM, or JAX's own variables).

    Under SLURM, JAX reads everything from SLURM's variables (one process per GPU). Elsewhere,
    start one process per host with `JAX_COORDINATOR_ADDRESS=host:port` (process 0's host),
    `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`. On one host with no such environment this does
    nothing, so the same command runs anywhere.
    """
    in_slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1
    explicit = "JAX_COORDINATOR_ADDRESS" in os.environ
    if in_slurm or explicit:
        # JAX reads JAX_COORDINATOR_ADDRESS itself, but not the process count and id.
        counts = {
            arg: int(os.environ[name])
            for arg, name in (
                ("num_processes", "JAX_NUM_PROCESSES"),
                ("process_id", "JAX_PROCESS_ID"),
            )
            if name in os.environ
        }
        jax.distributed.initialize(**counts)


def sync_processes(name: str) -> None:
    """Waits until every process of a multi-host job reaches the barrier `name`."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


T = TypeVar("T")


def on_process_zero_first(fn: Callable[[], T]) -> T:
    """Runs `fn` on process 0, then on the other processes once it has finished.

    For steps that write files to a shared workdir the first time and read them later (the
    vocabulary, generated data): process 0 writes them, the others find and read them.
    """
    primary = jax.process_index() == 0
    result = fn() if primary else None
    sync_processes("process 0 done: " + getattr(fn, "__qualname__", "fn"))
    return result if primary else fn()


def make_mesh() -> Mesh:
    """A one-axis mesh over every device of every host: pure data parallelism."""
    return Mesh(np.array(jax.devices()), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, stacked: bool = False) -> NamedSharding:
    """Batches are [A, R, row_len]: micro-batch rows R are split over the `data` axis; with
    `stacked`, batches [K, A, R, row_len] of several steps (`put_batches`)."""
    return NamedSharding(mesh, PartitionSpec(*(None,) * (1 + stacked), DATA_AXIS))


def host_row_slice(rows: int) -> slice:
    """The rows of each micro-batch that this host loads (hosts own equal, contiguous parts)."""
    per_host = rows // jax.process_count()
    start = jax.process_index() * per_host
    return slice(start, start + per_host)


def put_batch(batch: Batch, mesh: Mesh) -> Batch:
    """Assembles this host's rows into global arrays sharded on the `data` axis."""
    sharding = batch_sharding(mesh)
    return jax.tree.map(lambda v: jax.make_array_from_process_local_data(sharding, v), batch)


def put_batches(batches: list[Batch], mesh: Mesh) -> Batch:
    """Several steps' batches stacked on a new leading axis, placed as `put_batch` places one."""
    sharding = batch_sharding(mesh, stacked=True)
    stacked = jax.tree.map(lambda *v: np.stack(v), *batches)
    return jax.tree.map(lambda v: jax.make_array_from_process_local_data(sharding, v), stacked)


def local_copy(params):
    """This host's full copy of replicated parameters, on its first device (for decoding)."""
    return jax.tree.map(lambda x: x.addressable_data(0), params)
