"""The compile worker (app.workers.compile_worker) under the compile-check service: its
memory cap (an address-space limit on CPU, a resident-memory watchdog on GPU) fails the
check with the reason; the GPU worker's environment takes no pool and has no address-space
cap; a host without a GPU answers 422 with the worker's reason; one worker at a time.
"""

from __future__ import annotations

import json
import os
import resource
import sys

import anyio
import pytest

from app.compiler import __main__ as worker
from app.core.errors import CompileTargetUnavailable
from app.services.compile_checks import CompileChecks
from app.services.compile_checks import targets as compile_checks
from app.workers import supervisor
from tests.compile_checks_support import (
    GPUS,
    QUICK,
    _finished,
    _live_plan,
    _plan,
    _request,
    _run,
    _settings,
    _wait,
)
from tests.helpers import make_settings


@pytest.mark.parametrize(
    "cap_mb",
    [300, 1000],
    # 300 MiB: the worker cannot even import JAX (OpenBLAS gives up); 1000 MiB: it starts
    # (~450 MiB), then XLA cannot create its compile threads and aborts (measured).
    ids=["at-start", "while-compiling"],
)
def test_memory_cap_failure_answers_failed_with_the_reason(tmp_path, cap_mb):
    async def test(checks):
        check = await checks.submit("m_test", _plan(), _request(QUICK))
        failed = await _wait(checks, check["id"], _finished)
        assert failed["status"] == "failed", failed
        detail = failed["error"]["detail"]
        assert f"ran out of memory under its cap of {cap_mb} MiB" in detail, detail

    _run(tmp_path, test, compile_memory_mb=cap_mb)


def test_a_gpu_worker_takes_no_pool_and_no_address_space_cap():
    base = {"CUDA_VISIBLE_DEVICES": "2,3", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"}
    env = worker.environment("cuda", 8, base)
    assert env["JAX_PLATFORMS"] == "cuda"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["XLA_PYTHON_CLIENT_ALLOCATOR"] == "platform"
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"  # the runtime's GPUs, the runtime's ids
    assert worker.memory_limits("cuda", 16384) == {}  # CUDA cannot start under RLIMIT_AS
    # --describe reads the pool the runtime's allocator would have, still taking none.
    described = worker.environment("cuda", 8, base, describe=True)
    assert described["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert "XLA_PYTHON_CLIENT_ALLOCATOR" not in described
    # The CPU worker keeps its simulated devices and its address-space cap.
    cpu = worker.environment("cpu", 8, base)
    assert cpu["JAX_PLATFORMS"] == "cpu" and "PREALLOCATE" not in " ".join(cpu)
    assert "--xla_force_host_platform_device_count=8" in cpu["XLA_FLAGS"]
    assert worker.memory_limits("cpu", 300) == {resource.RLIMIT_AS: (300 * 2**20, 300 * 2**20)}

    checks = CompileChecks(_settings(compile_memory_mb=300))
    argv = checks.worker_argv("cuda")
    assert argv[argv.index("--platform") + 1] == "cuda" and "--describe" not in argv
    assert checks.worker_argv("cuda", describe=True)[-1] == "--describe"
    assert compile_checks.gpu_platform(_settings(platforms="rocm")) == "rocm"
    assert compile_checks.gpu_platform(_settings(platforms="cpu")) == "cuda"
    assert supervisor.group_rss_bytes(os.getpgrp()) > 0  # what the GPU cap watches


def test_a_live_gpu_check_on_a_host_without_one_is_422_from_the_worker(tmp_path):
    # The real --describe (one JAX start): on this host no CUDA backend starts.
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this host has a GPU: tests/gpu covers the check there")

    async def main():
        checks = CompileChecks(make_settings(tmp_path))
        await checks.start()
        try:
            with pytest.raises(CompileTargetUnavailable) as refused:
                await checks.submit("m_live", _live_plan("gpu", [0]), _request(QUICK))
            assert "could not open them" in refused.value.detail, refused.value.detail
            assert checks.worker_starts == 0  # no compile worker for it
        finally:
            await checks.stop()

    anyio.run(main)


def test_a_check_for_the_other_platform_replaces_the_idle_worker(tmp_path):
    # One compile worker at a time: the CPU worker is stood in for the GPU one here (same
    # argv for both), so the switch itself is what is tested.
    settings = make_settings(tmp_path)

    async def main():
        checks = CompileChecks(settings)
        checks._worker_argv = checks.worker_argv("cpu")
        await checks.start()
        try:
            cpu = await checks._ensure_worker("cpu")
            assert await checks._ensure_worker("cpu") is cpu  # kept warm for its platform
            gpu = await checks._ensure_worker("cuda")
            assert gpu is not cpu and cpu.returncode is not None  # the idle one ended
            assert checks.worker_starts == 2 and checks.worker_pid == gpu.pid
        finally:
            await checks.stop()

    anyio.run(main)


def test_a_gpu_workers_resident_memory_past_the_cap_fails_the_check(tmp_path):
    # Without a GPU: the described GPUs are input data (a one-line --describe stand-in),
    # and the CPU worker, uncapped, stands in for the GPU worker; the service's watchdog
    # is what is tested (a JAX worker is past 100 MiB resident from its start).
    described = [sys.executable, "-c", f"print({json.dumps(json.dumps(GPUS))})"]

    async def main():
        checks = CompileChecks(
            make_settings(tmp_path, compile_memory_mb=100), describe_argv=described
        )
        argv = checks.worker_argv("cpu")
        argv[argv.index("--memory-mb") + 1] = "0"  # no RLIMIT_AS, as on a GPU worker
        checks._worker_argv = argv
        await checks.start()
        try:
            check = await checks.submit("m_live", _live_plan("gpu", [1, 0]), _request(QUICK))
            assert check["target"]["kind"] == "gpu" and check["status"] == "queued", check
            failed = await _wait(checks, check["id"], _finished)
            assert failed["status"] == "failed", failed
            detail = failed["error"]["detail"]
            assert "resident memory reached" in detail and "cap of 100 MiB" in detail, detail
        finally:
            await checks.stop()

    anyio.run(main)
