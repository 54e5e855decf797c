"""glibc ``malloc`` settings for a process that handles large request bodies.

By default glibc serves big allocations (a request body, its decoded arrays, a JSON
answer) with fresh ``mmap`` pages and hands freed memory straight back to the kernel, so
every large request page-faults its buffers in again: on a 32 MB npz body that is most of
the request's time (receiving it took 55 ms instead of 23 ms on the benchmark machine).
Keeping freed memory in the heap lets the next request reuse warm pages.

Kept memory must stay bounded, though. Issue 41: ten mixed clients left the HTTP process
at 804-903 MiB resident for good (84 MiB at start), nearly all of it free memory glibc
kept, in 16 arenas. The trim threshold was 256 MiB, which a worker thread's arena never
reaches (its heaps are at most 64 MiB), so those arenas never gave anything back, and
glibc makes up to 8 arenas per core, one per busy worker thread, each keeping its own.
So :func:`keep_freed_memory` also

- caps the arenas at ``arenas`` (``M_ARENA_MAX``), so worker threads share warm memory;
- starts a :class:`FreedMemoryTrimmer` thread: every ``check_every_s`` it reads the
  process's anonymous resident memory, and calls ``malloc_trim(0)`` (every arena, free
  pages in the middle of a heap too) when that grew more than ``keep_bytes`` above its
  lowest point since the last trim, or once when the process has been idle for
  ``idle_s`` after work.

Under load, anonymous resident memory stays within ``keep_bytes`` of its low point since
the last trim (checked every ``check_every_s``); after load settles, what stays is live
memory plus the free top of each worker arena's newest heap (at most 64 MiB per arena
beyond the main one), which ``malloc_trim`` does not release. docs/LIMITS.md has the
bound and the measurement (``benchmarks/http_memory.py``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("datarax.app")

# mallopt(3) parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
"""glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems; larger values are refused."""

ARENAS = 2
"""malloc arenas of the HTTP process (``M_ARENA_MAX``): the main one and one more, which
the worker threads share. Measured (docs/LIMITS.md) no slower than one per thread."""
CHECK_EVERY_S = 1.0
"""How often the trimmer reads the process's resident memory (one small ``/proc`` read)."""
IDLE_S = 5.0
"""After this long without work (CPU under :data:`IDLE_CPU_SHARE`), freed memory goes back."""
IDLE_CPU_SHARE = 0.1
"""A process using less than this share of one core is idle: health probes and scrapes
take well under 1%, a large body or a plan keeps it far above."""

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def anonymous_resident_bytes() -> int:
    """Resident memory of this process not backed by a file (``/proc/self/statm``)."""
    with open("/proc/self/statm", "rb") as statm:
        fields = statm.read().split()
    return (int(fields[1]) - int(fields[2])) * _PAGE


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


