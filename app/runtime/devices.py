"""Device commands (``ping``, ``devices``, ``mesh_grid``) and the memory budgets.

Loaded by every runtime (:data:`app.runtime.server.BUILTIN_MODULES`) after its environment
is set, so JAX may be imported inside the handlers.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from app.core.errors import InvalidRequest
from app.core.host_memory import host_memory_bytes
from app.core.settings import Settings
from app.runtime.environment import settings
from app.runtime.server import command

_started = time.monotonic()  # this module loads when the runtime starts


@command("ping", local=True)
def ping(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Liveness: ``{"pid", "uptime_s"}``."""
    return {"pid": os.getpid(), "uptime_s": time.monotonic() - _started}, {}


def host_capacity_bytes() -> int:
    """Physical memory, or the container's limit (cgroup v2 or v1) when lower."""
    return host_memory_bytes() or 0


def memory_budgets(settings: Settings) -> dict[str, int | None]:
    """Bytes training sessions may plan to hold (see :mod:`app.runtime.admission`).

    ``DATARAX_MEMORY_BUDGET_MB`` replaces both numbers; else they are
    ``DATARAX_MEMORY_FRACTION`` of the capacities.

    Returns:
      ``{"host": bytes for this host's CPU devices together, "device": bytes for each
      accelerator (the smallest local ``bytes_limit``, which is already XLA's share of the
      device) or None without one}``.
    """
    import jax

    if settings.memory_budget_mb is not None:
        fixed = int(settings.memory_budget_mb * 2**20)
        return {"host": fixed, "device": fixed}
    limits = []
    for device in jax.local_devices():
        if device.platform == "cpu":
            continue
        try:
            stats = device.memory_stats() or {}
        except Exception:  # a backend without memory statistics
            stats = {}
        limits.append(int(stats.get("bytes_limit") or host_capacity_bytes()))
    fraction = settings.memory_fraction
    return {
        "host": int(host_capacity_bytes() * fraction),
        "device": int(min(limits) * fraction) if limits else None,
    }


@command("devices")
def devices(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Every global device: ``{"platform", "process_count", "process_index", "devices",
    "memory_budget"}``; each device ``{"id", "kind", "platform", "process_index",
    "coords"}``."""
    import jax

    all_devices = jax.devices()
    return {
        "platform": all_devices[0].platform,
        "process_count": jax.process_count(),
        "process_index": jax.process_index(),
        "memory_budget": memory_budgets(settings()),
        "devices": [
            {
                "id": d.id,
                "kind": d.device_kind,
                "platform": d.platform,
                "process_index": d.process_index,
                "coords": _coords(d),
            }
            for d in all_devices
        ],
    }, {}


def _coords(device: Any) -> list[int] | None:
    coords = getattr(device, "coords", None)
    return None if coords is None else [int(c) for c in coords]


@command("mesh_grid")
def mesh_grid(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Device ids of a live mesh in JAX's mesh order.

    Payload ``{"axes": {name: size}}`` (ordered; one size may be -1). Answers
    ``{"axes": resolved sizes, "device_grid": nested lists of ids, shaped like the mesh,
    "process_index": {str(id): process index}, "platform"}``.

    Raises:
      InvalidRequest: ``axes`` missing or not a non-empty object.
      PlanError: ``not_enough_devices``, ``multiple_auto_axes``, ... (answered with its code).
    """
    axes = payload.get("axes")
    if not isinstance(axes, dict) or not axes:
        raise InvalidRequest(
            f"payload 'axes' must be a non-empty object name -> size, got {axes!r}"
        )
    from datarax.distributed.device_mesh import DeviceMeshManager

    mesh = DeviceMeshManager.create_device_mesh(axes)
    grid = np.vectorize(lambda d: d.id, otypes=[np.int64])(mesh.devices)
    return {
        "axes": {name: int(size) for name, size in mesh.shape.items()},
        "device_grid": grid.tolist(),
        "process_index": {str(d.id): d.process_index for d in mesh.devices.flat},
        "platform": mesh.devices.flat[0].platform,
    }, {}
