"""Job metric history as plain functions: push points (single, batch, multi-source parts),
read pages or downsampled buckets, list, finish, delete, expire. No HTTP here.

Rules (DESIGN.md "Job metric history at scale", "Multi-host jobs"):

- A step is written once. The same content again (same arrays, dtypes, reduce ops,
  weights and NaN policy: compared by a digest of what was pushed) is a no-op answered
  200; other content is 409 ``step_conflict``. A job retrying after a lost answer gets
  200, never a duplicate.
- ``sources > 1``: each source pushes the stacked metrics of its own devices; the step is
  stored (``complete``) when every source's part has arrived, reduced over all devices
  at once with :func:`datarax.distributed.merge.merge_parts` (sources in natural order of
  their names). Parts are rows of their own, so no push ever rewrites another's data.
- A batch is all or nothing: one transaction.

Memory and time per request: a batch holds at most 1,000 points and the body limit; a
page at most ``MAX_PAGE`` points; a downsampled read at most ``max_points`` buckets and
reads ~16 rollup rows per bucket and metric (app/storage/jobs.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import math
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import numpy as np
import orjson

from app.codecs.json_arrays import decode_json_arrays, encode_json, loads_body, validate_model
from app.codecs.media import NPZ_MEDIA_TYPE, is_json_media
from app.codecs.npz import load_npz
from app.core.errors import (
    AnswerTooLarge,
    InvalidNpz,
    InvalidParameter,
    InvalidTensor,
    JobNotFound,
    ServiceError,
    from_library,
)
from app.core.ids import utc_now
from app.core.threads import run_for_body
from app.schemas.jobs import (
    MAX_BATCH_POINTS,
    MAX_METRIC_NAME,
    MAX_SOURCES,
    MAX_STEP,
    JobBatchRequest,
    JobMetricsRequest,
)
from app.services.metrics import (
    WEIGHTS_ARRAY,
    check_stackable,
    decode_metrics_body,
    decode_weights,
    num_devices_of,
    parse_reduce_query,
)
from app.storage import jobs as store_jobs
from app.storage import parts as store_parts
from app.storage.db import Store
from app.storage.part_blobs import encode_part, row_hashes
from datarax.distributed.merge import PartialMetrics, merge_parts
from datarax.distributed.metrics import REDUCE_OPS, MetricsError, reduce_custom

log = logging.getLogger("datarax.jobs")

DEFAULT_PAGE = 1000
MAX_PAGE = store_jobs.MAX_PAGE
MAX_BUCKETS = store_jobs.MAX_BUCKETS
RETENTION_EVERY_S = 3600.0

_POINT_MEMBERS = frozenset({"metrics", "reduce", "weights", "nan_policy", "step", "source"})
_POINT_MEMBERS |= {"sources"}
_TENSOR_FIELDS = frozenset({"shape", "datatype", "data"})


# ------------------------------------------------------------------------------ decoding


@dataclass
class PointInput:
    """One decoded push: arrays of this source's devices (0-d: a value all agree on)."""

    step: int
    metrics: dict[str, np.ndarray]
    reduce: dict[str, str]
    weights: np.ndarray | None
    nan_policy: str
    source: str = ""
    sources: int = 1
    index: int | None = None  # position in a batch, for error messages
    digest: str = field(default="", init=False)


def _plain_scalar(value: Any) -> bool:
    kind = type(value)
    return kind is float or (kind is int and -(2**63) <= value < 2**64)


def _plain_point(data: Any) -> bool:
    """The point in the form the model takes unchanged (else the model gives the error)."""
    if type(data) is not dict or not data.keys() <= _POINT_MEMBERS:
        return False
    metrics = data.get("metrics")
    if type(metrics) is not dict:
        return False
    for value in metrics.values():
        if type(value) is list or _plain_scalar(value):
            continue
        if type(value) is not dict or value.keys() != _TENSOR_FIELDS:
            return False
        shape = value["shape"]
        if not (
            type(shape) is list
            and all(type(n) is int and n >= 0 for n in shape)
            and type(value["datatype"]) is str
            and type(value["data"]) is list
        ):
            return False
    step = data.get("step")
    if type(step) is not int or not 0 <= step <= MAX_STEP:
        return False
    reduce = data.get("reduce", {})
    if type(reduce) is not dict or not all(type(op) is str for op in reduce.values()):
        return False
    weights = data.get("weights")
    if weights is not None and (
        type(weights) is not list or not all(_plain_scalar(w) for w in weights)
    ):
        return False
    if type(data.get("nan_policy", "")) is not str:
        return False
    source = data.get("source", "")
    sources = data.get("sources", 1)
    return (
        type(source) is str
        and len(source) <= 128
        and all(c.isascii() and (c.isalnum() or c in "._:-") for c in source)
        and type(sources) is int
        and 1 <= sources <= MAX_SOURCES
    )


MAX_METRICS_PER_POINT = 1000
"""Metrics one job point may carry (:class:`PointLimits`). Each metric of a stored point
is a history row and a rollup row per block size, so a point's cost grows with its metric
count, not its body size: 218k tiny metrics in a 5 MiB body took 68 s and 93x the body in
memory before this cap. 1,000 is MLflow's per-call metric limit too (``log_batch``)."""


MAX_POINT_VALUES = 4096
"""Default of ``DATARAX_MAX_POINT_VALUES``: numbers one job point's reduced values may
hold, all its metrics together (a ``[n_devices, k]`` metric reduces to ``k`` numbers, a
scalar to one). A stored point is JSON text of its reduced values, so without a cap an
8 KB compressed npz of ``[1, 1000000]`` zeros stored 4 MB a point. 4,096 takes per-class
metrics of ImageNet-1k (1,000 classes) four times over."""


@dataclass(frozen=True)
class PointLimits:
    """The caps every push path checks (JSON single, JSON batch, npz single, npz batch),
    before any reduction runs: metrics per point, metric name length, and numbers per
    point after reduction (``value_too_large``)."""

    max_values: int = MAX_POINT_VALUES
    max_metrics: int = MAX_METRICS_PER_POINT
    max_name: int = MAX_METRIC_NAME
    max_answer_bytes: int | None = None
    """``DATARAX_MAX_ANSWER_MB``: a point whose JSON could pass it is refused when pushed
    (``value_too_large``), so every stored point can be read back (and its push
    answered, which echoes its values)."""