@dataclass
class FreedMemoryTrimmer:
    """When to give freed heap memory back: the decisions of the trimmer thread.

    Fed one reading at a time by :meth:`observe` (so tests can drive it with numbers); the
    thread (:meth:`start`) feeds it every ``check_every_s`` and calls ``trim`` when told.

    Attributes:
      keep_bytes: growth of anonymous resident memory above its lowest point since the
        last trim that is tolerated as warm freed memory; more is trimmed.
      idle_s: seconds of idleness after work before everything freed is trimmed.
      trim: the function that gives memory back (``malloc_trim(0)``).
      trims: trims done so far (``grown`` for the keep_bytes rule, ``idle`` for idleness).
    """

    keep_bytes: int
    idle_s: float = IDLE_S
    check_every_s: float = CHECK_EVERY_S
    trim: Callable[[], object] = lambda: None
    trims: dict[str, int] | None = None
    _low: int | None = None
    _busy_since_trim: bool = False
    _idle_since: float | None = None

    def observe(self, anon_bytes: int, now: float, busy: bool) -> str | None:
        """Takes one reading; returns why to trim now (``"grown"``, ``"idle"``) or None.

        Args:
          anon_bytes: anonymous resident bytes of the process now.
          now: a monotonic clock, seconds.
          busy: whether the process did work since the previous reading.
        """
        self._low = anon_bytes if self._low is None else min(self._low, anon_bytes)
        if busy:
            self._busy_since_trim = True
            self._idle_since = None
        elif self._idle_since is None:
            self._idle_since = now
        if anon_bytes - self._low > self.keep_bytes:
            return "grown"
        if (
            self._busy_since_trim
            and self._idle_since is not None
            and now - self._idle_since >= self.idle_s
        ):
            return "idle"
        return None

    def trimmed(self, reason: str, anon_bytes: int) -> None:
        """Records a trim: the low point starts again from what is resident now."""
        self._low = anon_bytes
        self._busy_since_trim = False
        self.trims = {**(self.trims or {}), reason: (self.trims or {}).get(reason, 0) + 1}

    def run(self, stop: threading.Event) -> None:
        """The thread's loop: one reading every ``check_every_s`` until ``stop`` is set."""
        cpu, then = _cpu_seconds(), time.monotonic()
        while not stop.wait(self.check_every_s):
            now, used = time.monotonic(), _cpu_seconds()
            busy = used - cpu >= IDLE_CPU_SHARE * (now - then)
            cpu, then = used, now
            try:
                reason = self.observe(anonymous_resident_bytes(), now, busy)
                if reason is not None:
                    before = anonymous_resident_bytes()
                    self.trim()  # ctypes releases the GIL: requests go on meanwhile
                    after = anonymous_resident_bytes()
                    self.trimmed(reason, after)
                    log.debug(
                        "malloc_trim (%s): %d -> %d MiB anonymous",
                        reason,
                        before >> 20,
                        after >> 20,
                    )
                    # The trim's own CPU time is not work that keeps the process busy.
                    cpu, then = _cpu_seconds(), time.monotonic()
            except OSError:  # no /proc: nothing to measure, so nothing to decide
                return

    def start(self) -> threading.Event:
        """Starts the daemon thread; set the returned event to stop it."""
        stop = threading.Event()
        threading.Thread(target=self.run, args=(stop,), name="malloc-trim", daemon=True).start()
        return stop


_trimmer: FreedMemoryTrimmer | None = None


def keep_freed_memory(
    keep_bytes: int,
    *,
    arenas: int = ARENAS,
    check_every_s: float = CHECK_EVERY_S,
    idle_s: float = IDLE_S,
) -> bool:
    """Makes glibc reuse freed memory for large allocations, within ``keep_bytes``.

    Args:
      keep_bytes: freed memory kept for reuse (the trim threshold, and the trimmer's
        bound); 0 leaves glibc's defaults and starts no trimmer.
      arenas: ``M_ARENA_MAX``; 0 leaves glibc's (8 per core, or ``MALLOC_ARENA_MAX``).
      check_every_s: seconds between the trimmer's readings.
      idle_s: idle seconds after work before everything freed is trimmed.

    Returns:
      True when the settings were applied and the trimmer runs; False for
      ``keep_bytes == 0`` and on a C library without ``mallopt`` (musl, macOS, Windows),
      where nothing changes.
    """
    global _trimmer
    if keep_bytes <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt, malloc_trim = libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    applied = (
        bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX))
        and bool(mallopt(_M_TRIM_THRESHOLD, min(keep_bytes, 2**31 - 1)))
        and (arenas <= 0 or bool(mallopt(_M_ARENA_MAX, arenas)))
    )
    if not applied:
        log.info("malloc tuning not applied; large requests will page-fault their buffers")
        return False
    if _trimmer is None:
        _trimmer = FreedMemoryTrimmer(
            keep_bytes, idle_s=idle_s, check_every_s=check_every_s, trim=lambda: malloc_trim(0)
        )
        _trimmer.start()
    else:
        _trimmer.keep_bytes = keep_bytes
    return True
