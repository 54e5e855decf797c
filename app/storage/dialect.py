"""The store's SQL, read by PostgreSQL: one statement text for both engines.

The table modules write their statements once, in the SQL both engines share (SQLite's
upsert ``INSERT ... ON CONFLICT``, ``coalesce``, ``CASE``, ``LIMIT ? OFFSET ?``, columns
qualified by their table in ``DO UPDATE SET``); :func:`postgres_sql` turns what differs
into PostgreSQL's, once per statement text (cached):

- ``?`` placeholders become ``%s`` (and a literal ``%`` becomes ``%%``), outside quotes;
- the scalar ``min(a, b)`` / ``max(a, b)`` become ``least`` / ``greatest`` (the one-argument
  aggregates stay); where an argument may be NULL the statements already wrap them in
  ``coalesce(min(a, b), a, b)``, which means the same in both (SQLite's scalar ``min`` is
  NULL when an argument is; PostgreSQL's ``least`` skips NULLs);
- ``BEGIN``, ``BEGIN IMMEDIATE`` and ``BEGIN EXCLUSIVE`` become a ``SERIALIZABLE``
  transaction: SQLite's single writer makes every write transaction serializable, and
  PostgreSQL gives the same guarantee across processes only at that level (the store
  retries a transaction that loses, :mod:`app.storage.postgres`);
- table definitions (:func:`postgres_ddl`): ``INTEGER`` is ``BIGINT`` (an ``INTEGER PRIMARY
  KEY`` an identity, as SQLite numbers it), ``REAL`` ``DOUBLE PRECISION``, ``BLOB``
  ``BYTEA``, ``TEXT`` ``TEXT COLLATE "C"`` (byte order, as SQLite sorts: a database's own
  locale would sort metric names and ids differently), ``WITHOUT ROWID`` goes, and the
  tables read in insertion order (``ORDER BY rowid``: :data:`ROWID_TABLES`) get a
  ``rowid`` identity column.

An ``INSERT ... VALUES`` (an upsert too) sent for many rows (``executemany``) is one
statement over arrays instead (:func:`unnest_insert`): psycopg sends each row of an
``executemany`` as its own bind and execute, while ``INSERT ... SELECT ... FROM
unnest(%b::T[], ...)`` binds one array a column (in the binary format,
:mod:`app.storage.pg_arrays`), whatever the number of rows.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

ROWID_TABLES = frozenset({"plans", "sessions"})
"""Tables whose reads order by SQLite's implicit ``rowid`` (newest first): PostgreSQL has
none, so their definitions gain a ``rowid`` identity column that numbers rows as inserted."""

_BEGIN = re.compile(r"^\s*BEGIN(\s+(IMMEDIATE|EXCLUSIVE|DEFERRED))?\s*;?\s*$", re.IGNORECASE)
_SCALAR = re.compile(r"\b(min|max)\s*\(", re.IGNORECASE)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+TABLE\s+(IF\s+NOT\s+EXISTS\s+)?(\w+)\s*\(", re.IGNORECASE)


def _outside_quotes(sql: str) -> list[tuple[bool, str]]:
    """``sql`` in pieces, each marked True when it is outside a quoted literal or name."""
    pieces: list[tuple[bool, str]] = []
    start, quote = 0, ""
    for i, ch in enumerate(sql):
        if quote:
            if ch == quote:
                pieces.append((False, sql[start : i + 1]))
                start, quote = i + 1, ""
        elif ch in "'\"":
            pieces.append((True, sql[start:i]))
            start, quote = i, ch
    pieces.append((not quote, sql[start:]))
    return pieces


def _closing(sql: str, open_at: int) -> tuple[int, bool]:
    """Index of the parenthesis closing the one at ``open_at``, and whether a comma sits
    at its top level (a scalar ``min(a, b)`` rather than the aggregate ``min(a)``)."""
    depth, comma = 0, False
    for i in range(open_at, len(sql)):
        ch = sql[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i, comma
        elif ch == "," and depth == 1:
            comma = True
    raise ValueError(f"unbalanced parentheses in {sql!r}")


def _scalar_extremes(sql: str) -> str:
    """``min(a, b)`` -> ``least(a, b)``, ``max(a, b)`` -> ``greatest(a, b)``."""
    out, at = [], 0
    for match in _SCALAR.finditer(sql):
        if match.start() < at:
            continue
        _, scalar = _closing(sql, match.end() - 1)
        if scalar:
            name = "least" if match.group(1).lower() == "min" else "greatest"
            out.append(sql[at : match.start()] + name + "(")
            at = match.end()
    out.append(sql[at:])
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def postgres_sql(sql: str) -> str:
    """One statement in PostgreSQL's words (see the module docstring). Statements that
    carry parameters are sent with them (``%s``), so a literal ``%`` is doubled."""
    if _BEGIN.match(sql):
        return "BEGIN ISOLATION LEVEL SERIALIZABLE"
    if _CREATE_TABLE.match(sql):
        return postgres_ddl(sql)
    pieces = []
    for outside, text in _outside_quotes(sql):
        if outside:
            text = _scalar_extremes(text.replace("%", "%%").replace("?", "%s"))
        else:
            text = text.replace("%", "%%")
        pieces.append(text)
    return "".join(pieces)


_TYPES = (
    (re.compile(r"\bINTEGER\s+PRIMARY\s+KEY\b", re.IGNORECASE),
     "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"),
    (re.compile(r"\bINTEGER\b", re.IGNORECASE), "BIGINT"),
    (re.compile(r"\bREAL\b", re.IGNORECASE), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b", re.IGNORECASE), "BYTEA"),
    (re.compile(r"\bTEXT\b", re.IGNORECASE), 'TEXT COLLATE "C"'),
    (re.compile(r"\)\s*WITHOUT\s+ROWID", re.IGNORECASE), ")"),
)  # fmt: skip


BINARY_COLUMNS = {"plans": ("body",)}
"""``TEXT`` columns that SQLite lets hold bytes too (a large plan's zlib stream): ``BYTEA``
in PostgreSQL, whose table module then writes bytes only (:mod:`app.storage.plans`)."""


def postgres_ddl(sql: str) -> str:
    """A ``CREATE TABLE`` (or ``CREATE INDEX``) statement of the SQLite schema in
    PostgreSQL's types (see the module docstring)."""
    match = _CREATE_TABLE.match(sql)
    for column in BINARY_COLUMNS.get(match.group(2) if match else "", ()):
        sql = re.sub(rf"\b{column}(\s+)TEXT\b", rf"{column}\1BLOB", sql, flags=re.IGNORECASE)
    for pattern, replacement in _TYPES:
        sql = pattern.sub(replacement, sql)
    match = _CREATE_TABLE.match(sql)
    if match is not None and match.group(2) in ROWID_TABLES:
        at = match.end()
        sql = f"{sql[:at]}\n    rowid BIGINT GENERATED BY DEFAULT AS IDENTITY,{sql[at:]}"
    return sql


_PLAIN_INSERT = re.compile(
    r"^\s*INSERT\s+INTO\s+(\w+)(\s+AS\s+\w+)?\s*\(([^()]*)\)\s*VALUES\s*\(([^()]*)\)"
    r"\s*(ON\s+CONFLICT\s*\(([^()]*)\)\s+DO\s+.*)?$",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class ArrayInsert:
    """An ``INSERT ... VALUES`` of one row read as one over arrays (:func:`unnest_insert`).

    Attributes:
      sql: the statement, one ``%b`` (a binary array) a placeholder of the row.
      keys: positions in the row of the ``ON CONFLICT`` key's columns (none: no upsert).
        One statement may not update a row twice, so rows whose keys repeat go one by one.
      types: each array's element type, in placeholder order.
    """

    sql: str
    keys: tuple[int, ...]
    types: tuple[str, ...]


@functools.lru_cache(maxsize=256)
def _parsed_insert(
    sql: str,
) -> tuple[str, str, tuple[str, ...], tuple[str, ...], str, tuple[str, ...]] | None:
    """``(table, alias, columns, values, conflict clause, conflict key)`` of an ``INSERT INTO
    t [AS a] (columns) VALUES (values) [ON CONFLICT (key) DO ...]``; None for any other
    statement or one whose literals hold quotes or ``%``."""
    match = _PLAIN_INSERT.match(sql)
    if match is None or "'" in sql or "%" in sql:
        return None
    columns = tuple(c.strip() for c in match.group(3).split(","))
    values = tuple(v.strip() for v in match.group(4).split(","))
    tail = match.group(5) or ""
    if len(columns) != len(values) or "?" in tail:
        return None
    key = tuple(c.strip() for c in (match.group(6) or "").split(",") if c.strip())
    alias = match.group(2) or ""
    return match.group(1), alias, columns, values, _scalar_extremes(tail), key


def unnest_insert(sql: str, types: Mapping[str, Mapping[str, str]]) -> ArrayInsert | None:
    """``INSERT INTO t (a, b, c) VALUES (?, ?, 1) [ON CONFLICT (a) DO ...]`` as ``INSERT
    INTO t (a, b, c) SELECT u.c0, u.c1, 1 FROM unnest(%b::A[], %b::B[]) AS u(c0, c1)
    [ON CONFLICT (a) DO ...]``: sent with one list a placeholder (the column's values in
    row order), it writes every row in one statement. ``types``: each table's column
    types as PostgreSQL names them (``information_schema.columns.data_type``). None: not
    such an insert, a placeholder inside an expression, or a column's type unknown (send
    the rows one by one)."""
    parsed = _parsed_insert(sql)
    if parsed is None:
        return None
    table, alias, columns, values, tail, key = parsed
    known = types.get(table, {})
    arrays: list[str] = []
    select: list[str] = []
    position: dict[str, int] = {}
    for column, value in zip(columns, values, strict=True):
        if value == "?":
            if column not in known:
                return None
            position[column] = len(arrays)
            select.append(f"u.c{len(arrays)}")
            arrays.append(f"%b::{known[column]}[]")
        elif "?" in value:
            return None
        else:
            select.append(value)
    if any(column not in position for column in key):
        return None
    names = ", ".join(f"c{i}" for i in range(len(arrays)))
    statement = (
        f"INSERT INTO {table}{alias} ({', '.join(columns)}) SELECT {', '.join(select)} "
        f"FROM unnest({', '.join(arrays)}) AS u({names})"
    )
    return ArrayInsert(
        f"{statement} {tail}".strip(),
        tuple(position[c] for c in key),
        tuple(known[c] for c in sorted(position, key=position.__getitem__)),
    )


def statements(script: str) -> list[str]:
    """The statements of a script (``;``-separated; the schema holds no ``;`` in
    literals), blank ones dropped."""
    return [part.strip() for part in script.split(";") if part.strip()]
