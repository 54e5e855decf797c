"""The compile-check service (app.services.compile_checks.service) with its real worker
process, driven directly (no HTTP) over a TPU hardware plan: a kill -9 of the worker
mid-check and the per-check timeout each end in a clear state, and the next check still
compiles."""

from __future__ import annotations

import os
import signal

from tests.compile_checks_support import (
    QUICK,
    SLOW,
    _compiling,
    _finished,
    _plan,
    _request,
    _run,
    _wait,
)


def test_kill_9_of_the_worker_mid_check_fails_it_and_the_next_check_compiles(tmp_path):
    async def test(checks):
        slow = await checks.submit("m_test", _plan(), _request(SLOW, 16384))
        await _wait(checks, slow["id"], _compiling)
        os.kill(checks.worker_pid, signal.SIGKILL)
        failed = await _wait(checks, slow["id"], _finished)
        assert failed["status"] == "failed", failed
        assert failed["error"]["code"] == "compile_failed"
        assert "SIGKILL" in failed["error"]["detail"]
        quick = await checks.submit("m_test", _plan(), _request(QUICK))
        done = await _wait(checks, quick["id"], _finished)
        assert done["status"] == "done" and done["result"]["fits"] is True
        assert checks.worker_starts == 2

    _run(tmp_path, test)


def test_timeout_fails_the_check(tmp_path):
    async def test(checks):
        slow = await checks.submit("m_test", _plan(), _request(SLOW, 16384))
        failed = await _wait(checks, slow["id"], _finished)
        assert failed["status"] == "failed"
        assert "DATARAX_COMPILE_TIMEOUT_S" in failed["error"]["detail"]

    # long enough for the worker to start, too short for the compile
    _run(tmp_path, test, compile_timeout_s=2.0, runtime_start_timeout_s=120.0)
