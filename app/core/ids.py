"""Ids and timestamps of stored records: ULIDs that sort in creation order, RFC 3339 times.

The ULID generator is kept by hand rather than taken from ``python-ulid``: plan lists are
answered newest first by id, so ids made within one millisecond must still sort in the
order they were made. ``python-ulid`` draws fresh random bits each time and does not
promise that; here the random part is incremented within a millisecond (the ULID
specification's monotonic mode). See docs/ARCHITECTURE.md, "Kept by hand".
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_ulid_lock = threading.Lock()
_ulid_last = (0, 0)


def new_ulid() -> str:
    """A 26-character ULID (48-bit ms timestamp + 80 random bits), monotonic per process.

    Ids made in the same millisecond increment the random part, so ids sort in creation
    order (lexicographically) even within one millisecond.
    """
    global _ulid_last
    with _ulid_lock:
        ms = time.time_ns() // 1_000_000
        last_ms, last_rand = _ulid_last
        if ms <= last_ms:
            ms, rand = last_ms, (last_rand + 1) & ((1 << 80) - 1)
        else:
            rand = int.from_bytes(os.urandom(10), "big")
        _ulid_last = (ms, rand)
    value = (ms << 80) | rand
    return "".join(_CROCKFORD[(value >> shift) & 31] for shift in range(125, -1, -5))


def new_plan_id() -> str:
    """``m_`` + a ULID."""
    return "m_" + new_ulid()


def new_session_id() -> str:
    """``s_`` + a ULID."""
    return "s_" + new_ulid()


def utc_now() -> str:
    """Now as RFC 3339 UTC with a ``Z``, second precision: ``2026-11-30T08:00:00Z``."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
