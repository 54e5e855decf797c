"""RuntimeClient against real runtime processes: errors, arrays, loss and recovery,
timeouts, ordering, cancellation and shutdown. No mocks: every test talks to a real
``python -m app.runtime`` with 8 simulated CPU devices.

Tests that leave the runtime running share one (``shared_runtime``); tests that kill,
time out or stop it start their own (``start_runtime``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import ml_dtypes
import numpy as np
import pytest

from app.core.errors import ArrayNotAccepted, ServiceError, StepTimeout, WorkerLost
from app.workers.runtime_client import RuntimeClient
from tests.runtime_support import READY_S, pid_gone

ROUND_TRIP = {
    "bool": np.array([[True, False, True]]),
    "int8": np.arange(-4, 4, dtype=np.int8).reshape(2, 2, 2),
    "uint64": np.array([2**64 - 1], dtype=np.uint64),
    "float16": np.array([0.5, -1.25], dtype=np.float16),
    "float64": np.array(np.pi),
    "float64_special": np.array([np.nan, np.inf, -np.inf, -0.0]),
    "complex128": np.array([[1e300 + 1j]], dtype=np.complex128),
    "bfloat16": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
    "empty_3d": np.zeros((3, 0, 2), dtype=np.int64),
    "zero_d_bool": np.array(True),
    "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,
    "big_endian": np.arange(5, dtype=">i4"),
    "large": np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32),
}


# --------------------------------------------------------------------------- replies


def test_error_replies_are_service_errors_and_the_runtime_keeps_serving(shared_runtime):
    async def body(client: RuntimeClient) -> None:
        pid = client.pid
        with pytest.raises(ServiceError) as info:
            await client.call("boom", {"n": 7})
        assert (info.value.status, info.value.code) == (500, "runtime_error")
        assert "RuntimeError: boom 7" in info.value.detail
        with pytest.raises(ServiceError) as info:
            await client.call("sleep", {"seconds": -1})
        assert (info.value.status, info.value.code) == (422, "invalid_request")
        assert "-1" in info.value.detail
        with pytest.raises(ServiceError) as info:
            await client.call("no_such_command")
        assert (info.value.status, info.value.code) == (400, "unknown_command")
        assert info.value.title == "Unknown runtime command"
        assert client.pid == pid and client.ready and client.restarts == 0

    shared_runtime.body(body)


# -------------------------------------------------------------------------------- arrays


def test_arrays_round_trip(shared_runtime):
    async def body(client: RuntimeClient) -> None:
        result, back = await client.call("echo", {"k": [1, "x", None]}, ROUND_TRIP)
        assert result == {"k": [1, "x", None]}
        assert list(back) == list(ROUND_TRIP)
        for name, sent in ROUND_TRIP.items():
            got = back[name]
            assert got.shape == sent.shape, name
            assert got.dtype == sent.dtype.newbyteorder("="), name
            np.testing.assert_array_equal(got, sent, err_msg=name)
            assert got.flags.writeable and got.flags.c_contiguous, name
        for name, sent in ROUND_TRIP.items():  # one at a time: no offset bugs hidden
            _, back = await client.call("echo", None, {name: sent})
            np.testing.assert_array_equal(back[name], sent, err_msg=name)

    shared_runtime.body(body)


@pytest.mark.parametrize(
    "array",
    [
        np.array([{"a": 1}, None], dtype=object),
        np.array(["text"]),
        np.array(["2024-01-01"], dtype="datetime64[D]"),
    ],
    ids=["object", "unicode", "datetime64"],
)
def test_disallowed_dtype_is_refused_before_sending(shared_runtime, array):
    async def body(client: RuntimeClient) -> None:
        with pytest.raises(ArrayNotAccepted) as info:
            await client.call("echo", None, {"ok": np.ones(2), "bad": array})
        assert (info.value.status, info.value.code) == (422, "unsupported_dtype")
        assert "'bad'" in info.value.detail
        _, back = await client.call("echo", None, {"ok": np.ones(2)})  # channel still in sync
        np.testing.assert_array_equal(back["ok"], np.ones(2))

    shared_runtime.body(body)


# ------------------------------------------------------------------ loss and recovery


async def _until_exists(path, timeout_s: float = 60.0) -> None:
    """Polls for ``path`` (written by the runtime's test ``sleep`` command as it starts)."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.01)


def test_kill_9_fails_the_call_in_flight_and_the_runtime_comes_back(start_runtime, tmp_path):
    async def body(client: RuntimeClient) -> None:
        old = client.pid
        started = tmp_path / "started"
        payload = {"seconds": 30, "started_file": str(started)}
        in_flight = asyncio.create_task(client.call("sleep", payload))
        await _until_exists(started)  # the call is running in the runtime
        os.kill(old, signal.SIGKILL)
        with pytest.raises(WorkerLost) as info:
            await asyncio.wait_for(in_flight, 10)
        assert (info.value.status, info.value.code) == (503, "worker_lost")
        t0 = time.monotonic()
        with pytest.raises(WorkerLost):  # not ready: refused at once, never queued
            await client.call("ping")
        assert time.monotonic() - t0 < 0.5
        assert not client.ready and client.device_info() is None
        assert client.memory_budget() is None
        assert await client.wait_ready(READY_S)
        assert client.restarts == 1
        assert client.pid not in (None, old)
        assert (await client.call("ping"))[0]["pid"] == client.pid
        assert client.device_info()["devices"][7]["id"] == 7

    start_runtime().body(body, 120)


def test_timeout_kills_and_restarts_the_runtime(start_runtime):
    async def body(client: RuntimeClient) -> None:
        old = client.pid
        t0 = time.monotonic()
        slow = asyncio.create_task(client.call("sleep", {"seconds": 30}, timeout=1.0))
        queued = asyncio.create_task(client.call("ping"))
        with pytest.raises(StepTimeout) as info:
            await slow
        assert (info.value.status, info.value.code) == (504, "step_timeout")
        assert time.monotonic() - t0 < 5
        with pytest.raises(WorkerLost):  # queued behind it, for a runtime that is gone
            await queued
        assert await asyncio.to_thread(pid_gone, old)
        assert await client.wait_ready(READY_S)
        assert client.restarts == 1 and client.pid != old
        result, _ = await client.call("sleep", {"seconds": 0.1}, timeout=5)
        assert result["finished"] > result["started"]

    start_runtime().body(body, 120)


@pytest.mark.parametrize("how", ["exit", "abort"])
def test_crash_is_worker_lost_then_recovery(start_runtime, how):
    async def body(client: RuntimeClient) -> None:
        old = client.pid
        with pytest.raises(WorkerLost):
            await client.call("crash", {"how": how})
        assert await client.wait_ready(READY_S)
        assert client.restarts == 1 and client.pid != old
        grid, _ = await client.call("mesh_grid", {"axes": {"data": 2, "model": 4}})
        assert grid["device_grid"] == [[0, 1, 2, 3], [4, 5, 6, 7]]

    start_runtime().body(body, 120)


# ------------------------------------------------------------------------------ ordering


def test_concurrent_calls_run_one_at_a_time_in_call_order(shared_runtime):
    async def body(client: RuntimeClient) -> None:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        calls = [client.call("sleep", {"seconds": 0.15, "tag": i}) for i in range(5)]
        results = [r for r, _ in await asyncio.gather(*calls)]
        tick_task.cancel()
        assert [r["tag"] for r in results] == list(range(5))
        for before, after in zip(results, results[1:], strict=False):
            assert before["finished"] <= after["started"]  # CLOCK_MONOTONIC is system-wide
        assert ticks > 20  # the event loop kept running while the runtime worked

    shared_runtime.body(body)


def test_cancelled_callers_leave_the_channel_in_sync(shared_runtime, tmp_path):
    async def body(client: RuntimeClient) -> None:
        pid, restarts = client.pid, client.restarts
        started = tmp_path / "started"
        payload = {"seconds": 0.5, "tag": "a", "started_file": str(started)}
        running = asyncio.create_task(client.call("sleep", payload))
        queued = asyncio.create_task(client.call("crash"))  # would kill the runtime if sent
        await _until_exists(started)  # "a" is running, "crash" waits behind it
        running.cancel()
        queued.cancel()
        for task in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        result, _ = await client.call("sleep", {"seconds": 0, "tag": "b"})
        assert result["tag"] == "b"  # not the abandoned call's reply
        assert client.pid == pid and client.restarts == restarts

    shared_runtime.body(body)


# ------------------------------------------------------------------------------ shutdown


def test_built_ins_alone_then_stop_leaves_no_process_behind(settings_in):
    async def main() -> int:
        client = RuntimeClient(settings_in())  # no command modules: the built-ins only
        t0 = time.monotonic()
        await client.start()
        assert time.monotonic() - t0 < 5  # readiness comes in the background
        pid = client.pid
        assert pid is not None
        assert await client.wait_ready(READY_S)
        with pytest.raises(ServiceError) as info:
            await client.call("session_info", {"id": "nope"})
        assert (info.value.status, info.value.code) == (410, "session_lost")
        with pytest.raises(ServiceError) as info:
            await client.call("echo")  # a test command, not loaded here
        assert info.value.code == "unknown_command"
        await asyncio.wait_for(client.stop(), 20)
        assert client.pid is None and not client.ready and client.restarts == 0
        with pytest.raises(WorkerLost):
            await client.call("ping")
        await asyncio.sleep(1.0)  # no supervisor left to restart it
        assert client.pid is None and client.restarts == 0
        return pid

    pid = asyncio.run(asyncio.wait_for(main(), 180))
    assert pid_gone(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing left in its process group either
