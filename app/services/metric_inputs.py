"""What the metrics endpoints and the job push both take from a request: the plain-form
check of a metrics body, the npz decoding, weights, options and the device count.

:mod:`app.services.metrics` (``/v1/metrics/reduce`` and ``/collect``) and
:mod:`app.services.jobs` (``/v1/jobs/{job}/metrics``) both import these; neither imports
the other. No HTTP here.

Speed: a JSON body in the common form (see :func:`plain_metrics_fields`, the one such
check of every metrics body: reduce, collect and job points) skips pydantic; any other
body is validated by the request models, which give every error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from app.codecs.json_arrays import MAX_ARRAY_DIMS
from app.codecs.media import JSON_MEDIA_TYPE, NPZ_MEDIA_TYPE
from app.codecs.npz import load_npz
from app.core.errors import InvalidParameter, InvalidTensor, UnsupportedMediaType
from app.schemas.jobs import MAX_SOURCES, MAX_STEP, is_source_name
from datarax.tree_types import NanPolicy, ReduceOp

WEIGHTS_ARRAY = "_weights"
"""Name of the weights array inside an npz body."""


@dataclass
class MetricsInput:
    """A decoded metrics request: name -> ``[n_devices, ...]`` arrays and the options."""

    metrics: dict[str, np.ndarray]
    reduce: dict[str, str]
    weights: np.ndarray | None
    nan_policy: str


_REDUCE_MEMBERS = frozenset({"metrics", "reduce", "weights", "nan_policy"})
_POINT_MEMBERS = _REDUCE_MEMBERS | {"step", "source", "sources"}
_TENSOR_FIELDS = frozenset({"shape", "datatype", "data"})


def _plain_number(value: Any) -> bool:
    # bool is an int subclass; ints are limited to what float64 conversion handles alike
    # in pydantic and numpy.
    kind = type(value)
    return kind is float or (kind is int and -(2**63) <= value < 2**64)


def _plain_tensor(value: Any) -> bool:
    """An OIP tensor object exactly as ``Tensor`` takes it (a list metric needs no check:
    ``list[Any]``, its contents are checked while decoding)."""
    if type(value) is not dict or value.keys() != _TENSOR_FIELDS:
        return False
    shape = value["shape"]
    return (
        type(shape) is list
        and all(type(n) is int and n >= 0 for n in shape)
        and type(value["datatype"]) is str
        and type(value["data"]) is list
    )


def plain_metrics_fields(data: Any, *, options: bool, point: bool = False) -> dict[str, Any] | None:
    """The fields of a metrics request in its common form, or None to use the models.

    Accepts only what ``MetricsReduceRequest`` (``options``), ``JobMetricsRequest``
    (``options`` and ``point``) or ``MetricsCollectRequest`` (neither: other members are
    ignored) accept *unchanged*: ``metrics`` maps names to lists or exact OIP tensor
    objects (a job point also to plain numbers), ``reduce`` maps names to strings,
    ``weights`` is a list of numbers or null, ``nan_policy`` a string; a job point's
    ``step`` an int in ``0 .. MAX_STEP``, ``source`` a source name
    (:func:`app.schemas.jobs.is_source_name`), ``sources`` an int in ``1 ..
    MAX_SOURCES``. Anything else (a missing or extra member, a coercible string, a bool
    weight) returns None, and the pydantic model then gives the answer and its exact error.

    Args:
      data: the parsed JSON body.
      options: accept ``reduce``, ``weights`` and ``nan_policy`` (extra members forbidden).
      point: a job point (``step`` required; ``source``, ``sources`` and scalar metrics
        accepted).

    Returns:
      ``{"metrics", "reduce", "weights", "nan_policy"}`` with the defaults filled in (a
      job point's also ``step``, ``source`` and ``sources``), or None.
    """
    if type(data) is not dict:
        return None
    metrics = data.get("metrics")
    if type(metrics) is not dict:
        return None
    for value in metrics.values():
        if type(value) is list or (point and _plain_number(value)):
            continue
        if not _plain_tensor(value):
            return None
    fields: dict[str, Any] = {
        "metrics": metrics,
        "reduce": {},
        "weights": None,
        "nan_policy": "propagate",
    }
    if not options:
        return fields
    if not data.keys() <= (_POINT_MEMBERS if point else _REDUCE_MEMBERS):
        return None
    reduce = data.get("reduce", {})
    if type(reduce) is not dict or not all(type(op) is str for op in reduce.values()):
        return None
    weights = data.get("weights")
    if weights is not None and (
        type(weights) is not list or not all(_plain_number(w) for w in weights)
    ):
        return None
    nan_policy = data.get("nan_policy", "propagate")
    if type(nan_policy) is not str:
        return None
    fields.update(reduce=reduce, weights=weights, nan_policy=nan_policy)
    if point:
        step = data.get("step")
        source = data.get("source", "")
        sources = data.get("sources", 1)
        if (
            type(step) is not int
            or not 0 <= step <= MAX_STEP
            or type(source) is not str
            or not is_source_name(source)
            or type(sources) is not int
            or not 1 <= sources <= MAX_SOURCES
        ):
            return None
        fields.update(step=step, source=source, sources=sources)
    return fields


def library_options(
    reduce: Mapping[str, str], nan_policy: str
) -> tuple[dict[str, ReduceOp], NanPolicy]:
    """A request's ``reduce`` and ``nan_policy`` as the library's types. They pass
    unchanged: the library checks the names itself and answers ``unknown_reduce_op`` or
    ``invalid_nan_policy``, the problems the API documents."""
    return cast("dict[str, ReduceOp]", dict(reduce)), cast("NanPolicy", nan_policy)


def decode_weights(weights: Any) -> np.ndarray | None:
    """Request weights -> float64 array (validation of values is the library's)."""
    if weights is None:
        return None
    return np.asarray(weights, dtype=np.float64)


def split_npz_metrics(
    arrays: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Separates the ``_weights`` array from the metrics and checks ranks."""
    metrics = {k: v for k, v in arrays.items() if k != WEIGHTS_ARRAY}
    for name, array in metrics.items():
        if array.ndim == 0:
            raise InvalidTensor(
                f"npz array {name!r} is a scalar; metrics need a leading device axis"
            )
    return metrics, arrays.get(WEIGHTS_ARRAY)


def check_stackable(metrics: Mapping[str, np.ndarray | np.generic], lead: int = 1) -> None:
    """Refuses metrics that cannot gain one more leading axis: a job stores its points
    stacked ``[P, n_devices, ...]``, so a point's metric has at most ``MAX_ARRAY_DIMS -
    1`` dimensions (63; numpy's limit is 64).

    Args:
      metrics: name -> array, each with ``lead`` leading axes already (1: one point's
        ``[n_devices, ...]``; 2: a batch's ``[P, n_devices, ...]``).
      lead: how many leading axes the arrays carry.

    Raises:
      InvalidTensor: a metric with more dimensions than a stored point can hold.
    """
    limit = MAX_ARRAY_DIMS - 1 + (lead - 1)
    for name, array in metrics.items():
        if np.ndim(array) > limit:
            raise InvalidTensor(
                f"metric {name!r} has {np.ndim(array) - lead + 1} dimensions; a job point's "
                f"metrics have at most {MAX_ARRAY_DIMS - 1} (the history stacks points on "
                "one more axis)"
            )


# --------------------------------------------------------------------------- query in


def parse_reduce_query(text: str | None) -> dict[str, str]:
    """``"loss:mean,step:max"`` -> ``{"loss": "mean", "step": "max"}``.

    Raises:
      InvalidParameter: an entry without ``name:op``, or a name given twice.
    """
    if not text:
        return {}
    out: dict[str, str] = {}
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, op = entry.rpartition(":")
        if not sep or not name or not op:
            raise InvalidParameter(
                ["query", "reduce"],
                f"entry {entry!r} is not name:op; write e.g. reduce=loss:mean,step:max",
            )
        if name in out:
            raise InvalidParameter(["query", "reduce"], f"metric {name!r} is listed twice")
        out[name] = op
    return out


def decode_npz_metrics(
    body: bytes,
    *,
    max_bytes: int,
    reduce_query: str | None = None,
    nan_policy_query: str | None = None,
) -> MetricsInput:
    """An npz metrics body (``_weights`` beside the metrics; options from the query).

    Raises:
      ServiceError: ``invalid_npz``, ``invalid_tensor``, ``unsupported_datatype``,
        ``payload_too_large``, ``validation_error`` (``reduce``).
    """
    metrics, weights = split_npz_metrics(load_npz(body, max_bytes=max_bytes))
    return MetricsInput(
        metrics=metrics,
        reduce=parse_reduce_query(reduce_query),
        weights=weights,
        nan_policy=nan_policy_query or "propagate",
    )


def unsupported_media(content_type: str | None) -> UnsupportedMediaType:
    """The 415 of a metrics body that is neither JSON nor npz."""
    return UnsupportedMediaType(
        f"Content-Type {content_type!r} is not accepted; send {JSON_MEDIA_TYPE} or {NPZ_MEDIA_TYPE}"
    )


def num_devices_of(metrics: Mapping[str, np.ndarray | np.generic]) -> int:
    """The leading (device) axis size; 0 when no metric has one."""
    for value in metrics.values():
        if value.ndim >= 1:
            return int(value.shape[0])
    return 0
