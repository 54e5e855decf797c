"""glibc ``malloc`` settings for a process that handles large request bodies.

By default glibc serves big allocations (a request body, its decoded arrays, a JSON
answer) with fresh ``mmap`` pages and hands freed memory straight back to the kernel, so
every large request page-faults its buffers in again: on a 32 MB npz body that is most of
the request's time (receiving it took 55 ms instead of 23 ms on the benchmark machine).
Keeping freed memory in the heap lets the next request reuse warm pages.

The cost is resident memory: up to ``trim_bytes`` freed memory stays with the process
instead of going back to the kernel. ``datarax-serve`` sizes it from the body limit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("datarax.app")

# mallopt(3) parameters.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
"""glibc's ceiling for M_MMAP_THRESHOLD on 64-bit systems; larger values are refused."""


def keep_freed_memory(trim_bytes: int) -> bool:
    """Makes glibc reuse freed memory for large allocations instead of unmapping it.

    Args:
      trim_bytes: free memory at the top of the heap kept before glibc trims it.

    Returns:
      True when both settings were applied; False on a C library without ``mallopt``
      (musl, macOS, Windows), where nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    applied = bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX)) and bool(
        mallopt(_M_TRIM_THRESHOLD, min(trim_bytes, 2**31 - 1))
    )
    if not applied:
        log.info("malloc tuning not applied; large requests will page-fault their buffers")
    return applied