POINT_TEXT_OVERHEAD = 1024
"""Bytes of a push answer or history row besides the point's values, at most."""
NUMBER_TEXT = 25
"""Characters of one number as JSON, at most (``-1.7976931348623157e+308`` and a comma)."""


def point_text_bound(names: Sequence[str], values: int) -> int:
    """Bytes the JSON of a point of these metrics and ``values`` numbers takes, at most."""
    # The names exactly as JSON writes them (quoted, escaped, comma-separated): one call.
    text = len(orjson.dumps(list(names))) + 2 * len(names)  # and a ':' and a ',' each
    return POINT_TEXT_OVERHEAD + text + NUMBER_TEXT * values


DEFAULT_LIMITS = PointLimits()


def _where_point(index: int | None) -> str:
    return "the point" if index is None else f"point {index}"


def _check_metric_count(
    count: int, index: int | None, limits: PointLimits = DEFAULT_LIMITS
) -> None:
    if count > limits.max_metrics:
        raise ServiceError(
            f"{_where_point(index)} carries {count} metrics; a job point takes at most "
            f"{limits.max_metrics} (stack related values into one array metric instead)",
            code="too_many_metrics",
        )


def check_point_shape(
    names: Sequence[str],
    values_per_point: int,
    index: int | None,
    limits: PointLimits = DEFAULT_LIMITS,
) -> None:
    """The caps of one point (or every point of a columnar batch: they share names and
    shapes), from its metric names and how many numbers its reduced values hold.

    Raises:
      ServiceError: ``too_many_metrics``, ``metric_name_too_long``, ``value_too_large``.
    """
    _check_metric_count(len(names), index, limits)
    longest = max(names, key=len, default="")
    if len(longest) > limits.max_name:
        raise ServiceError(
            f"{_where_point(index)}: metric name {longest[:40]!r}... has {len(longest)} "
            f"characters; a metric name takes at most {limits.max_name}",
            code="metric_name_too_long",
        )
    if values_per_point > limits.max_values:
        raise ServiceError(
            f"{_where_point(index)} reduces to {values_per_point} numbers; a job point "
            f"stores at most {limits.max_values} (DATARAX_MAX_POINT_VALUES): reduce or "
            "summarise large arrays before pushing them as metrics",
            code="value_too_large",
        )
    if limits.max_answer_bytes is not None:
        bound = point_text_bound(names, values_per_point)
        if bound > limits.max_answer_bytes:
            raise ServiceError(
                f"{_where_point(index)}'s values as JSON may take {bound} bytes, above the "
                f"answer limit of {limits.max_answer_bytes} bytes (DATARAX_MAX_ANSWER_MB), "
                "so it could not be read back; send fewer or shorter-named metrics",
                code="value_too_large",
            )


def _reduced_numbers(shape: Sequence[int], lead: int) -> int:
    """Numbers a metric of ``shape`` reduces to when its first ``lead`` axes go (the
    device axis; for batch columns, the point axis too): 1 for a value per point."""
    return math.prod(shape[lead:]) if len(shape) > lead else 1


def _check_arrays(
    metrics: Mapping[str, np.ndarray], index: int | None, limits: PointLimits, lead: int = 1
) -> None:
    check_stackable(metrics, lead)  # stored stacked [P, ...]: one dimension to spare
    check_point_shape(
        list(metrics),
        sum(_reduced_numbers(np.shape(a), lead) for a in metrics.values()),
        index,
        limits,
    )


def npz_member_count(body: bytes) -> int | None:
    """Members an npz (zip) body declares, read from its end-of-central-directory record
    (O(1): no member is read or inflated), or None when the record is not found (the
    loader then gives its own error). Lets a push with 50,000 members be refused before
    the archive is opened (it took 36 s to load)."""
    tail = body[-(65535 + 22) :]
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or at + 22 > len(tail):
        return None
    count = int.from_bytes(tail[at + 10 : at + 12], "little")
    if count == 0xFFFF:  # zip64: the count is in the zip64 record; load and count
        return None
    return count


def _check_npz_members(body: bytes, limits: PointLimits, reserved: int) -> None:
    count = npz_member_count(body)
    if count is not None and count - reserved > limits.max_metrics:
        _check_metric_count(count - reserved, None, limits)


def _point_from_fields(
    fields: Mapping[str, Any], index: int | None, limits: PointLimits = DEFAULT_LIMITS
) -> PointInput:
    metrics = fields["metrics"]
    _check_metric_count(len(metrics), index, limits)  # before decoding; the rest after
    arrays: dict[str, np.ndarray] = {}
    lists: dict[str, Any] = {}
    for name, value in metrics.items():
        if _plain_scalar(value):
            arrays[name] = np.float64(value)
        else:
            lists[name] = value if not hasattr(value, "model_dump") else value.model_dump()
    arrays.update(decode_json_arrays(lists, what="metric") if lists else {})
    _check_arrays(arrays, index, limits)
    return PointInput(
        step=fields["step"],
        metrics={name: arrays[name] for name in metrics},
        reduce=dict(fields.get("reduce") or {}),
        weights=decode_weights(fields.get("weights")),
        nan_policy=fields.get("nan_policy") or "propagate",
        source=fields.get("source") or "",
        sources=fields.get("sources") or 1,
        index=index,
    )


def _model_fields(point: JobMetricsRequest) -> dict[str, Any]:
    return {
        "metrics": point.metrics,
        "reduce": point.reduce,
        "weights": point.weights,
        "nan_policy": point.nan_policy,
        "step": point.step,
        "source": point.source,
        "sources": point.sources,
    }


def decode_batch(body: bytes, limits: PointLimits = DEFAULT_LIMITS) -> list[PointInput]:
    """A batch body -> points, with the batch's ``source``/``sources`` as defaults.

    Raises:
      ServiceError: ``invalid_json``, ``validation_error`` (naming ``points.<i>.<field>``),
        ``invalid_tensor``, ``ragged_array``, ``unsupported_datatype``, and the caps of
        :class:`PointLimits`.
    """
    return _decode_batch_data(loads_body(body), limits)


