"""The host's memory: physical memory, or the container's limit when that is lower."""

from __future__ import annotations

import os
from pathlib import Path

from app.core.host_memory import host_memory_bytes


def _limit() -> int | None:
    for name in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = Path(name).read_text().strip()
        except OSError:
            continue
        if raw.isdigit():
            return int(raw)
    return None


def test_it_is_physical_memory_or_the_lower_container_limit():
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    found = host_memory_bytes()
    assert found is not None and 0 < found <= physical
    limit = _limit()
    assert found == (physical if limit is None else min(physical, limit))
