"""A pushed body -> one :class:`JobBatch`, whatever its shape (a single point, a JSON
batch of points, a columnar npz batch), decoded and validated once.

A JSON body in its common form is recognised by one plain-form check
(:func:`app.services.metric_inputs.plain_metrics_fields`); any other is validated by the
request models, which give every error. A JSON batch whose points all send the same
metrics as float lists (the usual batch) and an npz batch are kept as columns
(:class:`BatchColumns`): no object per point. Every path checks the caps of
:mod:`app.services.jobs.limits` before any reduction runs.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from app.codecs.json_arrays import decode_json_arrays, loads_body, validate_model
from app.codecs.media import NPZ_MEDIA_TYPE, is_json_media
from app.codecs.npz import load_npz
from app.core.errors import InvalidNpz, InvalidParameter, InvalidTensor, ServiceError
from app.schemas.jobs import MAX_BATCH_POINTS, MAX_STEP, JobBatchRequest, JobMetricsRequest
from app.services.jobs.limits import (
    DEFAULT_LIMITS,
    PointLimits,
    check_arrays,
    check_batch_text,
    check_metric_count,
    check_npz_members,
    point_text_bound,
)
from app.services.metric_inputs import (
    WEIGHTS_ARRAY,
    decode_npz_metrics,
    decode_weights,
    parse_reduce_query,
    plain_metrics_fields,
    unsupported_media,
)

STEPS_ARRAY = "_step"
"""The npz batch body's array of steps, ``[n_points]`` integers."""

type Metric = np.ndarray | np.float64
"""One metric of a point: ``[n_devices, ...]`` values, or a number every device agrees on
(as JSON's ``"lr": 0.001``)."""


@dataclass
class PointInput:
    """One decoded point: arrays of this source's devices (0-d: a value all agree on)."""

    step: int
    metrics: dict[str, Metric]
    reduce: dict[str, str]
    weights: np.ndarray | None
    nan_policy: str
    source: str = ""
    sources: int = 1
    index: int | None = None  # position in a batch, for error messages
    digest: str = field(default="", init=False)


@dataclass
class BatchColumns:
    """A batch as columns: each metric ``[P, n_devices, ...]`` (or ``[P]``: one number per
    point), ``weights`` ``[P, n_devices]`` or None; the options every point shares."""

    steps: list[int]
    arrays: dict[str, np.ndarray]
    weights: np.ndarray | None
    reduce: dict[str, str]
    nan_policy: str
    source: str
    sources: int

    def plain(self) -> bool:
        """Unweighted float64 ``[P]`` / ``[P, n_devices]`` columns with NaN policy
        ``propagate``: what the vectorised rows take (:mod:`app.services.jobs.rows`)."""
        return (
            self.weights is None
            and self.nan_policy == "propagate"
            and all(a.dtype == np.float64 and a.ndim <= 2 for a in self.arrays.values())
        )

    def points(self) -> list[PointInput]:
        """The same batch point by point.

        Raises:
          InvalidTensor: a one-number-per-point column that is not numeric.
        """
        out = []
        for i, step in enumerate(self.steps):
            metrics = {
                name: (array[i] if array.ndim > 1 else _scalar_of(name, array[i]))
                for name, array in self.arrays.items()
            }
            out.append(
                PointInput(
                    step=step,
                    metrics=metrics,
                    reduce=dict(self.reduce),
                    weights=None
                    if self.weights is None
                    else np.asarray(self.weights[i], np.float64),
                    nan_policy=self.nan_policy,
                    source=self.source,
                    sources=self.sources,
                    index=i,
                )
            )
        return out


@dataclass
class JobBatch:
    """A decoded push: its points one by one (``points``), or as columns (``columns``).

    ``single``: a single push (its answer echoes the point; a batch's counts them).
    """

    points: list[PointInput] = field(default_factory=list)
    columns: BatchColumns | None = None
    single: bool = False

    def __len__(self) -> int:
        return len(self.columns.steps) if self.columns is not None else len(self.points)


# ------------------------------------------------------------------------------- points


def _point_from_fields(
    fields: Mapping[str, Any], index: int | None, limits: PointLimits = DEFAULT_LIMITS
) -> PointInput:
    metrics = fields["metrics"]
    check_metric_count(len(metrics), index, limits)  # before decoding; the rest after
    arrays: dict[str, Metric] = {}
    lists: dict[str, Any] = {}
    for name, value in metrics.items():
        kind = type(value)
        if kind is float or (kind is int and -(2**63) <= value < 2**64):  # a plain number
            arrays[name] = np.float64(value)
        else:
            lists[name] = value if not hasattr(value, "model_dump") else value.model_dump()
    arrays.update(decode_json_arrays(lists, what="metric") if lists else {})
    check_arrays(arrays, index, limits)
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


def _point_fields(data: Any) -> dict[str, Any]:
    """A single point's fields: the plain form as it is, else the model's."""
    fields = plain_metrics_fields(data, options=True, point=True)
    if fields is None:
        fields = _model_fields(validate_model(data, JobMetricsRequest))
    return fields


