"""Compile checks over HTTP: the contract of DESIGN v1.1 and the ground truth.

The ground truth: a check's figures equal those of a direct
``jax.jit(step).lower(...).compile()`` of the same step over the same TPU devices, in
this test process. Error paths check status, content type and code.
"""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from datarax.spmd.compile_step import (
    abstract_train_step,
    compiled_figures,
    mesh_from_ids,
    tpu_topology_devices,
)
from tests.compile_checks_support import finish_over_http
from tests.datarax.spmd.test_compile_step import _require_libtpu
from tests.helpers import StubRuntime, assert_problem, make_settings

MODEL = {"kind": "mlp", "features": [512, 2048, 512], "dtype": "bfloat16"}
TPU_PLAN = {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"fsdp": 4, "tensor": 4},
            "batch_shape": [256, 512]}  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("compile"))
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
        yield c


def _plan(client, body) -> str:
    answer = client.post("/v1/meshes", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def test_a_check_answers_the_figures_of_a_direct_compile_and_repeats_from_cache(client):
    _require_libtpu()
    mesh_id = _plan(client, TPU_PLAN)
    answer = client.post(f"/v1/meshes/{mesh_id}/compile-checks", json={"model": MODEL})
    assert answer.status_code == 202 and answer.headers["content-type"] == "application/json"
    location = answer.headers["location"]
    assert location == f"/v1/compile-checks/{answer.json()['id']}"
    check = finish_over_http(client, location, timeout=240.0)
    assert check["status"] == "done", check
    result = check["result"]

    plan = client.get(f"/v1/meshes/{mesh_id}").json()
    devices = tpu_topology_devices("tpu-v5e", "4x4")
    mesh = mesh_from_ids(devices, np.array(plan["device_grid"]), list(plan["axes"]))
    step = abstract_train_step(MODEL, mesh, 256)
    direct = compiled_figures(step.jitted().lower(*step.args).compile(), 16 * 2**30)
    assert result["memory"] == direct["memory"]
    assert result["flops"] == direct["flops"]
    assert result["collectives"] == direct["collectives"]
    assert result["fits"] is True and result["xla_error"] is None
    err = check["estimate_error"]
    assert err["fits_agrees"] is True
    assert err["peak_bytes"]["xla"] == result["memory"]["peak_bytes"]

    again = client.post(f"/v1/meshes/{mesh_id}/compile-checks", json={"model": MODEL})
    assert again.status_code == 202
    assert again.json()["status"] == "done" and again.json()["cached"] is True
    assert again.json()["result"] == result
    listed = client.get(f"/v1/meshes/{mesh_id}/compile-checks").json()
    assert listed["total"] == 2


def test_an_oom_check_quotes_xla(client):
    _require_libtpu()
    mesh_id = _plan(client, {**TPU_PLAN, "ici": {"data": 16}})
    huge = {"kind": "mlp", "features": [65536, 65536], "dtype": "float32"}
    answer = client.post(f"/v1/meshes/{mesh_id}/compile-checks", json={"model": huge})
    check = finish_over_http(client, answer.headers["location"], timeout=240.0)
    assert check["status"] == "done" and check["result"]["fits"] is False
    assert "RESOURCE_EXHAUSTED" in check["result"]["xla_error"]
    assert check["estimate"]["fits"] is False and check["estimate_error"]["fits_agrees"]


def test_a_live_cpu_plan_compiles_on_the_hosts_cpu_devices(client):
    mesh_id = _plan(client, {"axes": {"data": 4, "model": 2}, "batch_shape": [32, 64]})
    body = {"model": {"kind": "mlp", "features": [64, 128, 64]}, "optimizer": "sgd"}
    answer = client.post(f"/v1/meshes/{mesh_id}/compile-checks", json=body)
    check = finish_over_http(client, answer.headers["location"], timeout=240.0)
    assert check["status"] == "done", check
    assert check["target"]["kind"] == "cpu" and check["target"]["devices"] == 8
    assert check["target"]["hbm_source"].endswith("shared by 8 CPU devices")
    assert check["result"]["memory"]["argument_bytes"] > 0
    # Judged against the host's memory per device, never true by default.
    assert check["result"]["memory"]["hbm_bytes"] > 0
    assert check["result"]["fits"] is True and check["result"]["fits_reason"]


def test_unknown_mesh_and_unknown_check(client):
    assert_problem(
        client.post("/v1/meshes/m_nope/compile-checks", json={"model": MODEL}),
        404,
        "mesh_not_found",
    )
    assert_problem(client.get("/v1/compile-checks/c_nope"), 404, "compile_check_not_found")
    assert_problem(client.delete("/v1/compile-checks/c_nope"), 404, "compile_check_not_found")


def test_targets_that_cannot_compile_here_carry_the_estimate(client):
    abstract = _plan(client, {"axes": {"data": 8}, "num_devices": 8, "batch_shape": [64, 512]})
    problem = assert_problem(
        client.post(f"/v1/meshes/{abstract}/compile-checks", json={"model": MODEL}),
        422,
        "compile_target_unavailable",
    )
    assert "hardware" in problem["detail"]
    gpu = _plan(client, {"hardware": "h100-sxm", "hosts": 1, "ici": {"data": 8},
                         "batch_shape": [64, 512]})  # fmt: skip
    problem = assert_problem(
        client.post(f"/v1/meshes/{gpu}/compile-checks", json={"model": MODEL}),
        422,
        "compile_target_unavailable",
    )
    assert problem["estimate"]["total"] > 0 and problem["estimate"]["fits"] is True


def test_bad_bodies(client):
    mesh_id = _plan(client, TPU_PLAN)
    url = f"/v1/meshes/{mesh_id}/compile-checks"
    assert_problem(client.post(url, json={}), 422, "validation_error")
    assert_problem(client.post(url, json={"model": MODEL, "extra": 1}), 422, "validation_error")
    giant = {"kind": "transformer", "layers": 4096, "d_model": 1048576, "d_ff": 1048576,
             "heads": 1, "kv_heads": 1, "vocab": 1048576, "seq_len": 1048576}  # fmt: skip
    problem = assert_problem(
        client.post(url, json={"model": giant, "batch_shape": [2**40]}), 422, "model_too_large"
    )
    assert "elements" in problem["detail"]
    assert_problem(
        client.post(url, json={"model": MODEL, "batch_shape": [102]}), 422, "batch_not_divisible"
    )


def test_kinds_the_program_does_not_build_are_refused_before_compiling(client):
    # issue 38: plans price 1F1B pipelines; the library's training program does not
    # build them, so a compile check says so instead of compiling another step (both
    # context strategies and the stages of MoE models are built)
    dense = {"kind": "transformer", "layers": 4, "d_model": 512, "d_ff": 2048, "heads": 8,
             "kv_heads": 8, "vocab": 32000, "seq_len": 2048}  # fmt: skip
    staged = _plan(client, {"hardware": "tpu-v5e", "topology": "4x4",
                            "ici": {"stage": 4, "fsdp": 4}, "batch_shape": [16, 2048],
                            "model": dense, "pipeline": {"schedule": "1f1b"}})  # fmt: skip
    problem = assert_problem(
        client.post(f"/v1/meshes/{staged}/compile-checks", json={"model": dense}),
        422,
        "invalid_parallelism",
    )
    assert "'1f1b'" in problem["detail"] and "gpipe and circular" in problem["detail"]
