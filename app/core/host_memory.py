"""The host's memory as a process here may use it: physical memory, or the container's
limit when lower. No JAX: the HTTP process (compile checks' ``fits`` on CPU) and the
runtime (session admission) both read it."""

from __future__ import annotations

import os
from pathlib import Path

_CGROUP_LIMITS = (
    "/sys/fs/cgroup/memory.max",  # cgroup v2
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",  # cgroup v1
)


def host_memory_bytes() -> int | None:
    """Physical memory, or the container's limit (cgroup v2 or v1) when lower; ``None``
    where the platform reports neither."""
    try:
        total: int | None = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = None
    for limit_file in _CGROUP_LIMITS:
        try:
            raw = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():  # "max" (v2) means no limit; v1 writes a huge number instead
            total = int(raw) if total is None else min(total, int(raw))
    return total
