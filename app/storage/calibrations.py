"""The ``calibrations`` table: calibration profiles the service measured or fitted
(``host`` and ``jobs`` kinds; the ``published`` ones ship with the library), each its
answer's JSON text, by id. A ``jobs`` profile is written once, done; a ``host`` profile is
written when its measuring starts (``status`` ``running``) and rewritten as each stage
ends, then once more ``done`` or ``failed``; a done profile never changes. A running
profile is owned by the process measuring it (:mod:`app.storage.owners`)."""

from __future__ import annotations

import orjson

from app.storage import owners
from app.storage.store import Connection, Statement, Store


def _insert(conn: Connection, row: tuple[str, str, str, str, str | None, str]) -> None:
    conn.execute(
        Statement(
            "INSERT INTO calibrations (id, created_at, kind, hardware_kind, device_kind, body) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            "INSERT INTO calibrations (id, created_at, kind, hardware_kind, device_kind, body) "
            "VALUES (%s, %s, %s, %s, %s, %s)",
        ),
        row,
    )
    _own(conn, row[0], row[-1])


def _own(conn: Connection, profile_id: str, body: str) -> None:
    """Claims a running profile for this process; releases one that ended."""
    if orjson.loads(body).get("status") == "running":
        owners.claim(conn, owners.CALIBRATION, profile_id)
    else:
        owners.release(conn, owners.CALIBRATION, profile_id)


async def insert_profile(
    store: Store,
    profile_id: str,
    created_at: str,
    kind: str,
    hardware_kind: str,
    device_kind: str | None,
    body: str,
) -> None:
    """Stores a profile; returns after the durable commit."""
    row = (profile_id, created_at, kind, hardware_kind, device_kind, body)
    await store.write(lambda c: _insert(c, row))


async def get_profile(store: Store, profile_id: str) -> str | None:
    """The profile's JSON text, or ``None``."""

    def run(conn: Connection) -> str | None:
        row = conn.execute(
            Statement(
                "SELECT body FROM calibrations WHERE id = ?",
                "SELECT body FROM calibrations WHERE id = %s",
            ),
            (profile_id,),
        ).fetchone()
        return None if row is None else str(row[0])

    return await store.read(run)


async def list_profiles(store: Store, limit: int = 1000) -> list[str]:
    """The stored profiles' JSON texts, newest first (``limit`` at most)."""

    def run(conn: Connection) -> list[str]:
        rows = conn.execute(
            Statement(
                "SELECT body FROM calibrations ORDER BY created_at DESC, id DESC LIMIT ?",
                "SELECT body FROM calibrations ORDER BY created_at DESC, id DESC LIMIT %s",
            ),
            (limit,),
        ).fetchall()
        return [str(row[0]) for row in rows]

    return await store.read(run)


async def update_profile(store: Store, profile_id: str, body: str) -> None:
    """Rewrites a profile's JSON text (a host profile's progress and its result)."""

    def run(conn: Connection) -> None:
        conn.execute(
            Statement(
                "UPDATE calibrations SET body = ? WHERE id = ?",
                "UPDATE calibrations SET body = %s WHERE id = %s",
            ),
            (body, profile_id),
        )
        _own(conn, profile_id, body)

    await store.write(run)


async def newest_host_profile(store: Store, device_kind: str) -> str | None:
    """The newest ``host`` profile measured on ``device_kind`` that finished
    (``status`` ``done``), as JSON text; ``None`` without one."""

    def run(conn: Connection) -> str | None:
        rows = conn.execute(
            Statement(
                "SELECT body FROM calibrations WHERE kind = 'host' AND device_kind = ? "
                "ORDER BY created_at DESC, id DESC",
                "SELECT body FROM calibrations WHERE kind = 'host' AND device_kind = %s "
                "ORDER BY created_at DESC, id DESC",
            ),
            (device_kind,),
        )
        for (body,) in rows:
            if orjson.loads(body).get("status") == "done":
                return str(body)
        return None

    return await store.read(run)


async def running_profiles(store: Store) -> list[str]:
    """The JSON texts of profiles still ``running`` whose process stopped mid-way (not
    those a running replica measures)."""

    def running(conn: Connection) -> dict[str, str]:
        rows = conn.execute(
            Statement(
                "SELECT id, body FROM calibrations WHERE kind = 'host'",
                "SELECT id, body FROM calibrations WHERE kind = 'host'",
            )
        ).fetchall()
        return {str(r[0]): str(r[1]) for r in rows if orjson.loads(r[1]).get("status") == "running"}

    await owners.settle(store, owners.CALIBRATION, lambda c: list(running(c)))

    def run(conn: Connection) -> list[str]:
        texts = running(conn)
        stale = owners.orphaned(conn, owners.CALIBRATION, texts, store.live_owners(conn))
        return [texts[pid] for pid in stale]

    return await store.read(run)
