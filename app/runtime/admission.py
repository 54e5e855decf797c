"""Memory admission: a session or a step is refused (422 ``insufficient_memory``) before it
could exhaust a memory pool.

A session or a step that does not fit would be killed by the kernel (CPU) or fail in the
allocator mid-step (accelerators), and take every other session down with the runtime. So
both are admitted first, against the budget of each memory *pool*: a host's memory, shared
by its CPU devices, or one accelerator's (:func:`app.runtime.devices.memory_budgets`:
``DATARAX_MEMORY_FRACTION`` of capacity, or ``DATARAX_MEMORY_BUDGET_MB``). A session
reserves what its steps need for parameters, optimizer state, gradients and (without
donation) the next state; a step checks what it needs against what is left: XLA's figures
for the compiled step (:func:`compiled_step_need`; the runtime compiles it from shapes
before it runs) where it has them, else the estimate of its batch and activations
(:func:`step_need`).

Multi-host, every process must decide alike, or the group restarts (``runtime_diverged``).
So the need covers every device of the mesh (pools named globally), every process keeps
every session's reservation (participating or not), and the budgets come from the command
(the leader's, which the HTTP process adds), not from each host.

Numbers are float32 bytes (:data:`datarax.plan.memory.BYTES_PER_ELEMENT`), from the
same layout arithmetic that mesh plans report.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from app.core.errors import InsufficientMemory
from datarax.plan.memory import BYTES_PER_ELEMENT, OPTIMIZER_STATE_FACTOR, param_layouts

if TYPE_CHECKING:
    from jax.sharding import Mesh

Pool = tuple[str, int]
"""``("host", process index)`` for CPU devices, ``("device", device id)`` otherwise."""

Need = dict[Pool, int]
"""Pool -> bytes."""


def pool_of(device: Any) -> Pool:
    """The memory pool a device allocates from."""
    return ("host", device.process_index) if device.platform == "cpu" else ("device", device.id)


def pool_budget(pool: Pool, budgets: Mapping[str, int | None]) -> int:
    """Bytes ``pool`` may hold: ``budgets[kind]``, the host's when the kind has none."""
    value = budgets.get(pool[0])
    if value is None:
        value = budgets["host"]
    if value is None:  # no budget for the kind nor the host: a caller's bug
        raise TypeError(f"no memory budget for {pool[0]!r} pools nor the host")
    return int(value)


def session_need(
    mesh: Mesh, features: Sequence[int], param_sharding: str, optimizer: str, donate: bool
) -> Need:
    """What a session's state takes while it steps, on every device of the mesh, plus the
    whole model once per process (each initialises it unsharded, then places it).

    Args:
      mesh: the session's mesh (its devices may span processes).
      features: MLP widths ``[in, hidden..., out]``.
      param_sharding: the parameter rule (``replicate``, ``fsdp``, ``model``).
      optimizer: the optimizer name (its state is a multiple of the parameters).
      donate: whether steps donate the old state (no second copy of it).

    Returns:
      Pool -> bytes.
    """
    layouts, _ = param_layouts(features, dict(mesh.shape), param_sharding)
    per_device = sum(int(e["bytes_per_device"]) for e in layouts)
    whole = sum(math.prod(e["shape"]) for e in layouts) * BYTES_PER_ELEMENT
    return state_need(mesh, per_device, whole, optimizer, donate)


def replicated_session_need(mesh: Mesh, param_bytes: int, optimizer: str, donate: bool) -> Need:
    """:func:`session_need` of a model whose ``param_bytes`` are replicated on every device
    (a transformer session: data parallel)."""
    return state_need(mesh, param_bytes, param_bytes, optimizer, donate)


def state_need(mesh: Mesh, per_device: int, whole: int, optimizer: str, donate: bool) -> Need:
    """A session's state on every device (``per_device`` parameter bytes times parameters,
    optimizer slots, gradients and, without donation, the next state), plus the whole
    model (``whole`` bytes) once per process, which initialises it before placing it."""
    state = 1 + OPTIMIZER_STATE_FACTOR.get(optimizer, 2)  # params + optimizer slots
    copies = state + 1 + (0 if donate else state)  # + gradients, + the next state
    need: Need = {}
    first_of_process: dict[int, Pool] = {}
    for device in mesh.devices.flat:
        pool = pool_of(device)
        need[pool] = need.get(pool, 0) + per_device * copies
        first_of_process.setdefault(device.process_index, pool)
    for pool in first_of_process.values():
        need[pool] += whole
    return need


