"""Every error path: status, ``application/problem+json`` and ``code``.

Most cases run against the session's real service (``api``). Guards and runtime failures
run against a small app with a stand-in runtime (no JAX process), an API token and small
limits, as do the refusals the app makes without a runtime. What the messages say (issue
40), for every code of docs/ERRORS.md, is tests/app/core/test_error_messages.py, which
walks these tables too.
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI

from app.core.errors import StepTimeout, WorkerLost, from_reply
from app.main import create_app
from tests.app.api.routes.test_calibrations import GPU_PLAN
from tests.app.api.routes.test_hardware import TRANSFORMER
from tests.helpers import StubRuntime, TestClient, assert_problem, make_settings, npz_bytes

JSON = {"content-type": "application/json"}
NPZ = {"content-type": "application/x-npz"}
TOKEN = "s3cret-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def _pickled_npz() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, loss=np.array([{"a": 1}, None], dtype=object))
    return buffer.getvalue()


def _npy_not_npz() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(3))
    return buffer.getvalue()


def _zip_without_arrays() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("loss.npy", b"not an npy file")
    return buffer.getvalue()


def _npz_bomb() -> bytes:
    """8 MB of zeros that compress to a few KiB: under the body limit, not once inflated."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x=np.zeros(1_000_000))
    return buffer.getvalue()


def _plan(**body):
    return ("POST", "/v1/meshes", {"json": body})


def _reduce(body=None, **kwargs):
    if body is not None:
        kwargs["json"] = body
    return ("POST", "/v1/metrics/reduce", kwargs)


