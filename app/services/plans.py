"""Mesh plans as plain functions: layout arithmetic in, the plan's answer and its JSON text
out. No HTTP here.

A plan is built in three steps:

1. the caller resolves the axes and finds the devices: an *abstract* plan numbers
   ``num_devices`` devices ``0..n-1`` row-major (all in process 0); a *live* plan gets the
   device ids in JAX's mesh order and their process indices from the runtime;
2. :func:`plan_answer` computes the batch layout, every device's shard (vectorised over
   devices with :mod:`datarax.plan.layout`), the parameter layouts and the memory
   estimate, and builds the answer, a :class:`~datarax.answers.plans.MeshPlan`;
3. :func:`render` writes its JSON text (and its summary's, which the store keeps beside
   it).

Speed: a 65,536-device plan has 65,536 shards. Building them as objects (or dicts) and
serialising them takes ~0.3 s; here the plan's ``shards`` is a :class:`ShardColumns`, the
shards as int64 columns (one per member of :class:`~datarax.answers.plans.Shard`), whose
JSON is one ``%``-format per row of the column matrix (~0.1 s), the format derived from
the ``Shard`` class; its ``device_grid`` is a :class:`DeviceGrid`, the ids as an array
that orjson writes whole. :func:`render` splices both into the rest of the answer, which
orjson writes from :meth:`~datarax.answers.base.Answer.to_json`. The same text is stored
and served again byte for byte.

Platform: a live plan reports the runtime's platform (``cpu``, ``gpu``, ``tpu``); an
abstract plan echoes the request's optional ``platform`` (a cluster it is planned for)
or ``null``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np
import orjson

from app.core.errors import AnswerTooLarge, RuntimeFailed
from datarax.answers.estimates import MemoryEstimate, MemoryPerDevice
from datarax.answers.plans import BatchLayout, MeshPlan, MeshPlanSummary, ParamLayout, Shard
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
      grid: int64 ids shaped like the mesh (``device_grid``).
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
    grid: np.ndarray
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
        grid=ids.reshape(sizes),
        platform=platform,
        live=False,
    )


def live_devices(
    axes: Mapping[str, int], grid_answer: Mapping[str, Any], available: int
) -> Devices:
    """Devices from the runtime's ``mesh_grid`` answer (ids in JAX's mesh order)."""
    sizes = tuple(int(s) for s in axes.values())
    ids = np.asarray(grid_answer["device_grid"], dtype=np.int64).reshape(-1)
    if ids.size != math.prod(sizes):
        raise RuntimeFailed(f"the runtime returned {ids.size} devices for mesh {dict(axes)}")
    index_of = {int(k): int(v) for k, v in (grid_answer.get("process_index") or {}).items()}
    process_index = np.fromiter((index_of.get(int(i), 0) for i in ids), np.int64, ids.size)
    return Devices(
        ids=ids,
        process_index=process_index,
        grid=ids.reshape(sizes),
        platform=grid_answer.get("platform"),
        live=True,
        available=available,
    )


def _json_spec(spec: Sequence[Any]) -> list[Any]:
    return [list(entry) if isinstance(entry, tuple) else entry for entry in spec]


# ------------------------------------------------------------------------------ shards


def _json_key(name: str) -> str:
    """``"name":`` as the shards' ``%``-format writes it (``%`` doubled)."""
    return orjson.dumps(name).decode().replace("%", "%%") + ":"


@dataclass(frozen=True)
class _ColumnKind:
    """How a shard member of one JSON type is held in int64 columns: its ``%``-format
    from its ``width`` columns (and the mesh's axis names), its value from one row."""

    format: Callable[[Sequence[str], int], str]
    read: Callable[[Sequence[str], list[int]], Any]


