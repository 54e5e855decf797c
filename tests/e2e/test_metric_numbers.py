"""Numbers that never wrap and decoders that never 500, against the real ``datarax-serve``
(issue 26).

One server serves the module. Classes, each tried on every route that decodes arrays
(reduce, collect, job pushes JSON single/batch/part and npz single/batch, session steps
JSON and npz):

- claimed shapes numpy cannot hold (sizes past 2**63, 65 dimensions, empty arrays with
  huge other sizes), in JSON tensors and npz headers (stored and deflated): 422
  ``invalid_tensor``; 64-dimensional job metrics (a stored history stacks one more axis):
  422 ``invalid_tensor``, 63 accepted;
- npz dtypes JSON cannot answer (float128): 422 ``unsupported_datatype``; member names
  with NUL or control characters, or given twice: 422 ``invalid_npz``;
- integer sums past their dtype, every integer datatype: exact or 422
  ``integer_overflow`` (nothing stored); integer means from the exact sum;
- float means and sums finite where the true value is; weighted means scale-invariant.

Every answer is checked as RFC 9457 problem JSON with its code, or as the exact value.
"""

from __future__ import annotations

import io
import math
import zipfile

import numpy as np
import pytest

from tests.helpers import ServiceProcess, assert_problem, npz_bytes

pytestmark = pytest.mark.timeout(300)

NPZ = {"content-type": "application/x-npz"}
NPZ_ANSWER = {**NPZ, "accept": "application/x-npz"}
I64_MAX, U64_MAX = 2**63 - 1, 2**64 - 1
FEATURES = [4, 8, 2]  # the session's MLP: inputs [B, 4], targets [B, 2]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("numbers")
    with ServiceProcess(root / "numbers.sqlite", root / "server.log") as service:
        service.wait_ready()
        yield service


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=120.0) as client:
        yield client


@pytest.fixture(scope="module")
def session_id(http):
    plan = http.post("/v1/meshes", json={"axes": {"data": 2}, "name": "numbers"})
    assert plan.status_code == 201, plan.text
    answer = http.post(
        f"/v1/meshes/{plan.json()['id']}/sessions",
        json={"model": {"kind": "mlp", "features": FEATURES}, "loss": "mse", "seed": 0},
    )
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def _job_exists(http, job: str) -> bool:
    answer = http.get(f"/v1/jobs/{job}")
    assert answer.status_code in (200, 404), answer.text
    return answer.status_code == 200


# ---------------------------------------------------------------- claimed shapes

HOSTILE_SHAPES = [
    ("sizes-past-2**63", [0, 2**62, 2**62]),  # the attack
    ("bytes-past-2**63", [0, 2**61]),
    ("65-zero-dims", [0] * 65),  # the attack
    ("65-one-dims", [1] * 65),
    ("empty-but-huge", [1, 2**40, 0]),
]
JSON_ROUTES = ["reduce", "collect", "job-single", "job-batch", "job-part", "session-steps"]


def _tensor(shape) -> dict:
    return {"shape": shape, "datatype": "FP32", "data": [1.0] * (1 if all(shape) else 0)}


def _post_json_metric(http, route: str, value, job: str, session: str | None = None):
    """Posts one metric (or batch field) ``value`` on ``route``; returns the answer."""
    if route == "reduce":
        return http.post("/v1/metrics/reduce", json={"metrics": {"x": value}})
    if route == "collect":
        return http.post("/v1/metrics/collect", json={"metrics": {"x": value}})
    if route == "job-single":
        return http.post(f"/v1/jobs/{job}/metrics", json={"metrics": {"x": value}, "step": 1})
    if route == "job-part":
        body = {"metrics": {"x": value}, "step": 1, "source": "h0", "sources": 2}
        return http.post(f"/v1/jobs/{job}/metrics", json=body)
    if route == "job-batch":
        points = [{"metrics": {"x": value}, "step": s} for s in (1, 2)]
        return http.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
    if route == "session-steps":
        batch = {"inputs": value, "targets": [[0.0, 0.0]]}
        return http.post(f"/v1/sessions/{session}/steps", json={"steps": 1, "batch": batch})
    raise AssertionError(route)


