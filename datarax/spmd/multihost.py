"""Multi-host helpers: joining JAX's distributed runtime, and moving host data to and from
arrays that span processes.

In a multi-process ("multi-controller") JAX program every process runs the same code; an
array on a mesh that spans processes is *global*: each process holds only the shards on
its own (addressable) devices. This module covers the three things a program then needs:

- :func:`initialize_distributed`: ``jax.distributed.initialize`` with bounded timeouts,
  a configurable heartbeat, the preemption notifier off (so SIGTERM stops the process)
  and gloo collectives on CPU.
- Host data in: :func:`global_array_from_host` (a value identical on every process, such
  as freshly initialised parameters) and :func:`place_global_batch` (a global batch; each
  process keeps only the rows its devices hold, :func:`process_local_rows`). The row and
  array helpers, and ``place_batch_on_shards`` below ``place_global_batch``, live in
  :mod:`datarax.spmd.global_arrays` (below this module and ``data_parallel``, which both
  use them); the helpers are re-exported here.
- Results out: :func:`fetch_global` reads a global array back to numpy without touching
  non-addressable shards where it can.
- Meshes over some of the processes: only processes that hold a device of the mesh
  (:func:`owns_devices_of`) take part in its computations.

Everything here also works in a single process (then it is plain ``jax.device_put`` and
``np.asarray``), so the same program runs on a laptop and on a cluster. Importing this
module never touches devices.

Failure semantics of JAX's runtime (measured with jax 0.12 on CPU): when a process stops
sending heartbeats for ``heartbeat_timeout_s`` the coordination service tells every other
process, and each one aborts (``SIGABRT`` from C++, no Python exception); when process 0
(which hosts the coordination service) dies the others abort within milliseconds; a
restarted process cannot rejoin a live group (the service sees a new incarnation and
aborts everyone), so the whole group restarts together.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from datarax.spmd.global_arrays import (
    global_array_from_host,
    place_batch_on_shards,
    process_local_rows,
    process_local_slice,
)
from datarax.tree_types import PyTree

__all__ = [
    "coordination_client",
    "detect_process_id",
    "fetch_global",
    "global_array_from_host",
    "initialize_distributed",
    "owns_devices_of",
    "place_global_batch",
    "process_local_rows",
    "process_local_slice",
]

_MAX_HEARTBEAT_S = 3600


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto: bool = False,
    heartbeat_timeout_s: float = 10.0,
    init_timeout_s: float = 300.0,
    local_device_ids: Sequence[int] | None = None,
    coordinator_bind_address: str | None = None,
) -> bool:
    """Joins JAX's distributed runtime (``jax.distributed.initialize``) when asked to.

    Call it before anything touches a device (``jax.devices()``, ``device_put``, a jit).
    Process 0 also hosts the coordination service at ``coordinator_address``.

    Besides the initialize call it sets, before the backend starts:

    - ``jax_enable_preemption_service=False``: the preemption notifier would otherwise
      swallow SIGTERM (it turns it into a "preemption sync point" notice), so a process
      could not be stopped by its supervisor.
    - ``jax_cpu_collectives_implementation="gloo"``: cross-process collectives on CPU
      (GPU uses NCCL, TPU its own interconnect, whatever this flag says).
    - ``jax_cpu_get_local_topology_timeout_minutes`` / ``..._global_...``: the CPU client's
      topology exchange is bounded by ``init_timeout_s`` too (rounded up to minutes; the
      defaults are 2 and 5 minutes).

    Args:
      coordinator_address: ``"host:port"`` of process 0's coordination service.
      num_processes: processes in the group.
      process_id: this process, ``0 <= process_id < num_processes``.
      auto: with none of the three given, let JAX detect the cluster (SLURM, Open MPI,
        Kubernetes indexed Jobs / JobSets with the ``kubernetes`` package, Cloud TPU);
        any of the three that is given overrides what JAX detects.
      heartbeat_timeout_s: a process that sends no heartbeat for this long is considered
        dead and the whole group aborts (``heartbeat_timeout_seconds``, whole seconds,
        rounded up). JAX's default is 100 s.
      init_timeout_s: how long ``initialize`` waits for every process to connect
        (``initialization_timeout``; measured, JAX aborts the process a few seconds
        after it). ``shutdown_timeout_seconds`` (how long a leaving process waits for the
        others) is the smaller of the two timeouts.
      local_device_ids: restrict this process to these local devices (JAX also reads
        ``JAX_LOCAL_DEVICE_IDS``).
      coordinator_bind_address: ``"host:port"`` process 0's coordination service listens
        on. Default: ``JAX_COORDINATOR_BIND_ADDRESS`` if set, else ``coordinator_address``
        itself, so the unauthenticated service is reachable only where the group
        reaches it (JAX's own default, ``[::]:port``, is every interface). Pass
        ``"[::]:port"`` to listen everywhere. With ``auto`` and no coordinator address
        JAX's detection decides, and so does its default.

    Returns:
      True when the runtime was initialised (or already was), False for a single-process
      run (no coordinator, ``auto`` off): nothing was changed then.

    Raises:
      ValueError: a partial configuration (say a coordinator without ``num_processes``),
        ``process_id`` out of range, or non-positive timeouts.
      RuntimeError: JAX's backend is already initialised (see above).
    """
    given = (coordinator_address, num_processes, process_id)
    if not auto and all(v is None for v in given):
        return False
    if not auto and any(v is None for v in given):
        raise ValueError(
            "multi-host needs coordinator_address, num_processes and process_id together "
            f"(got {coordinator_address!r}, {num_processes!r}, {process_id!r}); "
            "or pass auto=True to let JAX detect the cluster"
        )
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"num_processes must be >= 1, got {num_processes}")
    if process_id is not None and not 0 <= process_id < (num_processes or process_id + 1):
        raise ValueError(f"process_id must be in [0, {num_processes}), got {process_id}")
    if not 0 < heartbeat_timeout_s <= _MAX_HEARTBEAT_S or not init_timeout_s > 0:
        raise ValueError(
            f"timeouts must be positive (heartbeat at most {_MAX_HEARTBEAT_S} s); got "
            f"heartbeat_timeout_s={heartbeat_timeout_s}, init_timeout_s={init_timeout_s}"
        )
    if jax.distributed.is_initialized():
        return True
    init_minutes = max(1, math.ceil(init_timeout_s / 60))
    jax.config.update("jax_enable_preemption_service", False)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.config.update("jax_cpu_get_local_topology_timeout_minutes", init_minutes)
    jax.config.update("jax_cpu_get_global_topology_timeout_minutes", init_minutes + 1)
    if coordinator_bind_address is None and coordinator_address is not None:
        coordinator_bind_address = os.environ.get(
            "JAX_COORDINATOR_BIND_ADDRESS", coordinator_address
        )
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        coordinator_bind_address=coordinator_bind_address,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=local_device_ids,
        initialization_timeout=max(1, math.ceil(init_timeout_s)),
        heartbeat_timeout_seconds=max(1, math.ceil(heartbeat_timeout_s)),
        shutdown_timeout_seconds=max(1, math.ceil(min(init_timeout_s, heartbeat_timeout_s))),
    )
    return True


def detect_process_id() -> int | None:
    """This process's id as ``jax.distributed.initialize()`` would detect it, or ``None``.

    Reads the cluster environment without starting a JAX backend, so a launcher can decide
    what to run (e.g. only process 0 serves HTTP) before any process initialises. Asks
    JAX's own cluster detectors, in JAX's order (SLURM ``SLURM_PROCID``, Open MPI
    ``OMPI_COMM_WORLD_RANK``, Kubernetes ``JOB_COMPLETION_INDEX`` with the ``kubernetes``
    package, Cloud TPU once JAX has probed for TPUs), through JAX's internal
    ``jax._src.clusters.ClusterEnv`` registry: there is no public API for this.
    """
    from jax._src import clusters  # JAX's detectors; importing them starts no backend

    for env in clusters.ClusterEnv._cluster_types:
        if getattr(env, "opt_in_only_method", False):
            continue
        try:
            if env.is_env_present():
                return int(env.get_process_id())
        except Exception:  # noqa: BLE001 - a detector that cannot answer is not our cluster
            continue
    return None


def coordination_client() -> Any:
    """JAX's coordination-service client (``jax._src.distributed.global_state.client``).

    Its key-value store is shared by every process of the group and lives in process 0:
    ``key_value_set(_bytes)(key, value, allow_overwrite=False)``,
    ``blocking_key_value_get(_bytes)(key, timeout_in_ms)`` (raises
    ``jax.errors.JaxRuntimeError`` ``DEADLINE_EXCEEDED`` on timeout),
    ``key_value_try_get(_bytes)``, ``key_value_increment``, ``key_value_delete`` (a key
    and everything under ``key/``), ``wait_at_barrier``.

    Raises:
      RuntimeError: the distributed runtime is not initialised.
    """
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialised; call initialize_distributed")
    return client


def place_global_batch(batch: PyTree, sharding: NamedSharding) -> PyTree:
    """Places a global host batch, given whole on every process, with ``sharding``.

    Each process keeps only the rows its devices hold (:func:`process_local_slice`) and
    hands them to ``jax.make_array_from_process_local_data`` with the global shape, so
    nothing is compared or sent between processes. In one process this is
    ``jax.device_put``. Use ``place_batch_on_shards`` instead when each process loads only
    its own rows.

    Args:
      batch: pytree of host arrays, identical on every process, e.g. ``{"inputs": [B, F]
        float32, "targets": [B, C] float32}``; leaves other than ``np.ndarray`` and
        ``jax.Array`` (strings, Python and numpy scalars) pass through; 0-d arrays are
        replicated.
      sharding: e.g. ``NamedSharding(mesh, P("data"))`` over a mesh spanning processes.

    Returns:
      The pytree with global ``jax.Array`` leaves: ``inputs: [B, F] sharded over 'data'``.

    Raises:
      ValueError: a leaf whose leading dimension does not split over the shards.
    """
    if sharding.is_fully_addressable:
        return place_batch_on_shards(batch, sharding)

    def local_rows(leaf: Any) -> Any:
        if not _is_host_array(leaf) or np.ndim(leaf) == 0:
            return leaf
        value = np.asarray(leaf)
        sharding.shard_shape(value.shape)  # ValueError when a dimension does not divide
        return process_local_slice(value, sharding)

    # Each process keeps its own rows; place_batch_on_shards turns them into global arrays.
    return place_batch_on_shards(jax.tree.map(local_rows, batch), sharding)


def fetch_global(x: jax.typing.ArrayLike) -> np.ndarray:
    """Reads a (possibly global) array back to host numpy.

    - fully addressable: ``np.asarray``;
    - fully replicated (e.g. a loss with ``out_shardings=P()``): this process's first
      shard (``x.addressable_data(0)``), no communication;
    - sharded over a mesh (e.g. per-device losses ``[n_devices]`` sharded over the
      devices): gathered to replicated on that same mesh, a collective that every process
      owning devices of the mesh must run at the same point of the program;
    - any other sharding: ``multihost_utils.process_allgather`` (every process).

    Raises:
      ValueError: this process holds no shard of ``x`` (it cannot read it).
    """
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
        return np.asarray(x)
    if not x.addressable_shards:
        raise ValueError(
            f"this process ({jax.process_index()}) holds no shard of the array "
            f"{x.shape} {x.dtype}; read it on a process that owns some of its devices"
        )
    if x.is_fully_replicated:
        return np.asarray(x.addressable_data(0))
    if isinstance(x.sharding, NamedSharding):
        gathered = _replicate_on(NamedSharding(x.sharding.mesh, PartitionSpec()))(x)
        return np.asarray(gathered.addressable_data(0))
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def owns_devices_of(mesh: Mesh) -> bool:
    """Whether this process holds at least one device of ``mesh``.

    A process that holds none takes no part in computations over the mesh: it must not
    call them (nor place arrays on the mesh); everyone else must, in the same order.
    """
    here = jax.process_index()
    return any(d.process_index == here for d in mesh.devices.flat)


@functools.lru_cache(maxsize=64)
def _replicate_on(sharding: NamedSharding) -> Any:
    return jax.jit(_identity, out_shardings=sharding)


def _identity(x: jax.Array) -> jax.Array:
    return x


def _is_host_array(x: Any) -> bool:
    # as place_batch_on_shards: numpy arrays and jax arrays are placed, scalars pass through
    return isinstance(x, np.ndarray) or (isinstance(x, jax.Array) and x.is_fully_addressable)
