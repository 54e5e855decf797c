"""The connection bound's arithmetic and its start-up checks (app.api.connections,
app.cli.connection_bound); the timeouts and the bound itself are tested against the real
server with real sockets in tests/e2e/test_connections.py."""

from __future__ import annotations

import resource
import subprocess
import sys

import pytest

from app.api.connections import (
    FD_RESERVE,
    HEALTH_ROOM,
    MAX_FILE_DESCRIPTORS,
    default_max_connections,
    raise_fd_limit,
)
from app.cli import EXIT_BAD_SETTINGS
from tests.helpers import PROJECT_ROOT, serve_with_file_limit


def test_the_default_bound_leaves_room_for_files_and_health_checks():
    assert default_max_connections(1024) == 1024 - FD_RESERVE - HEALTH_ROOM == 864
    assert default_max_connections(65536) == 65536 - 160
    assert default_max_connections(100) == 1  # never zero: the service still answers


def _in_child(soft: int, hard: int) -> int:
    code = (
        "import resource; from app.api.connections import raise_fd_limit; "
        f"resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard})); "
        "print(raise_fd_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    returned, now = map(int, done.stdout.split())
    assert returned == now
    return returned


def test_the_soft_file_limit_is_raised_to_the_hard_one():
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard < 2048:
        pytest.fail(f"needs a finite hard file limit of at least 2048; it is {hard}")
    assert _in_child(1024, hard) == min(hard, MAX_FILE_DESCRIPTORS)
    assert _in_child(1024, 1024) == 1024  # nothing to raise
    assert _in_child(1024, 2048) == 2048


def test_raise_fd_limit_in_this_process_is_idempotent():
    first = raise_fd_limit()
    assert raise_fd_limit() == first == resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--max-connections", "5000"], "do not fit this process's limit of 1024"),
        (["--max-connections", "0"], "max-connections"),
        (["--header-timeout-s", "inf"], "header-timeout-s"),
        (["--body-timeout-s", "0"], "body-timeout-s"),
        (["--write-timeout-s", "nan"], "write-timeout-s"),
        (["--keep-alive-s", "-1"], "keep-alive-s"),
    ],
)
def test_a_bound_or_timeout_that_cannot_work_exits_2_with_one_line(tmp_path, args, needle):
    command = [*serve_with_file_limit(1024), "--db", str(tmp_path / "d.sqlite"), *args]
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_BAD_SETTINGS, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], done.stderr
    assert not (tmp_path / "d.sqlite").exists()
