"""The runtime process and its client: real worker processes, no mocks.

Each test runs its own event loop (``asyncio.run``) and its own runtime, bounded by
timeouts; the runtime simulates 8 CPU devices. This module doubles as a command module
(``--command-module tests.test_runtime``) to check that other modules can add commands.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from app import channel
from app.runtime import RuntimeClient, RuntimeCommandError, RuntimeTimeout, WorkerLost
from app.settings import Settings
from app.worker import command, worker_environment

ROOT = Path(__file__).resolve().parent.parent
READY_S = 60.0


@command("test_boom", test_only=True)
def _boom(payload: dict, arrays: dict) -> tuple[dict, dict]:  # noqa: ARG001
    raise RuntimeError(f"boom {payload.get('n')}")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        cpu_devices=8,
        platforms="cpu",
        test_commands=True,
        db=tmp_path / "db.sqlite",
        step_timeout_s=20.0,
        runtime_start_timeout_s=READY_S,
    )


def with_runtime(
    settings: Settings, body: Callable[[RuntimeClient], Awaitable[None]], limit: float = 60.0
) -> None:
    """Runs ``body(client)`` against a ready runtime in a fresh loop, then stops it."""

    async def main() -> None:
        client = RuntimeClient(settings, command_modules=["tests.test_runtime"])
        await client.start()
        try:
            assert await client.wait_ready(READY_S), "runtime did not become ready"
            await asyncio.wait_for(body(client), limit)
        finally:
            await client.stop()

    asyncio.run(main())


# Not imported from service_helpers: the runtime imports this module as a command
# module, where only the project root is on sys.path.
def pid_gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


# -------------------------------------------------------------------------- environment


def test_worker_environment_replaces_device_count_and_keeps_other_flags(settings):
    base = {"XLA_FLAGS": "--xla_a=1 --xla_force_host_platform_device_count=2 --xla_b=x"}
    env = worker_environment(settings.model_copy(update={"cpu_devices": 16}), base)
    assert env["XLA_FLAGS"] == "--xla_a=1 --xla_b=x --xla_force_host_platform_device_count=16"
    assert env["JAX_PLATFORMS"] == "cpu"
    env = worker_environment(settings.model_copy(update={"platforms": None}), {})
    assert env["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    assert "JAX_PLATFORMS" not in env


# ------------------------------------------------------------------------------ commands


def test_ready_and_devices(settings):
    async def body(client: RuntimeClient) -> None:
        info = client.device_info()
        assert info is not None and client.ready and client.restarts == 0
        assert info["platform"] == "cpu"
        assert (info["process_count"], info["process_index"]) == (1, 0)
        assert [d["id"] for d in info["devices"]] == list(range(8))
        assert {(d["platform"], d["process_index"]) for d in info["devices"]} == {("cpu", 0)}
        assert all(d["coords"] is None or isinstance(d["coords"], list) for d in info["devices"])
        fresh, arrays = await client.call("devices")
        assert fresh == info and arrays == {}
        ping, _ = await client.call("ping")
        assert ping["pid"] == client.pid != os.getpid()
        assert ping["uptime_s"] > 0

    with_runtime(settings, body)


MESHES = [
    ({"data": 2, "model": 4}, [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ({"data": 8}, [0, 1, 2, 3, 4, 5, 6, 7]),
    ({"model": 4}, [0, 1, 2, 3]),
    ({"data": -1, "model": 2}, [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ({"data": 2, "fsdp": 2, "model": 2}, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]),
]


def test_mesh_grid_matches_jax_mesh_order(settings):
    import jax

    if jax.device_count() < 8:
        pytest.skip(f"needs 8 devices in the test process, it has {jax.device_count()}")

    async def body(client: RuntimeClient) -> None:
        for axes, expected in MESHES:
            result, _ = await client.call("mesh_grid", {"axes": axes})
            assert result["device_grid"] == expected, axes
            sizes = list(result["axes"].values())
            assert list(result["axes"]) == list(axes) and -1 not in sizes
            n = int(np.prod(sizes))
            mesh = jax.make_mesh(sizes, list(axes), devices=jax.devices()[:n])
            ids = np.vectorize(lambda d: d.id)(mesh.devices).tolist()
            assert result["device_grid"] == ids, axes
            assert result["process_index"] == {str(i): 0 for i in range(n)}
            assert result["platform"] == "cpu"

    with_runtime(settings, body)


@pytest.mark.parametrize(
    ("payload", "status", "code"),
    [
        ({"axes": {"data": 16}}, 422, "not_enough_devices"),
        ({"axes": {"data": -1, "model": -1}}, 422, "multiple_auto_axes"),
        ({"axes": []}, 422, "invalid_request"),
        ({}, 422, "invalid_request"),
    ],
    ids=["not_enough_devices", "multiple_auto_axes", "axes_not_object", "axes_missing"],
)
def test_mesh_grid_errors(settings, payload, status, code):
    async def body(client: RuntimeClient) -> None:
        with pytest.raises(RuntimeCommandError) as info:
            await client.call("mesh_grid", payload)
        assert (info.value.status, info.value.code) == (status, code)
        assert info.value.title and info.value.detail
        if code == "not_enough_devices":
            assert "16" in info.value.detail and "8" in info.value.detail
        assert (await client.call("ping"))[0]["pid"] == client.pid  # still serving

    with_runtime(settings, body)


def test_handler_errors_become_replies_and_the_runtime_keeps_serving(settings):
    async def body(client: RuntimeClient) -> None:
        pid = client.pid
        with pytest.raises(RuntimeCommandError) as info:
            await client.call("test_boom", {"n": 7})
        assert (info.value.status, info.value.code) == (500, "runtime_error")
        assert "RuntimeError: boom 7" in info.value.detail
        with pytest.raises(RuntimeCommandError) as info:
            await client.call("sleep", {"seconds": -1})
        assert (info.value.status, info.value.code) == (422, "invalid_request")
        with pytest.raises(RuntimeCommandError) as info:
            await client.call("no_such_command")
        assert (info.value.status, info.value.code) == (400, "unknown_command")
        assert client.pid == pid and client.ready and client.restarts == 0

    with_runtime(settings, body)


# -------------------------------------------------------------------------------- arrays

ROUND_TRIP = {
    "bool": np.array([[True, False, True]]),
    "int8": np.arange(-4, 4, dtype=np.int8).reshape(2, 2, 2),
    "uint8": np.arange(250, 256, dtype=np.uint8),
    "int16": np.array(-3, dtype=np.int16),
    "uint16": np.array([65535], dtype=np.uint16),
    "int32": np.arange(12, dtype=np.int32).reshape(3, 4),
    "uint32": np.array([2**32 - 1], dtype=np.uint32),
    "int64": np.array([-(2**62), 2**62], dtype=np.int64),
    "uint64": np.array([2**64 - 1], dtype=np.uint64),
    "float16": np.array([0.5, -1.25], dtype=np.float16),
    "float32": np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4),
    "float64": np.array(np.pi),
    "float64_special": np.array([np.nan, np.inf, -np.inf, -0.0]),
    "complex64": np.array([1 + 2j, -3j], dtype=np.complex64),
    "complex128": np.array([[1e300 + 1j]], dtype=np.complex128),
    "bfloat16": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
    "empty": np.zeros((0,), dtype=np.float32),
    "empty_3d": np.zeros((3, 0, 2), dtype=np.int64),
    "zero_d_bool": np.array(True),
    "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,
    "big_endian": np.arange(5, dtype=">i4"),
    "large": np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32),
}


def test_arrays_round_trip(settings):
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

    with_runtime(settings, body)


@pytest.mark.parametrize(
    "array",
    [
        np.array([{"a": 1}, None], dtype=object),
        np.array(["text"]),
        np.array([b"bytes"]),
        np.array(["2024-01-01"], dtype="datetime64[D]"),
        np.zeros(2, dtype=[("x", "i4"), ("y", "f4")]),
    ],
    ids=["object", "unicode", "bytes", "datetime64", "structured"],
)
def test_disallowed_dtype_is_refused_before_sending(settings, array):
    async def body(client: RuntimeClient) -> None:
        with pytest.raises(RuntimeCommandError) as info:
            await client.call("echo", None, {"ok": np.ones(2), "bad": array})
        assert (info.value.status, info.value.code) == (422, "unsupported_dtype")
        assert "'bad'" in info.value.detail
        _, back = await client.call("echo", None, {"ok": np.ones(2)})  # channel still in sync
        np.testing.assert_array_equal(back["ok"], np.ones(2))

    with_runtime(settings, body)


# ------------------------------------------------------- the runtime process on its own


def _raw_frame(header: dict, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack(">I", len(raw)) + raw + body


def _raw_reply(sock: socket.socket) -> dict:
    (length,) = struct.unpack(">I", sock.recv(4, socket.MSG_WAITALL))
    header, total = channel.decode_header(sock.recv(length, socket.MSG_WAITALL))
    assert total == 0
    return header


def test_worker_checks_frames_itself_and_exits_on_eof(settings):
    """Frames the client would refuse, sent by hand; test commands off; EOF ends it."""
    parent, child = socket.socketpair()
    parent.settimeout(30)
    plain = settings.model_copy(update={"test_commands": False})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.worker",
            f"--fd={child.fileno()}",
            f"--settings-json={plain.model_dump_json(exclude={'api_token'})}",
        ],
        pass_fds=[child.fileno()],
        cwd=ROOT,
        env=worker_environment(plain, os.environ),
        start_new_session=True,
    )
    child.close()
    try:
        spec = {"name": "x", "dtype": "object", "shape": [1], "nbytes": 8}
        parent.sendall(_raw_frame({"id": 1, "command": "echo", "arrays": [spec]}, b"\0" * 8))
        reply = _raw_reply(parent)
        assert reply["id"] == 1 and not reply["ok"]
        assert (reply["error"]["status"], reply["error"]["code"]) == (422, "unsupported_dtype")

        spec = {"name": "x", "dtype": "float32", "shape": [3], "nbytes": 8}
        parent.sendall(_raw_frame({"id": 2, "command": "ping", "arrays": [spec]}, b"\0" * 8))
        assert _raw_reply(parent)["error"]["code"] == "invalid_array"

        parent.sendall(_raw_frame({"id": 3, "command": "echo", "payload": {}}))
        reply = _raw_reply(parent)
        assert (reply["error"]["status"], reply["error"]["code"]) == (400, "unknown_command")

        parent.sendall(_raw_frame({"id": 4, "command": "ping"}))
        reply = _raw_reply(parent)
        assert reply["ok"] and reply["result"]["pid"] == proc.pid

        parent.close()
        assert proc.wait(timeout=20) == 0
    finally:
        parent.close()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


# ------------------------------------------------------------------ loss and recovery


def test_kill_9_fails_the_call_in_flight_and_the_runtime_comes_back(settings):
    async def body(client: RuntimeClient) -> None:
        old = client.pid
        in_flight = asyncio.create_task(client.call("sleep", {"seconds": 30}))
        await asyncio.sleep(0.5)
        os.kill(old, signal.SIGKILL)
        with pytest.raises(WorkerLost):
            await asyncio.wait_for(in_flight, 10)
        t0 = time.monotonic()
        with pytest.raises(WorkerLost):  # not ready: refused at once, never queued
            await client.call("ping")
        assert time.monotonic() - t0 < 0.5
        assert not client.ready and client.device_info() is None
        assert await client.wait_ready(READY_S)
        assert client.restarts == 1
        assert client.pid not in (None, old)
        assert (await client.call("ping"))[0]["pid"] == client.pid
        assert client.device_info()["devices"][7]["id"] == 7

    with_runtime(settings, body)


def test_timeout_kills_and_restarts_the_runtime(settings):
    async def body(client: RuntimeClient) -> None:
        old = client.pid
        t0 = time.monotonic()
        slow = asyncio.create_task(client.call("sleep", {"seconds": 30}, timeout=1.0))
        queued = asyncio.create_task(client.call("ping"))
        with pytest.raises(RuntimeTimeout):
            await slow
        assert time.monotonic() - t0 < 5
        with pytest.raises(WorkerLost):  # queued behind it, for a runtime that is gone
            await queued
        assert await asyncio.to_thread(pid_gone, old)
        assert await client.wait_ready(READY_S)
        assert client.restarts == 1 and client.pid != old
        result, _ = await client.call("sleep", {"seconds": 0.1}, timeout=5)
        assert result["finished"] > result["started"]

    with_runtime(settings, body)


@pytest.mark.parametrize("how", ["exit", "abort"])
def test_crash_is_worker_lost_then_recovery(settings, how):
    async def body(client: RuntimeClient) -> None:
        old = client.pid
        with pytest.raises(WorkerLost):
            await client.call("crash", {"how": how})
        assert await client.wait_ready(READY_S)
        assert client.restarts == 1 and client.pid != old
        grid, _ = await client.call("mesh_grid", {"axes": {"data": 2, "model": 4}})
        assert grid["device_grid"] == [[0, 1, 2, 3], [4, 5, 6, 7]]

    with_runtime(settings, body)


# ------------------------------------------------------------------------------ ordering


def test_concurrent_calls_run_one_at_a_time_in_call_order(settings):
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

    with_runtime(settings, body)


def test_cancelled_callers_leave_the_channel_in_sync(settings):
    async def body(client: RuntimeClient) -> None:
        pid = client.pid
        running = asyncio.create_task(client.call("sleep", {"seconds": 0.5, "tag": "a"}))
        queued = asyncio.create_task(client.call("crash"))  # would kill the runtime if sent
        await asyncio.sleep(0.2)
        running.cancel()
        queued.cancel()
        for task in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        result, _ = await client.call("sleep", {"seconds": 0, "tag": "b"})
        assert result["tag"] == "b"  # not the abandoned call's reply
        assert client.pid == pid and client.restarts == 0

    with_runtime(settings, body)


# ------------------------------------------------------------------------------ shutdown


def test_stop_leaves_no_process_behind(settings):
    async def main() -> int:
        client = RuntimeClient(settings)
        t0 = time.monotonic()
        await client.start()
        assert time.monotonic() - t0 < 5  # readiness comes in the background
        pid = client.pid
        assert pid is not None
        assert await client.wait_ready(READY_S)
        await asyncio.wait_for(client.stop(), 20)
        assert client.pid is None and not client.ready and client.restarts == 0
        with pytest.raises(WorkerLost):
            await client.call("ping")
        await asyncio.sleep(1.0)  # no supervisor left to restart it
        assert client.pid is None and client.restarts == 0
        return pid

    pid = asyncio.run(main())
    assert pid_gone(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing left in its process group either
