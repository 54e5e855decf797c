"""Pure mesh planning: axis resolution, batch specs and per-device slices, in numpy only.

Nothing here touches a device, so a plan for a 65,536-device cluster is computed on a
laptop. Every per-device quantity is one vectorised numpy expression over the device
list (no per-device Python loop).

Conventions shared by all functions:

- ``axes`` is an ordered mapping ``{axis name: size}``; the mesh's devices are numbered
  row-major over it (the first axis is the slowest), which is ``mesh.devices.flat`` order
  for a ``jax.sharding.Mesh`` with the same axis order.
- ``spec`` is a per-dimension sequence, like the entries of ``PartitionSpec(*spec)``:
  each entry is ``None`` (that dimension is not split), an axis name, or a tuple of axis
  names, which splits the dimension major-to-minor: shard index
  ``c[a1] * size(a2) + c[a2]`` for the entry ``(a1, a2)``. Dimensions past
  ``len(spec)`` are not split. A ``PartitionSpec`` itself is accepted.

Indivisible dimensions: JAX (0.12) refuses them. ``NamedSharding.devices_indices_map``
and ``jax.device_put`` raise ``IndivisibleError`` when a split dimension's size is not a
multiple of its shard count (there are no ceil-sized or padded last chunks), so every
function here that needs a concrete shape raises ``PlanError("batch_not_divisible")``
instead, naming the nearest valid sizes. A dimension of size 0 is divisible by any
shard count; every device then holds the empty range ``[0, 0)``.

Example:
  >>> axes = resolve_axes({"data": -1, "model": 4}, 8)
  >>> axes
  {'data': 2, 'model': 4}
  >>> spec = batch_partition_spec(axes, None, 2)
  >>> spec
  ('data', None)
  >>> shard_index_ranges(axes, spec, (256, 1024))[4].tolist()
  [[128, 256], [0, 1024]]
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import TypeGuard

import numpy as np

from datarax.errors import PlanError

__all__ = [
    "MAX_AXIS_NAME_LENGTH",
    "MAX_BATCH_ELEMENTS",
    "AxesLike",
    "SpecEntry",
    "PlanCancelled",
    "PlanError",
    "batch_partition_spec",
    "check_batch_shape",
    "check_divisible",
    "device_coords",
    "mesh_device_ids",
    "nearest_valid_sizes",
    "replica_ids",
    "resolve_axes",
    "shard_index_ranges",
    "shard_shape",
    "spec_shard_counts",
]

type SpecEntry = str | tuple[str, ...] | None
"""One ``PartitionSpec`` entry: no axis, one axis name, or several."""

AxesLike = Mapping[str, int] | Sequence[tuple[str, int]]
"""Ordered mesh axes: ``{"data": 2, "model": 4}`` or ``[("data", 2), ("model", 4)]``."""

_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

MAX_AXIS_NAME_LENGTH = 64
"""Longest axis name: a plan repeats every name in each device's ``coords``, so a plan's size
grows with the names' lengths times the device count (a 10 KB name made a 330 MB plan)."""

MAX_BATCH_ELEMENTS = 2**53
"""Largest batch dimension, and largest product of a batch shape's dimensions: every index
and byte count then stays exact in int64 and in a JSON double (2**53, RFC 8259's
interoperable integer range); far beyond any real global batch."""
_AUTO = -1


class PlanCancelled(Exception):
    """Work that was asked to stop (its ``should_stop`` callable answered true): the
    caller abandoned it (a client gone, a service shutting down). Not a ``PlanError``:
    nothing is wrong with the plan."""


# ---------------------------------------------------------------------------- validation


def _is_int(value: object) -> TypeGuard[int | np.integer]:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _axes_items(axes: AxesLike) -> list[tuple[object, object]]:
    """Returns ``axes`` as a list of (name, size) pairs, checking only the container."""
    if isinstance(axes, Mapping):
        return [(name, size) for name, size in axes.items()]
    if isinstance(axes, str | bytes) or not isinstance(axes, Sequence):
        raise PlanError(
            "invalid_axis_name",
            f"axes must be a mapping such as {{'data': 2, 'model': 4}} or a list of "
            f"(name, size) pairs, got {axes!r}",
        )
    items: list[tuple[object, object]] = []
    for entry in axes:
        if isinstance(entry, str | bytes) or not isinstance(entry, Sequence) or len(entry) != 2:
            raise PlanError(
                "invalid_axis_name",
                f"axes entry {entry!r} is not a (name, size) pair; "
                f"write axes as [('data', 2), ('model', 4)] or {{'data': 2, 'model': 4}}",
            )
        items.append((entry[0], entry[1]))
    return items


