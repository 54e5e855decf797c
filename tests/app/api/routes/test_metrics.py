"""Metric reductions, per-device collection and job history over HTTP."""

from __future__ import annotations

import io
import json
from typing import Annotated

import numpy as np
import pytest
from fastapi import APIRouter, Depends, FastAPI, Path, Query, Request
from fastapi.routing import APIRoute
from starlette.responses import Response

from app.api.middleware import install_error_handlers
from app.api.routing import ParamsRoute, RequestOnlyRoute
from app.codecs.json_arrays import encode_json
from app.codecs.npz import encode_npz, load_npz
from app.core.threads import INLINE_BODY_BYTES
from app.main import create_app
from tests.helpers import (
    StubRuntime,
    TestClient,
    assert_problem,
    make_settings,
    npz_bytes,
    to_jsonable,
)

DESIGN_BODY = {
    "metrics": {
        "loss": [0.9, 1.1, 1.0, 1.0],
        "accuracy": {"shape": [4], "datatype": "FP32", "data": [0.5, 0.6, 0.7, 0.8]},
        "step": [10, 10, 10, 10],
    },
    "reduce": {"loss": "mean", "accuracy": "mean", "step": "max"},
    "weights": [32, 32, 32, 16],
    "nan_policy": "propagate",
}

JSON = {"content-type": "application/json"}
NPZ = {"content-type": "application/x-npz"}


def test_reduce_design_example(api):
    response = api.post("/v1/metrics/reduce", json=DESIGN_BODY)
    assert response.status_code == 200, response.text
    body = response.json()
    w = np.array([32, 32, 32, 16]) / 112
    assert body["num_devices"] == 4
    assert body["reduced"]["loss"] == pytest.approx(float(w @ [0.9, 1.1, 1.0, 1.0]))
    assert body["reduced"]["accuracy"] == pytest.approx(float(w @ [0.5, 0.6, 0.7, 0.8]), rel=1e-6)
    assert body["reduced"]["step"] == 10 and isinstance(body["reduced"]["step"], int)


