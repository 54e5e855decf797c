"""Reductions of small per-device metrics given as Python lists, without NumPy.

The service's most common reduce is a handful of metrics over a few devices, sent as
JSON lists (``{"loss": [0.9, 1.1, ...], "step": [10, 10, ...]}``). Turning each list into
an array and back costs more than the arithmetic; :func:`reduce_number_lists` answers
such a request from the lists themselves, with the same values, bit for bit, as
:func:`datarax.metrics.reductions.reduce_custom` gives for the arrays the service would
have built (float64 for lists with a float, int64 for integer lists):

- float sums and means add in NumPy's own order (its pairwise summation: eight partial
  sums for 8 to 128 values, a plain loop below 8), then divide by the device count as
  ``np.mean`` does;
- integer sums and maxima are exact Python integers, refused (``None``) when they leave
  int64, where the general path raises ``integer_overflow``; integer means divide the
  exact sum, as the general path does for up to 64 devices.

It answers only what it can answer the same way; everything else returns ``None`` and
the caller takes the general path, which gives the value or the error: more than
:data:`MAX_DEVICES` devices, nested lists, bools, an integer a float64 list could not hold
exactly, weights, an unknown op or metric, a sum that is not finite (the general path
computes an overflow-free one), a maximum or minimum of zero (NumPy's choice between
``0.0`` and ``-0.0`` is its own). ``tests/datarax/metrics/test_list_reductions.py``
checks the values against the general path on random inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = ["MAX_DEVICES", "reduce_number_lists"]

MAX_DEVICES = 64
"""Lists longer than this take the general (NumPy) path."""

_INT64 = (-(2**63), 2**63 - 1)
_FLOAT_EXACT = 2**53
_OPS = frozenset({"mean", "sum", "max", "min"})
_NAN_POLICIES = frozenset({"propagate", "omit", "raise"})


def _pairwise(values: list[float], lo: int, n: int) -> float:
    """NumPy's pairwise sum of ``values[lo:lo + n]`` (``n <= MAX_DEVICES`` here, so the
    split above 128 values never happens)."""
    if n < 8:
        total = 0.0
        for i in range(lo, lo + n):
            total += values[i]
        return total
    r = values[lo : lo + 8]
    i = 8
    whole = n - n % 8
    while i < whole:
        at = lo + i
        r[0] += values[at]
        r[1] += values[at + 1]
        r[2] += values[at + 2]
        r[3] += values[at + 3]
        r[4] += values[at + 4]
        r[5] += values[at + 5]
        r[6] += values[at + 6]
        r[7] += values[at + 7]
        i += 8
    total = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        total += values[lo + i]
        i += 1
    return total


def _as_floats(values: list[object]) -> list[float] | None:
    """A list with a float in it, as float64 values; None when an int could not be held
    exactly (NumPy's and Python's roundings of such an int are not promised equal)."""
    out: list[float] = []
    for v in values:
        kind = type(v)
        if kind is float:
            out.append(v)  # type: ignore[arg-type]
        elif kind is int and -_FLOAT_EXACT <= v <= _FLOAT_EXACT:  # type: ignore[operator]
            out.append(float(v))  # type: ignore[arg-type]
        else:
            return None
    return out


def _reduce_ints(values: list[int], op: str) -> int | float | None:
    if op == "max":
        return max(values)
    if op == "min":
        return min(values)
    total = sum(values)
    if op == "mean":
        return total / len(values)  # int / int: correctly rounded
    return total if _INT64[0] <= total <= _INT64[1] else None


def _reduce_floats(values: list[float], op: str) -> float | None:
    total = _pairwise(values, 0, len(values))
    if not math.isfinite(total):
        return None  # an overflow (inputs from JSON are finite): the general path's work
    if op == "sum":
        return total
    if op == "mean":
        return total / len(values)
    out = max(values) if op == "max" else min(values)
    return None if out == 0.0 else out


def reduce_number_lists(
    metrics: Mapping[str, object],
    ops: Mapping[str, object],
    nan_policy: object = "propagate",
) -> tuple[dict[str, int | float], int] | None:
    """Reduces flat lists of finite numbers over the devices, or says it cannot.

    Args:
      metrics: ``{name: [v_0, ..., v_{n-1}]}``, one value per device, as JSON decodes
        them (``float`` and ``int``; every float finite).
      ops: ``{name: "mean" | "sum" | "max" | "min"}``; unlisted metrics use ``mean``.
      nan_policy: any of ``reduce_custom``'s; with finite values all three answer alike.

    Returns:
      ``(reduced, n_devices)``: Python ``float`` (float lists, and every mean) or ``int``
      values equal to what ``reduce_custom`` gives for the arrays, or None when the
      general path must answer (see the module docstring).
    """
    if not metrics or type(nan_policy) is not str or nan_policy not in _NAN_POLICIES:
        return None
    for name, op in ops.items():
        if type(op) is not str or op not in _OPS or name not in metrics:
            return None
    n = -1
    out: dict[str, int | float] = {}
    for name, values in metrics.items():
        if type(values) is not list:
            return None
        if n < 0:
            n = len(values)
            if not 0 < n <= MAX_DEVICES:
                return None
        elif len(values) != n:
            return None
        op = ops.get(name, "mean")
        kinds = set(map(type, values))
        if kinds == {int}:
            if not (_INT64[0] <= min(values) and max(values) <= _INT64[1]):
                return None
            value = _reduce_ints(values, op)  # type: ignore[arg-type]
        elif kinds <= {int, float}:
            floats = _as_floats(values)
            value = None if floats is None else _reduce_floats(floats, op)  # type: ignore[arg-type]
        else:
            return None
        if value is None:
            return None
        out[name] = value
    return out, n
