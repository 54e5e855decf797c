"""The ``sessions`` table: each training session's metadata as one JSON text, by id.

The record (spec, step count, last loss, layouts, loss history) is written at creation
and rewritten after each step; :mod:`app.services.sessions` builds and reads it. The
parameters themselves live in the runtime process, never here: in the runtime of the
process that created the session, its owner (:mod:`app.storage.owners`), which replicas
sharing a PostgreSQL database tell apart (:func:`held_elsewhere`).
"""

from __future__ import annotations

import sqlite3

from app.storage import owners
from app.storage.db import Store


async def insert_session(
    store: Store, session_id: str, mesh_id: str, created_at: str, body: str
) -> None:
    """Stores a new session's record; returns after the durable commit.

    Raises:
      sqlite3.IntegrityError: ``session_id`` is taken.
      ServiceError: a storage fault (``storage_full``, ``storage_unavailable``).
    """
    row = (session_id, mesh_id, created_at, body)

    def run(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO sessions (id, mesh_id, created_at, body) VALUES (?, ?, ?, ?)", row)
        owners.claim(c, owners.SESSION, session_id)

    await store.write(run)


async def update_session(store: Store, session_id: str, body: str) -> bool:
    """Replaces a session's record; False when there is no such session."""
    return await store.write(
        lambda c: (
            c.execute("UPDATE sessions SET body = ? WHERE id = ?", (body, session_id)).rowcount > 0
        )
    )


async def get_session(store: Store, session_id: str) -> str | None:
    """The session's record (JSON text), or None."""

    def read(c: sqlite3.Connection) -> str | None:
        row = c.execute("SELECT body FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return None if row is None else str(row[0])

    return await store.read(read)


async def delete_session(store: Store, session_id: str) -> bool:
    """Deletes a session's record; False when there was none. Works on a full disk
    (:meth:`Store.delete`)."""

    def run(c: sqlite3.Connection) -> bool:
        owners.release(c, owners.SESSION, session_id)
        return c.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount > 0

    return await store.delete(run)


async def held_elsewhere(store: Store, session_id: str) -> bool:
    """True when another live service process (a replica on the same database) created
    the session and holds its parameters."""

    def read(c: sqlite3.Connection) -> bool:
        row = c.execute(
            "SELECT owner FROM work_owners WHERE kind = ? AND id = ?", (owners.SESSION, session_id)
        ).fetchone()
        if row is None or int(row[0]) == owners.OWNER:
            return False
        return int(row[0]) in store.live_owners(c)

    return await store.read(read)


async def list_sessions(
    store: Store, limit: int, offset: int, mesh_id: str | None = None
) -> tuple[list[str], int]:
    """A page of session records (JSON texts), newest first, and how many there are (of
    ``mesh_id``'s, when given)."""
    where, args = ("WHERE mesh_id = ?", (mesh_id,)) if mesh_id is not None else ("", ())

    def read(c: sqlite3.Connection) -> tuple[list[str], int]:
        total = c.execute(f"SELECT COUNT(*) FROM sessions {where}", args).fetchone()[0]
        rows = c.execute(
            f"SELECT body FROM sessions {where} ORDER BY rowid DESC LIMIT ? OFFSET ?",
            (*args, limit, offset),
        ).fetchall()
        return [row[0] for row in rows], int(total)

    return await store.read(read)
