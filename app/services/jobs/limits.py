"""The caps of a job point, checked alike on every push path (JSON or npz, single or
batch) before any reduction runs: metrics per point, metric name length, numbers per
point after reduction, and the JSON a stored point may take."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from app.core.errors import ServiceError
from app.schemas.jobs import MAX_METRIC_NAME
from app.services.metric_inputs import check_stackable

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


DEFAULT_LIMITS = PointLimits()

POINT_TEXT_OVERHEAD = 1024
"""Bytes of a push answer or history row besides the point's values, at most."""
NUMBER_TEXT = 25
"""Characters of one number as JSON, at most (``-1.7976931348623157e+308`` and a comma)."""


def point_text_bound(names: Sequence[str], values: int) -> int:
    """Bytes the JSON of a point of these metrics and ``values`` numbers takes, at most."""
    # The names exactly as JSON writes them (quoted, escaped, comma-separated): one call.
    text = len(orjson.dumps(list(names))) + 2 * len(names)  # and a ':' and a ',' each
    return POINT_TEXT_OVERHEAD + text + NUMBER_TEXT * values


def _where_point(index: int | None) -> str:
    return "the point" if index is None else f"point {index}"


def check_metric_count(count: int, index: int | None, limits: PointLimits = DEFAULT_LIMITS) -> None:
    """Raises ``too_many_metrics`` for a point of more metrics than ``limits`` take."""
    if count > limits.max_metrics:
        raise ServiceError(
            f"{_where_point(index)} carries {count} metrics; a job point takes at most "
            f"{limits.max_metrics} (stack related values into one array metric instead)",
            code="too_many_metrics",
        )


RESERVED_NAMES = ("_weights", "_step")
"""Names the npz codec keeps for itself (the per-device weights, a batch's steps)."""


def _bad_name(name: str) -> str:
    """Why ``name`` is no metric name ('' when it is one)."""
    if not name.strip():
        return "is empty or blank: name the metric"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "holds control characters (NUL, tab, newline, ...): drop them"
    if name in RESERVED_NAMES:
        return f"is reserved ({', '.join(RESERVED_NAMES)} are the npz codec's own): rename it"
    return ""


def check_point_shape(
    names: Sequence[str],
    values_per_point: int,
    index: int | None,
    limits: PointLimits = DEFAULT_LIMITS,
) -> None:
    """The caps of one point (or every point of a columnar batch: they share names and
    shapes), from its metric names and how many numbers its reduced values hold.

    Raises:
      ServiceError: ``too_many_metrics``, ``metric_name_too_long``,
        ``invalid_metric_name``, ``value_too_large``.
    """
    check_metric_count(len(names), index, limits)
    for name in names:
        why = _bad_name(name)
        if why:
            raise ServiceError(
                f"{_where_point(index)}: metric name {name[:40]!r} {why}",
                code="invalid_metric_name",
            )
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


def reduced_numbers(shape: Sequence[int], lead: int) -> int:
    """Numbers a metric of ``shape`` reduces to when its first ``lead`` axes go (the
    device axis; for batch columns, the point axis too): 1 for a value per point."""
    return math.prod(shape[lead:]) if len(shape) > lead else 1


def check_arrays(
    metrics: Mapping[str, np.ndarray | np.generic],
    index: int | None,
    limits: PointLimits,
    lead: int = 1,
) -> None:
    """The caps of a point's decoded arrays (``lead`` 2: a batch's ``[P, n_devices, ...]``
    columns, whose every point shares names and shapes)."""
    check_stackable(metrics, lead)  # stored stacked [P, ...]: one dimension to spare
    check_point_shape(
        list(metrics),
        sum(reduced_numbers(np.shape(a), lead) for a in metrics.values()),
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


def check_npz_members(body: bytes, limits: PointLimits, reserved: int) -> None:
    """``too_many_metrics`` from the archive's directory, before it is opened
    (``reserved``: members that are not metrics, such as ``_weights``)."""
    count = npz_member_count(body)
    if count is not None and count - reserved > limits.max_metrics:
        check_metric_count(count - reserved, None, limits)


def check_batch_text(arrays: Mapping[str, np.ndarray], count: int, max_bytes: int) -> None:
    """An npz batch names its metrics once for every point, so its stored text (names
    repeated in each point's JSON) could be ~35x its body: 1,000 points of 1,000 metrics
    with 250-character names are ~8 MB of npz and ~270 MB of history. Such a batch is
    refused (``value_too_large``) when its points' text may pass the body limit: what a
    batch stores stays within what a body may carry.

    Raises:
      ServiceError: ``value_too_large``.
    """
    values = sum(reduced_numbers(np.shape(a), 2) for a in arrays.values())
    bound = count * point_text_bound(list(arrays), values)
    if bound > max_bytes:
        raise ServiceError(
            f"the batch's {count} points may store {bound} bytes of values as JSON, more "
            f"than a request body may carry ({max_bytes} bytes, DATARAX_MAX_BODY_MB); send "
            "fewer points per batch, or fewer or shorter-named metrics",
            code="value_too_large",
        )