def per_device_step_need(mesh: Mesh, per_device: int, host: int) -> Need:
    """A step's ``per_device`` bytes on every device, plus ``host`` bytes (the batch) on
    every host pool."""
    need: Need = {}
    for device in mesh.devices.flat:
        pool = pool_of(device)
        need[pool] = need.get(pool, 0) + per_device
    for pool in need:
        if pool[0] == "host":
            need[pool] += host
    return need


def step_need(mesh: Mesh, row_shards: int, features: Sequence[int], rows: int) -> Need:
    """What one step's batch and activations take (forward kept for backward), plus the
    host copy of the batch every process holds.

    Args:
      mesh: the session's mesh.
      row_shards: how many shards the batch's rows are split into.
      features: MLP widths ``[in, hidden..., out]``.
      rows: the batch size.

    Returns:
      Pool -> bytes.
    """
    shard_rows = rows // max(1, row_shards)
    width = sum(features)
    per_device = shard_rows * (2 * width + features[0] + features[-1]) * BYTES_PER_ELEMENT
    host = rows * (features[0] + features[-1]) * BYTES_PER_ELEMENT
    return per_device_step_need(mesh, per_device, host)


def compiled_step_need(
    mesh: Mesh, peak_per_device: int, reserved: Mapping[Pool, int], host_batch_bytes: int
) -> Need:
    """What one step needs by XLA's own figure, once the step is compiled.

    ``peak_per_device`` is the compiled step's ``memory_analysis()`` peak on one device
    (:func:`app.runtime.compile_cache.compiled_peak`): the state and batch it takes, the
    state it returns and every temporary (gradients, activations, fusion buffers) at the
    worst moment. The session's own reservation (``reserved``) already holds its state, so
    a pool needs only what the devices' peaks exceed that reservation by, plus the host
    copy of the batch (``host_batch_bytes``) on host pools.

    Args:
      mesh: the session's mesh.
      peak_per_device: XLA's per-device peak bytes of the step.
      reserved: the session's reservation, pool -> bytes.
      host_batch_bytes: bytes of the whole batch as every process holds it.

    Returns:
      Pool -> bytes.
    """
    peaks: Need = {}
    for device in mesh.devices.flat:
        pool = pool_of(device)
        peaks[pool] = peaks.get(pool, 0) + int(peak_per_device)
    return {
        pool: max(0, peak - int(reserved.get(pool, 0)))
        + (host_batch_bytes if pool[0] == "host" else 0)
        for pool, peak in peaks.items()
    }


def admit(
    what: str,
    need: Mapping[Pool, int],
    budgets: Mapping[str, int | None],
    reservations: Iterable[Mapping[Pool, int]],
) -> None:
    """Refuses ``need`` unless it fits beside ``reservations`` in every pool.

    Args:
      what: what asks, for the message (``"a session of MLP [16, 8] (replicate, adam)"``).
      need: pool -> bytes it needs.
      budgets: ``{"host": bytes, "device": bytes or None}`` (the leader's, multi-host).
      reservations: pool -> bytes held, one mapping per session.

    Raises:
      InsufficientMemory: a pool whose reservations plus ``need`` exceed its budget; the
        message names the pool, the numbers and the ways out.
    """
    held_by_pool: dict[Pool, int] = {}
    for reserved in reservations:
        for pool, held in reserved.items():
            held_by_pool[pool] = held_by_pool.get(pool, 0) + held
    for pool, bytes_needed in need.items():
        held = held_by_pool.get(pool, 0)
        budget = pool_budget(pool, budgets)
        if held + bytes_needed > budget:
            kind, index = pool
            where = (
                f"host memory (process {index}, shared by its CPU devices)"
                if kind == "host"
                else f"device {index}"
            )
            raise InsufficientMemory(
                f"{what} needs about {_size(bytes_needed)} of {where}; sessions hold "
                f"{_size(held)} of its {_size(budget)} budget. Use a smaller model or "
                "batch, shard the parameters (param_sharding fsdp or model), delete "
                "sessions, or raise DATARAX_MEMORY_FRACTION"
            )


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"
