"""Bounded compute per request, against the real ``datarax-serve`` (issue 26):

- a recommendation's search space is counted before any work: 422
  ``search_space_too_large`` with the count, the limit and request changes that shrink it;
- hardware clusters obey the abstract plans' device cap (422 ``too_many_devices``);
- client strings (axis names, plan and model names, MaxText keys) have length limits;
- huge ``batch_shape`` values are 422s on every plan path (live, abstract, hardware);
- heavy work runs in a lane of its own: 16 heavy requests whose clients hang up leave
  readiness and job pushes answering, the lane refuses what it cannot queue with 503
  ``busy``, and the abandoned work frees its slots;
- SIGTERM stops the server within the grace period with heavy work in flight.

Latencies are printed (``-s``), never asserted beyond generous client timeouts.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import time

import httpx
import pytest

from datarax.estimate.recommend import count_factorisations
from tests.helpers import ServiceProcess, assert_problem

SEARCH_LIMIT = 200_000
SLOTS, QUEUE = 2, 8

SMALL_MODEL = {
    "kind": "transformer",
    "layers": 4,
    "d_model": 1024,
    "d_ff": 4096,
    "heads": 8,
    "kv_heads": 8,
    "vocab": 32000,
    "seq_len": 2048,
}
# 70B-class: fits no 16 GiB v5e chip of a small slice, so every candidate is priced and
# the explaining re-searches run too (minutes of CPU without abandonment).
BIG_MODEL = {
    "kind": "transformer",
    "layers": 80,
    "d_model": 8192,
    "d_ff": 28672,
    "heads": 64,
    "kv_heads": 8,
    "vocab": 128256,
    "seq_len": 8192,
}
SIX_AXES = ["data", "fsdp", "tensor", "batch", "replica", "model"]

# 126 ICI x 1,287 DCN = 162,162 candidates, under SEARCH_LIMIT: a search of minutes.
HEAVY = {
    "hardware": "tpu-v5e",
    "topology": "4x4",
    "slices": 256,
    "axes": SIX_AXES,
    "model": BIG_MODEL,
    "global_batch": 256,
    "allow_split_physical_axes": True,
}
SMALL = {
    "hardware": "tpu-v5e",
    "topology": "4x4",
    "slices": 2,
    "model": SMALL_MODEL,
    "global_batch": 64,
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bounded")
    env = {
        "DATARAX_MAX_SEARCH_SPACE": str(SEARCH_LIMIT),
        "DATARAX_HEAVY_WORKERS": str(SLOTS),
        "DATARAX_HEAVY_QUEUE": str(QUEUE),
    }
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log", env=env) as proc:
        proc.wait_ready()
        yield proc


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=60) as c:
        yield c


# ------------------------------------------------------------------- search space


def _space(n_ici: int, n_dcn: int, axes: int) -> int:
    return count_factorisations(n_ici, axes) * count_factorisations(n_dcn, axes)


SPACES = [
    pytest.param(
        {**SMALL, "slices": 4096, "axes": SIX_AXES},
        _space(16, 4096, 6),
        id="v5e-4x4-x4096-6-axes",
    ),
    pytest.param(
        {**SMALL, "topology": "16x16", "slices": 512, "axes": SIX_AXES[:5]},
        _space(256, 512, 5),
        id="v5e-16x16-x512-5-axes",
    ),
    pytest.param(
        {
            **SMALL,
            "topology": None,
            "slices": 1,
            "hardware": "h100-sxm",
            "hosts": 4096,
            "axes": SIX_AXES,
        },
        _space(8, 4096, 6),
        id="h100-4096-hosts-6-axes",
    ),  # fmt: skip
    pytest.param(
        {**SMALL, "slices": 4096, "axes": SIX_AXES, "fixed_ici": {"model": 1}},
        count_factorisations(16, 5) * count_factorisations(4096, 6),
        id="fixed-ici-still-too-large",
    ),
]


@pytest.mark.parametrize(("body", "count"), SPACES)
def test_search_space_is_refused_before_work_with_count_limit_and_shrinks(client, body, count):
    body = {k: v for k, v in body.items() if v is not None}
    assert count > SEARCH_LIMIT
    started = time.perf_counter()
    answer = client.post("/v1/recommendations", json=body)
    elapsed = time.perf_counter() - started
    problem = assert_problem(answer, 422, "search_space_too_large")
    print(f"refused {count} candidates in {elapsed * 1000:.1f} ms")
    assert problem["search_space"] == count
    assert problem["limit"] == SEARCH_LIMIT
    suggestions = problem["suggestions"]
    assert suggestions, problem
    assert all(s["search_space"] < count for s in suggestions), suggestions
    # every suggestion is a request change the endpoint takes, and one that fits the limit
    # is searched (an answer or no_plan_fits, never search_space_too_large again)
    fitting = [s for s in suggestions if s["search_space"] <= SEARCH_LIMIT]
    assert fitting, suggestions
    smallest = min(fitting, key=lambda s: s["search_space"])
    retry = client.post("/v1/recommendations", json={**body, **smallest["request"]})
    assert retry.status_code in (200, 422), retry.text
    if retry.status_code == 422:
        assert retry.json()["code"] != "search_space_too_large", retry.text
    else:
        assert retry.json()["considered"] == smallest["search_space"]


def test_search_space_at_the_limit_is_searched(client):
    # 15 ICI x 3 DCN = 45 candidates: the counted space is what the search considers
    answer = client.post("/v1/recommendations", json=SMALL)
    assert answer.status_code == 200, answer.text
    assert answer.json()["considered"] == _space(16, 2, 3)


@pytest.mark.parametrize(
    ("fixed", "code"),
    [
        ({"fixed_ici": {"tensor": 3}}, "axes_product_mismatch"),
        ({"fixed_ici": {"nope": 2}}, "invalid_axis_name"),
        ({"fixed_dcn": {"data": 4}}, "axes_product_mismatch"),
        ({"fixed_ici": {"tensor": 0}}, "validation_error"),
        ({"fixed_ici": {"x" * 65: 2}}, "validation_error"),
    ],
    ids=["ici-not-dividing", "unknown-axis", "dcn-not-dividing", "size-0", "long-name"],
)
def test_bad_fixed_sizes_are_422(client, fixed, code):
    assert_problem(client.post("/v1/recommendations", json={**SMALL, **fixed}), 422, code)


def test_fixed_sizes_shrink_and_are_kept(client):
    body = {**SMALL, "fixed_ici": {"tensor": 4}, "fixed_dcn": {"fsdp": 1, "tensor": 1}}
    answer = client.post("/v1/recommendations", json=body)
    assert answer.status_code == 200, answer.text
    out = answer.json()
    assert out["considered"] == count_factorisations(4, 2) * 1
    for candidate in out["candidates"]:
        assert candidate["ici"]["tensor"] == 4
        assert candidate["dcn"]["fsdp"] == candidate["dcn"]["tensor"] == 1
        # and the plan request it carries is a plan the service makes
        plan = client.post("/v1/meshes", json=candidate["plan_request"])
        assert plan.status_code == 201, plan.text


# ------------------------------------------------------------------- device cap


@pytest.mark.parametrize(
    "where",
    [
        {"hardware": "tpu-v5e", "topology": "16x16", "slices": 4096},
        {"hardware": "tpu-v5e", "topology": "16x16", "slices": 1025},
        {"hardware": "h100-sxm", "hosts": 65536},
        {"hardware": "tpu-v5p", "topology": "8x16x16", "slices": 129},
    ],
    ids=["v5e-1M", "v5e-just-above", "h100-524k", "v5p-just-above"],
)
def test_hardware_clusters_obey_the_device_cap(client, where):
    plan = {**where, "ici": {"data": -1}, "dcn": {"data": -1}}
    started = time.perf_counter()
    problem = assert_problem(client.post("/v1/meshes", json=plan), 422, "too_many_devices")
    print(f"refused {problem['devices']} devices in {(time.perf_counter() - started) * 1e3:.1f} ms")
    assert problem["limit"] == 262_144 < problem["devices"]
    rec = {**where, "model": SMALL_MODEL, "global_batch": 64, "axes": ["data"]}
    assert_problem(client.post("/v1/recommendations", json=rec), 422, "too_many_devices")
    listed = client.get("/v1/meshes", params={"limit": 100}).json()["items"]
    assert all(item["total_devices"] <= 262_144 for item in listed)


def test_a_large_hardware_plan_under_the_cap_is_made(client):
    # 16,384 devices: the heavy lane renders it
    plan = {
        "hardware": "tpu-v5e",
        "topology": "16x16",
        "slices": 64,
        "ici": {"data": 1, "fsdp": -1},
        "dcn": {"data": -1},
        "batch_shape": [16384],
    }
    answer = client.post("/v1/meshes", json=plan)
    assert answer.status_code == 201, answer.text[:500]
    assert answer.json()["total_devices"] == 16384


# ------------------------------------------------------------------- names


LONG = "a" * 65
NAME_CASES = [
    ({"axes": {LONG: 8}}, "axes"),
    ({"axes": {"data": 8}, "batch_shape": [8], "batch_axes": [LONG]}, "batch_axes"),
    ({"axes": {"data": 8}, "name": "n" * 201}, "plan name"),
    ({"axes": {"data": 8}, "num_devices": 8, "platform": "p" * 65}, "platform"),
    ({"hardware": "tpu-v5e", "topology": "4x4", "ici": {LONG: -1}}, "ici"),
    ({"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": -1}, "dcn": {LONG: 1}}, "dcn"),
    ({"hardware": "h" * 65, "hosts": 1, "ici": {"data": -1}}, "hardware"),
    ({"hardware": "tpu-v5e", "topology": "4" * 65, "ici": {"data": -1}}, "topology"),
    (
        {
            "hardware": "tpu-v5e",
            "topology": "4x4",
            "ici": {"data": -1},
            "batch_shape": [64],
            "model": {"name": "m" * 65},
        },
        "model name",
    ),  # fmt: skip
    ({"hardware": "tpu-v5e", "topology": "4x4", "maxtext": {LONG: 1}}, "maxtext key"),
    ({"axes": {"data": 8}, "optimizer": {"name": "adam", LONG: 1}}, "optimizer key"),
    ({"axes": {"data": 8}, "optimizer": {"name": "adam", "tag": "t" * 257}}, "optimizer value"),
    ({"axes": {"data": 8}, "optimizer": {f"m{i}": 0.9 for i in range(17)}}, "optimizer members"),
    ({"axes": {"data": 8}, "optimizer": {"name": "adam", "b": {"deep": [1] * 9}}}, "nested"),
    (
        {"hardware": "tpu-v5e", "topology": "4x4", "maxtext": {"model_name": "m" * 257}},
        "maxtext value",
    ),
]


@pytest.mark.parametrize(("body", "what"), NAME_CASES, ids=[c[1] for c in NAME_CASES])
def test_every_client_string_in_a_plan_has_a_length_limit(client, body, what):
    answer = client.post("/v1/meshes", json=body)
    assert_problem(answer, 422, "validation_error")
    assert len(answer.content) < 8192, (what, len(answer.content))  # no echo of megabytes


@pytest.mark.parametrize(
    "body",
    [{**SMALL, "axes": [LONG]}, {**SMALL, "model": {"name": "m" * 65}, "global_batch": 8}],
    ids=["axis", "model-name"],
)
def test_recommendation_strings_have_length_limits(client, body):
    assert_problem(client.post("/v1/recommendations", json=body), 422, "validation_error")


def test_names_at_the_limit_are_accepted(client):
    name = "a" * 64
    body = {"axes": {name: 8}, "batch_shape": [8], "batch_axes": [name], "num_devices": 8,
            "name": "n" * 200}  # fmt: skip
    answer = client.post("/v1/meshes", json=body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["shards"][3]["coords"] == {name: 3}
    members = {"name": "adamw", "learning_rate": 1e-3, **{f"m{i:02d}": 0.9 for i in range(16)}}
    body = {"axes": {"data": 8}, "model": {"kind": "mlp", "features": [4, 2]}, "optimizer": members}
    answer = client.post("/v1/meshes", json=body)
    assert answer.status_code == 201, answer.text
    # the members sessions read change nothing in a plan: taken, and said (DESIGN v1.4)
    assert any("optimizer.learning_rate" in w for w in answer.json()["warnings"])


# ------------------------------------------------------------------- batch shapes


HUGE_SHAPES = [
    pytest.param([2**70], "validation_error", id="2^70"),
    pytest.param([2**63, 2**63], "validation_error", id="2^63x2^63"),
    pytest.param([1e300], "validation_error", id="1e300"),
    pytest.param([2**53 + 8], "validation_error", id="2^53+8"),
    pytest.param([2**40, 2**40], "invalid_batch_shape", id="product-2^80"),
    pytest.param([2**32, 2**21, 8], "invalid_batch_shape", id="product-2^56"),
]
PATHS = {
    "live": {"axes": {"data": 8}},
    "abstract": {"axes": {"data": 8}, "num_devices": 8},
    "hardware": {"hardware": "tpu-v5e", "topology": "2x4", "ici": {"data": -1}},
    "hardware-model": {
        "hardware": "tpu-v5e",
        "topology": "2x4",
        "ici": {"data": -1},
        "model": SMALL_MODEL,
    },  # fmt: skip
}


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize(("shape", "code"), HUGE_SHAPES)
def test_huge_batch_shapes_are_422_on_every_plan_path(client, path, shape, code):
    answer = client.post("/v1/meshes", json={**PATHS[path], "batch_shape": shape})
    assert_problem(answer, 422, code)


@pytest.mark.parametrize("path", ["live", "abstract", "hardware"])
def test_a_batch_of_2_to_the_53_is_planned_exactly(client, path):
    answer = client.post("/v1/meshes", json={**PATHS[path], "batch_shape": [2**53]})
    assert answer.status_code == 201, answer.text
    shards = answer.json()["shards"]
    assert shards[-1]["index"] == [[2**53 - 2**50, 2**53]]


# ------------------------------------------------------------------- the heavy lane


def _raw_post(port: int, path: str, body: dict) -> socket.socket:
    """A connection holding one whole POST whose answer is not read (yet)."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    sock.sendall(head.encode() + data)
    return sock


