"""Which service process owns unfinished work, so that a process that starts fails only
what a stopped one left behind, never what a running replica is doing.

A compile check stays ``queued`` or ``compiling``, a host calibration ``running``, while
the process that took it works on it (a training session lives in the runtime of the
process that created it, :mod:`app.storage.sessions`); if that process stops, the next
one to start marks such work failed. With one process per SQLite file every owner but
the starting process is gone; with replicas on one PostgreSQL database
(:mod:`app.storage.postgres`) each process holds a shared advisory lock keyed by
:data:`OWNER` while it runs, and an owner is alive while its lock is held (PostgreSQL
drops it with the process's connection, a ``kill -9`` included). Rows of ``work_owners``
exist while the work is unfinished (a session's until it is deleted).

A replica whose database connection was lost (a database restart) holds no lock until it
connects again, within :data:`app.storage.postgres.KEEPALIVE_S`: a starting process that
finds work without a live owner waits that store's ``owner_grace_s`` and looks again
(:func:`settle`) before failing it.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from typing import Any

from anyio import sleep

from app.storage.store import Connection, Statement

OWNER = secrets.randbits(31) | 1
"""This process's owner key (random, positive, fits PostgreSQL's int4 advisory key)."""
OWNER_CLASS = 0x64617461
"""The first key of the owners' advisory locks ("data"), apart from other locks."""

COMPILE_CHECK = "compile_check"
CALIBRATION = "calibration"
SESSION = "session"


def claim(conn: Connection, kind: str, item_id: str) -> None:
    """Records this process as the owner of unfinished work ``item_id``."""
    conn.execute(
        Statement(
            "INSERT INTO work_owners (kind, id, owner) VALUES (?, ?, ?) "
            "ON CONFLICT (kind, id) DO UPDATE SET owner = excluded.owner",
            "INSERT INTO work_owners (kind, id, owner) VALUES (%s, %s, %s) "
            "ON CONFLICT (kind, id) DO UPDATE SET owner = excluded.owner",
        ),
        (kind, item_id, OWNER),
    )


def release(conn: Connection, kind: str, item_id: str) -> None:
    """Forgets the owner of work that has ended."""
    conn.execute(
        Statement(
            "DELETE FROM work_owners WHERE kind = ? AND id = ?",
            "DELETE FROM work_owners WHERE kind = %s AND id = %s",
        ),
        (kind, item_id),
    )


def orphaned(conn: Connection, kind: str, ids: Iterable[str], alive: set[int]) -> list[str]:
    """Those of ``ids`` whose owner is not among ``alive`` (or was never recorded: work
    stored before owners were)."""
    out = []
    for item_id in ids:
        row = conn.execute(
            Statement(
                "SELECT owner FROM work_owners WHERE kind = ? AND id = ?",
                "SELECT owner FROM work_owners WHERE kind = %s AND id = %s",
            ),
            (kind, item_id),
        ).fetchone()
        if row is None or int(row[0]) not in alive:
            out.append(item_id)
    return out


async def settle(store: Any, kind: str, unfinished: Callable[[Connection], Iterable[str]]) -> None:
    """Before ``store``'s unfinished work of ``kind`` is judged orphaned: when some of it
    has no live owner now and the store lets owners reconnect (``owner_grace_s``:
    PostgreSQL's replicas; SQLite has one process a file), waits that long, so that an
    owner back on its connection by then keeps its work. ``unfinished``: the work's ids."""
    grace = float(getattr(store, "owner_grace_s", 0.0))
    if grace <= 0:
        return

    def candidates(conn: Connection) -> list[str]:
        return orphaned(conn, kind, unfinished(conn), store.live_owners(conn))

    if await store.read(candidates):
        await sleep(grace)
