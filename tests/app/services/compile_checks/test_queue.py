"""The queue (app.services.compile_checks.queue) with the real worker: a full queue is 429
with a Retry-After, a cancel during the compile ends the check, and the next one runs."""

from __future__ import annotations

import pytest

from app.core.errors import CompileQueueFull
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
