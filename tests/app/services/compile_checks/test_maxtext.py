"""Compile checks of MaxText's own program (``"program": "maxtext"``, DESIGN v1.4 "The
program users launch"): the request, the refusals, the configuration compiled (the
launch's), and real MaxText compiles through libtpu.

The real compiles need MaxText's environment (``make maxtext``: requirements-maxtext.txt
into .venv/maxtext); without it they skip, saying so, and fail with CI=true.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.core.errors import CompileTargetUnavailable
from app.main import create_app
from app.schemas.compile_checks import CompileCheckRequest
from app.schemas.hardware import HardwarePlanRequest
from app.services.compile_checks.maxtext_target import (
    MAXTEXT_SITE_ENV,
    compile_topology,
    installed_packages,
    maxtext_cache_key,
    maxtext_site,
    maxtext_target,
)
from app.services.hardware import check_hardware_plan, render_hardware_plan
from tests.compile_checks_support import _finished, _run, _wait, finish_over_http
from tests.datarax.spmd.test_compile_step import _require_libtpu
from tests.helpers import StubRuntime, assert_problem, make_settings

TINY = {"kind": "transformer", "layers": 2, "d_model": 256, "d_ff": 512, "heads": 4,
        "kv_heads": 4, "head_dim": 64, "vocab": 1024, "seq_len": 128}  # fmt: skip
TINY_PLAN = {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"fsdp": 4},
             "batch_shape": [4, 128], "model": TINY}  # fmt: skip
# The measured case: Llama 2 7B, float32 weights, full remat, one 2,048-token
# sequence a chip on v5e-4: XLA's CompileTimeHbmOom, 28.88G of 15.75G.
LLAMA = {"name": "llama2-7b", "seq_len": 2048, "param_dtype": "float32", "remat": "full"}
LLAMA_PLAN = {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"fsdp": 4},
              "batch_shape": [4, 2048], "model": LLAMA, "optimizer": "adam"}  # fmt: skip


def _require_maxtext() -> None:
    _require_libtpu()
    site = maxtext_site()
    if "maxtext" not in installed_packages(site):
        message = (
            f"MaxText's compile environment is not installed at {site}: the real MaxText "
            "compiles cannot run. Install it with `make maxtext` (make test does)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("maxtext"), compile_timeout_s=300.0)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
        yield c


def _plan(client, body) -> tuple[str, dict]:
    answer = client.post("/v1/meshes", json=body)
    assert answer.status_code == 201, answer.text
    plan_id = answer.json()["id"]
    return plan_id, client.get(f"/v1/meshes/{plan_id}").json()


# ------------------------------------------------------------------------------ install


def _pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"{path.name}: {line!r} is not pinned with =="
            out[name.lower().replace("_", "-")] = version
    return out


def test_the_maxtext_environment_is_pinned_and_never_shadows_the_venv():
    root = Path(__file__).resolve().parents[4]
    pins = _pins(root / "requirements-maxtext.txt")
    assert pins["maxtext"] == "0.2.5" and len(pins) == 35
    # the compile puts these first on PYTHONPATH: a package the venv pins would shadow it
    assert not set(pins) & set(_pins(root / "constraints.txt"))
    site = maxtext_site()
    if "maxtext" in installed_packages(site):  # installed: exactly the pinned set
        assert installed_packages(site) == pins


# ------------------------------------------------------------------------------ request


def test_the_request_takes_program_datarax_by_default_or_maxtext():
    assert CompileCheckRequest(model=TINY).program == "datarax"
    assert CompileCheckRequest(model=TINY, program="maxtext").program == "maxtext"
    for wrong in ("pytorch", "MaxText", 1, None):
        with pytest.raises(ValidationError):
            CompileCheckRequest(model=TINY, program=wrong)


def test_program_over_http_is_validated_and_non_tpu_targets_are_refused(client):
    tpu, _ = _plan(client, TINY_PLAN)
    url = f"/v1/meshes/{tpu}/compile-checks"
    problem = assert_problem(
        client.post(url, json={"model": TINY, "program": "megatron"}), 422, "validation_error"
    )
    assert "program" in json.dumps(problem)
    gpu, _ = _plan(client, {"hardware": "h100-sxm", "hosts": 1, "ici": {"fsdp": 8},
                            "batch_shape": [8, 128], "model": TINY})  # fmt: skip
    body = {"model": TINY, "program": "maxtext"}
    problem = assert_problem(
        client.post(f"/v1/meshes/{gpu}/compile-checks", json=body),
        422,
        "compile_target_unavailable",
    )
    assert "TPU targets only" in problem["detail"] and "h100-sxm" in problem["detail"]
    assert problem["estimate"]["total"] > 0
    live, _ = _plan(client, {"axes": {"data": 4}, "batch_shape": [8, 128]})
    problem = assert_problem(
        client.post(f"/v1/meshes/{live}/compile-checks", json=body),
        422,
        "compile_target_unavailable",
    )
    assert "TPU hardware plan" in problem["detail"] and "program 'datarax'" in problem["detail"]


def test_without_the_maxtext_environment_the_check_says_how_to_install_it(
    client, monkeypatch, tmp_path
):
    _require_libtpu()
    monkeypatch.setenv(MAXTEXT_SITE_ENV, str(tmp_path / "empty"))
    tpu, _ = _plan(client, TINY_PLAN)
    problem = assert_problem(
        client.post(f"/v1/meshes/{tpu}/compile-checks", json={"model": TINY, "program": "maxtext"}),
        422,
        "compile_target_unavailable",
    )
    assert "make maxtext" in problem["detail"] and problem["estimate"]["total"] > 0


# ----------------------------------------------------------------- what is compiled


def test_the_configuration_is_the_launchs_and_the_topology_maxtexts_name(client):
    _require_maxtext()
    plan_id, plan = _plan(client, LLAMA_PLAN)
    launch = client.post(f"/v1/meshes/{plan_id}/launch", json={"target": "maxtext"})
    assert launch.status_code == 200, launch.text
    settings = make_settings(maxtext_site())
    work = maxtext_target(plan, CompileCheckRequest(model=LLAMA, program="maxtext"), settings)
    assert work["args"] == launch.json()["args"]  # exactly what launch writes
    assert work["env"] == {"LIBTPU_INIT_ARGS": launch.json()["env"]["LIBTPU_INIT_ARGS"]}
    assert (work["compile_topology"], work["compile_topology_num_slices"]) == ("v5e-4", 1)
    assert "per_device_batch_size=1" in work["args"] and "weight_dtype=float32" in work["args"]
    # another batch is another program, and another key
    other = maxtext_target(
        plan,
        CompileCheckRequest(model=LLAMA, program="maxtext", batch_shape=[8, 2048]),
        settings,
    )
    assert "per_device_batch_size=2" in other["args"]
    assert maxtext_cache_key(other) != maxtext_cache_key(work)

    site = maxtext_site()
    assert compile_topology(site, "tpu-v5e", "v5e:16x16") == "v5e-256"
    assert compile_topology(site, "tpu-v5p", "v5p:2x2x1") == "v5p-8"  # cores, as MaxText
    assert compile_topology(site, "tpu-v6e", "v6e:2x2") == "v6e-4"
    assert compile_topology(site, "tpu7x", "tpu7x:2x2x1") == "tpu7x-8"
    # a shape the catalog plans and MaxText does not name
    with pytest.raises(CompileTargetUnavailable, match="none of its v4 names is 12x12x12"):
        compile_topology(site, "tpu-v4", "v4:12x12x12")


def test_maxtext_compiles_a_step_that_fits_and_repeats_it_from_the_cache(client):
    _require_maxtext()
    plan_id, _ = _plan(client, TINY_PLAN)
    url = f"/v1/meshes/{plan_id}/compile-checks"
    answer = client.post(url, json={"model": TINY, "program": "maxtext"})
    assert answer.status_code == 202, answer.text
    check = finish_over_http(client, answer.headers["location"])
    assert check["status"] == "done", check
    result = check["result"]
    program = result["program"]
    assert program["name"] == "maxtext" and program["version"] == "0.2.5"
    assert program["args"][-2:] == ["compile_topology=v5e-4", "compile_topology_num_slices=1"]
    assert "--xla_tpu_enable_async_collective_fusion=true" in program["env"]["LIBTPU_INIT_ARGS"]
    assert result["fits"] is True and result["xla_error"] is None
    memory = result["memory"]
    assert 0 < memory["hbm_peak_bytes"] < 2**30 and memory["hbm_bytes"] == 16 * 2**30
    assert memory["argument_bytes"] > 0 and result["flops"] > 0
    assert result["collectives"].get("all-gather", 0) > 0  # fsdp gathers the weights
    assert check["estimate_error"]["fits_agrees"] is True

    again = client.post(url, json={"model": TINY, "program": "maxtext"})
    assert again.json()["status"] == "done" and again.json()["cached"] is True
    assert again.json()["result"] == result
    datarax = client.post(url, json={"model": TINY})  # the library's program: not cached
    assert datarax.json()["cached"] is False
    done = finish_over_http(client, datarax.headers["location"])
    assert done["result"]["program"]["name"] == "datarax", done


def test_maxtext_refuses_llama2_7b_in_float32_on_v5e_4_for_memory(client):
    _require_maxtext()
    plan_id, _ = _plan(client, LLAMA_PLAN)
    body = {"model": LLAMA, "program": "maxtext"}
    answer = client.post(f"/v1/meshes/{plan_id}/compile-checks", json=body)
    check = finish_over_http(client, answer.headers["location"])
    assert check["status"] == "done", check
    result = check["result"]
    assert result["fits"] is False and result["memory"] is None
    assert "CompileTimeHbmOom" in result["xla_error"], result["xla_error"]
    assert "exceeds available HBM (15.75G)" in result["xla_error"]
    assert result["program"]["name"] == "maxtext"


# ------------------------------------------------------------- bounded like the worker


def _tiny_plan() -> dict:
    request = HardwarePlanRequest(**TINY_PLAN)
    rendered = render_hardware_plan(check_hardware_plan(request), plan_id="m_mt", created_at="now")
    return json.loads(rendered.body)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_maxtext_compile_past_its_timeout_or_cancelled_is_killed(tmp_path):
    _require_maxtext()
    request = CompileCheckRequest(model=TINY, program="maxtext")

    async def test(checks):
        check = await checks.submit("m_mt", _tiny_plan(), request)
        failed = await _wait(checks, check.id, _finished)
        assert failed["status"] == "failed", failed
        assert "DATARAX_COMPILE_TIMEOUT_S=1 s" in failed["error"]["detail"]
        assert checks.maxtext.pid is None and checks.maxtext.starts == 1

        checks.settings.compile_timeout_s = 300.0
        check = await checks.submit("m_mt", _tiny_plan(), request)
        running = await _wait(checks, check.id, lambda _: checks.maxtext.pid is not None)
        pid = checks.maxtext.pid
        assert running["status"] == "compiling" and _alive(pid)
        cancelled = await checks.cancel(check.id)
        assert cancelled["status"] == "cancelled" and cancelled["finished_at"]
        assert not _alive(pid) and checks.maxtext.pid is None

    _run(tmp_path, test, compile_timeout_s=1.0)