_COLUMN_KINDS: dict[Any, _ColumnKind] = {
    int: _ColumnKind(lambda _axes, _width: "%d", lambda _axes, row: row[0]),
    list[int]: _ColumnKind(
        lambda _axes, width: "[" + ",".join(["%d"] * width) + "]", lambda _axes, row: row
    ),
    list[list[int]]: _ColumnKind(  # [start, stop) pairs
        lambda _axes, width: "[" + ",".join(["[%d,%d]"] * (width // 2)) + "]",
        lambda _axes, row: [row[k : k + 2] for k in range(0, len(row), 2)],
    ),
    dict[str, int]: _ColumnKind(  # one int per mesh axis, keyed by its name
        lambda axes, _width: "{" + ",".join(_json_key(a) + "%d" for a in axes) + "}",
        lambda axes, row: dict(zip(axes, row, strict=True)),
    ),
}
"""The column kinds of the JSON types a :class:`~datarax.answers.plans.Shard` member has."""


@functools.cache
def _shard_members() -> tuple[tuple[str, _ColumnKind, bool], ...]:
    """``(name, column kind, required)`` of every JSON member of a shard, in the class's
    order (the kind of its type without ``| None``)."""
    hints = typing.get_type_hints(Shard)
    members = []
    for f in dataclasses.fields(Shard):
        hint = hints[f.name]
        if isinstance(hint, types.UnionType):
            (hint,) = (arm for arm in typing.get_args(hint) if arm is not type(None))
        members.append((f.name, _COLUMN_KINDS[hint], f.default is dataclasses.MISSING))
    return tuple(members)


def shard_template(axes: Sequence[str], widths: Mapping[str, int]) -> str:
    """The ``%``-format of one shard object whose members have these column ``widths``
    (a member without columns is left out: hardware plans' ``slice``, ...), written in
    :class:`~datarax.answers.plans.Shard`'s order.

    Raises:
      ValueError: a required member without columns, or columns of no member.
    """
    parts = []
    for name, kind, required in _shard_members():
        if name not in widths:
            if required:
                raise ValueError(f"a shard needs columns for its {name!r}")
            continue
        parts.append(_json_key(name) + kind.format(axes, widths[name]))
    unknown = set(widths) - {name for name, _, _ in _shard_members()}
    if unknown:
        raise ValueError(f"a shard has no member {sorted(unknown)}")
    return "{" + ",".join(parts) + "}"


SHARD_ROWS_PER_CHECK = 16_384
"""Shards written between two ``should_stop`` checks (~20 ms of work)."""


def _stop_if(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise PlanCancelled("the plan was abandoned")


class ShardColumns(Sequence[Shard]):
    """A plan's shards as int64 columns: ``columns[name]`` holds member ``name`` of every
    shard (``[n]``, or ``[n, width]`` for a list or an object), in mesh order. A
    ``Sequence`` of :class:`~datarax.answers.plans.Shard` (indexing builds one), whose
    JSON :meth:`write` makes with one ``%``-format per row (:func:`shard_template`).

    Args:
      axes: the mesh's axis names (the keys of ``coords``).
      columns: member name -> its column(s), each with one row per device.
    """

    def __init__(self, axes: Sequence[str], columns: Mapping[str, np.ndarray]) -> None:
        self.axes = tuple(axes)
        self.columns = {
            name: np.asarray(column, np.int64).reshape(len(column), -1)
            if column.ndim == 1
            else np.asarray(column, np.int64)
            for name, column in columns.items()
        }
        self.template = shard_template(
            self.axes, {name: c.shape[1] for name, c in self.columns.items()}
        )
        self.text: str | None = None

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    @overload
    def __getitem__(self, index: int) -> Shard: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Shard]: ...

    def __getitem__(self, index: int | slice) -> Shard | Sequence[Shard]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        values = {
            name: kind.read(self.axes, self.columns[name][index].tolist())
            for name, kind, _ in _shard_members()
            if name in self.columns
        }
        return Shard(**values)

    def __iter__(self) -> Iterator[Shard]:
        return (self[i] for i in range(len(self)))

    def write(self, should_stop: Callable[[], bool] | None = None) -> str:
        """The ``shards`` JSON array (written once, then kept). ``should_stop`` is checked
        every :data:`SHARD_ROWS_PER_CHECK` shards.

        Raises:
          PlanCancelled: ``should_stop`` answered true.
        """
        if self.text is not None:
            return self.text
        order = [name for name, _, _ in _shard_members() if name in self.columns]
        table = np.concatenate([self.columns[name] for name in order], axis=1)
        template = self.template
        parts: list[str] = []
        for start in range(0, len(table), SHARD_ROWS_PER_CHECK):
            _stop_if(should_stop)
            rows = table[start : start + SHARD_ROWS_PER_CHECK].tolist()
            parts.extend(template % tuple(row) for row in rows)
        self.text = "[" + ",".join(parts) + "]"
        return self.text


class DeviceGrid(Sequence[Any]):
    """A plan's ``device_grid``: the device ids shaped like the mesh (int64), read as the
    nested lists of its JSON and written by orjson from the array."""

    def __init__(self, grid: np.ndarray) -> None:
        self.grid = np.ascontiguousarray(grid, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.grid)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        return self.grid[index].tolist()

    def json(self) -> bytes:
        """The JSON array."""
        return orjson.dumps(self.grid, option=orjson.OPT_SERIALIZE_NUMPY)


def _device_columns(devices: Devices, rows: int | None = None) -> dict[str, np.ndarray]:
    """The shards' columns that the devices give (``rows``: the first ones only)."""
    columns: dict[str, np.ndarray | None] = {
        "device": devices.ids,
        "process_index": devices.process_index,
    }
    if devices.physical is not None:
        columns.update(
            slice=devices.slice_index,
            host=devices.host_index,
            physical=devices.physical,
            core=devices.core,
        )
    return {
        name: np.asarray(column)[:rows] for name, column in columns.items() if column is not None
    }


def _batch_columns(
    axes: Mapping[str, int], spec: Sequence[Any] | None, batch_shape: Sequence[int] | None
) -> dict[str, np.ndarray]:
    """The shards' columns that the mesh and the batch give: every device's coordinates,
    its ``[start, stop)`` of every batch dimension (``index`` equals ``NamedSharding(mesh,
    P(*spec)).devices_indices_map(batch_shape)``) and its ``replica`` (the devices holding
    the same slice numbered in mesh order)."""
    coords = device_coords(axes)
    n = coords.shape[0]
    if batch_shape is None:
        ranges = np.zeros((n, 0), dtype=np.int64)
        replicas = np.arange(n, dtype=np.int64)  # no batch: every device holds "the same" []
    else:
        if spec is None:
            raise ValueError("a batch shape needs its partition spec")
        ranges = shard_index_ranges(axes, spec, batch_shape).reshape(n, 2 * len(batch_shape))
        replicas = replica_ids(axes, spec, shape=batch_shape)
    return {"coords": coords, "index": ranges, "replica": replicas}


def shard_columns(
    axes: Mapping[str, int],
    devices: Devices,
    spec: Sequence[Any] | None,
    batch_shape: Sequence[int] | None,
) -> ShardColumns:
    """The plan's shards, one per device in mesh order, as columns (nothing written)."""
    return ShardColumns(
        list(axes), {**_device_columns(devices), **_batch_columns(axes, spec, batch_shape)}
    )


def plan_size_floor(
    axes: Mapping[str, int], devices: Devices, ndim: int, name: str | None = None
) -> int:
    """Bytes a plan's text has at least: its shards' fixed characters (keys, the axis
    names of ``coords``, punctuation; one digit per number) for every device, plus the
    device grid. Cheap (the shards' format is that of a one-device sample of the same
    axes, batch rank and device members; no shard is written), so an oversized plan is
    refused before it is built."""
    one = dict.fromkeys(axes, 1)
    sample = ShardColumns(
        list(axes),
        {
            **_device_columns(devices, rows=1),
            **_batch_columns(one, [None] * ndim if ndim else None, [1] * ndim if ndim else None),
        },
    )
    per_shard = len(sample.template.replace("%d", "0")) + 1
    n = math.prod(int(s) for s in axes.values())
    return n * (per_shard + 2) + len(name or "")


# ------------------------------------------------------------------------------ the plan


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
class RenderedPlan:
    """A plan's JSON text, and its summary's (every member but ``device_grid`` and
    ``shards``)."""

    body: str
    summary: str


def plan_answer(
    request: PlanRequest,
    axes: Mapping[str, int],
    devices: Devices,
    *,
    plan_id: str,
    created_at: str,
    params: list[ParamLayout] | None = None,
    memory: MemoryEstimate | None = None,
    should_stop: Callable[[], bool] | None = None,
    max_bytes: int | None = None,
    program: Literal["datarax", "maxtext"] = "datarax",
) -> MeshPlan:
    """The plan (see docs/API.md for its members), its shards as columns not yet written.
    ``program``: what ``memory_per_device`` prices without a step estimate (DESIGN v1.4:
    ``maxtext`` for hardware plans, ``datarax`` for live and abstract plans).

    Args:
      request: what was asked for.
      axes: resolved axes (no ``-1``), in mesh order.
      devices: the plan's devices in row-major mesh order.
      plan_id: the plan's id.
      created_at: RFC 3339 UTC timestamp.
      params: hardware plans with a model: the step estimate's parameter layouts, in place
        of the MLP's.
      memory: hardware plans with a model: the step estimate's memory, in place of the
        MLP's.
      should_stop: checked first; when it answers true the plan is abandoned
        (``PlanCancelled``).
      max_bytes: refuse a plan whose text would pass this many bytes
        (:func:`plan_size_floor`) before its shards are laid out
        (``DATARAX_MAX_ANSWER_MB``).

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
        batch = BatchLayout(shape=shape, spec=_json_spec(spec), shard_shape=batch_block)
        if spec[0] is None and total > 1:
            warnings.append(
                "no batch axes: the whole batch is replicated on every device "
                "(set batch_axes, or add a 'data' axis)"
            )
    elif request.batch_axes:
        # Validate the axes even without a batch, so typos surface.
        batch_partition_spec(axes, request.batch_axes, 1)

    if params is None:
        params = []
        if request.features is not None:
            params, param_warnings = param_layouts(request.features, axes, request.param_sharding)
            warnings.extend(param_warnings)
    plan_memory: MemoryEstimate | MemoryPerDevice = (
        dataclasses.replace(
            memory_per_device(params, request.optimizer, batch_block), program=program
        )
        if memory is None
        else memory
    )
    return MeshPlan(
        id=plan_id,
        name=request.name,
        created_at=created_at,
        live=devices.live,
        platform=devices.platform,
        axes=axes,
        total_devices=total,
        batch=batch,
        params=params,
        memory_per_device=plan_memory,
        warnings=warnings,
        device_grid=DeviceGrid(devices.grid),
        shards=shard_columns(axes, devices, spec, request.batch_shape),
    )


def _columnar_json(value: object) -> orjson.Fragment:
    """orjson's ``default``: the JSON of the columnar sequences a plan holds."""
    if isinstance(value, ShardColumns):
        return orjson.Fragment(value.write())
    if isinstance(value, DeviceGrid):
        return orjson.Fragment(value.json())
    raise TypeError(f"{type(value).__name__} is not JSON")


def answer_text(answer: MeshPlanSummary) -> str:
    """A plan's (or a summary's) JSON text: its :meth:`~datarax.answers.base.Answer.to_json`
    through orjson, the columnar shards and grid spliced in."""
    return orjson.dumps(answer.to_json(), default=_columnar_json).decode()


def render(plan: MeshPlan, should_stop: Callable[[], bool] | None = None) -> RenderedPlan:
    """The plan's JSON text and its summary's.

    Raises:
      PlanCancelled: ``should_stop`` answered true while the shards were written.
    """
    if isinstance(plan.shards, ShardColumns):
        plan.shards.write(should_stop)  # checked between chunks; then kept for the text
    return RenderedPlan(body=answer_text(plan), summary=answer_text(plan.summary()))


def render_plan(
    request: PlanRequest,
    axes: Mapping[str, int],
    devices: Devices,
    *,
    plan_id: str,
    created_at: str,
    should_stop: Callable[[], bool] | None = None,
    max_bytes: int | None = None,
) -> RenderedPlan:
    """A live or abstract plan as compact JSON text: :func:`plan_answer`, then
    :func:`render` (hardware plans: :func:`app.services.hardware.render_hardware_plan`).

    Raises:
      PlanError: ``batch_not_divisible``, ``unknown_batch_axis``, ``duplicate_batch_axis``,
        ``invalid_batch_shape``.
      AnswerTooLarge: the plan would pass ``max_bytes``.
      PlanCancelled: ``should_stop`` answered true.
    """
    plan = plan_answer(
        request,
        axes,
        devices,
        plan_id=plan_id,
        created_at=created_at,
        should_stop=should_stop,
        max_bytes=max_bytes,
    )
    return render(plan, should_stop)
