"""The child-process supervision (app.workers.supervisor) with real processes: a child's
environment and process group, a kill that reaches its grandchildren, waits that are
bounded, staged shutdown, the restart backoff, and the group's resident memory."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import anyio
import pytest

from app.workers.supervisor import PROJECT_ROOT, Backoff, Child, describe_exit, group_rss_bytes
from tests.runtime_support import pid_gone

# A child that starts a grandchild in its own process group, says both pids, and waits.
PARENT_OF_ONE = (
    "import subprocess, sys, time\n"
    "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(grandchild.pid, flush=True)\n"
    "time.sleep(120)\n"
)
# A child that exits 0 at EOF on its input and ignores SIGTERM (a busy runtime, say).
EXITS_ON_EOF = (
    "import signal, sys\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)
IGNORES_EOF_AND_SIGTERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


async def _spawn(
    code: str,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: int = asyncio.subprocess.DEVNULL,
) -> Child:
    return await Child.spawn(
        [sys.executable, "-c", code],
        env=dict(os.environ) if env is None else env,
        cwd=cwd,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
    )


async def _line(child: Child) -> str:
    assert child.proc.stdout is not None
    return (await asyncio.wait_for(child.proc.stdout.readline(), 60)).decode().strip()


def test_a_child_has_its_environment_directory_and_own_process_group():
    async def main() -> None:
        code = "import os; print(os.environ['SUPERVISOR_TEST'], os.getcwd(), os.getpgrp())"
        child = await _spawn(code, env={**os.environ, "SUPERVISOR_TEST": "seen"}, cwd=PROJECT_ROOT)
        value, cwd, pgrp = (await _line(child)).split()
        assert value == "seen" and cwd == str(PROJECT_ROOT)
        assert int(pgrp) == child.pid != os.getpgrp()  # a group of its own: killable whole
        assert await child.wait(60) == 0 and not child.alive

    anyio.run(main)


def test_kill_reaches_the_whole_process_group():
    async def main() -> None:
        child = await _spawn(PARENT_OF_ONE)
        grandchild = int(await _line(child))
        assert group_rss_bytes(child.pid) > 0  # both are resident in the group
        child.kill()
        assert await child.wait(30) == -signal.SIGKILL
        assert pid_gone(grandchild, 30), "the grandchild outlived the group's kill"
        child.kill()  # an ended child: nothing to signal, no error

    anyio.run(main)


def test_a_wait_is_bounded_and_stop_goes_through_its_stages():
    async def main() -> None:
        busy = await _spawn(IGNORES_EOF_AND_SIGTERM, stdin=asyncio.subprocess.PIPE)
        assert await _line(busy) == "ready"
        started = time.monotonic()
        assert await busy.wait(0.3) is None and busy.alive
        assert time.monotonic() - started < 10
        started = time.monotonic()
        status = await busy.stop([(None, 0.3), (signal.SIGTERM, 0.3), (signal.SIGKILL, None)])
        assert status == -signal.SIGKILL  # neither EOF nor SIGTERM ended it
        assert time.monotonic() - started < 30

        idle = await _spawn(EXITS_ON_EOF, stdin=asyncio.subprocess.PIPE)
        assert await _line(idle) == "ready"
        status = await idle.stop([(None, 60), (signal.SIGKILL, None)])
        assert status == 0  # its own exit at EOF, the first stage

    anyio.run(main)


def test_a_crashing_child_is_restarted_with_a_doubling_backoff_reset_by_a_long_life():
    async def main() -> None:
        backoff = Backoff(initial_s=0.05, max_s=0.2, healthy_after_s=30.0)
        delays, statuses = [], []
        for _ in range(4):
            child = await _spawn("import sys; sys.exit(3)")
            started = time.monotonic()
            statuses.append(await child.wait(60))
            backoff.lived(time.monotonic() - started)  # a crash at start: no reset
            delays.append(backoff.delay_s)
            slept = time.monotonic()
            await backoff.sleep()
            assert time.monotonic() - slept >= delays[-1] * 0.9
        assert statuses == [3, 3, 3, 3]
        assert delays == [0.05, 0.1, 0.2, 0.2]  # doubling up to the ceiling
        backoff.lived(30.0)
        assert backoff.delay_s == 0.05  # a child that lived long restarts at once again

    anyio.run(main)


@pytest.mark.parametrize(("status", "text"), [(-9, "signal 9"), (0, "code 0"), (70, "code 70")])
def test_describe_exit(status, text):
    assert describe_exit(status) == text


def test_group_rss_of_a_group_that_does_not_exist_is_zero():
    async def main() -> None:
        child = await _spawn("pass")
        await child.wait(60)
        assert group_rss_bytes(child.pid) == 0  # ended, reaped: no process in the group

    anyio.run(main)
