"""One column of rows as a PostgreSQL array in its binary wire format, packed at once.

The PostgreSQL store writes a many-row insert as one statement over arrays
(:attr:`app.storage.store.Statement.many`). psycopg dumps a Python list element by
element (about 1.3 us an element, most of a 1,000-step push's Python time); the columns
the store writes are of four types, which pack faster here: ``bigint`` and ``double
precision`` with numpy in one pass, ``text`` and ``bytea`` as one join. The format
(PostgreSQL's ``array_send``): ``ndim``, a has-nulls flag, the element type's oid, each
dimension's size and lower bound (1), then each element as its length (``-1``: NULL) and
its bytes, all big-endian.

:func:`packed` answers a value psycopg sends as it is (:func:`register`'s dumpers), or
None where the column is not one of those types or holds what the type cannot take
(NULLs in a numeric column, a float in an integer one): the list then goes through
psycopg's own dumpers.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

_ELEMENT_OIDS = {"bigint": 20, "double precision": 701, "text": 25, "bytea": 17}
_ARRAY_OIDS = {"bigint": 1016, "double precision": 1022, "text": 1009, "bytea": 1001}
_NULL = struct.pack(">i", -1)
_INT64_MAX = 2**63 - 1
_SIZE = struct.Struct(">i").pack
_NUMERIC = {
    "bigint": np.dtype([("size", ">i4"), ("value", ">i8")]),
    "double precision": np.dtype([("size", ">i4"), ("value", ">f8")]),
}


class PackedArray(bytes):
    """A column packed in the binary array format; ``pg_type`` names its element type."""

    pg_type = ""


_CLASSES: dict[str, type[PackedArray]] = {
    name: type(f"Packed_{name.replace(' ', '_')}", (PackedArray,), {"pg_type": name})
    for name in _ARRAY_OIDS
}


def _head(pg_type: str, count: int, nulls: bool) -> bytes:
    return struct.pack(">iiIii", 1, int(nulls), _ELEMENT_OIDS[pg_type], count, 1)


def _numeric(values: Sequence[Any], pg_type: str) -> bytes | None:
    kind = "iub" if pg_type == "bigint" else "iubf"
    try:
        array = np.asarray(values)
    except (ValueError, TypeError):
        return None
    if array.ndim != 1 or array.dtype.kind not in kind:
        return None  # NULLs (an object array), strings, floats in an integer column
    if array.dtype.kind == "u" and int(array.max()) > _INT64_MAX:
        return None  # would wrap round; PostgreSQL refuses it through psycopg's dumper
    body = np.empty(len(array), dtype=_NUMERIC[pg_type])
    body["size"] = 8
    body["value"] = array
    return _head(pg_type, len(array), False) + body.tobytes()


def _variable(values: Sequence[Any], pg_type: str) -> bytes | None:
    wanted: type = str if pg_type == "text" else bytes
    first = values[0]
    if type(first) is wanted and values.count(first) == len(values):  # a job's name
        data = first.encode() if isinstance(first, str) else cast(bytes, first)
        return _head(pg_type, len(values), False) + (_SIZE(len(data)) + data) * len(values)
    if any(type(v) is not wanted for v in values if v is not None):
        return None
    nulls = None in values
    if not nulls:
        encoded = [v.encode() for v in values] if wanted is str else values
        sizes = map(_SIZE, map(len, encoded))
        body = b"".join(itertools.chain.from_iterable(zip(sizes, encoded, strict=True)))
        return _head(pg_type, len(values), False) + body
    parts = [_head(pg_type, len(values), True)]
    for value in values:
        if value is None:
            parts.append(_NULL)
        else:
            data = value.encode() if wanted is str else value
            parts.append(_SIZE(len(data)))
            parts.append(data)
    return b"".join(parts)


def packed(values: Sequence[Any], pg_type: str) -> PackedArray | None:
    """``values`` as one ``pg_type[]`` in the binary format; None: not packable here."""
    if pg_type not in _CLASSES or not values:
        return None
    data = _numeric(values, pg_type) if pg_type in _NUMERIC else _variable(values, pg_type)
    return None if data is None else _CLASSES[pg_type](data)


def _as_is(_dumper: Any, obj: PackedArray) -> bytes:
    return obj


def register(adapters: Any) -> None:
    """Teaches ``adapters`` (a psycopg ``AdaptersMap``) to send a :class:`PackedArray` as
    the array it holds, in the binary format, as it is."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    for name, cls in _CLASSES.items():
        dumper = type(
            f"{cls.__name__}Dumper",
            (Dumper,),
            {"format": Format.BINARY, "oid": _ARRAY_OIDS[name], "dump": _as_is},
        )
        adapters.register_dumper(cls, dumper)
