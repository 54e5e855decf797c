"""Targets and cache keys (app.services.compile_checks.targets): what the worker compiles
for a plan, the memory bound ``fits`` is judged against, and the key of a result.

GPU targets, without a GPU (tests/gpu compiles on one): a live plan as the runtime reports
it on a GPU host selects the worker's GPUs in the plan's order, with the memory figure
from XLA's pool, the budget setting or the catalog; the cache key tells it from a CPU
target.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.errors import CompileTargetUnavailable
from app.core.host_memory import host_memory_bytes
from app.services.compile_checks import targets as compile_checks
from app.services.compile_checks.targets import cache_key
from datarax.hardware.chips import get_hardware
from tests.compile_checks_support import (
    GPUS,
    H200,
    QUICK,
    _live_plan,
    _plan,
    _request,
    _settings,
)
from tests.helpers import make_settings


def test_a_cpu_bound_is_the_hosts_budget_split_over_the_plans_devices():
    hbm, source = compile_checks.cpu_device_bound(_settings(memory_budget_mb=800), 8)
    assert hbm == 100 * 2**20 and source.startswith("DATARAX_MEMORY_BUDGET_MB"), source
    hbm, source = compile_checks.cpu_device_bound(_settings(memory_fraction=0.5), 4)
    assert hbm == int(host_memory_bytes() * 0.5) // 4 and "4 CPU devices" in source


def test_cache_key_covers_the_program_and_the_compiler_versions(monkeypatch):
    settings = make_settings(Path("/nonexistent"))
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
