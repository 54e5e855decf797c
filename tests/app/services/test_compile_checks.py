"""The compile-check supervisor (app.services.compile_checks) with its real worker process.

Each test drives :class:`CompileChecks` directly (no HTTP) over a TPU hardware plan: a
kill -9 of the worker mid-check, a cancel during the compile, a full queue, the per-check
timeout and the worker's memory cap each end in a clear state, and the next check still
compiles. The cache key covers the compiler's versions.

GPU targets, without a GPU (tests/gpu compiles on one): a live plan as the runtime reports
it on a GPU host selects the worker's GPUs in the plan's order, with the memory figure
from XLA's pool, the budget setting or the catalog; the cache key tells it from a CPU
target; the GPU worker's environment takes no pool and has no address-space cap; a host
without a GPU answers 422 with the worker's reason.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import time

import anyio
import pytest

from app.compiler import __main__ as worker
from app.core.errors import CompileQueueFull, CompileTargetUnavailable
from app.core.host_memory import host_memory_bytes
from app.schemas.compile_checks import CompileCheckRequest
from app.schemas.hardware import HardwarePlanRequest
from app.services import compile_checks
from app.services.compile_checks import CompileChecks, cache_key
from app.services.hardware import render_hardware_plan
from app.services.plans import PlanRequest, live_devices, render_plan
from datarax.distributed.hardware import get_hardware
from tests.datarax.distributed.test_compile_step import _require_libtpu
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


FIGURES = {"fits": True, "memory": {"hbm_peak_bytes": 3 * 2**40, "peak_bytes": 2**40},
           "xla_error": None}  # fmt: skip


@pytest.mark.parametrize(
    ("result", "bound", "fits", "reason"),
    [
        (FIGURES, None, None, "unknown"),  # the library's default true is not kept
        (FIGURES, 4 * 2**40, True, "within"),
        (FIGURES, 2 * 2**40, False, "beyond"),
        ({**FIGURES, "memory": {"peak_bytes": 2**40}}, 2 * 2**40, True, "within"),
        ({**FIGURES, "memory": None}, 2**40, None, "no memory figures"),
        ({"fits": False, "memory": None, "xla_error": "RESOURCE_EXHAUSTED"}, None, False, "XLA"),
    ],
    ids=["no-bound", "within", "beyond", "peak-only", "no-figures", "xla-refused"],
)
def test_fits_is_judged_never_defaulted(result, bound, fits, reason):
    judged = compile_checks.judge_fits(result, bound, "test bound")
    assert judged["fits"] is fits, judged
    assert reason in judged["fits_reason"], judged


def test_a_cpu_bound_is_the_hosts_budget_split_over_the_plans_devices():
    hbm, source = compile_checks.cpu_device_bound(_settings(memory_budget_mb=800), 8)
    assert hbm == 100 * 2**20 and source.startswith("DATARAX_MEMORY_BUDGET_MB"), source
    hbm, source = compile_checks.cpu_device_bound(_settings(memory_fraction=0.5), 4)
    assert hbm == int(host_memory_bytes() * 0.5) // 4 and "4 CPU devices" in source


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


# ------------------------------------------------------------------------ GPU targets
# A live plan as the service stores it on a GPU host: the runtime's mesh_grid answer
# (platform "gpu", as jax.Device.platform is for CUDA) rendered like any live plan.

H200 = "NVIDIA H200"
GPUS = {
    "platform": "gpu",
    "jax_platform": "cuda",
    "platform_version": "cuda 12090",
    "visible_devices": "0,1",
    "devices": [
        {"id": 0, "kind": H200, "bytes_limit": 100 * 2**30},
        {"id": 1, "kind": H200, "bytes_limit": 101 * 2**30},
    ],
}


def _live_plan(platform: str, grid: list[int]) -> dict:
    axes = {"data": len(grid)}
    answer = {
        "axes": axes,
        "device_grid": grid,
        "process_index": {str(i): 0 for i in grid},
        "platform": platform,
    }
    devices = live_devices(axes, answer, available=len(grid))
    rendered = render_plan(
        PlanRequest(axes=axes, batch_shape=[64, 128]),
        axes,
        devices,
        plan_id="m_live",
        created_at="now",
    )
    return json.loads(rendered.body)


def _settings(**overrides):
    return make_settings(__import__("pathlib").Path("/nonexistent"), **overrides)


def test_a_live_gpu_plan_compiles_on_the_workers_gpus_in_its_order():
    plan = _live_plan("gpu", [1, 0])
    assert compile_checks.needs_gpu(plan)
    work = compile_checks.check_target(plan, _request(QUICK), _settings(), GPUS)
    assert work["target"] == {
        "kind": "gpu",
        "platform": "cuda",
        "platform_version": "cuda 12090",
        "device_kind": H200,
        "devices": 2,
        "hbm_source": "bytes_limit",
    }
    assert work["device_ids"] == [1, 0]  # the plan's order, not the worker's
    assert work["hbm_bytes"] == 100 * 2**30  # the smallest pool of the plan's GPUs
    assert work["estimate"]["fits"] is True  # the estimate is sized against it too
    assert compile_checks.worker_platform(work["target"], _settings()) == "cuda"

    # DATARAX_MEMORY_BUDGET_MB wins, as on CPU; without bytes_limit, the catalog's figure.
    budget = compile_checks.check_target(
        plan, _request(QUICK), _settings(memory_budget_mb=512), GPUS
    )
    assert budget["hbm_bytes"] == 512 * 2**20
    assert budget["target"]["hbm_source"] == "DATARAX_MEMORY_BUDGET_MB"
    no_stats = {**GPUS, "devices": [{**d, "bytes_limit": None} for d in GPUS["devices"]]}
    catalog = compile_checks.check_target(plan, _request(QUICK), _settings(), no_stats)
    assert catalog["hbm_bytes"] == get_hardware("h200-sxm").hbm_bytes
    assert catalog["target"]["hbm_source"] == "catalog:h200-sxm"


def test_a_live_gpu_plan_the_worker_cannot_compile_is_422_with_the_reason():
    plan = _live_plan("gpu", [0, 3])
    with pytest.raises(CompileTargetUnavailable) as missing:
        compile_checks.check_target(plan, _request(QUICK), _settings(), GPUS)
    assert (
        "GPU ids 3" in missing.value.detail and "CUDA_VISIBLE_DEVICES='0,1'" in missing.value.detail
    )
    assert missing.value.extra["estimate"]["total"] > 0
    no_gpu = {"error": "JAX started no 'cuda' backend in the compile worker"}
    with pytest.raises(CompileTargetUnavailable) as unopened:
        compile_checks.check_target(_live_plan("gpu", [0]), _request(QUICK), _settings(), no_gpu)
    assert "could not open them: JAX started no 'cuda' backend" in unopened.value.detail


def test_the_cache_key_tells_gpu_from_cpu_targets():
    settings = _settings()
    cpu = compile_checks.check_target(_live_plan("cpu", [0, 1]), _request(QUICK), settings)
    gpu = compile_checks.check_target(_live_plan("gpu", [0, 1]), _request(QUICK), settings, GPUS)
    assert cpu["target"]["kind"] == "cpu" and gpu["target"]["kind"] == "gpu"
    for work in (cpu, gpu):
        work.pop("estimate")
    gpu_with_cpu_memory = {**gpu, "hbm_bytes": cpu["hbm_bytes"]}
    assert cpu["device_ids"] == gpu["device_ids"] and cpu["axes"] == gpu["axes"]
    assert cache_key(cpu) != cache_key(gpu_with_cpu_memory)
    other_kind = {
        **GPUS,
        "devices": [{**d, "kind": "NVIDIA H100 80GB HBM3"} for d in GPUS["devices"]],
    }
    h100 = compile_checks.check_target(
        _live_plan("gpu", [0, 1]), _request(QUICK), settings, other_kind
    )
    h100.pop("estimate")
    assert cache_key({**h100, "hbm_bytes": gpu["hbm_bytes"]}) != cache_key(gpu)
    one_more = {
        **GPUS,
        "devices": [*GPUS["devices"], {"id": 2, "kind": H200, "bytes_limit": 2**40}],
    }
    three = compile_checks.check_target(
        _live_plan("gpu", [0, 1]), _request(QUICK), settings, one_more
    )
    three.pop("estimate")
    assert three["hbm_bytes"] == gpu["hbm_bytes"] and cache_key(three) != cache_key(gpu)


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
    assert compile_checks.group_rss_bytes(os.getpgrp()) > 0  # what the GPU cap watches


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