@pytest.mark.parametrize("route", JSON_ROUTES)
@pytest.mark.parametrize(
    "shape", [s for _, s in HOSTILE_SHAPES], ids=[i for i, _ in HOSTILE_SHAPES]
)
def test_json_tensors_with_impossible_shapes_are_invalid_tensor(http, session_id, route, shape):
    job = f"shape-{route}-{len(shape)}-{shape[1] if len(shape) > 1 else 0}"
    answer = _post_json_metric(http, route, _tensor(shape), job, session_id)
    body = assert_problem(answer, 422, "invalid_tensor")
    assert "dimensions" in body["detail"] or "shape" in body["detail"], body
    if route.startswith("job"):
        assert not _job_exists(http, job), "a refused push stored something"
    if route == "session-steps":
        assert http.get(f"/v1/sessions/{session_id}").json()["step"] == 0


def _npz_claiming(shape, *, compress=zipfile.ZIP_STORED, name="x.npy", extra=None) -> bytes:
    """An npz whose member ``name`` has a header claiming ``shape`` and no data."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": tuple(shape)}
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compress) as archive:
        archive.writestr(name, header.getvalue())
        for other, array in (extra or {}).items():
            with archive.open(f"{other}.npy", "w") as member:
                np.lib.format.write_array(member, array)
    return buffer.getvalue()


NPZ_ROUTES = ["reduce", "collect", "job-single", "job-batch", "session-steps"]


def _post_npz(http, route: str, body: bytes, job: str, session: str | None = None):
    if route == "reduce":
        return http.post("/v1/metrics/reduce", content=body, headers=NPZ)
    if route == "collect":
        return http.post("/v1/metrics/collect", content=body, headers=NPZ)
    if route == "job-single":
        return http.post(f"/v1/jobs/{job}/metrics?step=1", content=body, headers=NPZ)
    if route == "job-batch":
        return http.post(f"/v1/jobs/{job}/metrics/batch", content=body, headers=NPZ)
    if route == "session-steps":
        return http.post(f"/v1/sessions/{session}/steps?steps=1", content=body, headers=NPZ)
    raise AssertionError(route)


def _npz_member_name(route: str) -> str:
    return "inputs.npy" if route == "session-steps" else "x.npy"


def _npz_extra(route: str) -> dict:
    if route == "job-batch":
        return {"_step": np.array([1])}
    if route == "session-steps":
        return {"targets": np.zeros((1, 2), np.float32)}
    return {}


@pytest.mark.parametrize(
    "compress", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED], ids=["stored", "deflated"]
)
@pytest.mark.parametrize("route", NPZ_ROUTES)
@pytest.mark.parametrize(
    "shape", [s for _, s in HOSTILE_SHAPES], ids=[i for i, _ in HOSTILE_SHAPES]
)
def test_npz_members_with_impossible_shapes_are_invalid_tensor(
    http, session_id, route, shape, compress
):
    job = f"npz-shape-{route}-{compress}-{len(shape)}-{shape[1] if len(shape) > 1 else 0}"
    body = _npz_claiming(
        shape, compress=compress, name=_npz_member_name(route), extra=_npz_extra(route)
    )
    answer = _post_npz(http, route, body, job, session_id)
    assert_problem(answer, 422, "invalid_tensor")
    if route.startswith("job"):
        assert not _job_exists(http, job)


@pytest.mark.parametrize("route", NPZ_ROUTES)
def test_npz_float128_is_unsupported_datatype(http, session_id, route):
    # float128 reduced fine and then failed writing the JSON answer (a 500).
    field = "inputs" if route == "session-steps" else "x"
    arrays = {field: np.ones((1, 4) if field == "inputs" else 2, dtype=np.longdouble)}
    arrays |= _npz_extra(route)
    if np.dtype(np.longdouble).itemsize <= 8:
        pytest.skip("longdouble is float64 on this platform")  # never on x86-64 Linux
    answer = _post_npz(http, route, npz_bytes(**arrays), f"f128-{route}", session_id)
    body = assert_problem(answer, 422, "unsupported_datatype")
    assert "float128" in body["detail"]


def _renamed(body: bytes, old: bytes, new: bytes) -> bytes:
    assert len(old) == len(new) and body.count(old) == 2  # local and central header
    return body.replace(old, new)


@pytest.mark.parametrize("route", NPZ_ROUTES)
@pytest.mark.parametrize(
    ("name", "why"),
    [
        (b"a\x00b.npy", "NUL or control"),  # the attack: stored as 'a'
        (b"a\nb.npy", "NUL or control"),
        (b"a\x1bb.npy", "NUL or control"),
        (b"dup.npy", "appears twice"),
    ],
    ids=["nul", "newline", "escape", "duplicate"],
)
def test_npz_member_names_must_name_their_array(http, session_id, route, name, why):
    arrays = {"aXb": np.array([1.0, 2.0]), "dup": np.array([3.0, 4.0])} | _npz_extra(route)
    body = npz_bytes(**arrays)
    body = _renamed(body, b"aXb.npy", name)
    answer = _post_npz(http, route, body, f"names-{route}-{name[1]}", session_id)
    detail = assert_problem(answer, 422, "invalid_npz")["detail"]
    assert why in detail


@pytest.mark.parametrize("name", ["a\u0000b", "a\nb", "a\u001bb", "a\u0085b"])
def test_npz_answers_refuse_names_a_member_cannot_carry(http, name):
    # 'a\x00b' became the member 'a' and shadowed the metric really named 'a'.
    body = {"metrics": {name: [1.0, 2.0], "a": [3.0, 4.0]}}
    answer = http.post("/v1/metrics/reduce", json=body, headers={"accept": "application/x-npz"})
    assert "NUL or control" in assert_problem(answer, 422, "reserved_metric_name")["detail"]
    as_json = http.post("/v1/metrics/reduce", json=body)  # JSON carries any name
    assert as_json.status_code == 200 and as_json.json()["reduced"] == {name: 1.5, "a": 3.5}


@pytest.mark.parametrize("path", ["json-single", "json-batch", "npz-single", "npz-batch"])
def test_job_metrics_have_at_most_63_dimensions(http, path):
    for dims, status in ((64, 422), (63, 201)):
        job = f"dims-{path}-{dims}"
        value = np.ones((1,) * dims, dtype=np.float64)
        if path == "json-single":
            answer = http.post(
                f"/v1/jobs/{job}/metrics", json={"metrics": {"x": value.tolist()}, "step": 1}
            )
        elif path == "json-batch":
            points = [{"metrics": {"x": value.tolist()}, "step": s} for s in (1, 2)]
            answer = http.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
        elif path == "npz-single":
            answer = http.post(
                f"/v1/jobs/{job}/metrics?step=1", content=npz_bytes(x=value), headers=NPZ
            )
        else:  # [P, ...]: the batch itself has one more axis, which numpy caps at 64
            stacked = value[None] if dims < 64 else None
            body = (
                npz_bytes(x=stacked, _step=np.array([1]))
                if stacked is not None
                else _npz_claiming((1,) * (dims + 1), extra={"_step": np.array([1])})
            )
            answer = http.post(f"/v1/jobs/{job}/metrics/batch", content=body, headers=NPZ)
        if status == 422:
            assert_problem(answer, 422, "invalid_tensor")
            assert not _job_exists(http, job)
        else:
            assert answer.status_code == 201, (path, answer.text[:300])
            history = http.get(f"/v1/jobs/{job}/metrics")
            assert history.status_code == 200, history.text[:300]
            assert np.asarray(history.json()["points"][0]["reduced"]["x"]).ndim == dims - 1


# ------------------------------------------------------------------ integer sums

INT_TYPES = {
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
}


@pytest.mark.parametrize("datatype", list(INT_TYPES))
def test_integer_sums_of_every_datatype_are_exact_or_refused(http, datatype):
    top = int(np.iinfo(INT_TYPES[datatype]).max)
    tensor = {"shape": [8, 2], "datatype": datatype, "data": [top, 1] * 8}
    body = {"metrics": {"n": tensor}, "reduce": {"n": "sum"}}
    answer = http.post("/v1/metrics/reduce", json=body)
    exact = 8 * top
    if exact <= (I64_MAX if datatype.startswith("INT") else U64_MAX):
        assert answer.status_code == 200, answer.text
        assert answer.json()["reduced"]["n"] == [exact, 8]
    else:
        detail = assert_problem(answer, 422, "integer_overflow")["detail"]
        assert "metric 'n'" in detail and "at 1 of 2 position(s)" in detail
    # The npz body and the npz answer agree.
    array = np.array([[top, 1]] * 8, dtype=INT_TYPES[datatype])
    via_npz = http.post(
        "/v1/metrics/reduce?reduce=n:sum", content=npz_bytes(n=array), headers=NPZ_ANSWER
    )
    if answer.status_code == 200:
        assert via_npz.status_code == 200
        with np.load(io.BytesIO(via_npz.content)) as out:
            assert [int(v) for v in out["n"]] == [exact, 8]
    else:
        assert_problem(via_npz, 422, "integer_overflow")


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ({"shape": [2], "datatype": "INT64", "data": [I64_MAX, 1]}, None),  # was -2**63
        ([I64_MAX, 1], None),  # a plain list reads as int64
        ({"shape": [2], "datatype": "UINT64", "data": [U64_MAX, 1]}, None),  # was 0
        ({"shape": [3], "datatype": "INT64", "data": [I64_MAX, 1, -1]}, I64_MAX),
        ({"shape": [2], "datatype": "UINT64", "data": [U64_MAX, 0]}, U64_MAX),
        ({"shape": [2], "datatype": "INT64", "data": [-(2**63), -1]}, None),
    ],
    ids=["int64-attack", "list", "uint64-attack", "wrap-cancels", "uint64-top", "int64-low"],
)
def test_64_bit_sums_at_the_edge(http, metric, expected):
    answer = http.post(
        "/v1/metrics/reduce", json={"metrics": {"n": metric}, "reduce": {"n": "sum"}}
    )
    if expected is None:
        assert_problem(answer, 422, "integer_overflow")
    else:
        assert answer.status_code == 200, answer.text
        assert answer.json()["reduced"]["n"] == expected


@pytest.mark.parametrize(
    "path", ["json-single", "json-batch", "json-part", "npz-single", "npz-batch"]
)
def test_job_pushes_refuse_integer_overflow_and_store_nothing(http, path):
    job = f"overflow-{path}"
    values = np.array([I64_MAX, 1], dtype=np.int64)
    reduce = {"n": "sum"}
    if path.startswith("json"):
        point = {"metrics": {"n": values.tolist()}, "reduce": reduce, "step": 1}
        if path == "json-part":
            point |= {"source": "h0", "sources": 2}
        if path == "json-batch":
            answer = http.post(f"/v1/jobs/{job}/metrics/batch", json={"points": [point]})
        else:
            answer = http.post(f"/v1/jobs/{job}/metrics", json=point)
    elif path == "npz-single":
        answer = http.post(
            f"/v1/jobs/{job}/metrics?step=1&reduce=n:sum", content=npz_bytes(n=values), headers=NPZ
        )
    else:
        body = npz_bytes(n=values[None], _step=np.array([1]))
        answer = http.post(f"/v1/jobs/{job}/metrics/batch?reduce=n:sum", content=body, headers=NPZ)
    assert_problem(answer, 422, "integer_overflow")
    assert not _job_exists(http, job)


def test_parts_that_fit_alone_but_not_merged_are_refused(http):
    # Each source's part sums to 2**62 (+1); merged over 4 devices the step would wrap.
    def part(source, values):
        body = {"metrics": {"n": values}, "reduce": {"n": "sum"}, "step": 1}
        return http.post(
            "/v1/jobs/merge-edge/metrics", json=body | {"source": source, "sources": 2}
        )

    assert part("h0", [2**62, 1]).status_code == 201
    assert_problem(part("h1", [2**62, 0]), 422, "integer_overflow")
    point = http.get("/v1/jobs/merge-edge/metrics?include_partial=true").json()["points"][0]
    assert point["complete"] is False and point["missing_sources"] == ["h1"]
    assert part("h1", [-5, 0]).status_code == 201  # a part that fits completes the step
    done = http.get("/v1/jobs/merge-edge/metrics").json()["points"][0]
    assert done["complete"] is True and done["reduced"]["n"] == 2**62 + 1 - 5


def test_integer_means_come_from_the_exact_sum(http):
    metrics = {
        "a": {"shape": [2], "datatype": "INT64", "data": [2**60 + 1, -(2**60)]},  # float: 0
        "b": {"shape": [2], "datatype": "INT64", "data": [I64_MAX, I64_MAX]},  # sum > 64 bits
        "c": {"shape": [3], "datatype": "UINT64", "data": [U64_MAX] * 3},
    }
    metrics["c"]["shape"] = [3]
    answer = http.post(
        "/v1/metrics/reduce", json={"metrics": {"a": metrics["a"], "b": metrics["b"]}}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["reduced"] == {"a": 0.5, "b": float(I64_MAX)}
    answer = http.post("/v1/metrics/reduce", json={"metrics": {"c": metrics["c"]}})
    assert answer.json()["reduced"]["c"] == float(U64_MAX)


# ----------------------------------------------------------------------- floats


@pytest.mark.parametrize(
    ("metric", "op", "weights", "expected"),
    [
        ([1e308, 1e308], "mean", None, 1e308),  # the attack: answered null
        ([[1e308, 1.0], [1e308, 3.0]], "mean", None, [1e308, 2.0]),
        ({"shape": [2], "datatype": "FP32", "data": [3e38, 3e38]}, "mean", None, 3e38),
        ([1e308, 1e308, -1e308], "sum", None, 1e308),
        ([1e308, 1e308], "sum", None, None),  # the true sum is inf: null, as JSON says
        ([1.0, 3.0], "mean", [1e308, 1e308], 2.0),  # the attack: answered 0.0
        ([1.0, 3.0, 5.0], "mean", [8e307, 8e307, 0.0], 2.0),
        ([1.0, 3.0], "mean", [1e-320, 3e-320], 2.5),  # subnormal weights
    ],
    ids=["mean", "mean-2d", "fp32", "sum", "sum-inf", "weights", "weights-0", "weights-tiny"],
)
def test_float_reductions_are_finite_where_the_result_is(http, metric, op, weights, expected):
    body = {"metrics": {"x": metric}, "reduce": {"x": op}}
    if weights is not None:
        body["weights"] = weights
    answer = http.post("/v1/metrics/reduce", json=body)
    assert answer.status_code == 200, answer.text
    got = answer.json()["reduced"]["x"]
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected, rel=1e-6), got


def test_float_overflow_fixes_hold_on_the_npz_path_and_in_job_history(http):
    body = npz_bytes(x=np.array([1e308, 1e308]), _weights=np.array([1e308, 1e308]))
    answer = http.post("/v1/metrics/reduce?reduce=x:mean", content=body, headers=NPZ_ANSWER)
    assert answer.status_code == 200, answer.text
    with np.load(io.BytesIO(answer.content)) as out:
        assert float(out["x"]) == 1e308
    push = http.post(
        "/v1/jobs/float-edge/metrics", json={"metrics": {"x": [1e308, 1e308]}, "step": 1}
    )
    assert push.status_code == 201, push.text
    point = http.get("/v1/jobs/float-edge/metrics").json()["points"][0]
    assert point["reduced"]["x"] == 1e308 and math.isfinite(point["reduced"]["x"])
