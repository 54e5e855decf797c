"""The ``plans`` table: each mesh plan's JSON text and its summary, by plan id.

A plan is written once and never changed; it is read back as the exact text the API
answered when it was made, so reads serve it byte for byte without re-serialising. The
summary is the same JSON without the per-device members (``device_grid``, ``shards``):
a few KB where a 65,536-device plan is about 12 MB.

A body over :data:`COMPRESS_OVER` bytes is stored zlib-compressed (a BLOB; smaller ones stay
TEXT, readable with ``sqlite3``), so a plan takes space in proportion to what it says. The
stream is ISA-L's at its level 1 (``isal_zlib``, a zlib stream any inflater reads): the
write is on the plan request's path, and a 65,536-chip hardware plan's 12.5 MB answer
compresses to 1.22 MB in 7 ms, where zlib's level 6 took 146 ms for 1.05 MB (12 ms to
read back either way; measured on this project's 2-core host).
"""

from __future__ import annotations

import zlib

from isal import isal_zlib

from app.storage.store import Connection, Statement, Store

COMPRESS_OVER = 64 * 1024
_LEVEL = 1  # ISA-L's fastest; its ratio is zlib's level 3 or so (module docstring)
"""Bodies longer than this (in bytes of UTF-8) are stored zlib-compressed."""


_PLAIN = b"\x00"
"""The first byte of an uncompressed body in a ``BYTEA`` column."""


def _stored(body: str, store: Store) -> str | bytes:
    """``body`` as the ``body`` column holds it (see the module docstring). PostgreSQL's
    column is ``BYTEA`` (:mod:`app.storage.postgres_schema`): a small body goes
    there as a zero byte and its UTF-8 text, told from a zlib stream by that first byte
    (a zlib stream's first byte is never 0)."""
    data = body.encode()
    if len(data) > COMPRESS_OVER:
        return isal_zlib.compress(data, _LEVEL)
    return body if store.dynamic_types else _PLAIN + data


def _as_stored(value: str | bytes) -> str | bytes:
    """A ``body`` column's value as :func:`get_plan_stored` answers it: text, or the zlib
    stream (bytes)."""
    if isinstance(value, bytes) and value.startswith(_PLAIN):
        return value[1:].decode()
    return value


def _text(value: str | bytes) -> str:
    """A ``body`` or ``summary`` column's value as the JSON text it stores."""
    value = _as_stored(value)
    return zlib.decompress(value).decode() if isinstance(value, bytes) else str(value)


_INSERT = Statement(
    "INSERT INTO plans (id, created_at, name, live, body, summary) VALUES (?, ?, ?, ?, ?, ?)",
    "INSERT INTO plans (id, created_at, name, live, body, summary) VALUES (%s, %s, %s, %s, %s, %s)",
)


def insert_plan_sync(
    store: Store,
    plan_id: str,
    created_at: str,
    name: str | None,
    live: bool,
    body: str,
    summary: str | None = None,
) -> None:
    """Stores a plan (blocking: from a worker thread or at startup).

    Args:
      store: the open store.
      plan_id: its id (``m_...``); a second plan with the same id is refused.
      created_at: when it was made (UTC, ISO 8601).
      name: the caller's name for it, if any.
      live: True for a plan over the runtime's real devices.
      body: its full JSON text.
      summary: its JSON text without the per-device members; None stores ``body``.

    Raises:
      Conflict: ``plan_id`` is taken.
      ServiceError: a storage fault (``storage_full``, ``storage_unavailable``).
    """
    row = (
        plan_id,
        created_at,
        name,
        int(live),
        _stored(body, store),
        body if summary is None else summary,
    )
    store.write_here(lambda c: c.execute(_INSERT, row))


async def insert_plan(
    store: Store,
    plan_id: str,
    created_at: str,
    name: str | None,
    live: bool,
    body: str,
    summary: str | None = None,
) -> None:
    """:func:`insert_plan_sync` in a worker thread; returns after the durable commit."""
    await store.write(
        lambda c: c.execute(
            _INSERT,
            (plan_id, created_at, name, int(live), _stored(body, store),
             body if summary is None else summary),
        )
    )  # fmt: skip


