"""Metric reductions as plain functions: a request body in, reduced values out. No HTTP here.

``decode_metrics_body`` turns a JSON or npz body into a :class:`MetricsInput`;
``reduce_metrics`` and ``collect_metrics`` run the library's reductions on it. What this
service shares with the job push (the plain-form check, the npz decoding, weights,
options, the device count) lives in :mod:`app.services.metric_inputs`, which both import.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import numpy as np
import orjson
from pydantic import BaseModel

from app.codecs.json_arrays import decode_json_arrays, encode_json, loads_body, validate_model
from app.codecs.media import NPZ_MEDIA_TYPE, is_json_media
from app.core.errors import AnswerTooLarge, ReservedMetricName
from app.schemas.metrics import MetricsCollectRequest, MetricsReduceRequest
from app.services.answer_json import INT, TEXT, template

# WEIGHTS_ARRAY, check_stackable, parse_reduce_query and split_npz_metrics lived here before
# the job push stopped coming here: re-exported (``as``) so old imports keep working.
from app.services.metric_inputs import (
    WEIGHTS_ARRAY as WEIGHTS_ARRAY,
)
from app.services.metric_inputs import (
    MetricsInput,
    decode_npz_metrics,
    decode_weights,
    library_options,
    num_devices_of,
    plain_metrics_fields,
    unsupported_media,
)
from app.services.metric_inputs import (
    check_stackable as check_stackable,
)
from app.services.metric_inputs import (
    parse_reduce_query as parse_reduce_query,
)
from app.services.metric_inputs import (
    split_npz_metrics as split_npz_metrics,
)
from datarax.answers.metrics import CollectAnswer, DeviceMetrics, ReduceAnswer
from datarax.metrics.reductions import reduce_custom, reduce_number_lists, split_by_device

NUM_DEVICES_ARRAY = "_num_devices"
"""The npz answer's extra member: the device count (the JSON answer's ``num_devices``)."""


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


_REDUCED = template(ReduceAnswer(reduced=TEXT, num_devices=INT))

SMALL_BODY_BYTES = 4096
"""JSON reduce bodies up to this size try :func:`reduce_small_json` first."""


def reduce_small_json(body: bytes) -> bytes | None:
    """The JSON answer of a small plain reduce, from the lists themselves (no arrays), or
    None for the general path (:func:`decode_metrics_body`, :func:`reduce_metrics`,
    :func:`encode_reduced`), which answers every other body, and every error.

    Plain: a body :func:`plain_metrics_fields` accepts unchanged, no ``weights``, every
    metric a flat list of finite numbers over at most
    :data:`~datarax.metrics._list_reductions.MAX_DEVICES` devices. The values are the
    general path's, bit for bit (:mod:`datarax.metrics._list_reductions`); it costs about
    a third of it (3 metrics x 8 devices: ~3 us against ~10 us, in process).
    """
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    fields = plain_metrics_fields(data, options=True)
    if fields is None or fields["weights"] is not None:
        return None
    done = reduce_number_lists(fields["metrics"], fields["reduce"], fields["nan_policy"])
    if done is None:
        return None
    reduced, num_devices = done
    return _REDUCED % (orjson.dumps(reduced), num_devices)


def encode_reduced(reduced: dict[str, Any], num_devices: int) -> bytes:
    """The JSON answer of a reduction (:class:`~datarax.answers.metrics.ReduceAnswer`, from
    its template: see :mod:`app.services.answer_json`): ``reduced`` as
    :func:`reduce_metrics` gives it (numpy values, written by ``encode_json``)."""
    return _REDUCED % (encode_json(reduced), num_devices)


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


def collect_metrics(data: MetricsInput) -> list[DeviceMetrics]:
    """Splits stacked metrics into per-device values (numpy, for ``encode_json``)."""
    per_device = split_by_device(data.metrics)
    return [
        DeviceMetrics(device=i, metrics=cast("dict[str, Any]", m)) for i, m in enumerate(per_device)
    ]


COLLECT_CHUNK_DEVICES = 1024
"""Devices encoded at a time by :func:`encode_collect`: Python objects for this many
devices exist at once, never one per device of the whole answer."""

# Written from templates of the answer classes (app.services.answer_json): an answer may
# hold a million devices.
_DEVICE = template(DeviceMetrics(device=INT, metrics=TEXT))
_COLLECT = template(CollectAnswer(devices=TEXT))

# Bytes every device entry takes at least: '{"device":0,"metrics":{}},'; and a value at
# least one digit and a comma.
_MIN_ENTRY_BYTES = len(_DEVICE % (0, b"{}")) + 1


def encode_collect(data: MetricsInput, *, max_bytes: int) -> bytes:
    """The collect answer (:class:`~datarax.answers.metrics.CollectAnswer`) as JSON bytes,
    built a chunk of devices at a time and refused before it passes ``max_bytes``.

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
    head, tail = _COLLECT.split(b"%s")
    parts = [head + b"["]
    size = len(parts[0])
    for start in range(0, n, COLLECT_CHUNK_DEVICES):
        chunk = {name: v[start : start + COLLECT_CHUNK_DEVICES] for name, v in metrics.items()}
        encoded = b",".join(
            [_DEVICE % (start + i, encode_json(m)) for i, m in enumerate(split_by_device(chunk))]
        )
        size += len(encoded) + 1
        if size > max_bytes:
            raise _answer_too_large(f"more than {size} bytes", max_bytes)
        if start:
            parts.append(b",")
        parts.append(encoded)
    parts.append(b"]" + tail)
    return b"".join(parts)


def _answer_too_large(size: str, max_bytes: int) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"the answer would take {size}, above the limit of {max_bytes} bytes "
        "(DATARAX_MAX_ANSWER_MB); send fewer devices or metrics per request"
    )
