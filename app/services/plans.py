"""Mesh plans as plain functions: layout arithmetic in, plan JSON text out. No HTTP here.

A plan is built in two steps:

1. the caller resolves the axes and finds the devices: an *abstract* plan numbers
   ``num_devices`` devices ``0..n-1`` row-major (all in process 0); a *live* plan gets the
   device ids in JAX's mesh order and their process indices from the runtime;
2. :func:`render_plan` computes the batch layout, every device's shard (vectorised over
   devices with :mod:`datarax.plan.layout`), the parameter layouts and the memory
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.core.errors import AnswerTooLarge, RuntimeFailed
from datarax.plan.layout import (
    PlanCancelled,
    batch_partition_spec,
    check_batch_shape,
    check_divisible,
    device_coords,
    replica_ids,
    shard_index_ranges,
    shard_shape,
)
from datarax.plan.memory import memory_per_device, param_layouts

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
      slice_index: hardware plans only: int64 ``[n]`` slice (TPU) or NVLink domain (GPU).
      host_index: hardware plans only: int64 ``[n]`` host, numbered over the plan.
      physical: hardware plans only: int64 ``[n, 3]`` chip ``(x, y, z)`` (TPU) or
        ``[n, 2]`` ``(host, local index)`` (GPU/CPU).
      core: hardware plans on TPU only: int64 ``[n]`` core on the chip.
    """

    ids: np.ndarray
    process_index: np.ndarray
    grid: list[Any]
    platform: str | None
    live: bool
    available: int | None = None
    notes: list[str] = field(default_factory=list)
    slice_index: np.ndarray | None = None
    host_index: np.ndarray | None = None
    physical: np.ndarray | None = None
    core: np.ndarray | None = None


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
        raise RuntimeFailed(f"the runtime returned {ids.size} devices for mesh {dict(axes)}")
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


def _shard_template(
    names: Sequence[str], ndim: int, physical: int | None = None, core: bool = False
) -> str:
    """A ``%``-format for one shard object: device, process_index, coords, index, replica,
    and for hardware plans slice, host, physical (``physical`` coordinates) and core."""

    def key(name: str) -> str:
        return json.dumps(name).replace("%", "%%")

    coords = ",".join(f"{key(name)}:%d" for name in names)
    index = ",".join("[%d,%d]" for _ in range(ndim))
    hardware = ""
    if physical is not None:
        hardware = ',"slice":%d,"host":%d,"physical":[' + ",".join(["%d"] * physical) + "]"
        if core:
            hardware += ',"core":%d'
    return (
        '{"device":%d,"process_index":%d,"coords":{' + coords + '},"index":[' + index + "]"
        ',"replica":%d' + hardware + "}"
    )


SHARD_ROWS_PER_CHECK = 16_384
"""Shards written between two ``should_stop`` checks (~20 ms of work)."""