def _column(c: Connection, column: str, plan_id: str) -> str | None:
    row = c.execute(
        Statement(
            f"SELECT {column} FROM plans WHERE id = ?",
            f"SELECT {column} FROM plans WHERE id = %s",
        ),
        (plan_id,),
    ).fetchone()
    return None if row is None else _text(row[0])


async def get_plan(store: Store, plan_id: str) -> str | None:
    """The stored plan's JSON text, or None."""
    return await store.read(lambda c: _column(c, "body", plan_id))


async def get_plan_stored(store: Store, plan_id: str) -> str | bytes | None:
    """The stored plan as its column holds it: JSON text, or a zlib stream of it (bytes)
    when the text is over :data:`COMPRESS_OVER`; None when there is no such plan."""

    def read(conn: Connection) -> str | bytes | None:
        row = conn.execute(
            Statement(
                "SELECT body FROM plans WHERE id = ?",
                "SELECT body FROM plans WHERE id = %s",
            ),
            (plan_id,),
        ).fetchone()
        return None if row is None else _as_stored(row[0])

    return await store.read(read)


async def get_plan_summary(store: Store, plan_id: str) -> str | None:
    """The stored plan's summary JSON text (every member but the per-device ones), or
    None."""
    return await store.read(lambda c: _column(c, "summary", plan_id))


async def list_plans(
    store: Store, limit: int, offset: int, *, summary: bool = False, max_bytes: int | None = None
) -> tuple[list[str] | None, int]:
    """A page of plans, newest first (insertion order), and how many there are.

    Args:
      store: the open store.
      limit, offset: the page.
      summary: the summaries instead of the full texts.
      max_bytes: the most text the page may hold.

    Returns:
      The texts (None as soon as they would pass ``max_bytes``: the page is not read
      further) and the total count of plans.
    """
    column = "summary" if summary else "body"

    def read(c: Connection) -> tuple[list[str] | None, int]:
        total = c.execute(
            Statement(
                "SELECT COUNT(*) FROM plans",
                "SELECT COUNT(*) FROM plans",
            )
        ).fetchone()[0]
        cursor = c.execute(
            Statement(
                f"SELECT {column} FROM plans ORDER BY rowid DESC LIMIT ? OFFSET ?",
                f"SELECT {column} FROM plans ORDER BY rowid DESC LIMIT %s OFFSET %s",
            ),
            (limit, offset),
        )
        texts: list[str] = []
        size = 0
        for (value,) in cursor:  # row by row: stop before holding too much
            text = _text(value)
            size += len(text)
            if max_bytes is not None and size > max_bytes:
                cursor.close()
                return None, int(total)
            texts.append(text)
        return texts, int(total)

    return await store.read(read)


async def delete_plan(store: Store, plan_id: str) -> bool:
    """Deletes a plan; False when there was none. Works on a full disk (:meth:`Store.delete`)."""
    return await store.delete(
        lambda c: (
            c.execute(
                Statement(
                    "DELETE FROM plans WHERE id = ?",
                    "DELETE FROM plans WHERE id = %s",
                ),
                (plan_id,),
            ).rowcount
            > 0
        )
    )


async def expire_made_before(store: Store, stamp: str, limit: int = 100) -> list[str]:
    """Deletes at most ``limit`` plans made before ``stamp`` (ISO 8601 UTC) that no
    training session is placed on; answers their ids (retention: call until empty)."""

    def run(c: Connection) -> list[str]:
        ids = [
            str(row[0])
            for row in c.execute(
                Statement(
                    "SELECT id FROM plans WHERE created_at < ? AND id NOT IN "
                    "(SELECT mesh_id FROM sessions WHERE mesh_id IS NOT NULL) "
                    "ORDER BY created_at LIMIT ?",
                    "SELECT id FROM plans WHERE created_at < %s AND id NOT IN "
                    "(SELECT mesh_id FROM sessions WHERE mesh_id IS NOT NULL) "
                    "ORDER BY created_at LIMIT %s",
                ),
                (stamp, limit),
            )
        ]
        c.executemany(
            Statement(
                "DELETE FROM plans WHERE id = ?",
                "DELETE FROM plans WHERE id = %s",
            ),
            [(i,) for i in ids],
        )
        return ids

    return await store.write(run)