# (id, (method, path, request kwargs), status, code)
CASES = [
    # routing
    ("unknown-path", ("GET", "/v1/nope", {}), 404, "not_found"),
    ("wrong-method", ("PUT", "/v1/meshes", {}), 405, "method_not_allowed"),
    ("delete-devices", ("DELETE", "/v1/devices", {}), 405, "method_not_allowed"),
    ("mesh-not-found", ("GET", "/v1/meshes/m_nope", {}), 404, "mesh_not_found"),
    ("delete-not-found", ("DELETE", "/v1/meshes/m_nope", {}), 404, "mesh_not_found"),
    ("svg-not-found", ("GET", "/v1/meshes/m_nope/layout.svg", {}), 404, "mesh_not_found"),
    # bodies
    (
        "plan-malformed-json",
        ("POST", "/v1/meshes", {"content": b'{"axes": ', "headers": JSON}),
        422,
        "invalid_json",
    ),
    (
        "plan-not-utf8",
        ("POST", "/v1/meshes", {"content": b'{"axes": "\xff\xfe"}', "headers": JSON}),
        422,
        "invalid_json",
    ),
    (
        "reduce-not-utf8",
        _reduce(content=b'{"metrics": "\xff\xfe"}', headers=JSON),
        422,
        "invalid_json",
    ),
    (
        "reduce-malformed-json",
        _reduce(content=b"{nope", headers=JSON),
        422,
        "invalid_json",
    ),
    (
        "plan-text-body",
        ("POST", "/v1/meshes", {"content": b"axes=1", "headers": {"content-type": "text/plain"}}),
        415,
        "unsupported_media_type",
    ),
    (
        "plan-form-body",
        ("POST", "/v1/meshes", {"data": {"axes": "x"}}),
        415,
        "unsupported_media_type",
    ),
    (
        "plan-no-content-type",
        ("POST", "/v1/meshes", {"content": b'{"axes": {"data": 2}}'}),
        415,
        "unsupported_media_type",
    ),
    (
        "plan-npz-body",
        ("POST", "/v1/meshes", {"content": npz_bytes(a=np.arange(2)), "headers": NPZ}),
        415,
        "unsupported_media_type",
    ),
    (
        "reduce-text-body",
        _reduce(content=b"loss=1", headers={"content-type": "text/csv"}),
        415,
        "unsupported_media_type",
    ),
    (
        "plan-empty-body",
        ("POST", "/v1/meshes", {"content": b"", "headers": JSON}),
        422,
        "validation_error",
    ),
    # plan validation (schema)
    ("plan-axes-missing", _plan(batch_shape=[8]), 422, "validation_error"),
    ("plan-axis-size-string", _plan(axes={"data": "2"}), 422, "validation_error"),
    ("plan-unknown-field", _plan(axes={"data": 2}, batchshape=[8]), 422, "validation_error"),
    (
        "plan-model-kind",
        _plan(axes={"data": 2}, model={"kind": "cnn", "features": [2, 2]}),
        422,
        "validation_error",
    ),
    (
        "plan-features-short",
        _plan(axes={"data": 2}, model={"kind": "mlp", "features": [2]}),
        422,
        "validation_error",
    ),
    ("plan-num-devices-zero", _plan(axes={"data": 2}, num_devices=0), 422, "validation_error"),
    ("plan-num-devices-huge", _plan(axes={"data": -1}, num_devices=10**9), 422, "validation_error"),
    ("plan-batch-negative", _plan(axes={"data": 2}, batch_shape=[-1]), 422, "validation_error"),
    ("plan-batch-empty", _plan(axes={"data": 2}, batch_shape=[]), 422, "validation_error"),
    ("plan-param-rule", _plan(axes={"data": 2}, param_sharding="zero3"), 422, "validation_error"),
    ("plan-optimizer", _plan(axes={"data": 2}, optimizer="lion"), 422, "validation_error"),
    # plan errors (library codes)
    ("not-enough-devices", _plan(axes={"data": 16}), 422, "not_enough_devices"),
    ("not-enough-devices-2d", _plan(axes={"data": 4, "model": 4}), 422, "not_enough_devices"),
    ("abstract-product", _plan(axes={"data": 3}, num_devices=8), 422, "axes_product_mismatch"),
    (
        "auto-not-dividing",
        _plan(axes={"data": -1, "model": 3}, num_devices=8),
        422,
        "axes_product_mismatch",
    ),
    ("live-auto-not-dividing", _plan(axes={"data": -1, "model": 3}), 422, "axes_product_mismatch"),
    ("multiple-auto", _plan(axes={"data": -1, "model": -1}), 422, "multiple_auto_axes"),
    ("bad-axis-name", _plan(axes={"1data": 2}), 422, "invalid_axis_name"),
    ("empty-axes", _plan(axes={}), 422, "invalid_axis_name"),
    ("axis-size-zero", _plan(axes={"data": 0}), 422, "invalid_axis_size"),
    ("axis-size-minus-two", _plan(axes={"data": -2}, num_devices=8), 422, "invalid_axis_size"),
    (
        "batch-not-divisible",
        _plan(axes={"data": 8}, batch_shape=[250, 3]),
        422,
        "batch_not_divisible",
    ),
    (
        "unknown-batch-axis",
        _plan(axes={"data": 2}, batch_shape=[4], batch_axes=["dat"]),
        422,
        "unknown_batch_axis",
    ),
    (
        "unknown-batch-axis-no-batch",
        _plan(axes={"data": 2}, batch_axes=["dat"], num_devices=2),
        422,
        "unknown_batch_axis",
    ),
    (
        "duplicate-batch-axis",
        _plan(axes={"data": 2}, batch_shape=[4], batch_axes=["data", "data"]),
        422,
        "duplicate_batch_axis",
    ),
    # metrics
    ("ragged", _reduce({"metrics": {"x": [[1, 2], [3]]}}), 422, "ragged_array"),
    ("ragged-mixed", _reduce({"metrics": {"x": [[1, 2], 3]}}), 422, "ragged_array"),
    ("strings", _reduce({"metrics": {"x": ["a", "b"]}}), 422, "invalid_tensor"),
    ("objects-in-list", _reduce({"metrics": {"x": [{"a": 1}, 2]}}), 422, "invalid_tensor"),
    ("scalar-metric", _reduce({"metrics": {"x": 1.0}}), 422, "validation_error"),
    (
        "tensor-length",
        _reduce({"metrics": {"x": {"shape": [4], "datatype": "FP32", "data": [1, 2]}}}),
        422,
        "invalid_tensor",
    ),
    (
        "tensor-rank0",
        _reduce({"metrics": {"x": {"shape": [], "datatype": "FP32", "data": [1]}}}),
        422,
        "invalid_tensor",
    ),
    (
        "tensor-bf16",
        _reduce({"metrics": {"x": {"shape": [2], "datatype": "BF16", "data": [1, 2]}}}),
        422,
        "unsupported_datatype",
    ),
    (
        "tensor-bytes",
        _reduce({"metrics": {"x": {"shape": [1], "datatype": "BYTES", "data": ["a"]}}}),
        422,
        "unsupported_datatype",
    ),
    (
        "tensor-int-overflow",
        _reduce({"metrics": {"x": {"shape": [2], "datatype": "INT8", "data": [1, 300]}}}),
        422,
        "invalid_tensor",
    ),
    (
        "tensor-int-from-float",
        _reduce({"metrics": {"x": {"shape": [2], "datatype": "INT32", "data": [1.5, 2]}}}),
        422,
        "invalid_tensor",
    ),
    (
        "tensor-missing-data",
        _reduce({"metrics": {"x": {"shape": [2], "datatype": "FP32"}}}),
        422,
        "validation_error",
    ),
    (
        "unknown-op",
        _reduce({"metrics": {"x": [1, 2]}, "reduce": {"x": "median"}}),
        422,
        "unknown_reduce_op",
    ),
    (
        "unknown-metric",
        _reduce({"metrics": {"x": [1, 2]}, "reduce": {"y": "sum"}}),
        422,
        "unknown_metric",
    ),
    (
        "nan-policy",
        _reduce({"metrics": {"x": [1, 2]}, "nan_policy": "ignore"}),
        422,
        "unknown_nan_policy",
    ),
    (
        "device-mismatch",
        _reduce({"metrics": {"x": [1, 2], "y": [1, 2, 3]}}),
        422,
        "device_count_mismatch",
    ),
    ("empty-metrics", _reduce({"metrics": {}}), 422, "empty_metrics"),
    ("zero-devices", _reduce({"metrics": {"x": []}}), 422, "empty_metrics"),
    ("metrics-missing", _reduce({"reduce": {}}), 422, "validation_error"),
    (
        "weights-mismatch",
        _reduce({"metrics": {"x": [1, 2]}, "weights": [1, 2, 3]}),
        422,
        "weights_mismatch",
    ),
    (
        "weights-negative",
        _reduce({"metrics": {"x": [1, 2]}, "weights": [1, -1]}),
        422,
        "invalid_weights",
    ),
    (
        "nan-raise",
        _reduce(content=b'{"metrics": {"x": [1, NaN]}, "nan_policy": "raise"}', headers=JSON),
        422,
        "non_finite_values",
    ),
    (
        "collect-empty",
        ("POST", "/v1/metrics/collect", {"json": {"metrics": {}}}),
        422,
        "empty_metrics",
    ),
    # npz
    ("npz-garbage", _reduce(content=b"\x00garbage" * 10, headers=NPZ), 422, "invalid_npz"),
    ("npz-empty", _reduce(content=b"", headers=NPZ), 422, "invalid_npz"),
    ("npz-pickled-object", _reduce(content=_pickled_npz(), headers=NPZ), 422, "invalid_npz"),
    ("npz-plain-npy", _reduce(content=_npy_not_npz(), headers=NPZ), 422, "invalid_npz"),
    ("npz-corrupt-member", _reduce(content=_zip_without_arrays(), headers=NPZ), 422, "invalid_npz"),
    (
        "npz-complex",
        _reduce(content=npz_bytes(x=np.array([1j, 2j])), headers=NPZ),
        422,
        "unsupported_datatype",
    ),
    ("npz-scalar", _reduce(content=npz_bytes(x=np.float32(1)), headers=NPZ), 422, "invalid_tensor"),
    (
        "npz-bad-reduce-query",
        _reduce(content=npz_bytes(x=np.ones(2)), headers=NPZ, params={"reduce": "x"}),
        422,
        "validation_error",
    ),
    (
        "npz-unknown-op",
        _reduce(content=npz_bytes(x=np.ones(2)), headers=NPZ, params={"reduce": "x:avg"}),
        422,
        "unknown_reduce_op",
    ),
    (
        "npz-weights-mismatch",
        _reduce(content=npz_bytes(x=np.ones(2), _weights=np.ones(3)), headers=NPZ),
        422,
        "weights_mismatch",
    ),
    # jobs
    ("job-bad-name", ("GET", "/v1/jobs/bad name!/metrics", {}), 422, "validation_error"),
    (
        "job-name-too-long",
        ("GET", "/v1/jobs/" + "a" * 129 + "/metrics", {}),
        422,
        "validation_error",
    ),
    (
        "job-step-missing",
        ("POST", "/v1/jobs/j/metrics", {"json": {"metrics": {"x": [1]}}}),
        422,
        "validation_error",
    ),
    (
        "job-step-negative",
        ("POST", "/v1/jobs/j/metrics", {"json": {"metrics": {"x": [1]}, "step": -1}}),
        422,
        "validation_error",
    ),
    (
        "job-step-string",
        ("POST", "/v1/jobs/j/metrics", {"json": {"metrics": {"x": [1]}, "step": "3"}}),
        422,
        "validation_error",
    ),
    (
        "job-npz-without-step",
        ("POST", "/v1/jobs/j/metrics", {"content": npz_bytes(x=np.ones(2)), "headers": NPZ}),
        422,
        "validation_error",
    ),
    (
        "job-npz-negative-step",
        (
            "POST",
            "/v1/jobs/j/metrics",
            {"content": npz_bytes(x=np.ones(2)), "headers": NPZ, "params": {"step": -3}},
        ),
        422,
        "validation_error",
    ),
    (
        "job-metrics-error",
        ("POST", "/v1/jobs/j/metrics", {"json": {"metrics": {"x": [[1], [2, 3]]}, "step": 1}}),
        422,
        "ragged_array",
    ),
    ("list-limit-zero", ("GET", "/v1/meshes", {"params": {"limit": 0}}), 422, "validation_error"),
    (
        "list-offset-negative",
        ("GET", "/v1/meshes", {"params": {"offset": -1}}),
        422,
        "validation_error",
    ),
    (  # found by schemathesis: past SQLite's 64-bit integers this was a 500
        "list-offset-beyond-int64",
        ("GET", "/v1/meshes", {"params": {"offset": 2**63}}),
        422,
        "validation_error",
    ),
]


