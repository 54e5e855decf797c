"""glibc malloc tuning: applied on Linux with glibc, a no-op elsewhere."""

from __future__ import annotations

import ctypes.util
import subprocess
import sys

import pytest

from app.core.allocator import keep_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
    reason="mallopt is glibc's (Linux)",
)
def test_glibc_takes_both_settings():
    # In a fresh interpreter: the settings are process-wide, and this process is shared.
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from app.core.allocator import keep_freed_memory; "
            "print(keep_freed_memory(64 * 2**20), keep_freed_memory(2**40))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # A trim size past int's range is clamped, not refused.
    assert result.stdout.split() == ["True", "True"]


def test_other_platforms_change_nothing(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert keep_freed_memory(64 * 2**20) is False