def _stop_if(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise PlanCancelled("the plan was abandoned")


def plan_size_floor(
    axes: Mapping[str, int], devices: Devices, ndim: int, name: str | None = None
) -> int:
    """Bytes a plan's text has at least: its shards' fixed characters (keys, the axis
    names of ``coords``, punctuation; one digit per number) for every device, plus the
    device grid. Cheap (no shard is written), so an oversized plan is refused before it
    is built."""
    physical = None if devices.physical is None else devices.physical.shape[1]
    template = _shard_template(list(axes), ndim, physical, devices.core is not None)
    per_shard = len(template.replace("%d", "0")) + 1
    n = math.prod(int(s) for s in axes.values())
    return n * (per_shard + 2) + len(name or "")


def shards_json(
    axes: Mapping[str, int],
    devices: Devices,
    spec: Sequence[Any] | None,
    batch_shape: Sequence[int] | None,
    should_stop: Callable[[], bool] | None = None,
) -> str:
    """The ``shards`` JSON array: one object per device, in mesh order.

    ``index`` equals ``NamedSharding(mesh, P(*spec)).devices_indices_map(batch_shape)`` for
    each device; ``replica`` numbers the devices holding the same slice (mesh order).
    ``should_stop`` is checked every :data:`SHARD_ROWS_PER_CHECK` shards.
    """
    names = list(axes)
    coords = device_coords(axes)
    n = coords.shape[0]
    if batch_shape is None:
        ndim = 0
        ranges = np.zeros((n, 0), dtype=np.int64)
        replicas = np.arange(n, dtype=np.int64)  # no batch: every device holds "the same" []
    else:
        if spec is None:
            raise ValueError("a batch shape needs its partition spec")
        ndim = len(batch_shape)
        ranges = shard_index_ranges(axes, spec, batch_shape).reshape(n, 2 * ndim)
        replicas = replica_ids(axes, spec, shape=batch_shape)
    columns = [
        devices.ids.reshape(n, 1),
        devices.process_index.reshape(n, 1),
        coords,
        ranges,
        replicas.reshape(n, 1),
    ]
    physical = None
    if devices.physical is not None:
        physical = devices.physical.shape[1]
        columns += [
            np.asarray(devices.slice_index, np.int64).reshape(n, 1),
            np.asarray(devices.host_index, np.int64).reshape(n, 1),
            np.asarray(devices.physical, np.int64).reshape(n, physical),
        ]
        if devices.core is not None:
            columns.append(np.asarray(devices.core, np.int64).reshape(n, 1))
    table = np.concatenate(columns, axis=1)
    template = _shard_template(names, ndim, physical, devices.core is not None)
    parts: list[str] = []
    for start in range(0, n, SHARD_ROWS_PER_CHECK):
        _stop_if(should_stop)
        rows = table[start : start + SHARD_ROWS_PER_CHECK].tolist()
        parts.extend(template % tuple(row) for row in rows)
    return "[" + ",".join(parts) + "]"


def check_plan_request(request: PlanRequest, axes: Mapping[str, int]) -> None:
    """Validates the batch against resolved axes without building anything.

    Live plans call this before asking the runtime, so a bad request never waits behind
    device work.

    Raises:
      PlanError: as :func:`render_plan`.
    """
    if request.batch_shape is not None:
        check_batch_shape(request.batch_shape)
        spec = batch_partition_spec(axes, request.batch_axes, len(request.batch_shape))
        check_divisible(axes, spec, request.batch_shape)
    elif request.batch_axes:
        batch_partition_spec(axes, request.batch_axes, 1)


@dataclass(frozen=True)
class HardwareParts:
    """What a hardware plan adds to the plan JSON (see :func:`render_plan`).

    Attributes:
      members: JSON members appended after ``warnings``, in order (``axes_detail`` ...).
      params: parameter layouts replacing the MLP ones, or ``None`` to keep them.
      memory: ``memory_per_device`` replacing the MLP estimate, or ``None`` to keep it.
    """

    members: Mapping[str, Any]
    params: Sequence[Mapping[str, Any]] | None = None
    memory: Mapping[str, Any] | None = None


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
    hardware: HardwareParts | None = None,
    should_stop: Callable[[], bool] | None = None,
    max_bytes: int | None = None,
) -> RenderedPlan:
    """The plan as compact JSON text (see the module doc and docs/API.md for the fields).

    Args:
      request: what was asked for.
      axes: resolved axes (no ``-1``), in mesh order.
      devices: the plan's devices in row-major mesh order.
      plan_id: the plan's id.
      created_at: RFC 3339 UTC timestamp.
      hardware: hardware plans only: the parameter layouts and memory of the step
        estimate (replacing the MLP ones) and the members added after ``warnings``
        (``axes_detail``, ``step_estimate``, ...). ``None`` leaves the JSON as it was.
      should_stop: checked between the steps and while the shards are written; when it
        answers true the plan is abandoned (``PlanCancelled``).
      max_bytes: refuse a plan whose text would pass this many bytes
        (:func:`plan_size_floor`) before writing its shards (``DATARAX_MAX_ANSWER_MB``).

    Raises:
      PlanError: ``batch_not_divisible``, ``unknown_batch_axis``, ``duplicate_batch_axis``,
        ``invalid_batch_shape``.
      AnswerTooLarge: the plan would pass ``max_bytes``.
      PlanCancelled: ``should_stop`` answered true.
    """
    _stop_if(should_stop)
    if request.batch_shape is not None:
        check_batch_shape(request.batch_shape)
    if max_bytes is not None:
        ndim = 0 if request.batch_shape is None else len(request.batch_shape)
        floor = plan_size_floor(axes, devices, ndim, request.name)
        if floor > max_bytes:
            raise AnswerTooLarge(
                f"this plan of {math.prod(int(s) for s in axes.values())} devices would be "
                f"at least {floor} bytes, past the answer limit of {max_bytes} "
                "(DATARAX_MAX_ANSWER_MB); plan fewer devices, or use shorter axis names "
                "(each device's coords repeat them)"
            )
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
    if hardware is not None and hardware.params is not None:
        params = [dict(layout) for layout in hardware.params]
    memory: dict[str, Any] = memory_per_device(params, request.optimizer, batch_block)
    if hardware is not None and hardware.memory is not None:
        memory = dict(hardware.memory)

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
    if hardware is not None:
        after.update(hardware.members)
    shards = shards_json(axes, devices, spec, request.batch_shape, should_stop)
    body = "".join([_dumps(before)[:-1], ',"shards":', shards, ",", _dumps(after)[1:]])
    summary = {k: v for k, v in before.items() if k != "device_grid"}
    return RenderedPlan(body=body, summary=_dumps({**summary, **after}))


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
