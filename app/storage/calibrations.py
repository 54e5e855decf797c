"""The ``calibrations`` table: calibration profiles the service measured or fitted
(``host`` and ``jobs`` kinds; the ``published`` ones ship with the library), each its
answer's JSON text, by id. A ``jobs`` profile is written once, done; a ``host`` profile is
written when its measuring starts (``status`` ``running``) and rewritten as each stage
ends, then once more ``done`` or ``failed``; a done profile never changes. A running
profile is owned by the process measuring it (:mod:`app.storage.owners`).

Retention: a write that stores a profile deletes, in its transaction, those past the
newest ``keep`` (``DATARAX_CALIBRATIONS_KEEP``) but a running one and each device kind's
newest done host profile (the default plans on those devices take). One host
calibration at a time: :func:`start_host_profile` checks for a running one and stores
its own in one write transaction (SQLite has one writer; PostgreSQL's write transactions
are serializable, so two replicas starting at once cannot both find none: one is rolled
back, runs again and finds the other's)."""

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


def _newest_host(conn: Connection, device_kind: str | None) -> str | None:
    """The id of the newest done ``host`` profile of ``device_kind``, or ``None``."""
    rows = conn.execute(
        Statement(
            "SELECT id, body FROM calibrations WHERE kind = 'host' AND device_kind = ? "
            "ORDER BY created_at DESC, id DESC",
            "SELECT id, body FROM calibrations WHERE kind = 'host' AND device_kind = %s "
            "ORDER BY created_at DESC, id DESC",
        ),
        (device_kind,),
    )
    for profile_id, body in rows:
        if orjson.loads(body).get("status") == "done":
            return str(profile_id)
    return None


def _prune(conn: Connection, keep: int) -> int:
    """Deletes the profiles past the newest ``keep`` but the running ones and each device
    kind's newest done host profile; answers how many."""
    rows = conn.execute(
        Statement(
            "SELECT id, kind, device_kind FROM calibrations "
            "ORDER BY created_at DESC, id DESC LIMIT -1 OFFSET ?",
            "SELECT id, kind, device_kind FROM calibrations "
            "ORDER BY created_at DESC, id DESC OFFSET %s",
        ),
        (keep,),
    ).fetchall()
    deleted = 0
    for profile_id, kind, device_kind in rows:
        if kind == "host":
            body = _body(conn, str(profile_id))
            running = body is not None and orjson.loads(body).get("status") == "running"
            if running or _newest_host(conn, device_kind) == profile_id:
                continue
        _delete(conn, str(profile_id))
        deleted += 1
    return deleted


def _body(conn: Connection, profile_id: str) -> str | None:
    row = conn.execute(
        Statement(
            "SELECT body FROM calibrations WHERE id = ?",
            "SELECT body FROM calibrations WHERE id = %s",
        ),
        (profile_id,),
    ).fetchone()
    return None if row is None else str(row[0])


def _delete(conn: Connection, profile_id: str) -> None:
    conn.execute(
        Statement(
            "DELETE FROM calibrations WHERE id = ?",
            "DELETE FROM calibrations WHERE id = %s",
        ),
        (profile_id,),
    )
    owners.release(conn, owners.CALIBRATION, profile_id)


async def insert_profile(
    store: Store,
    profile_id: str,
    created_at: str,
    kind: str,
    hardware_kind: str,
    device_kind: str | None,
    body: str,
    *,
    keep: int | None = None,
) -> None:
    """Stores a profile and, with ``keep``, deletes those past the newest ``keep`` (see
    the module docstring) in the same transaction; returns after the durable commit."""
    row = (profile_id, created_at, kind, hardware_kind, device_kind, body)

    def run(conn: Connection) -> None:
        _insert(conn, row)
        if keep is not None:
            _prune(conn, keep)

    await store.write(run)


def _running_here(conn: Connection, alive: set[int]) -> str | None:
    """The id of a host calibration measuring now: a running profile whose owner lives."""
    rows = conn.execute(
        Statement(
            "SELECT id, owner FROM work_owners WHERE kind = ? ORDER BY id",
            "SELECT id, owner FROM work_owners WHERE kind = %s ORDER BY id",
        ),
        (owners.CALIBRATION,),
    ).fetchall()
    return next((str(pid) for pid, owner in rows if int(owner) in alive), None)


async def start_host_profile(
    store: Store,
    profile_id: str,
    created_at: str,
    hardware_kind: str,
    device_kind: str,
    body: str,
    *,
    keep: int | None = None,
) -> str | None:
    """Stores a running ``host`` profile (claimed by this process) unless one measures
    already, in one write transaction; answers ``None`` when stored, else the running
    one's id (nothing stored)."""
    row = (profile_id, created_at, "host", hardware_kind, device_kind, body)

    def run(conn: Connection) -> str | None:
        running = _running_here(conn, store.live_owners(conn))
        if running is not None:
            return running
        _insert(conn, row)
        if keep is not None:
            _prune(conn, keep)
        return None

    return await store.write(run)


async def delete_profile(store: Store, profile_id: str) -> str:
    """Deletes a stored profile: answers ``deleted``, ``missing`` (no such id) or
    ``running`` (a host profile its live owner is measuring: kept)."""

    def run(conn: Connection) -> str:
        body = _body(conn, profile_id)
        if body is None:
            return "missing"
        if orjson.loads(body).get("status") == "running" and not owners.orphaned(
            conn, owners.CALIBRATION, [profile_id], store.live_owners(conn)
        ):
            return "running"
        _delete(conn, profile_id)
        return "deleted"

    return await store.delete(run)


async def get_profile(store: Store, profile_id: str) -> str | None:
    """The profile's JSON text, or ``None``."""
    return await store.read(lambda c: _body(c, profile_id))


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


async def page_profiles(store: Store, limit: int, offset: int) -> tuple[list[str], int]:
    """A page of the stored profiles' JSON texts, newest first, and how many are stored
    (one snapshot)."""

    def run(conn: Connection) -> tuple[list[str], int]:
        rows = conn.execute(
            Statement(
                "SELECT body FROM calibrations ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?",
                "SELECT body FROM calibrations ORDER BY created_at DESC, id DESC "
                "LIMIT %s OFFSET %s",
            ),
            (limit, offset),
        ).fetchall()
        total = conn.execute(
            Statement("SELECT count(*) FROM calibrations", "SELECT count(*) FROM calibrations")
        ).fetchone()
        return [str(row[0]) for row in rows], int(total[0])

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
        newest = _newest_host(conn, device_kind)
        return None if newest is None else _body(conn, newest)

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
