"""Compile checks of serving plans over HTTP (issue 57, item 5): the compile worker
compiles the library's KV-cached decode step for the plan's TPU topology through libtpu,
and the check sets XLA's memory beside the plan's serving memory. Tiny models."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.compile_checks_support import finish_over_http
from tests.datarax.spmd.test_compile_step import _require_libtpu
from tests.helpers import StubRuntime, assert_problem, make_settings

TINY = {"kind": "transformer", "layers": 2, "d_model": 256, "d_ff": 512, "heads": 8,
        "kv_heads": 4, "vocab": 1024, "seq_len": 128}  # fmt: skip
SERVING = {"input_tokens": 384, "output_tokens": 128, "max_batch": 16}


def _body(**serving):
    return {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"data": 2, "tensor": 2},
            "model": TINY, "serving": {**SERVING, **serving}}  # fmt: skip


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("serving"), compile_timeout_s=300.0)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as c:
        yield c


def _plan(client, body) -> str:
    answer = client.post("/v1/meshes", json=body)
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def test_a_serving_plan_compiles_its_decode_step_against_the_serving_memory(client):
    _require_libtpu()
    plan = _plan(client, _body())
    answer = client.post(f"/v1/meshes/{plan}/compile-checks", json={"model": TINY})
    assert answer.status_code == 202, answer.text
    check = finish_over_http(client, answer.headers["location"])
    assert check["status"] == "done", check
    assert check["estimate"] is None
    memory = check["serving_memory"]
    assert memory["kv_cache"] > 0 and memory["weights"] > 0
    compared = check["estimate_error"]
    # the decode step takes in the weights and the cache the plan prices
    assert compared["argument_bytes"]["estimate"] == memory["weights"] + memory["kv_cache"]
    assert abs(compared["argument_bytes"]["relative"]) < 0.01, compared
    assert compared["hbm_peak_bytes"]["estimate"] == memory["total"]
    assert check["result"]["fits"] is True and compared["fits_agrees"] is True
    assert check["target"] == {"kind": "tpu", "hardware": "tpu-v5e", "topology": "v5e:2x2",
                               "slices": 1, "hbm_source": "catalog:tpu-v5e"}  # fmt: skip


@pytest.mark.parametrize(
    ("serving", "says"),
    [({"weight_dtype": "int8"}, "quantized matmul"), ({"kv_dtype": "float8"}, "float8")],
)
def test_what_the_decode_step_cannot_hold_is_refused_with_the_reason(client, serving, says):
    _require_libtpu()
    plan = _plan(client, _body(**serving))
    problem = assert_problem(
        client.post(f"/v1/meshes/{plan}/compile-checks", json={"model": TINY}),
        422,
        "compile_target_unavailable",
    )
    assert says in problem["detail"]
    assert problem["serving_memory"]["weights"] > 0