@pytest.mark.parametrize(
    ("request_", "status", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_error_table(api, request_, status, code):
    method, path, kwargs = request_
    response = api.request(method, path, **kwargs)
    assert_problem(response, status, code)


def test_validation_errors_name_the_field(api):
    body = assert_problem(
        api.post("/v1/meshes", json={"axes": {"data": "x"}}), 422, "validation_error"
    )
    assert body["errors"][0]["loc"] == ["body", "axes", "data"]
    assert body["errors"][0]["field"] == "axes.data"
    assert "axes.data" in body["detail"]
    body = assert_problem(
        api.post("/v1/jobs/j/metrics", json={"metrics": {"x": [1]}, "step": -1}),
        422,
        "validation_error",
    )
    assert body["errors"][0]["loc"] == ["body", "step"]


def test_detail_says_how_to_fix(api):
    body = assert_problem(
        api.post("/v1/meshes", json={"axes": {"data": 8}, "batch_shape": [250, 3]}),
        422,
        "batch_not_divisible",
    )
    assert "248" in body["detail"] and "256" in body["detail"]
    body = assert_problem(api.put("/v1/meshes"), 405, "method_not_allowed")


def test_method_not_allowed_lists_allowed_methods(api):
    response = api.put("/v1/meshes")
    assert_problem(response, 405, "method_not_allowed")
    assert set(response.headers["allow"].replace(" ", "").split(",")) == {"GET", "HEAD", "POST"}


# ------------------------------------------------------------------- guarded stand-in app


def guarded_app(
    tmp_path: Path, runtime: StubRuntime | None = None, **settings: Any
) -> tuple[FastAPI, StubRuntime]:
    """An app with a token required, small limits (64 KiB bodies, 8 KiB heads, 0.1 MB
    answers), a stand-in runtime (not ready unless given) and a route that raises a bug;
    ``settings`` are more overrides."""
    runtime = runtime if runtime is not None else StubRuntime(ready=False)
    limits = {"max_body_mb": 64 / 1024, "max_header_kb": 8, "max_answer_mb": 0.1}
    app = create_app(
        make_settings(tmp_path, api_token=TOKEN, **{**limits, **settings}), runtime=runtime
    )

    @app.get("/boom")
    async def boom():
        raise RuntimeError("a bug with a secret traceback")

    return app, runtime


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    app, runtime = guarded_app(tmp_path_factory.mktemp("guarded"))
    with TestClient(app, raise_server_exceptions=False) as client:
        client.runtime = runtime
        yield client


def _authorised_plan(**body):
    return ("POST", "/v1/meshes", {"json": body, "headers": AUTH})


def _recommend(**body):
    return ("POST", "/v1/recommendations", {"json": body, "headers": AUTH})


RECOMMENDATION = {"hardware": "tpu-v5e", "topology": "4x4", "slices": 2, "model": TRANSFORMER,
                  "global_batch": 64}  # fmt: skip
HEAVY_TRANSFORMER = {**TRANSFORMER, "layers": 96, "d_model": 12288, "d_ff": 49152,
                     "heads": 96, "kv_heads": 96}  # fmt: skip
SIX_AXES = ["data", "fsdp", "tensor", "batch", "replica", "model"]

GUARD_CASES = [
    (
        "post-without-token",
        ("POST", "/v1/meshes", {"json": {"axes": {"data": 2}}}),
        401,
        "unauthorized",
    ),
    (
        "post-wrong-token",
        (
            "POST",
            "/v1/meshes",
            {"json": {"axes": {"data": 2}}, "headers": {"authorization": "Bearer x"}},
        ),
        401,
        "unauthorized",
    ),
    (
        "basic-auth",
        ("POST", "/v1/metrics/reduce", {"json": {}, "headers": {"authorization": "Basic dTpw"}}),
        401,
        "unauthorized",
    ),
    ("delete-without-token", ("DELETE", "/v1/meshes/m_x", {}), 401, "unauthorized"),
    (
        "too-large-declared",
        ("POST", "/v1/metrics/reduce", {"content": b"[" * 70_000, "headers": {**JSON, **AUTH}}),
        413,
        "payload_too_large",
    ),
    (
        "too-large-chunked",
        (
            "POST",
            "/v1/metrics/reduce",
            # a list of chunks: sent chunked (no Content-Length), and alike every time a
            # test walks this table (an iterator is spent after one request)
            {"content": [b"{" * 40_000, b"{" * 40_000], "headers": {**JSON, **AUTH}},
        ),
        413,
        "payload_too_large",
    ),
    (
        "npz-bomb",
        (
            "POST",
            "/v1/metrics/reduce",
            {
                "content": _npz_bomb(),
                "headers": {**NPZ, **AUTH},
            },
        ),
        413,
        "payload_too_large",
    ),
    ("bug", ("GET", "/boom", {}), 500, "internal_error"),
    ("devices-not-ready", ("GET", "/v1/devices", {}), 503, "worker_lost"),
    ("ready-starting", ("GET", "/health/ready", {}), 503, "not_ready"),
    (
        "live-plan-not-ready",
        ("POST", "/v1/meshes", {"json": {"axes": {"data": 2}}, "headers": AUTH}),
        503,
        "worker_lost",
    ),
    # what the app answers without its runtime: plans, hardware, catalogs, jobs
    ("head-over-8-kib", ("GET", "/v1/meshes", {"headers": {"x-big": "a" * 9000}}), 431,
     "headers_too_large"),
    ("plan-answer-over-0.1-mb", _authorised_plan(axes={"data": -1}, num_devices=4096), 422,
     "answer_too_large"),
    ("65-axes", _authorised_plan(axes={f"a{i}": 1 for i in range(65)}, num_devices=1), 422,
     "too_many_axes"),
    ("batch-2^80", _authorised_plan(axes={"data": 8}, num_devices=8,
                                    batch_shape=[2**40, 2**40]), 422, "invalid_batch_shape"),
    ("hardware-tpu-v9", ("GET", "/v1/hardware/tpu-v9", {}), 404, "hardware_not_found"),
    ("tpu-without-topology", _authorised_plan(hardware="tpu-v5e", ici={"data": -1}), 422,
     "missing_topology"),
    ("topology-on-gpu", _authorised_plan(hardware="h100-sxm", hosts=1, topology="4x4",
                                         ici={"data": -1}), 422, "option_not_applicable"),
    ("3-hosts-of-nvl72", _authorised_plan(hardware="gb200-nvl72", hosts=3, ici={"data": -1}),
     422, "invalid_host_count"),
    ("dcn-axis-not-in-ici", _authorised_plan(hardware="tpu-v5e", topology="4x4", slices=2,
                                             ici={"data": -1}, dcn={"pipe": 2}), 422,
     "unknown_dcn_axis"),
    ("tensor-4-on-16x16", _authorised_plan(hardware="tpu-v5e", topology="16x16",
                                           ici={"data": 64, "tensor": 4}), 422,
     "physical_axes_split_required"),
    ("d-model-not-multiple-of-heads",
     _authorised_plan(hardware="tpu-v5e", topology="4x4", ici={"data": -1},
                      batch_shape=[16, 2048], model={**TRANSFORMER, "d_model": 1000}), 422,
     "invalid_model"),
    ("model-llama9", ("GET", "/v1/models/llama9", {}), 404, "model_not_found"),
    ("calibration-nope", ("GET", "/v1/calibrations/nope", {}), 404, "calibration_not_found"),
    ("plan-calibration-nope", _authorised_plan(**GPU_PLAN, calibration="nope"), 422,
     "unknown_calibration"),
    ("tpu-profile-on-gpu", _authorised_plan(**GPU_PLAN, calibration="published-tpu-jax"), 422,
     "invalid_calibration"),
    ("maxtext-key-typo", _authorised_plan(hardware="tpu-v5e", topology="4x4",
                                          maxtext={"ici_fdsp_parallelism": 4}), 422,
     "invalid_maxtext_config"),
    ("pipeline-without-stage-axis",
     _recommend(hardware="h100-sxm", hosts=4, global_batch=32, model={"name": "llama3.1-8b"},
                axes=["data", "fsdp"], pipeline={"microbatches": 4}), 422,
     "invalid_parallelism"),
    ("tensor-16-over-8-heads",
     _authorised_plan(hardware="tpu-v5e", topology="16x16", slices=2, dcn={"data": -1},
                      ici={"data": 1, "fsdp": 16, "tensor": 16}, batch_shape=[1024, 2048],
                      batch_axes=["data", "fsdp"],
                      model={**TRANSFORMER, "heads": 8, "kv_heads": 8}), 422,
     "tensor_not_divisible"),
    ("serving-jetstream-on-gpu",
     _authorised_plan(hardware="h100-sxm", hosts=1, ici={"tensor": 8},
                      model={"name": "llama3.1-8b"},
                      serving={"input_tokens": 100, "output_tokens": 100, "engine": "jetstream"}),
     422, "invalid_serving"),
    ("nothing-fits", _recommend(**{**RECOMMENDATION, "global_batch": 4096,
                                   "model": HEAVY_TRANSFORMER}), 422, "no_plan_fits"),
    ("4096-slices-6-axes", _recommend(**{**RECOMMENDATION, "slices": 4096, "axes": SIX_AXES}),
     422, "search_space_too_large"),
    ("1025-slices-of-16x16", _authorised_plan(hardware="tpu-v5e", topology="16x16",
                                              slices=1025, ici={"data": -1},
                                              dcn={"data": -1}), 422, "too_many_devices"),
    ("job-nobody", ("GET", "/v1/jobs/nobody", {}), 404, "job_not_found"),
    ("session-s-nope", ("GET", "/v1/sessions/s_nope", {}), 404, "session_not_found"),
    ("check-c-nope", ("GET", "/v1/compile-checks/c_nope", {}), 404,
     "compile_check_not_found"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("request_", "status", "code"),
    [c[1:] for c in GUARD_CASES],
    ids=[c[0] for c in GUARD_CASES],
)
def test_guard_table(guarded, request_, status, code):
    method, path, kwargs = request_
    body = assert_problem(guarded.request(method, path, **kwargs), status, code)
    assert "secret traceback" not in body["detail"]


def test_unauthorized_says_bearer(guarded):
    response = guarded.post("/v1/meshes", json={"axes": {"data": 2}})
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_token_lets_writes_through_and_reads_need_none(guarded):
    body = {"axes": {"data": 2}, "num_devices": 2}
    created = guarded.post("/v1/meshes", json=body, headers=AUTH)
    assert created.status_code == 201, created.text
    assert guarded.get(created.headers["location"]).status_code == 200
    assert guarded.get("/v1/meshes").status_code == 200
    assert guarded.delete(created.headers["location"], headers=AUTH).status_code == 204


def test_small_body_under_the_limit_passes_chunked(guarded):
    chunks = iter([b'{"metrics": {"x": ', b"[1, 2]}}"])
    response = guarded.post("/v1/metrics/reduce", content=chunks, headers={**JSON, **AUTH})
    assert response.status_code == 200, response.text
    assert response.json()["reduced"] == {"x": 1.5}


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (WorkerLost("runtime died"), 503, "worker_lost"),
        (StepTimeout("took too long"), 504, "step_timeout"),
        (
            from_reply({"code": "not_enough_devices", "detail": "needs 16"}),
            422,
            "not_enough_devices",
        ),
        (from_reply({"code": "runtime_error", "detail": "boom"}), 500, "runtime_error"),
        (from_reply({"code": "no_such_code", "detail": "newer runtime"}), 500, "runtime_error"),
    ],
    ids=["worker-lost", "timeout", "reply-422", "reply-500", "reply-unknown-code"],
)
def test_runtime_failures_map_to_problems(guarded, error, status, code):
    runtime = guarded.runtime
    runtime.ready, runtime.call_error = True, error
    try:
        response = guarded.post("/v1/meshes", json={"axes": {"data": 2}}, headers=AUTH)
    finally:
        runtime.ready, runtime.call_error = False, None
    assert_problem(response, status, code)


def test_abstract_plans_need_no_runtime(guarded):
    body = {"axes": {"data": 4}, "num_devices": 4, "batch_shape": [8]}
    assert guarded.post("/v1/meshes", json=body, headers=AUTH).status_code == 201


def test_ready_reports_worker_lost_after_a_restart(guarded):
    runtime = guarded.runtime
    runtime.restarts = 1
    try:
        body = assert_problem(guarded.get("/health/ready"), 503, "worker_lost")
    finally:
        runtime.restarts = 0
    assert body["runtime_restarts"] == 1


def test_bad_live_plan_is_refused_before_the_runtime_is_asked(guarded):
    runtime = guarded.runtime
    runtime.ready, runtime.call_error = True, AssertionError("the runtime must not be called")
    try:
        body = {"axes": {"data": 8}, "batch_shape": [250]}
        response = guarded.post("/v1/meshes", json=body, headers=AUTH)
    finally:
        runtime.ready, runtime.call_error = False, None
    assert_problem(response, 422, "batch_not_divisible")
