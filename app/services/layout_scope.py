"""Which devices a layout picture shows: the scope filters of its address.

A scope is the ``slice``, ``host``, ``process`` and ``positions`` query parameters, each a
number ``N`` or an inclusive range ``N-M``; several filters intersect, and ``positions``
counts devices in mesh order (the order of the plan's ``shards``). A scope filters the
stored plan, so a picture's address is a stable, shareable name for it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from app.core.errors import InvalidParameter

SCOPE_PARAMS = ("slice", "host", "process", "positions")
_RANGE = re.compile(r"^(\d{1,9})(?:-(\d{1,9}))?$")

# Viridis, sampled at 9 stops: perceptually even and readable on white.


def span_text(lo: Any, hi: Any) -> str:
    return str(lo) if lo == hi else f"{lo}\u2013{hi}"


def parse_scope(params: Mapping[str, str | None]) -> dict[str, tuple[int, int]]:
    """``{"slice": "3", "positions": "0-1023"}`` -> ``{"slice": (3, 3), "positions": (0,
    1023)}``; absent or empty values are left out.

    Raises:
      InvalidParameter: a value that is not ``N`` or ``N-M`` with ``N <= M`` (422
        ``validation_error``, naming the query parameter).
    """
    scope: dict[str, tuple[int, int]] = {}
    for name in SCOPE_PARAMS:
        value = params.get(name)
        if value is None or value == "":
            continue
        match = _RANGE.match(value)
        if not match:
            raise InvalidParameter(
                ("query", name), f"{value!r} is not a number N or a range N-M, e.g. 3 or 0-3"
            )
        lo = int(match.group(1))
        hi = int(match.group(2)) if match.group(2) is not None else lo
        if hi < lo:
            raise InvalidParameter(("query", name), f"the range {value!r} ends before it starts")
        scope[name] = (lo, hi)
    return scope


def scope_query(scope: Mapping[str, tuple[int, int]]) -> str:
    parts = []
    for k in SCOPE_PARAMS:
        if k in scope:
            lo, hi = scope[k]
            parts.append(f"{k}={lo}" if lo == hi else f"{k}={lo}-{hi}")
    return "&".join(parts)


def select_positions(
    shards: Sequence[Mapping[str, Any]], scope: Mapping[str, tuple[int, int]]
) -> list[int]:
    """The positions (mesh order) of the devices in ``scope``."""
    n = len(shards)
    lo, hi = scope.get("positions", (0, n - 1))
    positions = range(max(lo, 0), min(hi, n - 1) + 1)
    keyed = [(k, "process_index" if k == "process" else k) for k in ("slice", "host", "process")]
    tests = [(field_, scope[k]) for k, field_ in keyed if k in scope]
    if not tests:
        return list(positions)
    out = []
    for p in positions:
        shard = shards[p]
        for field_, (a, b) in tests:
            v = shard.get(field_, 0 if field_ == "process_index" else None)
            if v is None or not a <= v <= b:
                break
        else:
            out.append(p)
    return out


def scope_text(scope: Mapping[str, tuple[int, int]]) -> str:
    one = {"slice": "slice", "host": "host", "process": "process", "positions": "position"}
    many = {"slice": "slices", "host": "hosts", "process": "processes", "positions": "positions"}
    return ", ".join(
        f"{(one if scope[k][0] == scope[k][1] else many)[k]} {span_text(*scope[k])}"
        for k in SCOPE_PARAMS
        if k in scope
    )