def _decode_batch_data(data: Any, limits: PointLimits = DEFAULT_LIMITS) -> list[PointInput]:
    plain = (
        type(data) is dict
        and data.keys() <= {"points", "source", "sources"}
        and type(data.get("points")) is list
        and 1 <= len(data["points"]) <= MAX_BATCH_POINTS
        and all(_plain_point(point) for point in data["points"])
    )
    if plain and ("source" in data or "sources" in data):
        plain = _plain_point(
            {"metrics": {}, "step": 0, **{k: data[k] for k in data if k != "points"}}
        )
    if plain:
        defaults = {k: data[k] for k in ("source", "sources") if k in data}
        points = [{**defaults, **point} for point in data["points"]]
    else:
        parsed = validate_model(data, JobBatchRequest)
        points = []
        for point in parsed.points:
            fields = _model_fields(point)
            for key in ("source", "sources"):
                default = getattr(parsed, key)
                if key not in point.model_fields_set and default is not None:
                    fields[key] = default
            points.append(fields)
    out = []
    for index, fields in enumerate(points):
        try:
            out.append(_point_from_fields(fields, index, limits))
        except ServiceError as err:
            err.detail = f"points[{index}]: {err.detail}"
            raise
    return out


def decode_single(
    body: bytes,
    media: str | None,
    content_type: str | None,
    *,
    max_bytes: int,
    step: int | None,
    reduce: str | None,
    nan_policy: str | None,
    source: str | None,
    sources: int | None,
    limits: PointLimits = DEFAULT_LIMITS,
) -> PointInput:
    """A single push (JSON, or npz with the options in the query), checked against
    ``limits`` on either path (:func:`check_point_shape`)."""
    if is_json_media(media):
        data = loads_body(body)
        if _plain_point(data):
            return _point_from_fields(data, None, limits)
        fields = _model_fields(validate_model(data, JobMetricsRequest))
        return _point_from_fields(fields, None, limits)
    if media == NPZ_MEDIA_TYPE:
        # Before the archive is read; one member may be _weights (counted exactly below).
        _check_npz_members(body, limits, reserved=1)
    decoded = decode_metrics_body(
        body,
        media,
        content_type,
        JobMetricsRequest,
        max_bytes=max_bytes,
        reduce_query=reduce,
        nan_policy_query=nan_policy,
        step_query=step,
    )
    if decoded.step is None:
        raise InvalidParameter(["query", "step"], "npz bodies need ?step=N (an integer >= 0)")
    _check_arrays(decoded.metrics, None, limits)
    return PointInput(
        step=decoded.step,
        metrics=decoded.metrics,
        reduce=decoded.reduce,
        weights=decoded.weights,
        nan_policy=decoded.nan_policy,
        source=source or "",
        sources=sources or 1,
    )


# ------------------------------------------------------------------------- point → rows


def point_digests(
    names: Sequence[str],
    columns: Mapping[str, np.ndarray],
    weights: np.ndarray | None,
    ops: Mapping[str, str],
    nan_policy: str,
) -> list[str]:
    """What each point of a batch pushed, canonically, as text: ``"r"`` and 16 hex digits.

    ``columns``: each metric ``[P, ...]`` as the point decoded it (``[P]`` for a number),
    ``weights`` ``[P, n_devices]`` or None. One vectorised 64-bit hash of each point's
    arrays (:func:`app.storage.part_blobs.row_hashes`: bytes, dtypes, shapes), keyed by the
    metric names, the reduce ops and the NaN policy: no call per point. Digests stored
    before 2026-12-01 (32 hex digits) are not comparable; a retry of such a step is
    compared by its reduced values instead (:func:`app.storage.jobs.push`)."""
    order = sorted(names)
    every = {name: ops.get(name, "mean") for name in order}
    key = orjson.dumps([order, sorted(every.items()), nan_policy, weights is not None])
    salt = np.uint64(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))
    arrays = [np.asarray(columns[name]) for name in order]
    if weights is not None:
        arrays.append(np.asarray(weights, np.float64))
    count = len(next(iter(columns.values()))) if columns else 1
    hashed = row_hashes(arrays, count) ^ salt
    text = hashed.astype(">u8").tobytes().hex()
    return ["r" + text[i : i + 16] for i in range(0, len(text), 16)]


def _digest(point: PointInput) -> str:
    """:func:`point_digests` of one point (the same digest as in any batch)."""
    names = list(point.metrics)
    columns = {name: np.asarray(point.metrics[name])[None, ...] for name in names}
    weights = None if point.weights is None else np.asarray(point.weights, np.float64)[None, :]
    return point_digests(names, columns, weights, point.reduce, point.nan_policy)[0]


def _signature(point: PointInput) -> str:
    shapes = {k: (None if v.ndim == 0 else list(v.shape[1:])) for k, v in point.metrics.items()}
    ops = {name: point.reduce.get(name, "mean") for name in point.metrics}
    return orjson.dumps(
        {"metrics": shapes, "reduce": ops, "nan_policy": point.nan_policy},
        option=orjson.OPT_SORT_KEYS,
    ).decode()


def _where(point: PointInput) -> str:
    return "" if point.index is None else f"points[{point.index}]: "


def _library(point: PointInput, err: MetricsError) -> ServiceError:
    error = from_library(err)
    error.detail = _where(point) + error.detail
    return error


def _scalars(reduced: Mapping[str, Any]) -> dict[str, float]:
    out = {}
    for name, value in reduced.items():
        if isinstance(value, float | int | np.floating | np.integer) and not isinstance(
            value, bool | np.bool_
        ):
            out[name] = float(value)
    return out


def _reduce_one(point: PointInput) -> tuple[str, dict[str, float]]:
    try:
        reduced = reduce_custom(
            point.metrics, point.reduce, weights=point.weights, nan_policy=point.nan_policy
        )
    except MetricsError as err:
        raise _library(point, err) from None
    return encode_json(reduced).decode(), _scalars(reduced)


def _vector_key(point: PointInput) -> tuple | None:
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
        reduced = reduce_custom(stacked, {k: first.reduce.get(k, "mean") for k in stacked})
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


def build_items(points: Sequence[PointInput]) -> list[store_jobs.PushItem]:
    """Reduces complete points (grouped, stacked) and packs parts: the rows to store.

    Raises:
      ServiceError: the library's metric codes, naming the point.
    """
    items: list[store_jobs.PushItem | None] = [None] * len(points)
    groups: dict[tuple, list[int]] = {}
    for i, point in enumerate(points):
        point.digest = _digest(point)
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
            point = points[i]
            items[i] = store_jobs.PushItem(
                step=point.step,
                source=point.source,
                sources=1,
                digest=point.digest,
                num_devices=num_devices_of(point.metrics),
                reduced=text,
                values=values,
            )
            done.add(i)
    for i, point in enumerate(points):
        if i in done:
            continue
        if point.sources == 1:
            text, values = _reduce_one(point)
            items[i] = store_jobs.PushItem(
                step=point.step,
                source=point.source,
                sources=1,
                digest=point.digest,
                num_devices=num_devices_of(point.metrics),
                reduced=text,
                values=values,
            )
            continue
        _reduce_one(point)  # a part must reduce on its own (weights, ops, NaN policy)
        arrays = dict(point.metrics)
        if WEIGHTS_ARRAY in arrays:
            raise InvalidParameter(
                ["body", "metrics", WEIGHTS_ARRAY], "the name _weights is reserved for weights"
            )
        if point.weights is not None:
            arrays[WEIGHTS_ARRAY] = point.weights
        items[i] = store_jobs.PushItem(
            step=point.step,
            source=point.source,
            sources=point.sources,
            digest=point.digest,
            num_devices=num_devices_of(point.metrics),
            signature=_signature(point),
            arrays=encode_part(arrays),
        )
    return [item for item in items if item is not None]