def _timed(fn) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    answer = fn()
    return answer, time.perf_counter() - started


def _busy_probe(client: httpx.Client) -> httpx.Response:
    """A small recommendation, sent until the lane refuses it (503): the heavy requests sent
    before fill it. A probe queued instead (it came before them) times out and hangs up,
    which abandons it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            answer = client.post("/v1/recommendations", json=SMALL, timeout=3)
        except httpx.ReadTimeout:
            continue
        if answer.status_code == 503:
            return answer
    pytest.fail("the heavy requests never filled the lane")


def _abandoned_lines(server: ServiceProcess) -> int:
    return len(
        re.findall(r"abandoned recommendation", server.log_path.read_text("utf-8", "replace"))
    )


def test_sixteen_abandoned_heavy_requests_leave_health_and_pushes_answering(server, client):
    before = _abandoned_lines(server)
    socks = [_raw_post(server.port, "/v1/recommendations", HEAVY) for _ in range(16)]
    try:
        # The lane is full: more heavy work is refused at once, with Retry-After.
        extra = _busy_probe(client)
        problem = assert_problem(extra, 503, "busy")
        assert extra.headers["Retry-After"].isdigit()
        assert (problem["slots"], problem["queue"]) == (SLOTS, QUEUE)
        busy_lat = []
        for step in range(5):
            ready, t_ready = _timed(lambda: client.get("/health/ready"))
            push, t_push = _timed(
                lambda step=step: client.post(
                    "/v1/jobs/bounded/metrics",
                    json={"step": step, "metrics": {"loss": [1.0, 2.0]}},
                )
            )
            assert ready.status_code == 200, ready.text
            assert push.status_code in (200, 201), push.text
            busy_lat.append((t_ready, t_push))
        print("with the heavy lane full: ready/push s", busy_lat)
    finally:
        for sock in socks:
            sock.close()  # the clients hang up
    after = []
    for step in range(5, 10):
        ready, t_ready = _timed(lambda: client.get("/health/ready"))
        push, t_push = _timed(
            lambda step=step: client.post(
                "/v1/jobs/bounded/metrics", json={"step": step, "metrics": {"loss": [1.0, 2.0]}}
            )
        )
        assert ready.status_code == 200, ready.text
        assert push.status_code in (200, 201), push.text
        after.append((t_ready, t_push))
    print("after 16 hang-ups: ready/push s", after)
    # The abandoned searches free their slots: each would run for minutes, yet a small
    # recommendation gets a slot (and answers 200) long before one of them could end.
    started = time.monotonic()
    while True:
        small = client.post("/v1/recommendations", json=SMALL)
        if small.status_code != 503 or time.monotonic() - started > 90:
            break
        time.sleep(0.2)
    assert small.status_code == 200, small.text
    print(f"a slot was free again {time.monotonic() - started:.2f} s after the hang-ups")
    deadline = time.monotonic() + 30
    while _abandoned_lines(server) - before < SLOTS + QUEUE and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _abandoned_lines(server) - before >= SLOTS + QUEUE, server.log_tail()


def test_a_large_abstract_plan_whose_client_left_is_not_stored(server, client):
    total = client.get("/v1/meshes").json()["total"]
    body = {"axes": {"data": -1, "model": 16}, "num_devices": 262_144, "batch_shape": [262_144]}
    socks = [_raw_post(server.port, "/v1/meshes", body) for _ in range(SLOTS + QUEUE)]
    for sock in socks:
        sock.close()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        small = client.post("/v1/recommendations", json=SMALL)
        if small.status_code == 200:
            break
        time.sleep(0.2)
    assert small.status_code == 200, small.text
    # some of the plans may have been finished before their client's hang-up was seen;
    # all of them could only be if none was abandoned
    stored = client.get("/v1/meshes").json()["total"] - total
    print(f"{stored} of {len(socks)} abandoned 262,144-device plans were finished anyway")
    assert stored < len(socks)


@pytest.mark.slow
def test_sigterm_stops_the_server_with_heavy_work_in_flight(tmp_path):
    grace = 30.0
    env = {
        "DATARAX_MAX_SEARCH_SPACE": str(SEARCH_LIMIT),
        "DATARAX_HEAVY_WORKERS": "2",
        "DATARAX_HEAVY_QUEUE": "2",
        "DATARAX_SHUTDOWN_GRACE_S": str(grace),
    }
    server = ServiceProcess(tmp_path / "datarax.sqlite", tmp_path / "server.log", env=env)
    with server:
        server.wait_ready()
        socks = [_raw_post(server.port, "/v1/recommendations", HEAVY) for _ in range(4)]
        with server.client(timeout=30) as c:
            assert_problem(_busy_probe(c), 503, "busy")  # the 4 fill the lane
        assert server.proc is not None
        started = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        try:
            code = server.proc.wait(timeout=grace)
        except Exception:  # noqa: BLE001 - reported with the log
            pytest.fail(f"the server did not stop within {grace} s:\n{server.log_tail()}")
        stopped = time.monotonic() - started
        print(f"stopped {stopped:.2f} s after SIGTERM with 4 heavy searches in flight")
        # uvicorn raises the signal again after its shutdown (-15), or exits 0
        assert code in (0, -signal.SIGTERM), (code, server.log_tail())
        log = server.log_tail(200_000)
        assert "Finished server process" in log, server.log_tail()
        assert "Traceback" not in log, server.log_tail()
        assert log.count("abandoned recommendation") >= 4, server.log_tail()
        answers = []
        for sock in socks:
            sock.settimeout(10)
            data = b""
            try:
                while chunk := sock.recv(65536):
                    data += chunk
            except OSError:
                pass
            sock.close()
            answers.append(data.split(b"\r\n", 1)[0])
        print("heavy requests answered:", answers)
        assert all(b" 503 " in line for line in answers if line), answers