def _check_names(names: Sequence[object]) -> list[str]:
    """The names, checked: distinct identifiers of at most ``MAX_AXIS_NAME_LENGTH``."""
    if not names:
        raise PlanError(
            "invalid_axis_name", "axes is empty; give at least one axis, e.g. {'data': -1}"
        )
    seen: set[str] = set()
    checked: list[str] = []
    for name in names:
        if isinstance(name, str) and len(name) > MAX_AXIS_NAME_LENGTH:
            raise PlanError(
                "invalid_axis_name",
                f"axis name {name[:20]!r}... has {len(name)} characters; at most "
                f"{MAX_AXIS_NAME_LENGTH} are allowed",
            )
        if not isinstance(name, str) or not _AXIS_NAME.match(name):
            raise PlanError(
                "invalid_axis_name",
                f"axis name {name!r} is not a Python identifier; use letters, digits and "
                f"underscores, not starting with a digit (e.g. 'data', 'model')",
            )
        if name in seen:
            raise PlanError(
                "invalid_axis_name",
                f"axis name {name!r} appears more than once; give each axis a distinct name",
            )
        seen.add(name)
        checked.append(name)
    return checked


def _mesh_axes(axes: Mapping[str, int]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Checks already-resolved axes (no ``-1``) and returns (names, sizes)."""
    items = _axes_items(axes)
    names = _check_names([name for name, _ in items])
    sizes: list[int] = []
    for name, size in zip(names, (size for _, size in items), strict=True):
        if not _is_int(size) or size < 1:
            raise PlanError(
                "invalid_axis_size",
                f"axis {name!r} has size {size!r}; a resolved mesh needs integer sizes >= 1 "
                f"(pass the axes through resolve_axes first to fill in a -1)",
            )
        sizes.append(int(size))
    return tuple(names), tuple(sizes)


def _spec_groups(names: Sequence[str], spec: Sequence[object]) -> tuple[tuple[str, ...], ...]:
    """Normalises a spec to one tuple of axis names per entry, checking every name."""
    if isinstance(spec, str | bytes):
        raise PlanError(
            "unknown_batch_axis",
            f"spec must be a sequence with one entry per dimension, got the string {spec!r}; "
            f"write ({spec!r},) to split dimension 0 over it",
        )
    try:
        entries = tuple(spec)
    except TypeError:
        raise PlanError(
            "unknown_batch_axis",
            f"spec must be a sequence with one entry per dimension, got {spec!r}",
        ) from None
    known = set(names)
    used: set[str] = set()
    groups: list[tuple[str, ...]] = []
    for dim, entry in enumerate(entries):
        if entry is None:
            group: tuple[object, ...] = ()
        elif isinstance(entry, str):
            group = (entry,)
        elif isinstance(entry, tuple | list):
            group = tuple(entry)
        else:
            group = (entry,)
        checked: list[str] = []
        for axis in group:
            if not isinstance(axis, str) or axis not in known:
                raise PlanError(
                    "unknown_batch_axis",
                    f"spec entry {dim} names {axis!r}, which is not a mesh axis; "
                    f"use one of {list(names)}, a tuple of them, or None",
                )
            if axis in used:
                raise PlanError(
                    "duplicate_batch_axis",
                    f"mesh axis {axis!r} is used more than once in spec {entries!r}; "
                    f"each mesh axis may split at most one dimension, once",
                )
            used.add(axis)
            checked.append(axis)
        groups.append(tuple(checked))
    return tuple(groups)


def _check_shape(shape: Sequence[int], n_entries: int) -> tuple[int, ...]:
    if isinstance(shape, str | bytes) or not isinstance(shape, Sequence):
        raise PlanError(
            "invalid_batch_shape",
            f"shape must be a list of non-negative integers such as [256, 1024], got {shape!r}",
        )
    for dim, size in enumerate(shape):
        if not _is_int(size) or size < 0:
            raise PlanError(
                "invalid_batch_shape",
                f"dimension {dim} of shape {list(shape)} is {size!r}; every dimension must be "
                f"an integer >= 0",
            )
    dims = tuple(int(size) for size in shape)
    if max(dims, default=0) > MAX_BATCH_ELEMENTS or math.prod(dims) > MAX_BATCH_ELEMENTS:
        raise PlanError(
            "invalid_batch_shape",
            f"shape {_short(dims)} has {_magnitude(math.prod(dims))} elements; every dimension and "
            f"their product must be at most 2**53 ({MAX_BATCH_ELEMENTS})",
        )
    if n_entries > len(dims):
        raise PlanError(
            "invalid_batch_shape",
            f"spec has {n_entries} entries but shape {dims} has only {len(dims)} "
            f"dimensions; drop the extra spec entries or give a shape of rank >= {n_entries}",
        )
    return dims


def _magnitude(n: int) -> str:
    """``n``, or its order of magnitude (``~1e300``) when it is long."""
    digits = str(n)
    return digits if len(digits) <= 16 else f"~1e{len(digits) - 1}"


def _short(dims: Sequence[int]) -> str:
    """A shape for a message, each huge dimension cut to its order of magnitude."""
    return "[" + ", ".join(_magnitude(d) for d in dims) + "]"


def check_batch_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """Checks a batch shape on its own: integers >= 0, each and their product at most
    :data:`MAX_BATCH_ELEMENTS`.

    Raises:
      PlanError: ``invalid_batch_shape``.
    """
    return _check_shape(shape, 0)


def _group_counts(
    names: Sequence[str], sizes: Sequence[int], groups: Sequence[tuple[str, ...]]
) -> tuple[int, ...]:
    size_of = dict(zip(names, sizes, strict=True))
    return tuple(math.prod(size_of[axis] for axis in group) for group in groups)


def _raise_if_indivisible(
    dims: Sequence[int], counts: Sequence[int], groups: Sequence[tuple[str, ...]], what: str
) -> None:
    for dim, (size, count, group) in enumerate(zip(dims, counts, groups, strict=False)):
        if size % count:
            below, above = nearest_valid_sizes(size, count)
            nearest = f"size: {below}" if below == above else f"sizes: {below} or {above}"
            raise PlanError(
                "batch_not_divisible",
                f"{what} dimension {dim} of shape {tuple(dims)} is split into {count} shards; "
                f"{size} is not divisible by {count}; nearest valid {nearest} "
                f"(split over mesh axes {', '.join(group)})",
            )


# ------------------------------------------------------------------------------ public API


def resolve_axes(axes: AxesLike, num_devices: int, *, exact: bool = True) -> dict[str, int]:
    """Validates mesh axes and fills in the one ``-1`` axis, if any.

    Args:
      axes: ordered axes, ``{"data": -1, "model": 4}`` or ``[("data", -1), ("model", 4)]``.
        Names are unique Python identifiers; sizes are ints >= 1, or ``-1`` for at most one
        axis, which takes ``num_devices // prod(other sizes)``.
      num_devices: devices the plan is for (``exact=True``) or available (``exact=False``).
      exact: ``True`` for an abstract plan of exactly ``num_devices`` devices;
        ``False`` for a live plan that may use the first ``prod(sizes)`` of them.

    Returns:
      A new ordered dict ``{name: size}`` of plain ints, in the order given.

    Raises:
      PlanError: ``invalid_axis_name``, ``invalid_axis_size``, ``invalid_device_count``,
        ``multiple_auto_axes``, ``axes_product_mismatch`` (a ``-1`` that the other axes
        cannot fill, or an exact plan whose product is not ``num_devices``) or
        ``not_enough_devices`` (a live plan needing more than ``num_devices``).

    Example:
      >>> resolve_axes([("data", -1), ("model", 2)], 8)
      {'data': 4, 'model': 2}
      >>> resolve_axes({"model": 4}, 8, exact=False)
      {'model': 4}
    """
    if not _is_int(num_devices) or num_devices < 1:
        raise PlanError(
            "invalid_device_count",
            f"num_devices is {num_devices!r}; it must be an integer >= 1",
        )
    num_devices = int(num_devices)
    items = _axes_items(axes)
    names = _check_names([name for name, _ in items])
    resolved: dict[str, int] = {}
    for name, size in zip(names, (size for _, size in items), strict=True):
        if not _is_int(size) or (size < 1 and size != _AUTO):
            raise PlanError(
                "invalid_axis_size",
                f"axis {name!r} has size {size!r}; sizes must be integers >= 1, or -1 for one "
                f"axis that takes the devices the others leave",
            )
        resolved[name] = int(size)
    auto = [name for name, size in resolved.items() if size == _AUTO]
    if len(auto) > 1:
        raise PlanError(
            "multiple_auto_axes",
            f"axes {', '.join(map(repr, auto))} are all -1; at most one axis may be -1 "
            f"(it takes the devices the others leave), give the others explicit sizes",
        )
    if auto:
        others = math.prod(size for name, size in resolved.items() if name != auto[0])
        if num_devices % others or num_devices < others:
            raise PlanError(
                "axes_product_mismatch",
                f"axis {auto[0]!r} is -1 but the other axes multiply to {others}, which does "
                f"not divide {num_devices} devices; make the other sizes multiply to a "
                f"divisor of {num_devices}",
            )
        resolved[auto[0]] = num_devices // others
    needed = math.prod(resolved.values())
    if exact and needed != num_devices:
        raise PlanError(
            "axes_product_mismatch",
            f"mesh {resolved} uses {needed} devices but the plan is for exactly "
            f"{num_devices}; make the sizes multiply to {num_devices} or set one axis to -1",
        )
    if needed > num_devices:
        raise PlanError(
            "not_enough_devices",
            # "Not enough devices" is upstream datarax's wording; code matching it keeps working.
            f"Not enough devices: mesh {resolved} needs {needed} devices but only "
            f"{num_devices} are available",
        )
    return resolved


def batch_partition_spec(
    axes: Mapping[str, int], batch_axes: Sequence[str] | None, ndim: int
) -> tuple[SpecEntry, ...]:
    """The spec of a batch whose dimension 0 is split over ``batch_axes``.

    Args:
      axes: resolved mesh axes ``{name: size}``.
      batch_axes: mesh axes splitting dimension 0, major-to-minor. ``None`` means
        ``["data"]`` when the mesh has a ``data`` axis, else ``[]`` (replicated). A bare
        string is taken as one axis name.
      ndim: rank of the batch, >= 1.

    Returns:
      A tuple of length ``ndim`` usable as ``PartitionSpec(*spec)``: entry 0 is ``None``
      (no batch axes), the axis name (one) or a tuple of names (several); the rest are
      ``None``. E.g. ``("data", None)`` or ``(("data", "fsdp"), None)``.

    Raises:
      PlanError: ``unknown_batch_axis``, ``duplicate_batch_axis`` or
        ``invalid_batch_shape`` (``ndim < 1``).
    """
    names, _ = _mesh_axes(axes)
    if not _is_int(ndim) or ndim < 1:
        raise PlanError(
            "invalid_batch_shape",
            f"batch rank is {ndim!r}; a batch needs at least one dimension (the batch "
            f"dimension that batch_axes split)",
        )
    if batch_axes is None:
        chosen: tuple[str, ...] = ("data",) if "data" in names else ()
    elif isinstance(batch_axes, str):
        chosen = (batch_axes,)
    else:
        chosen = tuple(batch_axes)
    for axis in chosen:
        if not isinstance(axis, str) or axis not in names:
            raise PlanError(
                "unknown_batch_axis",
                f"batch axis {axis!r} is not a mesh axis; use some of {list(names)}",
            )
    if len(set(chosen)) != len(chosen):
        raise PlanError(
            "duplicate_batch_axis",
            f"batch_axes {list(chosen)} repeat an axis; list each mesh axis at most once",
        )
    first = None if not chosen else chosen[0] if len(chosen) == 1 else chosen
    return (first,) + (None,) * (int(ndim) - 1)


def spec_shard_counts(axes: Mapping[str, int], spec: Sequence[object]) -> tuple[int, ...]:
    """Number of shards each spec entry splits its dimension into.

    Args:
      axes: resolved mesh axes ``{name: size}``.
      spec: per-dimension entries (``None``, a name or a tuple of names).

    Returns:
      One int per spec entry: the product of its axes' sizes (1 for ``None``).

    Raises:
      PlanError: ``unknown_batch_axis`` or ``duplicate_batch_axis``.
    """
    names, sizes = _mesh_axes(axes)
    return _group_counts(names, sizes, _spec_groups(names, spec))


def nearest_valid_sizes(size: int, shards: int) -> tuple[int, int]:
    """The multiples of ``shards`` nearest to ``size``, below and above.

    Args:
      size: a dimension size, >= 0.
      shards: the shard count splitting it, >= 1.

    Returns:
      ``(below, above)``: the largest multiple of ``shards`` that is ``<= size`` (but at
      least ``shards``) and the smallest that is ``>= size`` (but at least ``shards``).
      Both equal ``size`` when it is already a positive multiple; ``(shards, shards)`` when
      ``size <= shards``. E.g. ``nearest_valid_sizes(250, 8) == (248, 256)``.

    Raises:
      ValueError: a negative size or a shard count below 1.
    """
    if not _is_int(size) or size < 0:
        raise ValueError(f"size is {size!r}; it must be an integer >= 0")
    if not _is_int(shards) or shards < 1:
        raise ValueError(f"shards is {shards!r}; it must be an integer >= 1")
    below = max(shards, size // shards * shards)
    above = max(shards, -(-size // shards) * shards)
    return int(below), int(above)


def shard_shape(
    axes: Mapping[str, int], spec: Sequence[object], shape: Sequence[int], *, what: str = "batch"
) -> tuple[int, ...]:
    """The shape of the block each device holds.

    Args:
      axes: resolved mesh axes ``{name: size}``.
      spec: per-dimension entries, ``len(spec) <= len(shape)``.
      shape: the global shape.
      what: what the array is, for error messages (``"batch"``, ``"parameter"``).

    Returns:
      ``shape`` with every split dimension divided by its shard count.

    Raises:
      PlanError: as :func:`check_divisible`.
    """
    names, sizes = _mesh_axes(axes)
    groups = _spec_groups(names, spec)
    dims = _check_shape(shape, len(groups))
    counts = _group_counts(names, sizes, groups)
    _raise_if_indivisible(dims, counts, groups, what)
    split = tuple(size // count for size, count in zip(dims, counts, strict=False))
    return split + dims[len(split) :]


def check_divisible(
    axes: Mapping[str, int], spec: Sequence[object], shape: Sequence[int], *, what: str = "batch"
) -> None:
    """Checks that every split dimension of ``shape`` divides evenly, as JAX requires.

    Args:
      axes: resolved mesh axes ``{name: size}``.
      spec: per-dimension entries, ``len(spec) <= len(shape)``.
      shape: the global shape, integers >= 0.
      what: what the array is, for error messages (``"batch"``, ``"parameter"``).

    Raises:
      PlanError: ``batch_not_divisible`` naming the dimension, shape, shard count and
        nearest valid sizes, e.g. "batch dimension 0 of shape (250, 1024) is split into
        8 shards; 250 is not divisible by 8; nearest valid sizes: 248 or 256 (...)";
        ``invalid_batch_shape`` (bad shape, or more spec entries than dimensions);
        ``unknown_batch_axis``; ``duplicate_batch_axis``.
    """
    shard_shape(axes, spec, shape, what=what)


def mesh_device_ids(axes: Mapping[str, int]) -> np.ndarray:
    """Device ids of an abstract plan, numbered row-major.

    Args:
      axes: resolved mesh axes ``{name: size}``.

    Returns:
      int64 array of shape ``tuple(axes.values())``: ``np.arange(n).reshape(sizes)``.
    """
    _, sizes = _mesh_axes(axes)
    return np.arange(math.prod(sizes), dtype=np.int64).reshape(sizes)


def device_coords(axes: Mapping[str, int]) -> np.ndarray:
    """Every device's coordinate along every mesh axis.

    Args:
      axes: resolved mesh axes ``{name: size}``.

    Returns:
      int64 ``[n_devices, n_axes]``; row ``i`` is the coordinate of the ``i``-th device in
      row-major mesh order (``mesh.devices.flat`` order), column ``j`` is axis ``j``.
    """
    _, sizes = _mesh_axes(axes)
    flat = np.arange(math.prod(sizes), dtype=np.int64)
    coords = np.unravel_index(flat, sizes)
    return np.stack(coords, axis=1).astype(np.int64, copy=False)


def _mixed_radix(coords: np.ndarray, columns: Sequence[int], sizes: Sequence[int]) -> np.ndarray:
    """Row-major index of ``coords[:, columns]`` in a grid of ``sizes[columns]``."""
    strides = np.ones(len(columns), dtype=np.int64)
    for k in range(len(columns) - 2, -1, -1):
        strides[k] = strides[k + 1] * sizes[columns[k + 1]]
    return coords[:, list(columns)] @ strides


def shard_index_ranges(
    axes: Mapping[str, int], spec: Sequence[object], shape: Sequence[int], *, what: str = "batch"
) -> np.ndarray:
    """The ``[start, stop)`` range of every dimension each device holds.

    Equals ``NamedSharding(mesh, PartitionSpec(*spec)).devices_indices_map(shape)`` for a
    mesh with these axes, taking devices in ``mesh.devices.flat`` order (a dimension that
    is not split, JAX's ``slice(None)``, is ``[0, dim]``).

    Args:
      axes: resolved mesh axes ``{name: size}``.
      spec: per-dimension entries, ``len(spec) <= len(shape)``.
      shape: the global shape, integers >= 0.
      what: what the array is, for error messages.

    Returns:
      int64 ``[n_devices, len(shape), 2]``: ``[..., 0]`` start, ``[..., 1]`` stop.

    Raises:
      PlanError: as :func:`check_divisible` (JAX raises ``IndivisibleError`` for an
        indivisible split dimension; so does this, as ``batch_not_divisible``).
    """
    names, sizes = _mesh_axes(axes)
    groups = _spec_groups(names, spec)
    dims = _check_shape(shape, len(groups))
    counts = _group_counts(names, sizes, groups)
    _raise_if_indivisible(dims, counts, groups, what)
    coords = device_coords(axes)
    n_devices = coords.shape[0]
    ranges = np.zeros((n_devices, len(dims), 2), dtype=np.int64)
    ranges[:, :, 1] = dims
    column = {name: j for j, name in enumerate(names)}
    for dim, (group, count) in enumerate(zip(groups, counts, strict=False)):
        if not group:
            continue
        chunk = dims[dim] // count
        start = _mixed_radix(coords, [column[axis] for axis in group], sizes) * chunk
        ranges[:, dim, 0] = start
        ranges[:, dim, 1] = start + chunk
    return ranges


def replica_ids(
    axes: Mapping[str, int], spec: Sequence[object], *, shape: Sequence[int] | None = None
) -> np.ndarray:
    """Each device's rank among the devices that hold the same slice.

    Matches ``Shard.replica_id`` of ``jax.device_put(x, NamedSharding(mesh, P(*spec)))``:
    the devices holding one slice are numbered in mesh order, which is row-major over the
    mesh axes that ``spec`` does not use.

    Args:
      axes: resolved mesh axes ``{name: size}``.
      spec: per-dimension entries.
      shape: optional global shape. JAX numbers replicas by equal index, so a split
        dimension of size 0 (every device holds ``[0, 0)``) counts as unsplit; pass the
        shape to get that right. Without it every split dimension is assumed non-empty.

    Returns:
      int64 ``[n_devices]``, in row-major mesh order, from 0 to
      ``n_devices // prod(sizes of spec axes) - 1``.

    Raises:
      PlanError: ``unknown_batch_axis``, ``duplicate_batch_axis``; with ``shape``, also
        as :func:`check_divisible`.
    """
    names, sizes = _mesh_axes(axes)
    groups = _spec_groups(names, spec)
    if shape is not None:
        dims = _check_shape(shape, len(groups))
        _raise_if_indivisible(dims, _group_counts(names, sizes, groups), groups, "batch")
        groups = tuple(group if dims[dim] else () for dim, group in enumerate(groups))
    used = {axis for group in groups for axis in group}
    free = [j for j, name in enumerate(names) if name not in used]
    return _mixed_radix(device_coords(axes), free, sizes)