# ------------------------------------------------------------------ the columnar batch path

_FAST_POINT_KEYS = frozenset({"step", "metrics"})


def _fast_columns(metrics: list[Any], names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """name -> ``[P]`` (a plain number per point) or ``[P, D]`` (a list of floats per
    point) float64 column, when every point sends exactly that; else None.

    When every metric is a list (the usual batch), one ``np.array`` call builds the
    ``[P, M, D]`` block and one pass over the values checks they are all floats (JSON
    integers or booleans would decode to other dtypes point by point)."""
    first = metrics[0]
    if all(type(first[name]) is list for name in names):
        chain = itertools.chain.from_iterable
        lists = list(chain(map(dict.values, metrics)))  # P * M lists, point-major
        if set(map(type, lists)) != {list}:
            return None
        lengths = set(map(len, lists))
        if len(lengths) != 1 or 0 in lengths:  # ragged or empty: the per-point path says
            return None
        flat = list(chain(lists))
        if set(map(type, flat)) != {float}:
            return None
        # One flat conversion (numpy's nested-list path costs ~1 us per inner list).
        block = np.array(flat, dtype=np.float64).reshape(len(metrics), len(names), -1)
        return {name: block[:, k, :] for k, name in enumerate(names)}
    columns: dict[str, np.ndarray] = {}
    for name in names:
        column = [m[name] for m in metrics]
        kinds = set(map(type, column))
        if kinds == {list}:
            if set(map(type, itertools.chain.from_iterable(column))) != {float}:
                return None
            try:
                array = np.array(column, dtype=np.float64)
            except ValueError:  # ragged: the per-point path names the point
                return None
            if array.ndim != 2 or array.shape[1] == 0:
                return None
        elif kinds <= {float, int}:
            if int in kinds and not all(-(2**63) <= v < 2**64 for v in column if type(v) is int):
                return None
            array = np.array(column, dtype=np.float64)
        else:
            return None
        columns[name] = array
    return columns


def _fast_items(
    data: Any, limits: PointLimits = DEFAULT_LIMITS
) -> list[store_jobs.PushItem] | None:
    """The common JSON batch, vectorised: every point ``{"step", "metrics"}`` with the same
    metric names in the same order, each metric a list of floats of one length (or a
    number), default options. None for any other batch, which takes the per-point path
    (and its error messages)."""
    if type(data) is not dict or not data.keys() <= {"points", "source", "sources"}:
        return None
    points = data.get("points")
    if type(points) is not list or not 2 <= len(points) <= MAX_BATCH_POINTS:
        return None
    options = {k: data[k] for k in data if k != "points"}
    if options and not _plain_point({"metrics": {}, "step": 0, **options}):
        return None
    # Every check below iterates in C (map, set): no Python-level step per point.
    if set(map(type, points)) != {dict} or set(map(len, points)) != {len(_FAST_POINT_KEYS)}:
        return None
    try:
        metrics = list(map(operator.itemgetter("metrics"), points))
        steps = list(map(operator.itemgetter("step"), points))
    except KeyError:
        return None
    first = metrics[0]
    if type(first) is not dict or not first:
        return None
    names = tuple(first)
    if len(names) > limits.max_metrics or len(names) > limits.max_values:
        return None  # the per-point path refuses it, naming the point
    if any(len(name) > limits.max_name for name in names):
        return None
    if limits.max_answer_bytes is not None and (
        point_text_bound(names, len(names)) > limits.max_answer_bytes
    ):
        return None
    if set(map(type, metrics)) != {dict} or set(map(tuple, metrics)) != {names}:
        return None
    if set(map(type, steps)) != {int} or min(steps) < 0 or max(steps) > MAX_STEP:
        return None
    columns = _fast_columns(metrics, names)
    if columns is None:
        return None
    return _columnar_items(
        steps, names, columns, {}, options.get("source", ""), options.get("sources", 1)
    )


def _columnar_items(
    steps: list[int],
    names: tuple[str, ...],
    columns: Mapping[str, np.ndarray],
    ops: Mapping[str, str],
    source: str,
    sources: int,
) -> list[store_jobs.PushItem] | store_jobs.PointColumns | store_parts.PartSegment | None:  # noqa: E501
    """Items for points given as float64 columns (``[P, D]``: D devices per point;
    ``[P]``: a number per point), unweighted, NaN policy ``propagate``: exactly the items
    :func:`build_items` gives for the same points (same digests, signature, stored part
    bytes, and reduced text: the library's stacked reduce, as :func:`_reduce_group`).
    None where that path must decide (a single point, ops naming other metrics, a
    reduce error: it names the point)."""
    if len(steps) < 2 or not ops.keys() <= set(names):
        return None
    if sources > 1 and WEIGHTS_ARRAY in names:
        return None
    stacked = {k: v.T for k, v in columns.items() if v.ndim == 2}  # [D, P]: devices lead
    if not stacked or any(v.shape[0] == 0 for v in stacked.values()):
        return None
    devices = next(v.shape[1] for v in columns.values() if v.ndim == 2)
    if sources > 1:
        # One source's parts of the batch: stored as they are, one segment (no object,
        # digest or row per part). Not reduced here: float64 [P, D > 0] parts with known
        # ops and NaN policy propagate cannot fail a reduction, which happens at the merge.
        if not set(ops.values()) <= set(REDUCE_OPS):
            return None
        signature = _signature(
            PointInput(
                step=0,
                metrics={k: v[0] for k, v in columns.items()},
                reduce=dict(ops),
                weights=None,
                nan_policy="propagate",
            )
        )
        return store_parts.PartSegment(
            source=source,
            sources=sources,
            signature=signature,
            num_devices=devices,
            steps=list(steps),
            columns={k: columns[k] for k in names},
        )
    try:
        reduced = reduce_custom(stacked, {k: ops.get(k, "mean") for k in stacked})
    except MetricsError:
        return None
    digests = point_digests(names, columns, None, ops, "propagate")
    values = {
        k: np.asarray(reduced[k] if k in reduced else columns[k], dtype=np.float64) for k in names
    }
    texts = _object_texts(names, [values[k] for k in names])
    return store_jobs.PointColumns(
        steps=list(steps),
        digests=digests,
        reduced=texts,
        values=values,
        num_devices=devices,
        source=source,
    )


def _object_texts(names: Sequence[str], columns: Sequence[np.ndarray]) -> list[str]:
    """Per row, the JSON text ``orjson.dumps({name: float(column[row]) ...})`` gives
    (NaN and inf -> null, as :func:`encode_json`), built from whole columns: each column
    written by one ``orjson.dumps`` and split at the commas, the pieces of every row laid
    out in one flat list (slice assignment), joined once and split at the row ends (JSON
    numbers and escaped keys hold no comma or newline): no Python call per row."""
    rows = len(columns[0]) if len(columns) else 0
    if not rows:
        return []
    width = 2 * len(names) + 1
    flat: list[str] = [""] * (rows * width)
    for i, (name, column) in enumerate(zip(names, columns, strict=True)):
        key = orjson.dumps(str(name)).decode()
        flat[2 * i :: width] = [("{" if i == 0 else ",") + key + ":"] * rows
        text = orjson.dumps(np.asarray(column, np.float64), option=orjson.OPT_SERIALIZE_NUMPY)
        flat[2 * i + 1 :: width] = text.decode()[1:-1].split(",")
    flat[width - 1 :: width] = ["}\n"] * rows
    return "".join(flat).split("\n")[:-1]


STEPS_ARRAY = "_step"
"""The npz batch body's array of steps, ``[n_points]`` integers."""


def npz_batch_items(
    body: bytes,
    *,
    max_bytes: int,
    reduce: str | None,
    nan_policy: str | None,
    source: str | None,
    sources: int | None,
    limits: PointLimits = DEFAULT_LIMITS,
) -> list[store_jobs.PushItem] | store_jobs.PointColumns:
    """An npz batch body -> the rows to store. The archive holds ``_step`` ``[P]``
    integers, each metric as ``[P, n_devices, ...]`` (or ``[P]``: one number per point,
    as a JSON scalar metric) and optionally ``_weights`` ``[P, n_devices]``; options in
    the query. The same as P single pushes of the rows (the same digests: a retry in
    JSON is a no-op).

    Raises:
      ServiceError: ``invalid_npz``, ``payload_too_large``, ``unsupported_datatype``,
        ``invalid_tensor``, ``validation_error`` (``_step``), the library's metric codes.
    """
    _check_npz_members(body, limits, reserved=2)  # _step and _weights
    arrays = load_npz(body, max_bytes=max_bytes)
    steps_array = arrays.pop(STEPS_ARRAY, None)
    _check_metric_count(len(arrays) - (WEIGHTS_ARRAY in arrays), None, limits)
    if steps_array is None:
        raise InvalidParameter(
            ["body", STEPS_ARRAY],
            "an npz batch needs a _step array: the step of each point, [n_points] integers",
        )
    count = steps_array.shape[0] if steps_array.ndim == 1 else 0
    steps_array = _integral_steps(steps_array)
    if steps_array.dtype.kind not in "iu" or not 1 <= count <= MAX_BATCH_POINTS:
        raise InvalidParameter(
            ["body", STEPS_ARRAY],
            f"_step must be [n_points] integers, 1 to {MAX_BATCH_POINTS} points; got shape "
            f"{list(steps_array.shape)} of {steps_array.dtype}",
        )
    steps = steps_array.tolist()
    if min(steps) < 0 or max(steps) > MAX_STEP:
        raise InvalidParameter(["body", STEPS_ARRAY], f"steps must be 0 to {MAX_STEP}")
    weights = arrays.pop(WEIGHTS_ARRAY, None)
    if not arrays:
        raise InvalidNpz("the npz holds no metric arrays besides _step and _weights")
    for name, array in {**arrays, **({} if weights is None else {WEIGHTS_ARRAY: weights})}.items():
        if array.ndim == 0 or array.shape[0] != count:
            raise InvalidTensor(
                f"npz array {name!r} has shape {list(array.shape)}; batch arrays lead with "
                f"the point axis: [{count}, n_devices, ...], or [{count}] for one number "
                "per point"
            )
    _check_arrays(arrays, None, limits, lead=2)  # [P, n_devices, ...]: per point, shape[2:]
    _check_batch_text(arrays, count, max_bytes)
    ops = parse_reduce_query(reduce)
    policy = nan_policy or "propagate"
    names = tuple(arrays)
    if (
        weights is None
        and policy == "propagate"
        and all(a.dtype == np.float64 and a.ndim <= 2 for a in arrays.values())
    ):
        items = _columnar_items(steps, names, arrays, ops, source or "", sources or 1)
        if items is not None:
            return items
    points = []
    for i, step in enumerate(steps):
        metrics = {
            name: (array[i] if array.ndim > 1 else _scalar_of(name, array[i]))
            for name, array in arrays.items()
        }
        points.append(
            PointInput(
                step=step,
                metrics=metrics,
                reduce=dict(ops),
                weights=None if weights is None else np.asarray(weights[i], np.float64),
                nan_policy=policy,
                source=source or "",
                sources=sources or 1,
                index=i,
            )
        )
    return build_items(points)


def _check_batch_text(arrays: Mapping[str, np.ndarray], count: int, max_bytes: int) -> None:
    """An npz batch names its metrics once for every point, so its stored text (names
    repeated in each point's JSON) could be ~35x its body: 1,000 points of 1,000 metrics
    with 250-character names are ~8 MB of npz and ~270 MB of history. Such a batch is
    refused (``value_too_large``) when its points' text may pass the body limit: what a
    batch stores stays within what a body may carry.

    Raises:
      ServiceError: ``value_too_large``.
    """
    values = sum(_reduced_numbers(np.shape(a), 2) for a in arrays.values())
    bound = count * point_text_bound(list(arrays), values)
    if bound > max_bytes:
        raise ServiceError(
            f"the batch's {count} points may store {bound} bytes of values as JSON, more "
            f"than a request body may carry ({max_bytes} bytes, DATARAX_MAX_BODY_MB); send "
            "fewer points per batch, or fewer or shorter-named metrics",
            code="value_too_large",
        )


def _integral_steps(steps: np.ndarray) -> np.ndarray:
    """Float steps that are whole numbers, as int64 (as JSON takes ``"step": 1000.0``);
    any other float array stays float and is refused by the caller."""
    if steps.dtype.kind != "f" or steps.ndim != 1 or not steps.size:
        return steps
    with np.errstate(invalid="ignore"):
        whole = np.isfinite(steps).all() and (steps == np.floor(steps)).all()
    if not whole or steps.min() < 0 or steps.max() >= 2.0**63:
        return steps
    return steps.astype(np.int64)


def _scalar_of(name: str, value: Any) -> np.float64:
    if np.asarray(value).dtype.kind not in "biuf":
        raise InvalidTensor(f"npz array {name!r}: one number per point must be numeric")
    return np.float64(value)


def _part(arrays: Mapping[str, np.ndarray]) -> PartialMetrics:
    loaded = dict(arrays)
    weights = loaded.pop(WEIGHTS_ARRAY, None)
    return PartialMetrics(loaded, weights=weights)


def _options(signature: str) -> tuple[dict[str, str], str]:
    meta = orjson.loads(signature)
    return meta["reduce"], meta["nan_policy"]


def _merge_rows(
    parts: list[tuple[str, dict[str, np.ndarray]]], signature: str
) -> list[store_parts.MergedStep]:
    """Merges k steps' parts (``[(source, {name: [k, n_devices, ...]})]``, source order)
    exactly as one push of every device: unweighted float64 ``[k, n_devices]`` metrics
    with NaN policy ``propagate`` are concatenated along the device axis and reduced in
    one stacked call (the same call, on the same memory layout, as a batch of complete
    steps: the same values); anything else step by step through the library's
    :func:`~datarax.distributed.merge.merge_parts`."""
    ops, nan_policy = _options(signature)
    names = [n for n in parts[0][1] if n != WEIGHTS_ARRAY]
    count = parts[0][1][names[0]].shape[0] if names else 0
    plain = (
        nan_policy == "propagate"
        and all(WEIGHTS_ARRAY not in arrays for _, arrays in parts)
        and all(
            a.dtype == np.float64 and a.ndim == 2 for _, arrays in parts for a in arrays.values()
        )
    )
    if plain and count:
        joined = {n: np.concatenate([arrays[n] for _, arrays in parts], axis=1) for n in names}
        try:
            reduced = reduce_custom(
                {n: v.T for n, v in joined.items()}, {n: ops.get(n, "mean") for n in names}
            )
        except MetricsError as err:
            raise from_library(err) from None
        values = {n: np.asarray(reduced[n], dtype=np.float64) for n in names}
        texts = _object_texts(names, [values[n] for n in names])
        devices = joined[names[0]].shape[1]
        rows = zip(*(values[n].tolist() for n in names), strict=True)
        return [
            store_parts.MergedStep(text, dict(zip(names, row, strict=True)), devices)
            for text, row in zip(texts, rows, strict=True)
        ]
    out = []
    for j in range(count):
        loaded = [_part({n: a[j] for n, a in arrays.items()}) for _, arrays in parts]
        try:
            merged = merge_parts(loaded)
            reduced = merged.reduce(ops, nan_policy=nan_policy)  # type: ignore[arg-type]
        except MetricsError as err:
            raise from_library(err) from None
        out.append(
            store_parts.MergedStep(
                encode_json(reduced).decode(), _scalars(reduced), merged.num_devices
            )
        )
    return out


# ---------------------------------------------------------------------------------- push


@dataclass(frozen=True)
class PushAnswer:
    created: bool
    body: bytes
    stored: int = 0  # points or parts newly written


async def push_points(
    store: Store, job: str, points: list[PointInput]
) -> list[store_jobs.PushItem]:
    """Stores points and parts in one transaction; returns the items with their outcome."""
    items = await run_for_body(lambda: build_items(points), 64 * 1024 + len(points) * 1024)
    await store.write_grouped(lambda c: store_jobs.push(c, job, items, utc_now(), _merge_rows))
    return items


async def push_single(store: Store, job: str, point: PointInput) -> PushAnswer:
    """One step (or one source's part of it); the answer body and whether it was new."""
    (item,) = await push_points(store, job, [point])
    reduced = item.step_reduced.encode() if item.complete and item.step_reduced else b"null"
    missing = b"null" if item.missing is None else encode_json(item.missing)
    body = b"".join(
        (
            b'{"job":',
            encode_json(job),
            b',"step":%d,"source":' % item.step,
            encode_json(item.source),
            b',"sources":%d,"complete":%s,"reduced":'
            % (item.sources, b"true" if item.complete else b"false"),
            reduced,
            b',"received_at":',
            encode_json(item.received_at),
            b',"num_devices":%d,"missing_sources":' % item.num_devices,
            missing,
            b"}",
        )
    )
    return PushAnswer(created=item.created, body=body, stored=int(item.created))


def batch_items(
    body: bytes, limits: PointLimits = DEFAULT_LIMITS
) -> list[store_jobs.PushItem] | store_jobs.PointColumns:
    """A batch body -> the rows to store: the columnar path when the batch allows it
    (:func:`_fast_items`), else point by point (:func:`decode_batch`, :func:`build_items`).

    Raises:
      ServiceError: as :func:`decode_batch` and :func:`build_items`.
    """
    data = loads_body(body)
    items = _fast_items(data, limits)
    if items is None:
        items = build_items(_decode_batch_data(data, limits))
    return items


async def push_batch(
    store: Store, job: str, body: bytes, limits: PointLimits = DEFAULT_LIMITS
) -> PushAnswer:
    """A batch body, all or nothing; the answer counts what was new. Decoded and stored
    in one worker thread (one hop off the event loop, not two)."""
    return await anyio.to_thread.run_sync(
        lambda: _store_batch(store, job, batch_items(body, limits))
    )


async def push_npz_batch(store: Store, job: str, body: bytes, **options: Any) -> PushAnswer:
    """An npz batch body (:func:`npz_batch_items`), all or nothing; one worker thread."""
    return await anyio.to_thread.run_sync(
        lambda: _store_batch(store, job, npz_batch_items(body, **options))
    )


def _batch_answer(
    job: str, points: int, created: int, completed: int, received_at: str
) -> PushAnswer:
    answer = {
        "job": job,
        "points": points,
        "created": created,
        "unchanged": points - created,
        "completed_steps": completed,
        "received_at": received_at,
    }
    return PushAnswer(created=created > 0, body=orjson.dumps(answer), stored=created)


def _store_batch(
    store: Store,
    job: str,
    batch: list[store_jobs.PushItem] | store_jobs.PointColumns | store_parts.PartSegment,
) -> PushAnswer:
    """Stores a decoded batch (in a worker thread: :meth:`Store.write_grouped_here`)."""
    now = utc_now()
    write = store.write_grouped_here
    if isinstance(batch, store_parts.PartSegment):
        created, completed = write(
            lambda c: store_jobs.push_part_columns(c, job, batch, now, _merge_rows)
        )
        first = batch.outcome(batch.steps[0])[2] if batch.steps else now
        return _batch_answer(job, len(batch.steps), created, completed, first)
    if isinstance(batch, store_jobs.PointColumns):
        # Computed before the write: the group commit's lock then covers SQLite's work only,
        # and a pusher's next batch is decoded while this one commits.
        rollup = store_jobs.columns_rollup_rows(job, batch)
        created, items = write(
            lambda c: store_jobs.push_columns(c, job, batch, now, _merge_rows, rollup)
        )
        if items is None:  # every step new and complete
            return _batch_answer(job, len(batch), created, created, now)
    else:
        items = batch
        write(lambda c: store_jobs.push(c, job, items, now, _merge_rows))
    created = sum(1 for i in items if i.created)
    completed = len({i.step for i in items if i.created and i.complete})
    return _batch_answer(
        job, len(items), created, completed, items[0].received_at if items else now
    )


# --------------------------------------------------------------------------------- reads


def _partial_point(entry: store_parts.PendingStep) -> dict[str, Any]:
    ops, nan_policy = _options(entry.signature)
    loaded = [_part(arrays) for _, arrays in entry.parts]
    try:
        merged = merge_parts(loaded)
        reduced: Any = orjson.loads(encode_json(merged.reduce(ops, nan_policy=nan_policy)))  # type: ignore[arg-type]
    except MetricsError:
        reduced = None
    received = [source for source, _ in entry.parts]
    return {
        "step": entry.step,
        "reduced": reduced,
        "received_at": entry.received_at,
        "complete": False,
        "sources": entry.sources,
        "received_sources": received,
        "missing_sources": store_parts.missing_sources(received, entry.sources),
    }


BUCKET_ENTRY_BYTES = 224
"""Bytes one metric adds to one bucket of a downsampled answer, besides twice its name
(the ``buckets`` entry with count/min/max/mean/last/last_step, and the ``points`` row's
mean), at most: how a downsampled read is sized before it runs."""
BUCKET_BYTES = 320
"""Bytes of one bucket besides its metrics (steps, the ``points`` row's members)."""


def _too_large(what: str, max_bytes: int, fix: str) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"{what} passes the answer limit of {max_bytes} bytes (DATARAX_MAX_ANSWER_MB); {fix}"
    )


