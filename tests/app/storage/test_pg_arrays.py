"""Columns packed as PostgreSQL binary arrays (app/storage/pg_arrays.py), read back by a
real PostgreSQL (tests/postgres_fixtures.py) as the values they came from."""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest

from app.storage import pg_arrays

COLUMNS = [
    ("bigint", [0, 1, -1, 2**62, -(2**63), 2**63 - 1, True, np.int64(7)]),
    ("double precision", [0.0, -1.5, 1e300, 5e-324, math.inf, -math.inf, 3, np.float32(0.25)]),
    ("text", ["", "loss", "émoji ✓", "a\x01b", "x" * 5000, "quote'\"\\", "{,}", "NULL"]),
    ("text", ["job-a"] * 9),
    ("text", ["a", None, "", None]),
    ("bytea", [b"", b"\x00\x01\xff", bytes(range(256)), None, b"NULL"]),
    ("bytea", [b"\x00" * 3] * 4),
]


@pytest.mark.parametrize(("pg_type", "values"), COLUMNS)
def test_a_packed_column_reads_back_as_its_values(postgres_url, pg_type, values):
    array = pg_arrays.packed(values, pg_type)
    assert isinstance(array, pg_arrays.PackedArray)
    adapters = psycopg.adapt.AdaptersMap(psycopg.adapters)
    pg_arrays.register(adapters)
    expected = [v.item() if isinstance(v, np.generic) else v for v in values]
    if pg_type in ("bigint", "double precision"):  # one Python type, as psycopg takes it
        expected = [(int if pg_type == "bigint" else float)(v) for v in expected]
    with psycopg.connect(postgres_url, context=adapters) as conn:
        got = conn.execute(f"SELECT %b::{pg_type}[]", [array]).fetchone()[0]
        theirs = conn.execute(f"SELECT %b::{pg_type}[]", [expected]).fetchone()[0]
    assert got == theirs == expected


@pytest.mark.parametrize(
    ("pg_type", "values"),
    [
        ("bigint", [1, None]),  # NULLs in a numeric column: psycopg's dumper
        ("bigint", [1, 2.5]),
        ("bigint", [2**64]),
        ("bigint", [2**63]),  # numpy reads it as uint64: it would wrap round
        ("bigint", [1, 2**63]),  # and this as float64
        ("double precision", ["1.0"]),
        ("text", ["a", b"b"]),
        ("bytea", [b"a", "b"]),
        ("text", []),
        ("boolean", [True]),
    ],
)
def test_what_the_packer_does_not_take_is_left_to_psycopg(pg_type, values):
    assert pg_arrays.packed(values, pg_type) is None