def decode_point(
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
) -> JobBatch:
    """A single push (JSON, or npz with the options in the query), checked against
    ``limits`` on either path (:func:`app.services.jobs.limits.check_point_shape`).

    Raises:
      ServiceError: ``unsupported_media_type``, ``invalid_json``, ``validation_error``,
        ``invalid_npz``, ``invalid_tensor``, ``payload_too_large``, and the caps.
    """
    if is_json_media(media):
        point = _point_from_fields(_point_fields(loads_body(body)), None, limits)
        return JobBatch(points=[point], single=True)
    if media != NPZ_MEDIA_TYPE:
        raise unsupported_media(content_type)
    # Before the archive is read; one member may be _weights (counted exactly below).
    check_npz_members(body, limits, reserved=1)
    decoded = decode_npz_metrics(
        body, max_bytes=max_bytes, reduce_query=reduce, nan_policy_query=nan_policy
    )
    if step is None:
        raise InvalidParameter(["query", "step"], "npz bodies need ?step=N (an integer >= 0)")
    check_arrays(decoded.metrics, None, limits)
    point = PointInput(
        step=step,
        metrics=dict(decoded.metrics),
        reduce=decoded.reduce,
        weights=decoded.weights,
        nan_policy=decoded.nan_policy,
        source=source or "",
        sources=sources or 1,
    )
    return JobBatch(points=[point], single=True)


# ---------------------------------------------------------------------------- JSON batch

_BATCH_MEMBERS = frozenset({"points", "source", "sources"})
_COLUMN_POINT_KEYS = frozenset({"step", "metrics"})


def _batch_options(data: dict[str, Any]) -> dict[str, Any] | None:
    """The batch's ``source``/``sources`` defaults in their plain form, or None."""
    options = {k: data[k] for k in data if k != "points"}
    if (
        options
        and plain_metrics_fields({"metrics": {}, "step": 0, **options}, options=True, point=True)
        is None
    ):
        return None
    return options


def _plain_points(data: Any) -> list[dict[str, Any]] | None:
    """Every point's fields (with the batch's defaults) when the whole batch is in the
    plain form; else None (the model then validates it)."""
    if (
        type(data) is not dict
        or not data.keys() <= _BATCH_MEMBERS
        or type(data.get("points")) is not list
        or not 1 <= len(data["points"]) <= MAX_BATCH_POINTS
    ):
        return None
    options = _batch_options(data)
    if options is None:
        return None
    out = []
    for point in data["points"]:
        fields = plain_metrics_fields(point, options=True, point=True)
        if fields is None:
            return None
        for key, value in options.items():  # a point's own member wins
            if type(point) is dict and key not in point:
                fields[key] = value
        out.append(fields)
    return out


def _json_columns(data: Any, limits: PointLimits) -> BatchColumns | None:
    """The common JSON batch as columns: every point ``{"step", "metrics"}`` with the
    same metric names in the same order, each metric a list of floats of one length (or
    a number), default options, within the caps. None for any other batch, which is
    decoded point by point (and gets its error messages)."""
    if type(data) is not dict or not data.keys() <= _BATCH_MEMBERS:
        return None
    points = data.get("points")
    if type(points) is not list or not 2 <= len(points) <= MAX_BATCH_POINTS:
        return None
    options = _batch_options(data)
    if options is None:
        return None
    # Every check below iterates in C (map, set): no Python-level step per point.
    if set(map(type, points)) != {dict} or set(map(len, points)) != {len(_COLUMN_POINT_KEYS)}:
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
    arrays = _float_columns(metrics, names)
    if arrays is None:
        return None
    return BatchColumns(
        steps=steps,
        arrays=arrays,
        weights=None,
        reduce={},
        nan_policy="propagate",
        source=options.get("source", ""),
        sources=options.get("sources", 1),
    )


def _float_columns(metrics: list[Any], names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
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


def _decode_points(data: Any, limits: PointLimits) -> list[PointInput]:
    points = _plain_points(data)
    if points is None:
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


def decode_batch(body: bytes, limits: PointLimits = DEFAULT_LIMITS) -> JobBatch:
    """A JSON batch body, with the batch's ``source``/``sources`` as defaults: as columns
    when its form allows (:func:`_json_columns`), else point by point.

    Raises:
      ServiceError: ``invalid_json``, ``validation_error`` (naming ``points.<i>.<field>``),
        ``invalid_tensor``, ``ragged_array``, ``unsupported_datatype``, and the caps of
        :class:`~app.services.jobs.limits.PointLimits`.
    """
    data = loads_body(body)
    columns = _json_columns(data, limits)
    if columns is not None:
        return JobBatch(columns=columns)
    return JobBatch(points=_decode_points(data, limits))


# ----------------------------------------------------------------------------- npz batch


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


def decode_npz_batch(
    body: bytes,
    *,
    max_bytes: int,
    reduce: str | None,
    nan_policy: str | None,
    source: str | None,
    sources: int | None,
    limits: PointLimits = DEFAULT_LIMITS,
) -> JobBatch:
    """An npz batch body: ``_step`` ``[P]`` integers, each metric ``[P, n_devices, ...]``
    (or ``[P]``: one number per point, as a JSON scalar metric) and optionally
    ``_weights`` ``[P, n_devices]``; options in the query. The same as P single pushes of
    the rows (the same digests: a retry in JSON is a no-op).

    Raises:
      ServiceError: ``invalid_npz``, ``payload_too_large``, ``unsupported_datatype``,
        ``invalid_tensor``, ``validation_error`` (``_step``, ``reduce``), the caps.
    """
    check_npz_members(body, limits, reserved=2)  # _step and _weights
    arrays = load_npz(body, max_bytes=max_bytes)
    steps_array = arrays.pop(STEPS_ARRAY, None)
    check_metric_count(len(arrays) - (WEIGHTS_ARRAY in arrays), None, limits)
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
    check_arrays(arrays, None, limits, lead=2)  # [P, n_devices, ...]: per point, shape[2:]
    check_batch_text(arrays, count, max_bytes)
    columns = BatchColumns(
        steps=steps,
        arrays=arrays,
        weights=weights,
        reduce=parse_reduce_query(reduce),
        nan_policy=nan_policy or "propagate",
        source=source or "",
        sources=sources or 1,
    )
    return JobBatch(columns=columns)