REDUCE_CASES = [
    ("per-class-sum", {"per_class": [[1, 2], [3, 4], [12, 14]]}, {"per_class": "sum"}, [16, 20]),
    ("max-2d", {"x": [[1.5, -1], [0.5, 7]]}, {"x": "max"}, [1.5, 7]),
    ("min", {"x": [3, 1, 2]}, {"x": "min"}, 1),
    ("default-mean", {"x": [1, 2]}, {}, 1.5),
    ("bool-sum", {"hit": [True, False, True]}, {"hit": "sum"}, 2),
    (
        "int32-tensor",
        {"n": {"shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}},
        {"n": "sum"},
        [4, 6],
    ),
    ("fp16-tensor", {"h": {"shape": [2], "datatype": "FP16", "data": [0.5, 1.5]}}, {}, 1.0),
    (
        "uint8-tensor",
        {"u": {"shape": [3], "datatype": "UINT8", "data": [1, 255, 3]}},
        {"u": "max"},
        255,
    ),
    (
        "bool-tensor",
        {"b": {"shape": [2], "datatype": "BOOL", "data": [True, True]}},
        {"b": "min"},
        1,
    ),
]


@pytest.mark.parametrize(
    ("metrics", "ops", "expected"),
    [case[1:] for case in REDUCE_CASES],
    ids=[case[0] for case in REDUCE_CASES],
)
def test_reduce_cases(api, metrics, ops, expected):
    response = api.post("/v1/metrics/reduce", json={"metrics": metrics, "reduce": ops})
    assert response.status_code == 200, response.text
    (value,) = response.json()["reduced"].values()
    assert value == pytest.approx(expected)


def test_non_finite_values(api):
    raw = b'{"metrics": {"loss": [1.0, NaN, 3.0], "other": [null, 1, 2]}, "nan_policy": "%s"}'
    propagate = api.post("/v1/metrics/reduce", content=raw % b"propagate", headers=JSON)
    assert propagate.status_code == 200, propagate.text
    assert propagate.json()["reduced"] == {"loss": None, "other": None}  # NaN -> null
    omit = api.post("/v1/metrics/reduce", content=raw % b"omit", headers=JSON)
    assert omit.json()["reduced"] == {"loss": 2.0, "other": 1.5}
    inf = b'{"metrics": {"x": [Infinity, 1.0]}, "reduce": {"x": "max"}}'
    assert api.post("/v1/metrics/reduce", content=inf, headers=JSON).json()["reduced"] == {
        "x": None
    }


def test_to_jsonable_shapes_and_floats():
    assert to_jsonable(np.float32(0.65)) == 0.65
    assert to_jsonable(np.array([1.0, np.nan, np.inf], np.float32)) == [1.0, None, None]
    assert to_jsonable(np.float64(np.nan)) is None
    assert to_jsonable(np.int64(3)) == 3
    assert to_jsonable(np.array([[1, 2]], np.int8)) == [[1, 2]]


def test_collect(api):
    body = {"metrics": {"loss": [0.9, 1.1], "per_class": [[1, 2], [3, 4]]}}
    response = api.post("/v1/metrics/collect", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "devices": [
            {"device": 0, "metrics": {"loss": 0.9, "per_class": [1, 2]}},
            {"device": 1, "metrics": {"loss": 1.1, "per_class": [3, 4]}},
        ]
    }
    # The reduce body is accepted as is.
    assert api.post("/v1/metrics/collect", json=DESIGN_BODY).status_code == 200


def test_npz_reduce_and_collect(api):
    loss = np.array([0.5, 1.5, 1.0, 1.0], np.float32)
    step = np.array([7, 7, 7, 8], np.int64)
    content = npz_bytes(loss=loss, step=step, _weights=np.array([1, 1, 1, 1]))
    response = api.post(
        "/v1/metrics/reduce",
        content=content,
        headers=NPZ,
        params={"reduce": "loss:mean,step:max", "nan_policy": "omit"},
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"reduced": {"loss": 1.0, "step": 8}, "num_devices": 4}
    collected = api.post("/v1/metrics/collect", content=npz_bytes(loss=loss), headers=NPZ).json()
    assert [d["metrics"]["loss"] for d in collected["devices"]] == [0.5, 1.5, 1.0, 1.0]


# Job history (stored reductions) is tested in tests/app/api/routes/test_jobs.py.


# ------------------------------------------------------------- fast paths, same answers

SMALL_BODY = {
    "metrics": {
        "loss": [0.9, 1.1, 1.0, 1.0],
        "per_class": [[1, 2], [3, 4], [5, 6], [7, 8]],
        "acc": {"shape": [4], "datatype": "FP32", "data": [0.5, 0.6, 0.7, 0.8]},
    },
    "reduce": {"per_class": "sum"},
    "weights": [32, 32, 32, 16],
}


@pytest.mark.parametrize(
    "variant",
    [
        # Forms the plain fast path leaves to the pydantic models (coercions they allow).
        {"weights": ["32", "32", "32", "16"]},
        {"weights": [32.0, 32.0, 32.0, 16.0], "nan_policy": "propagate"},
    ],
    ids=["string-weights", "float-weights"],
)
def test_plain_and_model_paths_answer_alike(api, variant):
    plain = api.post("/v1/metrics/reduce", json=SMALL_BODY)
    other = api.post("/v1/metrics/reduce", json={**SMALL_BODY, **variant})
    assert plain.status_code == other.status_code == 200, (plain.text, other.text)
    assert plain.json() == other.json()


def test_utf16_json_body_is_read_like_before(api):
    content = json.dumps({"metrics": {"x": [1, 2]}}).encode("utf-16")
    response = api.post("/v1/metrics/reduce", content=content, headers=JSON)
    assert response.status_code == 200, response.text
    assert response.json()["reduced"] == {"x": 1.5}


def test_large_json_body_is_decoded_off_the_event_loop(api):
    # Above INLINE_BODY_BYTES: decoded, reduced and encoded in a worker thread.
    values = np.arange(8 * 2_000, dtype=np.float64).reshape(8, 2_000) / 7
    body = {"metrics": {"x": values.tolist()}, "reduce": {"x": "max"}}
    assert len(json.dumps(body)) > INLINE_BODY_BYTES
    response = api.post("/v1/metrics/reduce", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["reduced"]["x"] == values.max(axis=0).tolist()
    ragged = {"metrics": {"x": [*values.tolist(), [1.0]]}}
    assert_problem(api.post("/v1/metrics/reduce", json=ragged), 422, "ragged_array")


def _savez(compressed: bool, **arrays) -> bytes:
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()


NPZ_ARRAYS = {
    "f32": np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32),
    "big_endian": np.arange(8, dtype=">i4").reshape(4, 2),
    "fortran": np.asfortranarray(np.arange(12.0).reshape(4, 3)),
    "flags": np.array([True, False, True, True]),
    "half": np.array([0.1, 0.2, 0.3, 0.4], np.float16),
}


def test_uncompressed_npz_read_in_place_matches_np_load(api):
    stored = _savez(False, **NPZ_ARRAYS)
    in_place = load_npz(stored, max_bytes=1 << 20)
    for name, array in NPZ_ARRAYS.items():
        np.testing.assert_array_equal(in_place[name], array)
        assert in_place[name].dtype == array.dtype and in_place[name].shape == array.shape
    answers = [
        api.post(
            "/v1/metrics/reduce",
            content=_savez(compressed, **NPZ_ARRAYS),
            headers=NPZ,
            params={"reduce": "big_endian:max,flags:sum,fortran:min"},
        )
        for compressed in (False, True)
    ]
    assert answers[0].status_code == answers[1].status_code == 200, answers[0].text
    assert answers[0].json() == answers[1].json()
    assert answers[0].json()["reduced"]["half"] == 0.25


def test_npz_with_a_bad_checksum_is_invalid_npz(api):
    content = bytearray(npz_bytes(x=np.arange(64.0)))
    content[len(content) // 3] ^= 0xFF  # inside the array data
    assert_problem(
        api.post("/v1/metrics/reduce", content=bytes(content), headers=NPZ), 422, "invalid_npz"
    )


def test_encode_json_writes_numpy_values_as_documented():
    half = np.random.default_rng(1).standard_normal(200).astype(np.float16)
    half[3] = np.nan
    encoded = json.loads(encode_json({"h": half, "h1": half[:5]}))
    expected = [None if np.isnan(v) else float(str(v)) for v in half]
    assert encoded["h"] == expected and encoded["h1"] == expected[:5]
    value = {
        "zero_d": np.array(2.5, np.float32),
        "big_endian": np.array([1, 2], ">i8"),
        "transposed": np.arange(6.0).reshape(2, 3).T,
        "scalar": np.float32(0.1),
        "inf": np.float64(np.inf),
    }
    assert json.loads(encode_json(value)) == {
        "zero_d": 2.5,
        "big_endian": [1, 2],
        "transposed": [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]],
        "scalar": 0.1,
        "inf": None,
    }
    with pytest.raises(TypeError):
        encode_json({"c": np.array([1j])})


def test_reduce_documents_the_parameters_fastapi_would(tmp_path):
    # reduce and collect take only the Request (no per-request dependency solving) and
    # declare their query parameters and bearer scheme in openapi_extra; the jobs route
    # declares the same ones through FastAPI, so the two documents must agree (bearer auth
    # is declared only when a token is set).
    app = create_app(make_settings(tmp_path, api_token="t"), runtime=StubRuntime())
    paths = app.openapi()["paths"]
    reduce_op = paths["/v1/metrics/reduce"]["post"]
    job_op = paths["/v1/jobs/{job}/metrics"]["post"]
    from_fastapi = {p["name"]: p for p in job_op["parameters"]}
    assert reduce_op["parameters"] == [from_fastapi["reduce"], from_fastapi["nan_policy"]]
    assert reduce_op["security"] == job_op["security"]
    assert paths["/v1/metrics/collect"]["post"]["security"] == job_op["security"]


def test_request_only_route_refuses_endpoints_it_would_not_feed():
    # RequestOnlyRoute calls endpoint(request) and nothing else, so an endpoint that
    # declares another parameter (or is sync) must be refused when the route is built.
    async def ok(request: Request) -> Response:  # noqa: ARG001
        return Response(b"")

    async def with_query(request: Request, steps: int = 1) -> Response:  # noqa: ARG001
        return Response(b"")

    async def no_request(steps: int = 1) -> Response:  # noqa: ARG001
        return Response(b"")

    def sync(request: Request) -> Response:  # noqa: ARG001
        return Response(b"")

    assert RequestOnlyRoute("/ok", ok, methods=["POST"]).path == "/ok"
    for endpoint in (with_query, no_request, sync):
        with pytest.raises(TypeError, match="RequestOnlyRoute"):
            RequestOnlyRoute("/bad", endpoint, methods=["POST"])

    async def guard() -> None:
        raise AssertionError("never run")

    from fastapi import Depends

    with pytest.raises(TypeError, match="no dependencies"):
        RequestOnlyRoute("/bad", ok, methods=["POST"], dependencies=[Depends(guard)])
    with pytest.raises(TypeError, match="status"):
        RequestOnlyRoute("/bad", ok, methods=["POST"], status_code=201)


def test_metric_routes_answer_problems_through_the_app_handlers(api):
    # The metric routes skip FastAPI's per-route wrapper; their errors must still be
    # the app's problem+json answers, validation errors included.
    routes = {r.path: r for r in api.app.router.routes if hasattr(r, "methods")}
    assert isinstance(routes["/v1/metrics/reduce"], RequestOnlyRoute)
    assert isinstance(routes["/v1/metrics/collect"], RequestOnlyRoute)
    response = api.post("/v1/metrics/reduce", json={"metrics": {"a": [1, 2]}, "bogus": 1})
    assert_problem(response, 422, "validation_error")
    response = api.post("/v1/metrics/collect", content=b"{", headers=JSON)
    assert_problem(response, 422, "invalid_json")
    response = api.post(
        "/v1/metrics/reduce", json={"metrics": {"a": [1, 2]}, "reduce": {"a": "median"}}
    )
    assert_problem(response, 422, "unknown_reduce_op")


def test_read_body_joins_chunks_and_reports_a_disconnect():
    import asyncio

    from starlette.requests import ClientDisconnect

    from app.api.routing import read_body

    def request_of(messages):
        queue = list(messages)

        async def receive():
            return queue.pop(0)

        return Request({"type": "http", "method": "POST", "headers": []}, receive)

    chunked = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"", "more_body": True},
        {"type": "http.request", "body": b"cd", "more_body": False},
    ]
    assert asyncio.run(read_body(request_of(chunked))) == b"abcd"
    one = [{"type": "http.request", "body": b"xyz"}]
    assert asyncio.run(read_body(request_of(one))) == b"xyz"
    gone = [chunked[0], {"type": "http.disconnect"}]
    with pytest.raises(ClientDisconnect):
        asyncio.run(read_body(request_of(gone)))


