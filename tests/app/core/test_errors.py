"""Every error path: status, ``application/problem+json`` and ``code``.

Most cases run against the session's real service (``api``). Guards and runtime failures
run against a small app with a stand-in runtime (no JAX process), an API token and a tiny
body limit.
"""

from __future__ import annotations

import io
import re
import zipfile

import numpy as np
import pytest

from app.core.errors import StepTimeout, WorkerLost, from_reply
from app.main import create_app
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


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """Token required, 64 KiB body limit, a stand-in runtime (not ready), a route that
    raises a bug."""
    settings = make_settings(
        tmp_path_factory.mktemp("guarded"), api_token=TOKEN, max_body_mb=64 / 1024
    )
    runtime = StubRuntime(ready=False)
    app = create_app(settings, runtime=runtime)

    @app.get("/boom")
    async def boom():
        raise RuntimeError("a bug with a secret traceback")

    with TestClient(app, raise_server_exceptions=False) as client:
        client.runtime = runtime
        yield client


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
            {"content": iter([b"{" * 40_000, b"{" * 40_000]), "headers": {**JSON, **AUTH}},
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
]


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


# ---------------------------------------------------------------- messages a user can act on

_INTERNALS = (
    "roles=", "callable", "Value error", "Extra inputs are not permitted", "list[any]",
    "function-after", ".named.", ".transformer.", ".mlp.", ".host.", ".jobs.",
)  # fmt: skip


def message_faults(detail: str) -> list[str]:
    """What breaks issue 40's rules in a problem's ``detail``: a Python-only field or a
    callable the HTTP API does not take, pydantic's internals, a number said twice
    ("use 64 or 64")."""
    faults = [word for word in _INTERNALS if word in detail]
    faults += [f"repeated {m.group(1)}" for m in re.finditer(r"\b(\d[\d,]*) or \1\b", detail)]
    return faults


@pytest.mark.parametrize(
    ("request_", "status", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_every_problem_in_the_table_reads_as_a_user_can_act_on(api, request_, status, code):
    method, path, kwargs = request_
    body = assert_problem(api.request(method, path, **kwargs), status, code)
    assert not message_faults(body["detail"]), body["detail"]
    for entry in body.get("errors", []):
        assert not message_faults(entry["msg"]), entry
        assert not message_faults("." + entry["field"] + "."), entry


TYPOS = [
    ("axis", {"ici": {"fsdb": 16}}, "unknown_axis_role", "'fsdp'"),
    ("model", {"model": {"name": "llama3.1-8bb"}}, "unknown_model", "'llama3.1-8b'"),
    ("hardware", {"hardware": "tpu-v5ee"}, "unknown_hardware", "'tpu-v5e'"),
    ("topology", {"topology": "4x44"}, "invalid_topology", "'4x4'"),
    ("field", {"batch_shap": [16, 2048]}, "validation_error", "'batch_shape'"),
    ("model-field", {"model": {"name": "llama3.1-8b", "remmat": "full"}}, "validation_error",
     "'remat'"),
    ("value", {"model": {"name": "llama3.1-8b", "remat": "fulll"}}, "validation_error", "'full'"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "code", "suggested"), [t[1:] for t in TYPOS],
                         ids=[t[0] for t in TYPOS])  # fmt: skip
def test_a_typo_is_answered_with_the_nearest_valid_name(api, change, code, suggested):
    # issue 40: "did you mean" for axis, model, hardware, topology, field and value typos,
    # in one sentence without pydantic's internals
    base = {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"fsdp": 16},
            "batch_shape": [16, 2048], "model": {"name": "llama3.1-8b"}}  # fmt: skip
    body = assert_problem(api.post("/v1/meshes", json={**base, **change}), 422, code)
    assert f"(did you mean {suggested}?)" in body["detail"], body["detail"]
    assert not message_faults(body["detail"]), body["detail"]
    if code == "validation_error":
        assert body["errors"][0]["field"] in ("batch_shap", "model.remmat", "model.remat")
