"""Mesh plans as plain functions: layout arithmetic in, plan JSON text out. No HTTP here.

A plan is built in two steps:

1. the caller resolves the axes and finds the devices: an *abstract* plan numbers
   ``num_devices`` devices ``0..n-1`` row-major (all in process 0); a *live* plan gets the
   device ids in JAX's mesh order and their process indices from the runtime;
2. :func:`render_plan` computes the batch layout, every device's shard (vectorised over
   devices with :mod:`datarax.distributed.planning`), the parameter layouts and the memory
   estimate, and writes the JSON text directly.

Speed: a 65,536-device plan has 65,536 shard objects. Building them as dicts and calling
``json.dumps`` takes ~0.3 s; here each shard is one ``%``-format of a row of an int64
matrix (~0.1 s), and the rest of the plan goes through ``json.dumps`` with the shards
spliced in. The same text is stored and served again byte for byte.

Platform: a live plan reports the runtime's platform (``cpu``, ``gpu``, ``tpu``); an
abstract plan echoes the request's optional ``platform`` (a cluster it is planned for)
or ``null``.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from datarax.distributed.planning import (
    batch_partition_spec,
    check_divisible,
    device_coords,
    replica_ids,
    shard_index_ranges,
    shard_shape,
)
from datarax.distributed.sharding import param_partition_spec

BYTES_PER_ELEMENT = 4  # float32 parameters, optimizer state and batches
OPTIMIZER_STATE_FACTOR = {"adam": 2, "adamw": 2, "sgd": 0}
"""Optimizer state bytes as a multiple of parameter bytes (adam: first and second moment)."""

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ulid_lock = threading.Lock()
_ulid_last = (0, 0)


def new_ulid() -> str:
    """A 26-character ULID (48-bit ms timestamp + 80 random bits), monotonic per process.

    Ids made in the same millisecond increment the random part, so ids sort in creation
    order (lexicographically) even within one millisecond.
    """
    global _ulid_last
    with _ulid_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, last_rand = _ulid_last
        if ms <= last_ms:
            ms, rand = last_ms, (last_rand + 1) & ((1 << 80) - 1)
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _ulid_last = (ms, rand)
    value = (ms << 80) | rand
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def new_plan_id() -> str:
    """``m_`` + a ULID."""
    return "m_" + new_ulid()


def utc_now() -> str:
    """Now as RFC 3339 UTC with a ``Z``, second precision: ``2026-11-30T08:00:00Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------------------ params


def mlp_param_shapes(features: Sequence[int]) -> list[tuple[str, tuple[int, ...]]]:
    """The built-in MLP's parameters: ``layers/{i}/kernel [f_i, f_i+1]``, ``layers/{i}/bias``."""
    shapes = []
    for i, (fan_in, fan_out) in enumerate(zip(features[:-1], features[1:], strict=True)):
        shapes.append((f"layers/{i}/kernel", (int(fan_in), int(fan_out))))
        shapes.append((f"layers/{i}/bias", (int(fan_out),)))
    return shapes