# ----------------------------------------------------------------- npz answers

NPZ_ACCEPT = {"accept": "application/x-npz"}


def json_bytes(value) -> bytes:
    return json.dumps(value).encode()


def _npz_answer(response) -> dict[str, np.ndarray]:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-npz"
    assert response.headers["vary"] == "Accept"
    with np.load(io.BytesIO(response.content), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def test_npz_answer_holds_the_json_answer(api):
    as_json = api.post("/v1/metrics/reduce", json=DESIGN_BODY).json()
    answer = _npz_answer(api.post("/v1/metrics/reduce", json=DESIGN_BODY, headers=NPZ_ACCEPT))
    assert list(answer) == ["loss", "accuracy", "step", "_num_devices"]
    assert answer["_num_devices"].shape == () and int(answer["_num_devices"]) == 4
    for name, value in as_json["reduced"].items():
        assert answer[name].shape == ()  # scalars are 0-d arrays
        assert to_jsonable(answer[name]) == value, name
    assert answer["accuracy"].dtype == np.float32 and answer["step"].dtype == np.int64


def test_npz_body_with_npz_answer_equals_numpy(api):
    rng = np.random.default_rng(3)
    loss = rng.standard_normal((8, 1000), dtype=np.float32)
    loss[2, 5] = np.nan  # kept as NaN in npz (JSON would write null)
    hits = rng.integers(0, 9, size=(8, 3)).astype(np.int32)
    response = api.post(
        "/v1/metrics/reduce?reduce=hits:max",
        content=npz_bytes(loss=loss, hits=hits),
        headers={**NPZ, **NPZ_ACCEPT},
    )
    answer = _npz_answer(response)
    np.testing.assert_array_equal(answer["loss"], np.mean(loss, axis=0))
    assert np.isnan(answer["loss"][5]) and answer["loss"].dtype == np.float32
    np.testing.assert_array_equal(answer["hits"], hits.max(axis=0))
    assert int(answer["_num_devices"]) == 8


def test_repeated_accept_headers_are_one_list(api):
    headers = [
        ("content-type", "application/json"),
        ("accept", "application/json;q=0.5"),
        ("accept", "application/x-npz"),
    ]
    response = api.post("/v1/metrics/reduce", content=json_bytes(DESIGN_BODY), headers=headers)
    assert response.headers["content-type"] == "application/x-npz"


@pytest.mark.parametrize(
    ("accept", "npz"),
    [
        (None, False),
        ("*/*", False),
        ("application/json", False),
        ("application/x-npz", True),
        ("Application/X-NPZ", True),
        ("application/x-npz;q=0", False),
        ("application/json, application/x-npz", False),  # a tie keeps JSON
        ("application/json;q=0.5, application/x-npz", True),
        ("application/x-npz;q=0.4, application/json;q=0.9", False),
        ("text/html, application/x-npz;q=0.1, */*;q=0.8", True),
        ("application/x-npz;q=oops", False),
    ],
)
def test_reduce_answer_follows_accept(api, accept, npz):
    headers = {} if accept is None else {"accept": accept}
    response = api.post("/v1/metrics/reduce", json=DESIGN_BODY, headers=headers)
    assert response.status_code == 200
    assert response.headers["vary"] == "Accept"
    expected = "application/x-npz" if npz else "application/json"
    assert response.headers["content-type"] == expected


def test_npz_answer_refuses_a_metric_named_like_its_device_count(api):
    body = {"metrics": {"_num_devices": [1, 2]}}
    assert api.post("/v1/metrics/reduce", json=body).status_code == 200  # JSON: fine
    response = api.post("/v1/metrics/reduce", json=body, headers=NPZ_ACCEPT)
    assert_problem(response, 422, "reserved_metric_name")


def test_errors_stay_problems_when_npz_is_accepted(api):
    response = api.post("/v1/metrics/reduce", content=b"{", headers={**JSON, **NPZ_ACCEPT})
    assert_problem(response, 422, "invalid_json")


def test_encode_npz_is_what_np_load_reads():
    import zipfile

    values = {
        "scalar": np.float32(1.5),
        "flag": np.bool_(True),
        "ints": np.arange(5, dtype=np.int16),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
        "big_endian": np.arange(3, dtype=">f8"),
        "empty": np.zeros((0, 3)),
        "strided": np.arange(10.0)[::3],
        "nan": np.array([np.nan, np.inf]),
        "path/like name": np.int64(7),
        "λoss ünïcode": np.float32(3),  # needs the UTF-8 flag, else read back as cp437
        "file": np.int8(1),  # np.savez(**kwargs) would clash with these two
        "allow_pickle": np.int8(2),
    }
    encoded = encode_npz(values)
    archive = zipfile.ZipFile(io.BytesIO(encoded))
    assert archive.testzip() is None  # every CRC checks
    flags = {m.filename: m.flag_bits for m in archive.infolist()}
    assert flags["λoss ünïcode.npy"] & 0x800 and not flags["scalar.npy"] & 0x800
    with np.load(io.BytesIO(encoded), allow_pickle=False) as archive:
        assert archive.files == list(values)
        for name, value in values.items():
            got, want = archive[name], np.asarray(value)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert got.tobytes() == want.tobytes(), name
    assert load_npz(encoded, max_bytes=1 << 20).keys() == values.keys()
    with pytest.raises(TypeError):
        encode_npz({"o": np.array([object()])})


@pytest.mark.parametrize("limit", ["_ZIP_LIMIT", "_ZIP_MAX_MEMBERS", "_ZIP_MAX_NAME"])
def test_encode_npz_writes_zip64_past_the_classic_limits(monkeypatch, limit):
    import datarax.npz as metrics_io

    values = {"a": np.arange(100, dtype=np.float64), "b": np.float32(2), "file": np.int8(3)}
    # Shrunk limits stand for 4 GiB members, 65,536 members and 64 KiB names.
    monkeypatch.setattr(metrics_io, limit, {"_ZIP_LIMIT": 500}.get(limit, 2))
    encoded = encode_npz(values)
    # zipfile's ZIP64 writer puts an extra field into every local header (extra length
    # at byte 28); the direct writer none: so the fallback wrote this one.
    assert int.from_bytes(encoded[28:30], "little") > 0
    with np.load(io.BytesIO(encoded), allow_pickle=False) as archive:
        assert archive.files == list(values)
        np.testing.assert_array_equal(archive["a"], values["a"])
        assert archive["b"].shape == () and archive["b"] == 2 and archive["file"] == 3
    monkeypatch.undo()
    assert int.from_bytes(encode_npz(values)[28:30], "little") == 0


@pytest.mark.parametrize("accept", [None, "application/x-npz"])
def test_unpaired_surrogate_names_are_invalid_json(api, accept):
    # Python's json reads "\ud800" into a str no answer could carry (orjson refuses it
    # in both directions): it must be a 422, not a failure while answering.
    headers = {**JSON, **({"accept": accept} if accept else {})}
    for body in (
        b'{"metrics": {"\\ud800": [1, 2]}}',
        b'{"metrics": {"a": [NaN, 1]}, "x\\udc00": 1}',
    ):
        response = api.post("/v1/metrics/reduce", content=body, headers=headers)
        assert_problem(response, 422, "invalid_json")
        assert "surrogate" in response.json()["detail"]


def test_params_route_validates_and_documents_exactly_as_fastapi():
    # The job push routes are ParamsRoutes: FastAPI's own parameter validation without its
    # request handler. The same endpoint under a plain APIRoute and under a ParamsRoute
    # must answer every request alike (values and validation problems) and document the
    # same operation.
    async def endpoint(
        job: Annotated[str, Path(pattern="^[a-z]{1,4}$")],
        request: Request,
        sources: Annotated[int | None, Query(ge=1, le=64)] = None,
        source: Annotated[str | None, Query(pattern="^h[0-9]+$")] = None,
        flag: bool = False,
    ) -> Response:
        seen = [job, sources, source, flag, request.url.path]
        return Response(repr(seen).encode(), status_code=201)

    apps = []
    for route_class in (APIRoute, ParamsRoute):
        router = APIRouter(route_class=route_class)
        router.add_api_route("/j/{job}", endpoint, methods=["POST"], response_class=Response)
        app = FastAPI()
        install_error_handlers(app)
        app.router.routes.extend(router.routes)
        apps.append(app)
    queries = ["", "?sources=3&source=h1&flag=true", "?sources=0", "?sources=x&source=bad",
               "?sources=2&sources=70", "?flag=maybe", "?sources="]  # fmt: skip
    for job in ("ab", "toolong", "a%20b"):
        for query in queries:
            plain, lean = (TestClient(a).post(f"/j/{job}{query}") for a in apps)
            assert (lean.status_code, lean.content) == (plain.status_code, plain.content), (
                job,
                query,
            )
    assert apps[0].openapi()["paths"] == apps[1].openapi()["paths"]

    async def guard() -> None:
        raise AssertionError("never run")

    with pytest.raises(TypeError, match="no dependencies"):
        ParamsRoute("/bad/{job}", endpoint, methods=["POST"], dependencies=[Depends(guard)])

    async def no_request(job: str) -> Response:  # noqa: ARG001
        return Response(b"")

    with pytest.raises(TypeError, match="takes the Request"):
        ParamsRoute("/bad/{job}", no_request, methods=["POST"])
