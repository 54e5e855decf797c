"""What the compile-check tests share: plans, requests, and driving a real
:class:`~app.services.compile_checks.CompileChecks` (with its compile worker) to an end.

Used by ``tests/app/services/compile_checks/`` and ``tests/app/workers/test_compile_worker.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from app.schemas.compile_checks import CompileCheckRequest
from app.schemas.hardware import HardwarePlanRequest
from app.services.compile_checks import CompileChecks
from app.services.hardware import check_hardware_plan, render_hardware_plan
from app.services.plans import PlanRequest, live_devices, render_plan
from tests.datarax.spmd.test_compile_step import _require_libtpu
from tests.helpers import make_settings

# ~5 s to compile on the 2-core CI host: long enough to act on while it compiles.
SLOW = {"kind": "mlp", "features": [4096, 16384, 4096], "dtype": "bfloat16"}
QUICK = {"kind": "mlp", "features": [128, 256, 128], "dtype": "bfloat16"}


def _plan() -> dict:
    request = HardwarePlanRequest(
        hardware="tpu-v5e", topology="4x4", ici={"fsdp": 4, "tensor": 4}, batch_shape=[64, 128]
    )
    rendered = render_hardware_plan(
        check_hardware_plan(request), plan_id="m_test", created_at="now"
    )
    return json.loads(rendered.body)


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


def finish_over_http(client, location: str, timeout: float = 300.0) -> dict:
    """GET ``location`` (a compile check) until it is done, failed or cancelled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check = client.get(location).json()
        if _finished(check):
            return check
        time.sleep(0.1)
    pytest.fail(f"{location} did not finish: {check}")


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
    return make_settings(Path("/nonexistent"), **overrides)
