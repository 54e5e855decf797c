"""Hostile inputs, endpoint by endpoint, against the real ``datarax-serve`` process.

One server (a token set, a small answer limit) serves the whole table. Every answer must
be a 4xx problem with a code (never a 500) and valid JSON (RFC 8259: no bare NaN), parsed
strictly. The classes of issue 15: nesting depth, claimed npz sizes, mesh rank, answer
size, malformed requests the HTTP parser itself refuses, the auth scheme's case, HEAD.
"""

from __future__ import annotations

import io
import json
import socket
import zipfile

import numpy as np
import pytest

from tests.helpers import PROBLEM_TYPE, ServiceProcess, assert_problem

pytestmark = pytest.mark.timeout(300)

TOKEN = "hostile-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ANSWER_LIMIT_MB = 1


def strict_json(text: str | bytes):
    """``json.loads`` that refuses NaN and Infinity (RFC 8259 has neither)."""

    def refuse(name: str):
        raise ValueError(f"answer holds the non-JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    env = {"DATARAX_API_TOKEN": TOKEN, "DATARAX_MAX_ANSWER_MB": str(ANSWER_LIMIT_MB)}
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log", env=env) as service:
        service.wait_ready()
        yield service


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=120.0) as http:
        yield http


def _nested(depth: int, leaf: str = "0") -> str:
    return "[" * depth + leaf + "]" * depth


