"""A decoded :class:`~app.services.jobs.decode.JobBatch` -> the rows to store
(:class:`app.storage.jobs.PushBatch`): complete steps reduced (grouped and stacked where
points share their shapes), parts packed for the merge, digests attached.

Columns of unweighted float64 ``[P, n_devices]`` metrics with NaN policy ``propagate``
(the usual batch) are reduced in one library call and their texts built from whole
columns; any other batch point by point, with the same values, digests and texts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson

from app.codecs.json_arrays import encode_json
from app.core.errors import InvalidParameter, ServiceError, from_library
from app.services.jobs.decode import BatchColumns, JobBatch, PointInput
from app.services.jobs.digests import part_signature, point_digest, point_digests
from app.services.jobs.spread import point_spread, spread_columns
from app.services.metric_inputs import WEIGHTS_ARRAY, library_options, num_devices_of
from app.storage.jobs import PointColumns, PushBatch, PushItem
from app.storage.part_blobs import encode_part
from app.storage.parts import PartSegment
from app.storage.reduced_text import object_texts, scalar_floats
from app.storage.spreads import encode_rows
from datarax.errors import MetricsError
from datarax.metrics.reductions import REDUCE_OPS, reduce_custom


def _library(point: PointInput, err: MetricsError) -> ServiceError:
    error = from_library(err)
    where = "" if point.index is None else f"points[{point.index}]: "
    error.detail = where + error.detail
    return error


def _reduce_one(point: PointInput) -> tuple[str, dict[str, float]]:
    ops, nan_policy = library_options(point.reduce, point.nan_policy)
    try:
        reduced = reduce_custom(point.metrics, ops, weights=point.weights, nan_policy=nan_policy)
    except MetricsError as err:
        raise _library(point, err) from None
    return encode_json(reduced).decode(), scalar_floats(reduced)


def _vector_key(point: PointInput) -> tuple[Any, ...] | None:
    """Points with the same key reduce together, stacked (unweighted, propagate, JSON's
    int64/float64 arrays): one library call for the whole group, the same values."""
    if point.weights is not None or point.nan_policy != "propagate" or point.sources != 1:
        return None
    if not point.metrics:  # refused point by point (empty_metrics), as a single push is
        return None
    key = []
    for name, array in point.metrics.items():
        if array.dtype.kind not in "if" or array.dtype.itemsize != 8:
            return None
        key.append((name, array.shape, array.dtype.char, point.reduce.get(name, "mean")))
    if any(name not in point.metrics for name in point.reduce):
        return None
    return tuple(key)


def _reduce_group(points: Sequence[PointInput]) -> list[tuple[str, dict[str, float]]]:
    first = points[0]
    stacked: dict[str, np.ndarray] = {}
    scalars: list[str] = []
    for name, array in first.metrics.items():
        if array.ndim == 0:
            scalars.append(name)
            continue
        # [P, D, ...] -> [D, P, ...]: the device axis leads, as the library reduces it.
        stacked[name] = np.moveaxis(np.stack([p.metrics[name] for p in points]), 0, 1)
    columns: dict[str, list[Any]] = {}
    if stacked:
        ops, _ = library_options({k: first.reduce.get(k, "mean") for k in stacked}, "propagate")
        reduced = reduce_custom(stacked, ops)
        columns = {name: np.asarray(value).tolist() for name, value in reduced.items()}
    out = []
    names = list(first.metrics)
    for i, point in enumerate(points):
        values = {
            name: (point.metrics[name].item() if name in scalars else columns[name][i])
            for name in names
        }
        text = orjson.dumps(values).decode()  # NaN and inf -> null, as encode_json
        out.append((text, {k: float(v) for k, v in values.items() if type(v) in (int, float)}))
    return out


def _complete(point: PointInput, text: str, values: dict[str, float]) -> PushItem:
    return PushItem(
        step=point.step,
        source=point.source,
        sources=1,
        digest=point.digest,
        num_devices=num_devices_of(point.metrics),
        reduced=text,
        values=values,
        spread=point_spread(point.metrics),
    )


def build_items(points: Sequence[PointInput]) -> list[PushItem]:
    """Reduces complete points (grouped, stacked) and packs parts: the rows to store.

    Raises:
      ServiceError: the library's metric codes, naming the point.
    """
    items: list[PushItem | None] = [None] * len(points)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, point in enumerate(points):
        point.digest = point_digest(point)
        key = _vector_key(point)
        if key is not None:
            groups.setdefault(key, []).append(i)
    done: set[int] = set()
    for members in groups.values():
        if len(members) < 2:
            continue
        try:
            results = _reduce_group([points[i] for i in members])
        except MetricsError:
            continue  # the per-point path below names the point at fault
        for i, (text, values) in zip(members, results, strict=True):
            items[i] = _complete(points[i], text, values)
            done.add(i)
    for i, point in enumerate(points):
        if i in done:
            continue
        if point.sources == 1:
            items[i] = _complete(point, *_reduce_one(point))
            continue
        _reduce_one(point)  # a part must reduce on its own (weights, ops, NaN policy)
        arrays = dict(point.metrics)
        if WEIGHTS_ARRAY in arrays:
            raise InvalidParameter(
                ["body", "metrics", WEIGHTS_ARRAY], "the name _weights is reserved for weights"
            )
        if point.weights is not None:
            arrays[WEIGHTS_ARRAY] = point.weights
        items[i] = PushItem(
            step=point.step,
            source=point.source,
            sources=point.sources,
            digest=point.digest,
            num_devices=num_devices_of(point.metrics),
            signature=part_signature(point.metrics, point.reduce, point.nan_policy),
            arrays=encode_part(arrays),
        )
    return [item for item in items if item is not None]


def _column_rows(batch: BatchColumns) -> PushBatch | None:
    """The rows of plain columns (:meth:`BatchColumns.plain`), exactly those
    :func:`build_items` gives for the same points (same digests, signature, stored part
    bytes, and reduced text: the library's stacked reduce, as :func:`_reduce_group`).
    None where the point-by-point path must decide (a single point, ops naming other
    metrics, a reduce error: it names the point)."""
    steps, names, ops = batch.steps, tuple(batch.arrays), batch.reduce
    columns: Mapping[str, np.ndarray] = batch.arrays
    if len(steps) < 2 or not ops.keys() <= set(names):
        return None
    if batch.sources > 1 and WEIGHTS_ARRAY in names:
        return None
    stacked = {k: v.T for k, v in columns.items() if v.ndim == 2}  # [D, P]: devices lead
    if not stacked or any(v.shape[0] == 0 for v in stacked.values()):
        return None
    devices = next(v.shape[1] for v in columns.values() if v.ndim == 2)
    if batch.sources > 1:
        # One source's parts of the batch: stored as they are, one segment (no object,
        # digest or row per part). Not reduced here: float64 [P, D > 0] parts with known
        # ops and NaN policy propagate cannot fail a reduction, which happens at the merge.
        if not set(ops.values()) <= set(REDUCE_OPS):
            return None
        segment = PartSegment(
            source=batch.source,
            sources=batch.sources,
            signature=part_signature({k: v[0] for k, v in columns.items()}, ops, "propagate"),
            num_devices=devices,
            steps=list(steps),
            columns={k: columns[k] for k in names},
        )
        return PushBatch(parts=segment)
    try:
        every, _ = library_options({k: ops.get(k, "mean") for k in stacked}, "propagate")
        reduced = reduce_custom(stacked, every)
    except MetricsError:
        return None
    digests = point_digests(names, columns, None, ops, "propagate")
    spreads = spread_columns(columns, len(steps))
    values = {
        k: np.asarray(reduced[k] if k in reduced else columns[k], dtype=np.float64) for k in names
    }
    texts = object_texts(names, [values[k] for k in names])
    point_columns = PointColumns(
        steps=list(steps),
        digests=digests,
        reduced=texts,
        values=values,
        num_devices=devices,
        source=batch.source,
        spread_rows=encode_rows(spreads, len(steps)),
        spread_columns=spreads,
    )
    return PushBatch(columns=point_columns)


def rows_of(batch: JobBatch) -> PushBatch:
    """The rows a decoded push stores.

    Raises:
      ServiceError: the library's metric codes (naming the point), ``invalid_tensor``,
        ``validation_error`` (a part's metric named ``_weights``).
    """
    columns = batch.columns
    if columns is None:
        return PushBatch(items=build_items(batch.points))
    rows = _column_rows(columns) if columns.plain() else None
    return rows if rows is not None else PushBatch(items=build_items(columns.points()))
