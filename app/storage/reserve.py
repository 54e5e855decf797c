"""Room to delete on a full disk: the space reserve beside the database, and the fence.

On a full disk SQLite cannot even delete: a delete, like any change, first appends its
pages to the WAL, and the WAL cannot grow. So the store keeps :data:`RESERVE_BYTES` of the
disk for deletes in a file of its own beside the database, ``<db>-reserve``: made once the
database is accepted (:meth:`app.storage.db.Store.open`; a file that is not the service's
never gets one) and the disk has room for it plus
:data:`app.storage.db.FREE_BYTES_TO_RECOVER`, and kept across restarts (a restart on a
full disk still has it). A delete that finds the disk full
(:meth:`app.storage.db.Store.delete`) removes the file, checkpoints the WAL into the
database file (growing it by the pages only the WAL held), runs in the room left, and
checkpoints again; a job too big for that room goes in pieces (:data:`PIECE_ROWS`).

A delete frees pages inside the database file (SQLite's freelist), not on the disk: the
file never shrinks (``auto_vacuum`` is off, and a ``VACUUM`` would need a copy of the
file). Later writes reuse those pages. While the reserve is missing for lack of room, the
store *fences* the file (``PRAGMA max_page_count`` = its current pages): other writes may
then only reuse freed pages, so they can never take the room the next delete needs, and
each commit is checkpointed at once so the WAL restarts in place instead of growing. The
reserve is made again, and the fence lifted, once the disk has room for it plus
``FREE_BYTES_TO_RECOVER`` (checked after each commit while fenced, readiness's probe
included).

The file starts with :data:`SIGNATURE` (what it is, in words; it names no path, so it
moves with its database) and is allocated with ``posix_fallocate`` (real blocks, never
sparse), then fsynced. A file at that path without the signature is not the service's: it
is never written, truncated or removed, and the store runs without a reserve (and without
a fence). A reserve whose blocks the file system does not keep (compression,
copy-on-write) cannot hold room, so it is not counted as one.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from app.core.errors import StorageFull
from app.storage.store import Connection

log = logging.getLogger("datarax.store")


class Writer(Protocol):
    """Runs a function in one durable transaction and answers its result (the store's)."""

    def __call__[U](self, fn: Callable[[Connection], U], /) -> U: ...


RESERVE_BYTES = 8 * 1024 * 1024
"""Bytes of disk kept for deletes. What a delete on a full disk needs, measured with 4 KiB
pages: first the checkpoint, which writes the pages only the WAL holds into the database
file, growing it: at most SQLite's checkpoint window (1,000 pages, 4 MiB, plus the last
transaction), 2.1-2.5 MB on the tests' filled 32 MiB disk. Then the delete's own WAL
frames: 16.5 KB (4 pages) for the largest plan (262,144 devices, 2.8 MB stored: its
overflow pages go to the freelist unread), a page or two for a session or a compile
check; for a job about 0.6-0.9 times its stored bytes (240 KB for 1,000 steps of 10
metrics, 2.3 MB for 10,000, 9.7 MB for 10,000 steps of 100 metrics, 11.8 MB for 50,000
of 10), which no fixed reserve bounds: a job that does not fit is deleted in pieces of
:data:`PIECE_ROWS` rows per table (1.0-1.2 MB of WAL each, measured at 10 and 100 metrics
a step), each checkpointed before the next. 8 MiB holds a whole checkpoint window and a
piece with room to spare (or twice the window, where checkpoints already failed while the
disk filled)."""

PIECE_ROWS = 1024
"""Rows per table in one piece of a job deleted in pieces (halved while a piece does not
fit, down to one row)."""

SIGNATURE = (
    b"datarax space reserve: disk room kept free so that deletes work when the disk is "
    b"full. Not data; the service makes it again when it is missing. See docs/LIMITS.md.\n"
)
"""How the reserve file starts (the rest is allocated, unwritten blocks)."""

_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_free(path: Path) -> int:
    """Bytes free to unprivileged users on the file system of ``path``'s directory."""
    try:
        stats = os.statvfs(path.parent)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def _sync_directory(directory: Path) -> None:
    """Makes a file's creation or removal in ``directory`` durable (best effort)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class SpaceReserve:
    """The reserve file of one database: ``<db>-reserve``.

    Attributes:
      path: the file.
      present: the file is there, the service's, and its blocks allocated.
      missing: why it is not there, in words (for problem details and logs).
      for_lack_of_room: it is missing because the disk had no room for it (or a delete
        used it): the store then fences its file. False for other reasons (a foreign file
        at the path, an unwritable directory), where there is no room to keep.
    """

    def __init__(self, db: Path) -> None:
        self.path = Path(f"{db}-reserve")
        self.present = False
        self.missing = "it was not made yet"
        self.for_lack_of_room = False

    def keep(self, spare: int = 0) -> bool:
        """Makes sure the reserve is there: an existing one of the service's is kept (and
        allocated to full size if it is short), a missing one is made when the disk has
        room for it and ``spare`` bytes more. Returns :attr:`present`; never raises for the
        file system (the reason is kept)."""
        try:
            self._keep(spare)
        except OSError as err:
            self.present = False
            self.for_lack_of_room = err.errno in _NO_ROOM
            self.missing = (
                f"there was no room for it ({self.path}: {os.strerror(err.errno or 0)})"
                if self.for_lack_of_room
                else f"it cannot be made ({self.path}: {err})"
            )
            log.warning("no space reserve for deletes on a full disk: %s", self.missing)
        return self.present

    def _keep(self, spare: int) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            if disk_free(self.path) < RESERVE_BYTES + spare:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path)) from None
            self._make()
            return
        try:
            if os.pread(fd, len(SIGNATURE), 0) != SIGNATURE:
                self.present = self.for_lack_of_room = False
                self.missing = (
                    f"{self.path} exists and is not the service's (it does not start with "
                    "the reserve's signature); it was left untouched: move it away"
                )
                log.warning("no space reserve for deletes on a full disk: %s", self.missing)
                return
            if not _allocated(fd):  # one of ours, short or sparse: its making was cut off
                try:
                    _allocate(fd)
                except OSError:
                    self.path.unlink()  # a part of a reserve only holds room nobody uses
                    raise
        finally:
            os.close(fd)
        self._held()

    def _make(self) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.pwrite(fd, SIGNATURE, 0)
            _allocate(fd)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                self.path.unlink()  # made by this call: never left half made
            raise
        os.close(fd)
        _sync_directory(self.path.parent)
        self._held()

    def _held(self) -> None:
        self.present, self.missing, self.for_lack_of_room = True, "", False
        fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            held = _allocated(fd)
        finally:
            os.close(fd)
        if not held:
            self.present = False
            self.missing = (
                f"this file system does not keep the blocks of {self.path} (compression "
                "or copy-on-write), so no file can hold room for deletes"
            )

    def release(self) -> bool:
        """Removes the reserve (its room is then free for a delete); True when it was
        there. A file that lost the signature meanwhile is left alone."""
        if not self.present:
            return False
        try:
            with open(self.path, "rb") as held:
                if held.read(len(SIGNATURE)) != SIGNATURE:
                    self.present = False
                    self.missing = f"{self.path} is no longer the service's; left untouched"
                    return False
            self.path.unlink()
        except OSError as err:
            self.present = False
            self.missing = f"it could not be removed ({self.path}: {err})"
            log.warning("the space reserve could not be used: %s", self.missing)
            return False
        _sync_directory(self.path.parent)
        self.present, self.for_lack_of_room = False, True
        self.missing = (
            f"a delete on a full disk used it at {_now()}; it is made again once the disk "
            f"has room for it"
        )
        log.warning("database disk full: the space reserve %s was used for a delete", self.path)
        return True


def _allocate(fd: int) -> None:
    """Gives the file real blocks up to :data:`RESERVE_BYTES` (never sparse), fsynced.
    glibc writes the blocks itself where the file system has no fallocate."""
    try:
        os.posix_fallocate(fd, 0, RESERVE_BYTES)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        zeros = bytes(1 << 20)
        for offset in range(len(SIGNATURE), RESERVE_BYTES, len(zeros)):
            os.pwrite(fd, zeros[: RESERVE_BYTES - offset], offset)
    os.ftruncate(fd, RESERVE_BYTES)  # a longer file of ours comes back to size
    os.fsync(fd)


def _allocated(fd: int) -> bool:
    stats = os.fstat(fd)
    return stats.st_size == RESERVE_BYTES and stats.st_blocks * 512 >= RESERVE_BYTES


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------------ the database's room


class DiskRoom:
    """A database's reserve and fence (one per open file, shared by its stores; used under
    the connection's lock).

    Args:
      db: the database file.
      conn: its connection, with the schema accepted.
    """

    def __init__(self, db: Path, conn: sqlite3.Connection) -> None:
        self.reserve = SpaceReserve(db)
        self.fenced = False
        self._page_limit = int(conn.execute("PRAGMA max_page_count").fetchone()[0])

    def start(self, conn: sqlite3.Connection, spare: int) -> None:
        """Keeps the reserve, or makes it when the disk has room for it and ``spare`` bytes
        more; fences the file when it is missing for lack of room."""
        if not self.reserve.keep(spare) and self.reserve.for_lack_of_room:
            self.fence(conn)

    def fence(self, conn: sqlite3.Connection) -> None:
        """Writes may only reuse the file's free pages from now on (and the WAL restarts
        in place: checkpointed now and after every commit)."""
        self.fenced = True
        _limit_pages(conn, _pages(conn))
        checkpoint(conn, "PASSIVE")

    def lift(self, conn: sqlite3.Connection) -> None:
        self.fenced = False
        _limit_pages(conn, self._page_limit)

    def room(self, conn: sqlite3.Connection, path: Path) -> int:
        """Bytes new data may take: the file's free pages, and the free disk unless fenced
        (see :data:`app.storage.db.FREE_BYTES_TO_RECOVER`)."""
        try:
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            free_pages = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
        except sqlite3.Error:
            free_pages = page_size = 0
        return free_pages * page_size + (0 if self.fenced else disk_free(path))

    def committed(self, conn: sqlite3.Connection, path: Path, recover_bytes: int) -> None:
        """After a commit: while fenced, checkpoint (the WAL restarts in place), and make
        the reserve again and lift the fence once the disk has room for both it and
        ``recover_bytes``."""
        if not self.fenced:
            return
        checkpoint(conn, "PASSIVE")
        if disk_free(path) < RESERVE_BYTES + recover_bytes:
            return
        if self.reserve.keep(recover_bytes):
            log.warning("the space reserve %s is back; writes may grow the file", self.reserve.path)
        if self.reserve.present or not self.reserve.for_lack_of_room:
            self.lift(conn)  # kept, or impossible for another reason: no room to keep

    def release_for_delete(self, conn: sqlite3.Connection) -> bool:
        """Frees the reserve's room for a delete and fences the file; then checkpoints the
        WAL (growing the file by the pages only the WAL holds), so the delete's pages reuse
        the WAL from its start. True when the reserve was there."""
        released = self.reserve.release()
        if released or self.reserve.for_lack_of_room:
            self.fenced = True
        checkpoint(conn, "TRUNCATE")
        return released

    @contextlib.contextmanager
    def unfenced(self, conn: sqlite3.Connection) -> Iterator[None]:
        """A delete's own transactions may take the released room (a rebalanced b-tree can
        need a page); the fence comes back after them at the file's new size."""
        _limit_pages(conn, self._page_limit)
        try:
            yield
        finally:
            if self.fenced:
                self.fence(conn)

    def delete[T](
        self,
        conn: sqlite3.Connection,
        write: Writer,
        fn: Callable[[Connection], T],
        piece: Callable[[Connection, int], int] | None,
        path: Path,
    ) -> T:
        """A delete that found the disk full, again with the reserve's room (see
        :meth:`app.storage.db.Store.delete`; the store's lock held).

        Args:
          conn: the connection.
          write: runs one function in one durable transaction (the store's).
          fn: the delete.
          piece: removes at most ``rows`` rows per table of what ``fn`` removes; answers
            how many (None: ``fn`` runs whole or not at all).
          path: the database file (named in the detail).

        Raises:
          StorageFull: not even that room was enough; the detail says why and what was
            deleted.
        """
        released = self.release_for_delete(conn)
        pieces = [0]
        try:
            with self.unfenced(conn):
                try:
                    result = write(fn)
                except StorageFull:
                    if piece is None:
                        raise
                    log.warning("a delete too big for the room left on the disk runs in pieces")
                    result = _in_pieces(conn, write, fn, piece, pieces)
        except StorageFull as err:
            done = (
                f"{pieces[0]} pieces of it were deleted; repeat the DELETE once there is room"
                if pieces[0]
                else "nothing was deleted"
            )
            raise StorageFull(
                f"the database disk is full ({path}) and this delete could not be written "
                f"either: {self.no_room(released)}; {done}. Free space on that disk and retry"
            ) from err
        checkpoint(conn, "TRUNCATE")  # the WAL's room back to the disk
        return result

    def no_room(self, released: bool) -> str:
        """Why a delete found no room, for its problem's detail (``released``: the reserve
        was there and this delete removed it)."""
        size = f"{RESERVE_BYTES >> 20} MiB"
        if released:
            return (
                f"it needs more room than the {size} space reserve ({self.reserve.path}) "
                "gave, which it used up"
            )
        return f"the {size} space reserve for deletes is missing: {self.reserve.missing}"