def _npz_claiming(shape: tuple[int, ...], compress: int) -> bytes:
    """An npz whose one member's header claims ``shape`` but holds 24 bytes."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f8", "fortran_order": False, "shape": shape}
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compress) as archive:
        archive.writestr("loss.npy", header.getvalue() + b"\0" * 24)
    return buffer.getvalue()


def _metrics_body(path: str, array: str) -> str:
    """A metrics body with one array; job pushes also carry their step."""
    step = ',"step":1' if path.startswith("/v1/jobs/") else ""
    return f'{{"metrics":{{"loss":{array}}}{step}}}'


JSON = {"Content-Type": "application/json", **AUTH}
NPZ = {"Content-Type": "application/x-npz", **AUTH}
DEEP = 1500  # past Python's recursion limit and orjson's 1024 levels

# (id, method, path, headers, body, status, code)
CASES = [
    *(
        (f"{path.split('/')[-1]}-depth-{depth}", "POST", path, JSON, body, 422, code)
        for path in ("/v1/metrics/reduce", "/v1/metrics/collect", "/v1/jobs/deep/metrics")
        for depth, body, code in (
            (DEEP, f'{{"metrics":{{"loss":{_nested(DEEP)}}},"step":1}}', "invalid_json"),
            (DEEP, f'{{"metrics":{{"loss":{_nested(DEEP, "NaN")}}},"step":1}}', "invalid_json"),
            (DEEP, _nested(DEEP), "invalid_json"),
            (100, _metrics_body(path, _nested(100)), "invalid_tensor"),
        )
    ),
    (
        "steps-depth",
        "POST",
        "/v1/sessions/s_none/steps",
        JSON,
        f'{{"steps":1,"batch":{{"inputs":{_nested(DEEP)}}}}}',
        404,
        "session_not_found",
    ),
    (
        "plan-depth",
        "POST",
        "/v1/meshes",
        JSON,
        f'{{"axes":{{"data":8}},"num_devices":8,"batch_shape":{_nested(DEEP)}}}',
        422,
        None,  # FastAPI's own body parsing: validation_error or invalid_json
    ),
    *(
        (f"npz-claims-{shape}-{kind}", "POST", "/v1/metrics/reduce", NPZ, body, status, code)
        for kind, compress in (("stored", zipfile.ZIP_STORED), ("deflated", zipfile.ZIP_DEFLATED))
        for shape, status, code in (
            ((2**40,), 413, "payload_too_large"),
            ((2**62, 2**62), 413, "payload_too_large"),
            ((2**20,), 422, "invalid_npz"),
        )
        for body in (_npz_claiming(shape, compress),)
    ),
    (
        "abstract-plan-65-axes",
        "POST",
        "/v1/meshes",
        JSON,
        json.dumps({"axes": {f"a{i}": 1 for i in range(65)}, "num_devices": 1}),
        422,
        "too_many_axes",
    ),
    (
        "live-plan-65-axes",
        "POST",
        "/v1/meshes",
        JSON,
        json.dumps({"axes": {f"a{i}": 1 for i in range(65)}}),
        422,
        "too_many_axes",
    ),
    (
        "collect-answer-over-limit",
        "POST",
        "/v1/metrics/collect",
        JSON,
        json.dumps({"metrics": {"loss": [0] * 200_000}}),
        422,
        "answer_too_large",
    ),
    (
        "collect-answer-over-limit-late",  # passes the lower bound, fails while building
        "POST",
        "/v1/metrics/collect",
        JSON,
        json.dumps({"metrics": {"loss": [0.123456789012345] * 30_000}}),
        422,
        "answer_too_large",
    ),
    (
        "lower-case-scheme",  # past auth (RFC 9110: the scheme is case-insensitive)
        "POST",
        "/v1/metrics/reduce",
        {"Content-Type": "application/json", "Authorization": f"bearer  {TOKEN}"},
        "{}",
        422,
        "validation_error",  # the empty body's own error: metrics is required
    ),
    (
        "wrong-token-lower-case",
        "POST",
        "/v1/metrics/reduce",
        {"Content-Type": "application/json", "Authorization": "bearer nope"},
        "{}",
        401,
        "unauthorized",
    ),
    (
        "other-scheme",
        "POST",
        "/v1/metrics/reduce",
        {"Content-Type": "application/json", "Authorization": f"Basic {TOKEN}"},
        "{}",
        401,
        "unauthorized",
    ),
]


@pytest.mark.parametrize(
    ("method", "path", "headers", "body", "status", "code"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_hostile_input_is_a_problem_with_a_code(client, method, path, headers, body, status, code):
    answer = client.request(method, path, headers=headers, content=body)
    assert answer.status_code == status, (answer.status_code, answer.text[:500])
    assert answer.headers["content-type"].startswith(PROBLEM_TYPE), answer.headers
    problem = strict_json(answer.content)
    assert problem["status"] == status
    if code is not None:
        assert problem["code"] == code, problem
    assert "Traceback" not in problem["detail"]


def test_unparseable_content_length_is_problem_json(server):
    # httptools refuses it before the app sees the request; the 400 is still a problem.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/metrics/reduce HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}"
        )
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), raw[:200]
    assert b"content-type: application/problem+json" in head.lower(), head
    assert strict_json(body)["code"] == "bad_request"


def test_head_answers_like_get_without_a_body(client):
    for path in ("/health/live", "/v1/meshes", "/openapi.json"):
        get = client.get(path, headers=AUTH)
        head = client.head(path, headers=AUTH)
        assert head.status_code == get.status_code == 200, (path, head.status_code)
        assert head.content == b""
        assert head.headers["content-type"] == get.headers["content-type"]
        assert head.headers.get("content-length") == get.headers.get("content-length")
        assert head.headers.get("content-encoding") == get.headers.get("content-encoding")


def test_openapi_declares_bearer_when_a_token_is_set(client):
    doc = client.get("/openapi.json").json()
    assert "bearerAuth" in doc["components"]["securitySchemes"]
    assert doc["paths"]["/v1/meshes"]["post"]["security"] == [{"bearerAuth": []}]
    # reads are open (DATARAX_AUTH_READS unset), and documented as such
    assert "security" not in doc["paths"]["/v1/meshes"]["get"]


def test_plan_list_is_summaries_and_full_is_bounded(client):
    # A plan whose own answer passes the limit is refused (and not stored); plans under it
    # are listed as summaries, and a full list that would pass it is refused.
    over = client.post(
        "/v1/meshes", headers=AUTH, json={"axes": {"data": -1}, "num_devices": 16384}
    )
    assert over.status_code == 422 and strict_json(over.content)["code"] == "answer_too_large"
    made, total = [], 0
    while total <= ANSWER_LIMIT_MB * 2**20:
        plan = client.post(
            "/v1/meshes", headers=AUTH, json={"axes": {"data": -1}, "num_devices": 8192}
        )
        assert plan.status_code == 201, plan.text
        made.append(plan.json()["id"])
        total += len(plan.content)
        assert len(made) <= 8, "8,192-device plans are unexpectedly small"
    listed = client.get("/v1/meshes", params={"limit": 5})
    assert listed.status_code == 200
    items = strict_json(listed.content)["items"]
    assert items[0]["id"] == made[-1] and all("shards" not in item for item in items)
    full = client.get("/v1/meshes", params={"limit": len(made), "view": "full"})
    assert full.status_code == 422 and strict_json(full.content)["code"] == "answer_too_large"
    one = client.get(f"/v1/meshes/{made[0]}")  # full plans one by one
    assert one.status_code == 200 and len(strict_json(one.content)["shards"]) == 8192


def test_diverging_session_answers_valid_json(client):
    plan = client.post("/v1/meshes", headers=AUTH, json={"axes": {"data": 8}})
    assert plan.status_code == 201, plan.text
    session = client.post(
        f"/v1/meshes/{plan.json()['id']}/sessions",
        headers=AUTH,
        json={
            "model": {"kind": "mlp", "features": [4, 8, 2]},
            "optimizer": {"name": "sgd", "learning_rate": 10.0},
        },
    )
    assert session.status_code == 201, session.text
    sid = session.json()["id"]
    batch = {"inputs": [[1e30] * 4] * 8, "targets": [[1e30] * 2] * 8}
    steps = client.post(
        f"/v1/sessions/{sid}/steps", headers=AUTH, json={"steps": 3, "batch": batch}
    )
    assert steps.status_code == 200, steps.text
    losses = strict_json(steps.content)["losses"]
    assert len(losses) == 3 and None in losses, losses  # non-finite losses are null
    state = client.get(f"/v1/sessions/{sid}")
    assert state.status_code == 200
    assert strict_json(state.content)["last_loss"] is None
    assert strict_json(state.content)["step"] == 3


def test_json_nan_literals_in_requests_answer_null(client):
    answer = client.post(
        "/v1/metrics/collect", headers=JSON, content='{"metrics":{"loss":[NaN, Infinity, 1]}}'
    )
    assert answer.status_code == 200
    assert [d["metrics"]["loss"] for d in strict_json(answer.content)["devices"]] == [
        None,
        None,
        1,
    ]


def test_strict_json_refuses_bare_nan():
    # The check above can fail: a bare NaN is refused.
    with pytest.raises(ValueError, match="NaN"):
        strict_json('{"losses":[NaN]}')
    with pytest.raises(ValueError, match="Infinity"):
        strict_json('{"last_loss":-Infinity}')


@pytest.mark.parametrize(
    "path",
    ["/v1/metrics/reduce", "/v1/metrics/collect", "/v1/jobs/huge-int/metrics",
     "/v1/jobs/huge-int/metrics/batch", "/v1/meshes"],
)  # fmt: skip
def test_integers_past_their_digit_limit_are_invalid_json_not_500(client, path):
    # Python refuses to convert integers over 4,300 digits (it raised inside the decoder,
    # a 500); every body is refused at the first integer over 20 digits
    big = "9" * 5000
    body = {
        "/v1/metrics/reduce": f'{{"metrics": {{"loss": [{big}, 1]}}}}',
        "/v1/metrics/collect": f'{{"metrics": {{"loss": [{big}, 1]}}}}',
        "/v1/jobs/huge-int/metrics": f'{{"step": 1, "metrics": {{"loss": [{big}]}}}}',
        "/v1/jobs/huge-int/metrics/batch": (
            f'{{"points": [{{"step": 1, "metrics": {{"x": {big}}}}}]}}'
        ),
        "/v1/meshes": f'{{"axes": {{"data": {big}}}}}',
    }[path]
    response = client.post(path, content=body, headers=JSON)
    assert_problem(response, 422, "invalid_json")
    # 20 digits still parse (a step up to 2**63 - 1)
    fine = client.post(
        "/v1/jobs/huge-int/metrics",
        content=json.dumps({"step": 2**63 - 1, "metrics": {"x": 1.0}}),
        headers=JSON,
    )
    assert fine.status_code in (200, 201), fine.text