def _fitting_buckets(names: Sequence[str], max_points: int, max_bytes: int) -> int:
    """The most buckets (up to ``max_points``) whose answer stays within ``max_bytes``.

    Raises:
      AnswerTooLarge: not even 2 buckets fit.
    """
    per_bucket = BUCKET_BYTES + sum(2 * len(n.encode()) + BUCKET_ENTRY_BYTES for n in names)
    fit = min(max_points, (max_bytes - 1024) // per_bucket)
    if fit < 2:
        raise _too_large(
            f"a downsampled history of {len(names)} metrics ({per_bucket} bytes a bucket)",
            max_bytes,
            "read a shorter step range or a plain page",
        )
    return fit


async def history(
    store: Store,
    job: str,
    *,
    since_step: int | None = None,
    until_step: int | None = None,
    after_step: int | None = None,
    limit: int = DEFAULT_PAGE,
    max_points: int | None = None,
    include_partial: bool = False,
    max_bytes: int | None = None,
) -> bytes:
    """A page of the job's steps, or its downsampled buckets, as JSON bytes.

    One answer shape for both (issue 27): ``kind`` is ``"points"`` or ``"buckets"`` and
    ``points`` is always there; downsampled, each of its rows is one bucket: ``step``
    the newest step in the bucket with a value, ``reduced`` each metric's mean over the
    bucket (null: no finite value), ``received_at`` and ``sources`` null, and
    ``start_step``, ``end_step``, ``count``. The mean, not the last value, so a plotted
    line of a downsampled read follows the data rather than aliasing it; ``buckets`` keeps
    ``min``, ``max``, ``mean`` and ``last`` per metric (extended, not renamed).

    ``max_bytes`` (``DATARAX_MAX_ANSWER_MB``): a page is cut short before its JSON would
    pass it (``next_after_step`` then gives the rest); a downsampled read answers fewer
    buckets than ``max_points`` where that many would not fit. Memory stays within it
    too: points are read until the budget is spent, and buckets are sized before any is
    read.

    Raises:
      InvalidParameter: ``since_step`` above ``until_step``.
      AnswerTooLarge: one stored point alone, or two buckets, pass ``max_bytes``.
    """
    low = 0 if since_step is None else since_step
    high = MAX_STEP if until_step is None else until_step
    if low > high:
        raise InvalidParameter(
            ["query", "since_step"], f"since_step {low} is above until_step {high}"
        )
    if after_step is not None:
        low = max(low, after_step + 1)
    budget = None if max_bytes is None else max(1, max_bytes - 256 - len(job))

    def read(conn):  # noqa: ANN001, ANN202
        info = store_jobs.get_job(conn, job)
        lo, hi = low, high
        if info is not None and info.first_step is not None:
            lo, hi = max(lo, info.first_step), min(hi, info.last_step or 0)
        if (
            max_points is not None
            and lo <= hi
            and hi - lo + 1 > max_points
            and store_jobs.count_points(conn, job, lo, hi, max_points + 1) > max_points
        ):
            buckets = max_points
            if max_bytes is not None:
                names = store_jobs.metric_names(conn, job, lo, hi)
                buckets = _fitting_buckets(names, max_points, max_bytes)
            return ("buckets", *store_jobs.downsample(conn, job, lo, hi, buckets))
        return (
            "page",
            *store_jobs.history_page(conn, job, low, high, limit, include_partial, budget),
        )

    kind, first, second = await store.read(read)
    head = b'{"job":' + encode_json(job)
    if kind == "buckets":
        width, buckets = first, second
        rendered = [_bucket_json(b) for b in buckets]
        return (
            head
            + b',"kind":"buckets","downsampled":true,"bucket_steps":%d,"points":' % width
            + orjson.dumps([_bucket_point(b) for b in rendered])
            + b',"buckets":'
            + orjson.dumps(rendered)
            + b',"next_after_step":null}'
        )
    entries, more = first, second
    parts = []
    used = 0
    for entry in entries:
        if isinstance(entry, store_jobs.StoredPoint):
            text = b'{"step":%d,"reduced":%s,"received_at":%s,"complete":true,"sources":%d}' % (
                entry.step,
                entry.reduced.encode(),
                encode_json(entry.received_at),
                entry.sources,
            )
        else:
            text = orjson.dumps(await run_for_body(lambda e=entry: _partial_point(e), 0))
        used += len(text) + 1
        if budget is not None and used > budget:
            if not parts:
                raise _too_large(
                    f"step {entry.step} of job {job!r} alone ({len(text)} bytes)",
                    budget,
                    "raise DATARAX_MAX_ANSWER_MB to read it",
                )
            more = True  # cut here: the next page starts at this entry
            break
        parts.append(text)
    shown = entries[: len(parts)]
    next_after = b"%d" % shown[-1].step if more and shown else b"null"
    return (
        head
        + b',"kind":"points","downsampled":false,"points":['
        + b",".join(parts)
        + b'],"next_after_step":'
        + next_after
        + b"}"
    )


def _bucket_json(bucket: store_jobs.Bucket) -> dict[str, Any]:
    metrics = {}
    for name, (n, total, low, high, last_step, last) in bucket.metrics.items():
        metrics[name] = {
            "count": int(n),
            "min": low,
            "max": high,
            "mean": (total / n) if n else None,
            "last": last if last is None or math.isfinite(last) else None,
            "last_step": int(last_step),
        }
    return {"start_step": bucket.start, "end_step": bucket.end, "metrics": metrics}


def _bucket_point(bucket: Mapping[str, Any]) -> dict[str, Any]:
    """One ``points`` row of a downsampled answer, from its bucket (see :func:`history`)."""
    metrics = bucket["metrics"]
    mean = {name: entry["mean"] for name, entry in metrics.items()}
    step = max((entry["last_step"] for entry in metrics.values()), default=bucket["end_step"])
    return {
        "step": step,
        "reduced": {k: (v if v is None or math.isfinite(v) else None) for k, v in mean.items()},
        "received_at": None,
        "complete": True,
        "sources": None,
        "start_step": bucket["start_step"],
        "end_step": bucket["end_step"],
        "count": max((entry["count"] for entry in metrics.values()), default=0),
    }


def _summary(row: store_jobs.JobRow) -> dict[str, Any]:
    missing: list[str] | None = None
    count = 0
    if row.incomplete_step is not None and row.incomplete_sources:
        missing = store_parts.missing_sources(row.received_sources, row.incomplete_sources)
        count = row.incomplete_sources - len(row.received_sources)
    return {
        "job": row.job,
        "points": row.points,
        "first_step": row.first_step,
        "last_step": row.last_step,
        "last_push_at": row.last_push_at,
        "finished": row.finished,
        "created_at": row.created_at,
        "incomplete_step": row.incomplete_step,
        "lagging_sources": missing,
        "missing_count": count,
    }


async def list_jobs(store: Store, limit: int, offset: int) -> bytes:
    """``{"items": [...], "total"}``, most recently pushed first."""
    rows, total = await store.read(lambda c: store_jobs.list_jobs(c, limit, offset))
    return orjson.dumps({"items": [_summary(r) for r in rows], "total": total})


async def get_job(store: Store, job: str) -> bytes:
    row = await store.read(lambda c: store_jobs.get_job(c, job))
    if row is None:
        raise JobNotFound(f"no job named {job!r}; GET /v1/jobs lists them")
    return orjson.dumps(_summary(row))


async def set_finished(store: Store, job: str, finished: bool) -> bytes:
    if not await store.write(lambda c: store_jobs.set_finished(c, job, finished)):
        raise JobNotFound(f"no job named {job!r}; GET /v1/jobs lists them")
    return await get_job(store, job)


async def delete_job(store: Store, job: str) -> None:
    if not await store.write(lambda c: store_jobs.delete_job(c, job)):
        raise JobNotFound(f"no job named {job!r}; GET /v1/jobs lists them")


async def expire_jobs(store: Store, retention_days: float, now: datetime | None = None) -> int:
    """Deletes the jobs whose last push is older than ``retention_days`` (0: none)."""
    if retention_days <= 0:
        return 0
    cutoff = (now or datetime.now(UTC)) - timedelta(days=retention_days)
    stamp = cutoff.strftime("%Y-%m-%dT%H:%M:%SZ")
    removed = 0
    while batch := await store.write(lambda c: store_jobs.expire_jobs(c, stamp)):
        removed += len(batch)
        log.info("retention: deleted jobs %s (last push before %s)", batch, stamp)
    return removed


async def retention_loop(store: Store, retention_days: float) -> None:
    """Applies retention now and then every hour (a lifespan task)."""
    while True:
        try:
            await expire_jobs(store, retention_days)
        except Exception:  # keep the loop alive; the error is logged
            log.exception("job retention failed")
        await asyncio.sleep(RETENTION_EVERY_S)


def seconds_since(stamp: str, now: datetime) -> float:
    then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return max(0.0, (now - then).total_seconds())


async def job_gauges(store: Store, top: int) -> tuple[dict[str, float], dict[str, float]]:
    """(seconds since the last push, per job; missing sources at the newest incomplete
    step, per job), each at most ``top`` jobs plus ``"<other>"``: the stalest of the
    unlisted unfinished jobs, and the sum of the unlisted jobs' stragglers."""
    stale, pending = await store.read(lambda c: store_jobs.gauges(c, top))
    now = datetime.now(UTC)
    seconds = {}
    for job, stamp in stale:
        if stamp is not None:
            seconds[job or "<other>"] = seconds_since(stamp, now)
    lagging = sorted(((sources - count, job) for job, _, sources, count in pending), reverse=True)
    stragglers = {job: float(n) for n, job in lagging[:top]}
    if len(lagging) > top:
        stragglers["<other>"] = float(sum(n for n, _ in lagging[top:]))
    return seconds, stragglers
