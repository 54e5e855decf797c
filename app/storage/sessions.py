"""The ``sessions`` table: each training session's metadata as one JSON text, by id.

The record (spec, step count, last loss, layouts, loss history) is written at creation
and rewritten after each step; :mod:`app.services.sessions` builds and reads it. The
parameters themselves live in the runtime process, never here: in the runtime of the
process that created the session, its owner (:mod:`app.storage.owners`), which replicas
sharing a PostgreSQL database tell apart (:func:`held_elsewhere`).
"""

from __future__ import annotations

from app.storage import owners
from app.storage.store import Connection, Statement, Store


async def insert_session(
    store: Store, session_id: str, mesh_id: str, created_at: str, body: str
) -> None:
    """Stores a new session's record; returns after the durable commit.

    Raises:
      Conflict: ``session_id`` is taken.
      ServiceError: a storage fault (``storage_full``, ``storage_unavailable``).
    """
    row = (session_id, mesh_id, created_at, body)

    def run(c: Connection) -> None:
        c.execute(
            Statement(
                "INSERT INTO sessions (id, mesh_id, created_at, body) VALUES (?, ?, ?, ?)",
                "INSERT INTO sessions (id, mesh_id, created_at, body) VALUES (%s, %s, %s, %s)",
            ),
            row,
        )
        owners.claim(c, owners.SESSION, session_id)

    await store.write(run)


async def update_session(store: Store, session_id: str, body: str) -> bool:
    """Replaces a session's record; False when there is no such session."""
    return await store.write(
        lambda c: (
            c.execute(
                Statement(
                    "UPDATE sessions SET body = ? WHERE id = ?",
                    "UPDATE sessions SET body = %s WHERE id = %s",
                ),
                (body, session_id),
            ).rowcount
            > 0
        )
    )


async def get_session(store: Store, session_id: str) -> str | None:
    """The session's record (JSON text), or None."""

    def read(c: Connection) -> str | None:
        row = c.execute(
            Statement(
                "SELECT body FROM sessions WHERE id = ?",
                "SELECT body FROM sessions WHERE id = %s",
            ),
            (session_id,),
        ).fetchone()
        return None if row is None else str(row[0])

    return await store.read(read)


async def delete_session(store: Store, session_id: str) -> bool:
    """Deletes a session's record; False when there was none. Works on a full disk
    (:meth:`Store.delete`)."""

    def run(c: Connection) -> bool:
        owners.release(c, owners.SESSION, session_id)
        return (
            c.execute(
                Statement(
                    "DELETE FROM sessions WHERE id = ?",
                    "DELETE FROM sessions WHERE id = %s",
                ),
                (session_id,),
            ).rowcount
            > 0
        )

    return await store.delete(run)


async def held_elsewhere(store: Store, session_id: str) -> int | None:
    """The owner key (:data:`app.storage.owners.OWNER`) of another live service process
    (a replica on the same database) that created the session and holds its parameters;
    None when there is none (never 0: keys are odd)."""

    def read(c: Connection) -> int | None:
        row = c.execute(
            Statement(
                "SELECT owner FROM work_owners WHERE kind = ? AND id = ?",
                "SELECT owner FROM work_owners WHERE kind = %s AND id = %s",
            ),
            (owners.SESSION, session_id),
        ).fetchone()
        if row is None or int(row[0]) == owners.OWNER:
            return None
        return int(row[0]) if int(row[0]) in store.live_owners(c) else None

    return await store.read(read)


_COUNT = Statement("SELECT COUNT(*) FROM sessions", "SELECT COUNT(*) FROM sessions")
_COUNT_OF_MESH = Statement(
    "SELECT COUNT(*) FROM sessions WHERE mesh_id = ?",
    "SELECT COUNT(*) FROM sessions WHERE mesh_id = %s",
)
_PAGE = Statement(
    "SELECT body FROM sessions ORDER BY rowid DESC LIMIT ? OFFSET ?",
    "SELECT body FROM sessions ORDER BY rowid DESC LIMIT %s OFFSET %s",
)
_PAGE_OF_MESH = Statement(
    "SELECT body FROM sessions WHERE mesh_id = ? ORDER BY rowid DESC LIMIT ? OFFSET ?",
    "SELECT body FROM sessions WHERE mesh_id = %s ORDER BY rowid DESC LIMIT %s OFFSET %s",
)


async def list_sessions(
    store: Store, limit: int, offset: int, mesh_id: str | None = None
) -> tuple[list[str], int]:
    """A page of session records (JSON texts), newest first, and how many there are (of
    ``mesh_id``'s, when given)."""
    args: tuple[str, ...] = () if mesh_id is None else (mesh_id,)
    count, page = (_COUNT, _PAGE) if mesh_id is None else (_COUNT_OF_MESH, _PAGE_OF_MESH)

    def read(c: Connection) -> tuple[list[str], int]:
        total = c.execute(count, args).fetchone()[0]
        rows = c.execute(page, (*args, limit, offset)).fetchall()
        return [row[0] for row in rows], int(total)

    return await store.read(read)
