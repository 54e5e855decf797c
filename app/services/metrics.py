"""Metric reductions as plain functions: a request body in, reduced values out. No HTTP here.

``decode_metrics_body`` turns a JSON or npz body into a :class:`MetricsInput`;
``reduce_metrics`` and ``collect_metrics`` run the library's reductions on it. The jobs
service (:mod:`app.services.jobs.decode`) shares the plain-form check, the npz decoding
and the device count.

Speed: a JSON body in the common form (see :func:`plain_metrics_fields`, the one such
check of every metrics body: reduce, collect and job points) skips pydantic; any other
body is validated by the request models, which give every error.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from pydantic import BaseModel

from app.codecs.json_arrays import (
    MAX_ARRAY_DIMS,
    decode_json_arrays,
    encode_json,
    loads_body,
    validate_model,
)
from app.codecs.media import JSON_MEDIA_TYPE, NPZ_MEDIA_TYPE, is_json_media
from app.codecs.npz import load_npz
from app.core.errors import (
    AnswerTooLarge,
    InvalidParameter,
    InvalidTensor,
    ReservedMetricName,
    UnsupportedMediaType,
)
from app.schemas.jobs import MAX_SOURCES, MAX_STEP, is_source_name
from app.schemas.metrics import MetricsCollectRequest, MetricsReduceRequest
from datarax.distributed.typing import NanPolicy, ReduceOp
from datarax.metrics.reductions import reduce_custom, split_by_device

WEIGHTS_ARRAY = "_weights"
"""Name of the weights array inside an npz body."""

NUM_DEVICES_ARRAY = "_num_devices"
"""The npz answer's extra member: the device count (the JSON answer's ``num_devices``)."""


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


@functools.cache
def _takes_options(model: type[BaseModel]) -> bool:
    """Whether a metrics request model takes reduce/weights/nan_policy."""
    return "reduce" in model.model_fields


def _json_metrics_input(
    body: bytes, model: type[MetricsReduceRequest] | type[MetricsCollectRequest]
) -> MetricsInput:
    data = loads_body(body)
    fields = plain_metrics_fields(data, options=_takes_options(model))
    if fields is None:
        parsed = validate_model(data, model)
        fields = {
            "metrics": parsed.metrics,
            "reduce": getattr(parsed, "reduce", None) or {},
            "weights": getattr(parsed, "weights", None),
            "nan_policy": getattr(parsed, "nan_policy", "propagate"),
        }
    return MetricsInput(
        metrics=decode_json_arrays(fields["metrics"], what="metric"),
        reduce=dict(fields["reduce"]),
        weights=decode_weights(fields["weights"]),
        nan_policy=fields["nan_policy"],
    )


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


def decode_metrics_body(
    body: bytes,
    media: str | None,
    content_type: str | None,
    model: type[MetricsReduceRequest] | type[MetricsCollectRequest],
    *,
    max_bytes: int,
    reduce_query: str | None = None,
    nan_policy_query: str | None = None,
) -> MetricsInput:
    """Decodes a JSON or npz metrics body (plain function: no I/O).

    Args:
      body: the raw request body.
      media: its media type (``app.api.routing.media_type``); ``content_type``: the raw
        header, for the 415 message.
      model: the request model a JSON body must satisfy.
      max_bytes: the largest decompressed npz accepted.
      reduce_query, nan_policy_query: npz bodies' options.

    Raises:
      ServiceError: ``unsupported_media_type``, ``invalid_json``, ``validation_error``,
        ``invalid_npz``, ``invalid_tensor``, ``ragged_array``, ``unsupported_datatype``,
        ``payload_too_large``.
    """
    if is_json_media(media):
        return _json_metrics_input(body, model)
    if media == NPZ_MEDIA_TYPE:
        return decode_npz_metrics(
            body, max_bytes=max_bytes, reduce_query=reduce_query, nan_policy_query=nan_policy_query
        )
    raise unsupported_media(content_type)


def unsupported_media(content_type: str | None) -> UnsupportedMediaType:
    """The 415 of a metrics body that is neither JSON nor npz."""
    return UnsupportedMediaType(
        f"Content-Type {content_type!r} is not accepted; send {JSON_MEDIA_TYPE} or {NPZ_MEDIA_TYPE}"
    )


def reduce_metrics(data: MetricsInput) -> tuple[dict[str, Any], int]:
    """Reduces over the device axis; returns (reduced values, device count).

    The values are numpy scalars and arrays, for ``encode_json``.

    Raises:
      MetricsError: with the library's codes.
    """
    ops, nan_policy = library_options(data.reduce, data.nan_policy)
    reduced = reduce_custom(
        data.metrics, reduce_fn=ops, weights=data.weights, nan_policy=nan_policy
    )
    return reduced, num_devices_of(data.metrics)


def reduced_npz_arrays(reduced: dict[str, Any], num_devices: int) -> dict[str, Any]:
    """The arrays of an npz answer: the reduced values plus ``_num_devices``.

    Raises:
      ReservedMetricName: a metric is named ``_num_devices``, or its name holds a NUL or
        control character (zip member names end at a NUL: ``a\x00b`` would be read back
        as ``a``, beside or over a metric really named ``a``).
    """
    if NUM_DEVICES_ARRAY in reduced:
        raise ReservedMetricName(
            f"{NUM_DEVICES_ARRAY!r} names the device count in npz answers; rename that "
            "metric, or ask for JSON"
        )
    for name in reduced:
        if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
            raise ReservedMetricName(
                f"metric name {name!r} holds a NUL or control character, which an npz "
                "member name cannot carry; rename that metric, or ask for JSON"
            )
    return {**reduced, NUM_DEVICES_ARRAY: np.int64(num_devices)}


def num_devices_of(metrics: Mapping[str, np.ndarray | np.generic]) -> int:
    """The leading (device) axis size; 0 when no metric has one."""
    for value in metrics.values():
        if value.ndim >= 1:
            return int(value.shape[0])
    return 0


def collect_metrics(data: MetricsInput) -> list[dict[str, Any]]:
    """Splits stacked metrics into per-device values (numpy, for ``encode_json``)."""
    per_device = split_by_device(data.metrics)
    return [{"device": i, "metrics": m} for i, m in enumerate(per_device)]


COLLECT_CHUNK_DEVICES = 1024
"""Devices encoded at a time by :func:`encode_collect`: Python objects for this many
devices exist at once, never one per device of the whole answer."""

# Bytes every device entry takes at least: '{"device":0,"metrics":{}},'; and a value at
# least one digit and a comma.
_MIN_ENTRY_BYTES = 26


def encode_collect(data: MetricsInput, *, max_bytes: int) -> bytes:
    """The collect answer ``{"devices": [...]}`` as JSON bytes, built a chunk of devices at
    a time and refused before it passes ``max_bytes``.

    Memory: the answer itself plus one chunk's objects (where building the whole list of
    per-device dicts first cost ~600 bytes of Python objects per device: 1M scalars in a
    1.9 MiB body made 1.1 GB).

    Raises:
      AnswerTooLarge: the answer would pass ``max_bytes`` (checked against a lower bound
        before anything is built, then while building).
      MetricsError: the library's codes (``empty_metrics``, ``device_count_mismatch``).
    """
    metrics = data.metrics
    counts = {int(v.shape[0]) if v.ndim else None for v in metrics.values()}
    if len(counts) != 1 or None in counts:
        split_by_device(metrics)  # raises the library's error for this input
    n = num_devices_of(metrics)
    per_device = sum(len(name) + 4 + max(1, v[:1].size) * 2 for name, v in metrics.items())
    least = n * (_MIN_ENTRY_BYTES + per_device)
    if least > max_bytes:
        raise _answer_too_large(f"at least {least} bytes", max_bytes)
    parts = [b'{"devices":[']
    size = len(parts[0])
    for start in range(0, n, COLLECT_CHUNK_DEVICES):
        chunk = {name: v[start : start + COLLECT_CHUNK_DEVICES] for name, v in metrics.items()}
        entries = [
            {"device": start + i, "metrics": m} for i, m in enumerate(split_by_device(chunk))
        ]
        encoded = encode_json(entries)[1:-1]  # the entries without the list's brackets
        size += len(encoded) + 1
        if size > max_bytes:
            raise _answer_too_large(f"more than {size} bytes", max_bytes)
        if start:
            parts.append(b",")
        parts.append(encoded)
    parts.append(b"]}")
    return b"".join(parts)


def _answer_too_large(size: str, max_bytes: int) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"the answer would take {size}, above the limit of {max_bytes} bytes "
        "(DATARAX_MAX_ANSWER_MB); send fewer devices or metrics per request"
    )