def param_layouts(
    features: Sequence[int], axes: Mapping[str, int], param_sharding: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """Layouts of the built-in MLP's parameters under a sharding rule.

    The rule table is the library's (:func:`datarax.distributed.sharding.param_partition_spec`),
    the one sessions place parameters with, so a plan predicts a session's layout exactly.
    A parameter the rule cannot split (axis missing, no divisible dimension) stays
    replicated and adds a warning.

    Args:
      features: MLP widths ``[in, hidden..., out]``.
      axes: resolved mesh axes.
      param_sharding: ``replicate``, ``model`` or ``fsdp``.

    Returns:
      ``(entries, warnings)``; each entry is ``{"path", "shape", "spec", "shard_shape",
      "bytes_per_device"}`` (float32 bytes of one device's block).
    """
    entries: list[dict[str, Any]] = []
    warnings: list[str] = []
    for path, shape in mlp_param_shapes(features):
        spec, warning = param_partition_spec(shape, axes, param_sharding, path)
        if warning:
            warnings.append(warning)
        block = shard_shape(axes, spec, shape, what="parameter")
        entries.append(
            {
                "path": path,
                "shape": list(shape),
                "spec": list(spec),
                "shard_shape": list(block),
                "bytes_per_device": math.prod(block) * BYTES_PER_ELEMENT,
            }
        )
    return entries, warnings


def memory_per_device(
    params: Sequence[Mapping[str, Any]], optimizer: str, batch_shard_shape: Sequence[int] | None
) -> dict[str, int]:
    """Bytes per device: parameters, optimizer state (a multiple of them) and one batch shard."""
    param_bytes = sum(int(entry["bytes_per_device"]) for entry in params)
    optimizer_bytes = param_bytes * OPTIMIZER_STATE_FACTOR[optimizer]
    batch_bytes = (
        0 if batch_shard_shape is None else math.prod(batch_shard_shape) * BYTES_PER_ELEMENT
    )
    return {
        "params": param_bytes,
        "optimizer": optimizer_bytes,
        "batch": batch_bytes,
        "total": param_bytes + optimizer_bytes + batch_bytes,
    }


# ------------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class PlanRequest:
    """What a plan is asked for (already checked by the HTTP schema)."""

    axes: Mapping[str, int]
    batch_shape: Sequence[int] | None = None
    batch_axes: Sequence[str] | None = None
    features: Sequence[int] | None = None
    param_sharding: str = "replicate"
    optimizer: str = "adam"
    name: str | None = None


@dataclass(frozen=True)
class Devices:
    """The devices of a plan, in row-major mesh order.

    Attributes:
      ids: int64 ``[n]`` device ids, ``mesh.devices.flat`` order.
      process_index: int64 ``[n]`` each device's JAX process.
      grid: the ids nested like the mesh (``device_grid``).
      platform: runtime platform, or ``None`` (abstract).
      live: whether these are the service's own devices.
      available: devices the host has (live plans), for a warning when fewer are used.
      notes: warnings about the request to pass on in the plan's ``warnings``.
    """

    ids: np.ndarray
    process_index: np.ndarray
    grid: list[Any]
    platform: str | None
    live: bool
    available: int | None = None
    notes: list[str] = field(default_factory=list)


def abstract_devices(axes: Mapping[str, int], platform: str | None = None) -> Devices:
    """Devices ``0..n-1`` numbered row-major over ``axes``, all in process 0."""
    sizes = tuple(int(s) for s in axes.values())
    n = math.prod(sizes)
    ids = np.arange(n, dtype=np.int64)
    return Devices(
        ids=ids,
        process_index=np.zeros(n, dtype=np.int64),
        grid=ids.reshape(sizes).tolist(),
        platform=platform,
        live=False,
    )


def live_devices(
    axes: Mapping[str, int], grid_answer: Mapping[str, Any], available: int
) -> Devices:
    """Devices from the runtime's ``mesh_grid`` answer (ids in JAX's mesh order)."""
    sizes = tuple(int(s) for s in axes.values())
    grid = grid_answer["device_grid"]
    ids = np.asarray(grid, dtype=np.int64).reshape(-1)
    if ids.size != math.prod(sizes):
        raise RuntimeError(f"runtime returned {ids.size} devices for mesh {dict(axes)}")
    index_of = {int(k): int(v) for k, v in (grid_answer.get("process_index") or {}).items()}
    process_index = np.fromiter((index_of.get(int(i), 0) for i in ids), np.int64, ids.size)
    return Devices(
        ids=ids,
        process_index=process_index,
        grid=np.asarray(grid, dtype=np.int64).reshape(sizes).tolist(),
        platform=grid_answer.get("platform"),
        live=True,
        available=available,
    )


def _json_spec(spec: Sequence[Any]) -> list[Any]:
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


def _shard_template(names: Sequence[str], ndim: int) -> str:
    """A ``%``-format for one shard object: device, process_index, coords, index, replica."""

    def key(name: str) -> str:
        return json.dumps(name).replace("%", "%%")

    coords = ",".join(f"{key(name)}:%d" for name in names)
    index = ",".join("[%d,%d]" for _ in range(ndim))
    return (
        '{"device":%d,"process_index":%d,"coords":{' + coords + '},"index":[' + index + "]"
        ',"replica":%d}'
    )


def shards_json(
    axes: Mapping[str, int],
    devices: Devices,
    spec: Sequence[Any] | None,
    batch_shape: Sequence[int] | None,
) -> str:
    """The ``shards`` JSON array: one object per device, in mesh order.

    ``index`` equals ``NamedSharding(mesh, P(*spec)).devices_indices_map(batch_shape)`` for
    each device; ``replica`` numbers the devices holding the same slice (mesh order).
    """
    names = list(axes)
    coords = device_coords(axes)
    n = coords.shape[0]
    if batch_shape is None:
        ndim = 0
        ranges = np.zeros((n, 0), dtype=np.int64)
        replicas = np.arange(n, dtype=np.int64)  # no batch: every device holds "the same" []
    else:
        ndim = len(batch_shape)
        ranges = shard_index_ranges(axes, spec, batch_shape).reshape(n, 2 * ndim)
        replicas = replica_ids(axes, spec, shape=batch_shape)
    table = np.concatenate(
        [
            devices.ids.reshape(n, 1),
            devices.process_index.reshape(n, 1),
            coords,
            ranges,
            replicas.reshape(n, 1),
        ],
        axis=1,
    )
    template = _shard_template(names, ndim)
    return "[" + ",".join([template % tuple(row) for row in table.tolist()]) + "]"


def check_plan_request(request: PlanRequest, axes: Mapping[str, int]) -> None:
    """Validates the batch against resolved axes without building anything.

    Live plans call this before asking the runtime, so a bad request never waits behind
    device work.

    Raises:
      PlanError: as :func:`render_plan`.
    """
    if request.batch_shape is not None:
        spec = batch_partition_spec(axes, request.batch_axes, len(request.batch_shape))
        check_divisible(axes, spec, request.batch_shape)
    elif request.batch_axes:
        batch_partition_spec(axes, request.batch_axes, 1)


@dataclass(frozen=True)
class RenderedPlan:
    """A plan's JSON text, and its summary (every field but ``device_grid`` and ``shards``)."""

    body: str
    summary: str


def render_plan(
    request: PlanRequest,
    axes: Mapping[str, int],
    devices: Devices,
    *,
    plan_id: str,
    created_at: str,
) -> RenderedPlan:
    """The plan as compact JSON text (see the module doc and DESIGN.md for the fields).

    Args:
      request: what was asked for.
      axes: resolved axes (no ``-1``), in mesh order.
      devices: the plan's devices in row-major mesh order.
      plan_id: the plan's id.
      created_at: RFC 3339 UTC timestamp.

    Raises:
      PlanError: ``batch_not_divisible``, ``unknown_batch_axis``, ``duplicate_batch_axis``,
        ``invalid_batch_shape``.
    """
    axes = {name: int(size) for name, size in axes.items()}
    total = math.prod(axes.values())
    warnings: list[str] = list(devices.notes)
    if devices.live and devices.available is not None and total < devices.available:
        warnings.append(
            f"plan uses the first {total} of {devices.available} devices in JAX's mesh order"
        )

    batch = None
    spec = None
    batch_block = None
    if request.batch_shape is not None:
        shape = [int(d) for d in request.batch_shape]
        spec = batch_partition_spec(axes, request.batch_axes, len(shape))
        batch_block = list(shard_shape(axes, spec, shape))
        batch = {"shape": shape, "spec": _json_spec(spec), "shard_shape": batch_block}
        if spec[0] is None and total > 1:
            warnings.append(
                "no batch axes: the whole batch is replicated on every device "
                "(set batch_axes, or add a 'data' axis)"
            )
    elif request.batch_axes:
        # Validate the axes even without a batch, so typos surface.
        batch_partition_spec(axes, request.batch_axes, 1)

    params: list[dict[str, Any]] = []
    if request.features is not None:
        params, param_warnings = param_layouts(request.features, axes, request.param_sharding)
        warnings.extend(param_warnings)
    memory = memory_per_device(params, request.optimizer, batch_block)

    before = {
        "id": plan_id,
        "name": request.name,
        "created_at": created_at,
        "live": devices.live,
        "platform": devices.platform,
        "axes": axes,
        "total_devices": total,
        "device_grid": devices.grid,
        "batch": batch,
    }
    after = {"params": params, "memory_per_device": memory, "warnings": warnings}
    shards = shards_json(axes, devices, spec, request.batch_shape)
    body = "".join([_dumps(before)[:-1], ',"shards":', shards, ",", _dumps(after)[1:]])
    summary = {k: v for k, v in before.items() if k != "device_grid"}
    return RenderedPlan(body=body, summary=_dumps({**summary, **after}))


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
