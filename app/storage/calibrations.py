"""The ``calibrations`` table: calibration profiles the service measured or fitted
(``host`` and ``jobs`` kinds; the ``published`` ones ship with the library), each its
answer's JSON text, by id. A profile is written once and never changed."""

from __future__ import annotations

import sqlite3

from app.storage.db import Store


def _insert(conn: sqlite3.Connection, row: tuple[str, str, str, str, str | None, str]) -> None:
    conn.execute(
        "INSERT INTO calibrations (id, created_at, kind, hardware_kind, device_kind, body) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        row,
    )


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

    def run(conn: sqlite3.Connection) -> str | None:
        row = conn.execute("SELECT body FROM calibrations WHERE id = ?", (profile_id,)).fetchone()
        return None if row is None else str(row[0])

    return await store.read(run)


async def list_profiles(store: Store, limit: int = 1000) -> list[str]:
    """The stored profiles' JSON texts, newest first (``limit`` at most)."""

    def run(conn: sqlite3.Connection) -> list[str]:
        rows = conn.execute(
            "SELECT body FROM calibrations ORDER BY created_at DESC, id DESC LIMIT ?", (limit,)
        ).fetchall()
        return [str(row[0]) for row in rows]

    return await store.read(run)
