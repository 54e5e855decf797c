"""The store interface's own errors: what every engine raises, whichever database it holds.

Each engine translates its driver's errors at its edge (``sqlite3``'s in
:mod:`app.storage.db`, psycopg's in :mod:`app.storage.postgres`), so callers catch these
and never a driver's. Storage faults (a full disk, a database that cannot be reached or
written) are not here: they answer HTTP problems of their own
(:class:`~app.core.errors.StorageFull`, :class:`~app.core.errors.StorageUnavailable`).
"""

from __future__ import annotations


class Conflict(Exception):
    """A write refused by a key the database already holds (a plan, session or calibration
    id that is taken): the caller's error, not a storage fault. Nothing of the write was
    committed; the store stays usable."""


class StoreClosed(RuntimeError):
    """The store was used before ``open()`` or after ``close()``."""


class StoreUnusable(RuntimeError):
    """The database exists but the store cannot use it (a file that is corrupt, truncated,
    not a database or unreadable; a database of a newer schema, or holding other tables).
    It is left exactly as it was."""


class StoreUnreachable(StoreUnusable):
    """The PostgreSQL server cannot be reached at start (it may come up later: unlike a
    file that is not a database, a restart can help)."""