def _in_pieces[T](
    conn: sqlite3.Connection,
    write: Writer,
    fn: Callable[[Connection], T],
    piece: Callable[[Connection, int], int],
    pieces: list[int],
) -> T:
    """A delete too big for the room, in pieces of at most :data:`PIECE_ROWS` rows per
    table (halved while one does not fit, down to one row), each committed and checkpointed
    so the next reuses the WAL from its start; then ``fn`` for the rest. Counts the pieces
    committed in ``pieces[0]``."""
    rows = PIECE_ROWS
    while True:
        try:
            removed = write(_one_piece(piece, rows))
        except StorageFull:
            if rows == 1:
                raise
            rows //= 2
            continue
        if not removed:
            return write(fn)
        pieces[0] += 1
        checkpoint(conn, "TRUNCATE")


def _one_piece(piece: Callable[[Connection, int], int], rows: int) -> Callable[[Connection], int]:
    return lambda conn: piece(conn, rows)


def checkpoint(conn: sqlite3.Connection, mode: str) -> bool:
    """Runs a WAL checkpoint (``PASSIVE`` or ``TRUNCATE``); False when it could not
    complete (a full disk or an I/O error: the WAL keeps every frame, nothing is lost)."""
    try:
        busy, _, _ = conn.execute(f"PRAGMA wal_checkpoint({mode})").fetchone()
    except sqlite3.Error:
        return False
    return not busy


def _pages(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA page_count").fetchone()[0])


def _limit_pages(conn: sqlite3.Connection, pages: int) -> None:
    conn.execute(f"PRAGMA max_page_count = {int(pages)}").fetchone()
