"""The compile-check supervisor (app.services.compile_checks) with its real worker process.

Each test drives :class:`CompileChecks` directly (no HTTP) over a TPU hardware plan: a
kill -9 of the worker mid-check, a cancel during the compile, a full queue, the per-check
timeout and the worker's memory cap each end in a clear state, and the next check still
compiles. The cache key covers the compiler's versions.
"""

from __future__ import annotations

import json
import os
import signal
import time

import anyio
import pytest

from app.errors import CompileQueueFull
from app.schemas.compile_checks import CompileCheckRequest
from app.schemas.hardware import HardwarePlanRequest
from app.services import compile_checks
from app.services.compile_checks import CompileChecks, cache_key
from app.services.hardware import render_hardware_plan
from tests.datarax.test_compile_step import _require_libtpu
from tests.helpers import make_settings

# ~5 s to compile on the 2-core CI host: long enough to act on while it compiles.
SLOW = {"kind": "mlp", "features": [4096, 16384, 4096], "dtype": "bfloat16"}
QUICK = {"kind": "mlp", "features": [128, 256, 128], "dtype": "bfloat16"}


def _plan() -> dict:
    request = HardwarePlanRequest(
        hardware="tpu-v5e", topology="4x4", ici={"fsdp": 4, "tensor": 4}, batch_shape=[64, 128]
    )
    return json.loads(render_hardware_plan(request, plan_id="m_test", created_at="now").body)


def _request(model: dict, batch: int = 64) -> CompileCheckRequest:
    return CompileCheckRequest(model=model, batch_shape=[batch])


def _run(tmp_path, test, **settings):
    _require_libtpu()

    async def main():
        checks = CompileChecks(make_settings(tmp_path, **settings))
        await checks.start()
        try:
            await test(checks)
        finally:
            await checks.stop()

    anyio.run(main)


async def _wait(checks, cid, until):
    deadline = time.monotonic() + 240.0
    while time.monotonic() < deadline:
        check = await checks.get(cid)
        if until(check):
            return check
        await anyio.sleep(0.05)
    pytest.fail(f"check {cid} never reached the state: {check}")


def _finished(check):
    return check["status"] in ("done", "failed", "cancelled")


def _compiling(check):
    return check.get("phase") == "compiling" or _finished(check)


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


def test_cancel_during_compile_and_a_full_queue(tmp_path):
    async def test(checks):
        slow = await checks.submit("m_test", _plan(), _request(SLOW, 16384))
        queued = await checks.submit("m_test", _plan(), _request(QUICK))
        assert queued["status"] == "queued" and queued["position"] == 1
        with pytest.raises(CompileQueueFull) as full:
            await checks.submit("m_test", _plan(), _request(QUICK, 128))
        assert full.value.status == 429 and int(full.value.headers["Retry-After"]) >= 1
        await _wait(checks, slow["id"], _compiling)
        cancelled = await checks.cancel(slow["id"])
        assert cancelled["status"] == "cancelled" and "result" not in cancelled
        assert (await checks.get(slow["id"]))["status"] == "cancelled"  # stored
        done = await _wait(checks, queued["id"], _finished)
        assert done["status"] == "done", done
        page = await checks.list("m_test", 10, 0)
        assert page["total"] == 2 and {c["status"] for c in page["items"]} == {"done", "cancelled"}

    _run(tmp_path, test, compile_queue=1)


def test_timeout_fails_the_check(tmp_path):
    async def test(checks):
        slow = await checks.submit("m_test", _plan(), _request(SLOW, 16384))
        failed = await _wait(checks, slow["id"], _finished)
        assert failed["status"] == "failed"
        assert "DATARAX_COMPILE_TIMEOUT_S" in failed["error"]["detail"]

    # long enough for the worker to start, too short for the compile
    _run(tmp_path, test, compile_timeout_s=2.0, runtime_start_timeout_s=120.0)


def test_memory_cap_failure_answers_failed_with_the_reason(tmp_path):
    async def test(checks):
        check = await checks.submit("m_test", _plan(), _request(QUICK))
        failed = await _wait(checks, check["id"], _finished)
        assert failed["status"] == "failed", failed
        assert "300 MiB" in failed["error"]["detail"], failed["error"]

    _run(tmp_path, test, compile_memory_mb=300)


def test_cache_key_covers_the_program_and_the_compiler_versions(monkeypatch):
    settings = make_settings(__import__("pathlib").Path("/nonexistent"))
    work = compile_checks.check_target(_plan(), _request(QUICK), settings)
    work.pop("estimate")
    key = cache_key(work)
    assert key == cache_key(dict(work))
    assert key != cache_key({**work, "global_batch": 128})
    assert key != cache_key({**work, "device_ids": list(reversed(work["device_ids"]))})
    monkeypatch.setattr(
        compile_checks, "compiler_versions", lambda: {"jax": "0.0", "libtpu": "0.0"}
    )
    assert cache_key(work) != key
