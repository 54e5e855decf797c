"""Issue 40: every problem ``code`` of docs/ERRORS.md answers, for real, a message a user
can act on. :func:`message_faults` holds the rules a message is checked by: no field or
callable the HTTP API does not take, none of pydantic's internals, no number said twice;
``test_a_typo_is_answered_with_the_nearest_valid_name`` checks the did-you-mean of axis,
model, hardware, topology, field and value typos.

The walk reads the codes of docs/ERRORS.md's table and runs every producer of each,
checking ``detail`` and the ``errors`` entries; a code without one fails, naming it, but
for those no request makes on purpose (:data:`NOT_FROM_OUTSIDE`, with the reason).
Producers ask ``api``, the session's real service (``test_errors.CASES``, the runtime's
metrics, sessions and batches); ``stub``, an app with a stand-in runtime
(``test_errors.guarded_app``: ``GUARD_CASES``) and low limits, where a full heavy lane or
compile queue, idle sessions, a full disk or a hang-up are quick to reach for real, and
the runtime process's own errors are made by its code and raised as the channel carries
them; ``server``, the real ``datarax-serve``, for what its HTTP protocol answers.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import numpy as np
import pytest

from app.core.channel import ArrayError, decode_arrays, encode_message
from app.core.errors import CODES, ArrayNotAccepted, ServiceError, from_reply
from app.runtime.group import _not_here
from app.runtime.server import error_reply, execute
from app.runtime.sessions import mesh_from_plan
from app.services.heavy_work import heavy_work
from datarax.estimate.calibrations import fit_work
from tests.app.api.routes.test_calibrations import GPU_PLAN
from tests.app.core.test_errors import (
    AUTH,
    CASES,
    GUARD_CASES,
    RECOMMENDATION,
    TOKEN,
    guarded_app,
)
from tests.helpers import ServiceProcess, StubRuntime, TestClient, assert_problem, npz_bytes

ERRORS_DOC = Path(__file__).resolve().parents[3] / "docs" / "ERRORS.md"
TABLE_CODES = re.findall(r"^\| `([a-z_]+)` \|", ERRORS_DOC.read_text(), flags=re.MULTILINE)
WAIT_S = 30.0  # bound on any wait for the app or the server to act

# ---------------------------------------------------------------------------- the rules

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


def problem_faults(problem: dict) -> list[str]:
    """:func:`message_faults` of the ``detail`` and of every ``errors`` entry."""
    faults = message_faults(problem["detail"])
    for entry in problem.get("errors", []):
        faults += message_faults(entry["msg"]) + message_faults("." + entry["field"] + ".")
    return faults


# ---------------------------------------------------------------- codes no request makes

NOT_FROM_OUTSIDE = {
    "invalid_device_count": "the library's check of num_devices for Python callers; every "
    "request schema refuses a count below 1 first (validation_error)",
    "invalid_slice_count": "the library's check of slices for Python callers; the request "
    "schemas refuse slices below 1 first (validation_error)",
    "invalid_top_k": "the library's check of top_k for Python callers; the recommendation "
    "schema refuses top_k below 1 first (validation_error)",
    "unknown_optimizer": "the library's check for Python callers; every request schema "
    "takes an optimizer from a fixed set and names the nearest one (validation_error)",
    "device_mesh_unsupported": "a guard on JAX's own transpose of a whole-axes assignment, "
    "which the assignment always makes a permutation; no request is known to reach it",
    "nan_policy_traced": "nan_policy 'raise' on traced values: Python callers of "
    "datarax.metrics under jit only; the service reduces concrete arrays",
    "unbound_axis_name": "a collective called outside pmap/shard_map: Python callers of "
    "datarax.spmd only",
    "runtime_diverged": "needs a multi-host runtime group whose processes disagree "
    "(tests/app/runtime/test_group.py)",
    "step_timeout": "needs a runtime command past DATARAX_STEP_TIMEOUT_S, which kills and "
    "restarts the runtime (tests/app/api/routes/test_sessions.py, "
    "test_step_timeout_is_504_and_runtime_comes_back)",
}
"""Codes of docs/ERRORS.md that no request can produce on purpose, with the reason."""


# ------------------------------------------------------------------------ the producers


@dataclass(frozen=True)
class Producer:
    """One way to have the service answer ``code``: ``answer(fixture)`` sends the
    request(s) to the fixture named ``where`` and answers the problem's response."""

    id: str
    code: str
    where: str
    answer: Callable[[Any], httpx.Response]


def _request(method: str, path: str, kwargs: dict) -> Callable[[Any], httpx.Response]:
    return lambda client: client.request(method, path, **kwargs)


def _table(cases: list, where: str) -> list[Producer]:
    return [Producer(id_, code, where, _request(*request)) for id_, request, _, code in cases]


_names = itertools.count()


def _name(what: str) -> str:
    """A name no other producer of this run uses (jobs, plans)."""
    return f"walk-{what}-{next(_names)}"


def _until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(0.05)
    pytest.fail(f"{what} within {WAIT_S} s")


def _created(response: httpx.Response) -> dict:
    assert response.status_code in (200, 201, 202), response.text
    return response.json()


# ------------------------------------------------------------- the stand-in app's states


class WalkRuntime(StubRuntime):
    """The stand-in runtime, with the commands the stand-in app's producers send: a
    session is placed (no arrays), the devices are listed, and a host calibration
    measures until the app stops."""

    async def call(self, command: str, payload: dict | None = None, arrays=None, **options):
        if self.call_error is not None:
            raise self.call_error
        if command == "session_create":
            return {"params": [], "reserved": {}}, {}
        if command == "session_delete":
            return {}, {}
        if command == "devices":
            return self.device_info(), {}
        if command == "calibration_measure":
            await anyio.sleep_forever()  # measuring, until the app's lifespan cancels it
        return await super().call(command, payload, arrays, **options)


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Iterator[TestClient]:
    app, runtime = guarded_app(
        tmp_path_factory.mktemp("walk"),
        runtime=WalkRuntime(ready=False),
        max_point_values=8,
        heavy_workers=1,
        heavy_queue=0,
        max_sessions=1,
        session_idle_s=2.0,
        compile_queue=1,
        compile_timeout_s=0.001,
        max_calibration_cells=fit_work(2),  # a jobs fit on 3 jobs is past it
    )
    with TestClient(app, raise_server_exceptions=False) as client:
        client.runtime = runtime
        yield client


@contextlib.contextmanager
def _ready(client: TestClient) -> Iterator[None]:
    """The stand-in runtime up for a while (it is down for ``GUARD_CASES``)."""
    client.runtime.ready = True
    try:
        yield
    finally:
        client.runtime.ready = False


def _post(client: TestClient, path: str, body: Any) -> httpx.Response:
    return client.post(path, json=body, headers=AUTH)


def _abstract_plan(client: TestClient, **body: Any) -> str:
    body = body or {"axes": {"data": -1}, "num_devices": 8}
    return _created(_post(client, "/v1/meshes", {**body, "name": _name("plan")}))["id"]


def _live_plan(client: TestClient) -> str:
    with _ready(client):
        body = {"axes": {"data": 8}, "batch_shape": [32, 64], "name": _name("live")}
        return _created(_post(client, "/v1/meshes", body))["id"]


SESSION = {"model": {"kind": "mlp", "features": [16, 64, 8]}}


def _session(client: TestClient, plan: str) -> httpx.Response:
    return _post(client, f"/v1/meshes/{plan}/sessions", SESSION)


def _push(client: TestClient, job: str, loss: list, step: int = 0, **extra) -> httpx.Response:
    body = {"metrics": {"loss": loss}, "step": step, **extra}
    return _post(client, f"/v1/jobs/{job}/metrics", body)


def _pushed(client: TestClient, **metrics: Any) -> httpx.Response:
    return _post(client, f"/v1/jobs/{_name('job')}/metrics", {"step": 0, "metrics": metrics})


def _job(client: TestClient) -> str:
    job = _name("job")
    _created(_push(client, job, [1.0, 2.0]))
    return job


def _part_mismatch(client):
    job = _name("job")
    _created(_push(client, job, [1.0, 2.0], source="h-0", sources=2))
    return _push(client, job, [1.0, 2.0, 3.0], source="h-1", sources=2)


def _sources_mismatch(client):
    job = _name("job")
    _created(_push(client, job, [1.0, 2.0], source="h-0", sources=2))
    return _push(client, job, [1.0, 2.0])


def _linked_to(client, plan: str) -> str:
    job = _job(client)
    _created(client.patch(f"/v1/jobs/{job}", json={"plan": plan}, headers=AUTH))
    return job


def _calibration_running(client):
    with _ready(client):
        _created(_post(client, "/v1/calibrations", {"kind": "host"}))
        return _post(client, "/v1/calibrations", {"kind": "host"})


def _with_session(then: Callable[..., httpx.Response]) -> Callable[[Any], httpx.Response]:
    """``then(client, plan, session)`` once a session is placed on a new live plan."""

    def answer(client):
        plan = _live_plan(client)
        with _ready(client):
            session = _created(_session(client, plan))["id"]
            try:
                return then(client, plan, session)
            finally:
                client.delete(f"/v1/sessions/{session}", headers=AUTH)

    return answer


def _after_a_restart(client, _plan: str, session: str) -> httpx.Response:
    client.runtime.restarts += 1  # the runtime restarted since
    try:
        return client.get(f"/v1/sessions/{session}")
    finally:
        client.runtime.restarts -= 1


def _once_idle(client, _plan: str, session: str) -> httpx.Response:
    return _until(  # DATARAX_SESSION_IDLE_S=2
        lambda: (got := client.get(f"/v1/sessions/{session}")).status_code == 410 and got,
        "the idle session expired",
    )


def _runtime_reply(make_error: Callable[[], ServiceError]) -> Callable[[Any], httpx.Response]:
    """An error of the runtime's (made by its own code, below) answered by the HTTP app,
    which asks for a session: the stand-in runtime raises it from ``call`` as the runtime
    client raises a reply's ``error`` (``from_reply``)."""

    def answer(client):
        plan = _live_plan(client)
        with _ready(client):
            client.runtime.call_error = make_error()
            try:
                return _session(client, plan)
            finally:
                client.runtime.call_error = None

    return answer


def _reply(header: dict, arrays: Any = None) -> ServiceError:
    """The runtime's reply to ``header`` (``app.runtime.server.execute``), as raised."""
    return from_reply(execute({"id": 1, **header}, arrays or {})[0]["error"])


def _raised(fn: Callable[[], Any], kind: type[Exception]) -> Any:
    with pytest.raises(kind) as caught:
        fn()
    return caught.value


def _unsupported_dtype() -> ServiceError:
    # as the runtime client refuses an array before sending it
    exc = _raised(lambda: encode_message({}, {"inputs": np.array(["a", "b"])}), ArrayError)
    return ArrayNotAccepted(str(exc), code=exc.code)


SHORT_ARRAY = {"name": "inputs", "dtype": "float32", "shape": [2, 2], "nbytes": 4}


def _busy(client):
    lane = heavy_work(client.app)  # DATARAX_HEAVY_WORKERS=1, DATARAX_HEAVY_QUEUE=0
    release = threading.Event()

    def hold(stop: Callable[[], bool]) -> None:
        while not release.is_set() and not stop():
            time.sleep(0.01)

    held = client.portal.start_task_soon(lane.run, "held work", hold)
    try:
        _until(lambda: lane.admitted == 1, "the held work took the heavy slot")
        return _post(client, "/v1/recommendations", RECOMMENDATION)
    finally:
        release.set()
        held.result(timeout=WAIT_S)


def _shutting_down(client):
    lifecycle = client.app.state.lifecycle
    lifecycle.shutting_down = True  # as SIGTERM sets it (app.cli)
    try:
        return _post(client, "/v1/recommendations", RECOMMENDATION)
    finally:
        lifecycle.shutting_down = False


def _hang_up(client):
    """A POST whose client hangs up before its body: raw ASGI, a disconnect first."""
    path = "/v1/meshes"
    headers = [(b"host", b"testserver"), (b"content-type", b"application/json"),
               (b"content-length", b"64"),
               (b"authorization", f"Bearer {TOKEN}".encode())]  # fmt: skip
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "headers": headers,
             "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
             "extensions": {}, "state": client.app_state.copy()}  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    client.portal.call(client.app, scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = [(k.decode(), v.decode()) for k, v in start["headers"]]
    return httpx.Response(start["status"], headers=headers, content=body)


def _storage_fault(pragma: str, undo: str) -> Callable[[Any], httpx.Response]:
    """A plan written while SQLite refuses it as a full disk or a read-only file does."""

    def answer(client):
        store = client.app.state.store
        pages = store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        store._run(lambda c: c.execute(pragma.format(pages=pages)))
        try:
            return _post(client, "/v1/meshes", {"axes": {"data": -1}, "num_devices": 1024})
        finally:
            store._run(lambda c: c.execute(undo))
            _abstract_plan(client)  # a write that works again clears the fault
            assert store.fault is None, store.fault

    return answer


# ------------------------------------------------------------- compile checks, run once


@pytest.fixture(scope="module")
def compile_walk(stub) -> dict[str, httpx.Response]:
    """Checks posted until one finds the queue full (DATARAX_COMPILE_QUEUE=1: one
    compiling, one waiting), and the first one's outcome: failed, past
    DATARAX_COMPILE_TIMEOUT_S=0.001 once its worker started."""
    url = f"/v1/meshes/{_live_plan(stub)}/compile-checks"

    def check(width: int) -> httpx.Response:
        return _post(stub, url, {"model": {"kind": "mlp", "features": [64, width, 64]}})

    first = _created(check(128))
    location = f"/v1/compile-checks/{first['id']}"
    _until(lambda: stub.get(location).json()["status"] != "queued", "the first check started")
    placed, refused = [], None
    for width in range(129, 135):  # distinct checks: none is answered from the cache
        answer = check(width)
        if answer.status_code == 429:
            refused = answer
            break
        placed.append(_created(answer)["id"])
    for check_id in placed:
        stub.delete(f"/v1/compile-checks/{check_id}", headers=AUTH)
    if refused is None:
        pytest.fail(f"{len(placed) + 1} checks and none found the queue full")

    def settled():
        answer = stub.get(location)
        return answer if answer.json()["status"] in ("done", "failed", "cancelled") else None

    return {"compile_queue_full": refused, "compile_failed": _until(settled, "the check ended")}


# -------------------------------------------------------------------- the real server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServiceProcess]:
    tmp = tmp_path_factory.mktemp("walk-server")
    env = {"DATARAX_HEADER_TIMEOUT_S": "1", "DATARAX_MAX_CONNECTIONS": "2",
           "DATARAX_BODY_TIMEOUT_S": "60"}  # fmt: skip
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log", env=env) as service:
        service.wait_live()
        yield service


def _connect(server: ServiceProcess, send: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    sock.sendall(send)
    return sock


def _answer_of(sock: socket.socket) -> httpx.Response:
    """What the server sent until it closed, as a response."""
    got = []
    with contextlib.suppress(ConnectionResetError), sock:
        while chunk := sock.recv(65536):
            got.append(chunk)
    head, _, body = b"".join(got).partition(b"\r\n\r\n")
    status, *fields = head.decode("latin-1").split("\r\n")
    headers = [tuple(part.strip() for part in field.split(":", 1)) for field in fields]
    return httpx.Response(int(status.split()[1]), headers=headers, content=body)


def _raw(send: bytes) -> Callable[[ServiceProcess], httpx.Response]:
    return lambda server: _answer_of(_connect(server, send))


def _too_many_connections(server):
    body = b'{"axes": {"data": -1}, "num_devices": 8}'
    head = (
        b"POST /v1/meshes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    busy = [_connect(server, head + body[:10]) for _ in range(2)]  # DATARAX_MAX_CONNECTIONS=2
    try:
        # until the server has read both heads: then the third is refused
        return _until(
            lambda: (a := _answer_of(_connect(server, head + body))).status_code == 503 and a,
            "every connection busy",
        )
    finally:
        for sock in busy:
            sock.close()


# ------------------------------------------------------------------ the real service


@pytest.fixture(scope="module")
def api_steps(api) -> Iterator[Callable[..., httpx.Response]]:
    """Steps of a session of the real runtime (an MLP of 16 inputs, cross-entropy over 8
    classes): ``api_steps(**request)`` posts one."""
    plan = _created(api.post("/v1/meshes", json={"axes": {"data": 8}}))
    body = {**SESSION, "loss": "cross_entropy"}
    session = _created(api.post(f"/v1/meshes/{plan['id']}/sessions", json=body))
    yield lambda **request: api.post(f"/v1/sessions/{session['id']}/steps", **request)
    api.delete(f"/v1/sessions/{session['id']}")


def _batch(**batch: Any) -> Callable[[Callable], httpx.Response]:
    """One step of a batch of 16 rows (16 zero inputs, class 0), with ``batch``'s
    changes (None: left out)."""
    rows = {"inputs": np.zeros((16, 16)).tolist(), "targets": [0] * 16}
    batch = {k: v for k, v in {**rows, **batch}.items() if v is not None}
    return lambda steps: steps(json={"steps": 1, "batch": batch})


def _api_session(axes: dict, body: dict) -> Callable[[Any], httpx.Response]:
    """A session of ``body`` asked for on a new live plan of the real runtime."""

    def answer(api):
        plan = _created(api.post("/v1/meshes", json={"axes": axes}))
        return api.post(f"/v1/meshes/{plan['id']}/sessions", json=body)

    return answer


GIANT = {"kind": "transformer", "layers": 4096, "d_model": 1048576, "d_ff": 1048576,
         "heads": 1, "kv_heads": 1, "vocab": 1048576, "seq_len": 1048576}  # fmt: skip

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
TYPO_BASE = {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"fsdp": 16},
             "batch_shape": [16, 2048], "model": {"name": "llama3.1-8b"}}  # fmt: skip
"""A plan each typo of :data:`TYPOS` changes."""


def _check_on(plan: Callable[[Any], str], body: dict) -> Callable[[Any], httpx.Response]:
    return lambda c: _post(c, f"/v1/meshes/{plan(c)}/compile-checks", body)


MLP_CHECK = {"model": {"kind": "mlp", "features": [64, 128, 64]}}
# issue 56: 12 microbatches over 9 stages, which MaxText refuses at start
NINE_STAGES = {"hardware": "h100-sxm", "hosts": 9, "ici": {"stage": 1, "fsdp": 8},
               "dcn": {"stage": 9}, "batch_shape": [96, 4096],
               "model": {"name": "llama3.1-405b", "remat": "full"},
               "pipeline": {"microbatches": 12}}  # fmt: skip

PRODUCERS: list[Producer] = [
    *_table(CASES, "api"),
    *_table(GUARD_CASES, "stub"),
    *[Producer(f"typo-{id_}", code, "api",
               _request("POST", "/v1/meshes", {"json": {**TYPO_BASE, **change}}))
      for id_, change, code, _ in TYPOS],
    # the real runtime
    Producer("int64-sum-past-its-range", "integer_overflow", "api", _request(
        "POST", "/v1/metrics/reduce", {"json": {
            "metrics": {"n": {"shape": [8, 2], "datatype": "INT64", "data": [2**63 - 1, 1] * 8}},
            "reduce": {"n": "sum"}}})),
    Producer("npz-answer-name-with-nul", "reserved_metric_name", "api", _request(
        "POST", "/v1/metrics/reduce", {"json": {"metrics": {"a\u0000b": [1.0, 2.0]}},
                                       "headers": {"accept": "application/x-npz"}})),
    Producer("session-beyond-memory", "insufficient_memory", "api", _api_session(
        {"data": 8}, {"model": {"kind": "mlp", "features": [65536, 65536]}, "optimizer": "sgd"})),
    Producer("collective-sharded-params", "invalid_strategy", "api", _api_session(
        {"data": 2, "model": 4}, {**SESSION, "strategy": "collective", "param_sharding": "model"})),
    Producer("npz-batch-without-inputs", "missing_inputs", "api_steps", lambda steps: steps(
        content=npz_bytes(targets=np.zeros(16, np.int32)), params={"steps": 1},
        headers={"content-type": "application/x-npz"})),
    Producer("batch-without-targets", "missing_targets", "api_steps", _batch(targets=None)),
    Producer("batch-5-features", "batch_shape_mismatch", "api_steps",
             _batch(inputs=np.zeros((16, 5)).tolist())),
    Producer("batch-class-9-of-8", "invalid_targets", "api_steps", _batch(targets=[9] * 16)),
    Producer("batch-bool-inputs", "invalid_inputs", "api_steps",
             _batch(inputs=[[True] * 16] * 16)),
    # the stand-in app, in states reached for real
    Producer("plan-without-estimate-linked", "invalid_request", "stub", lambda c: c.patch(
        f"/v1/jobs/{_job(c)}", json={"plan": _abstract_plan(c)}, headers=AUTH)),
    Producer("maxtext-on-plain-plan", "launch_target_unavailable", "stub", lambda c: _post(
        c, f"/v1/meshes/{_abstract_plan(c)}/launch", {"target": "maxtext"})),
    Producer("microbatches-12-over-9-stages", "not_launchable", "stub", lambda c: _post(
        c, f"/v1/meshes/{_abstract_plan(c, **NINE_STAGES)}/launch", {"target": "maxtext"})),
    Producer("1001-metrics", "too_many_metrics", "stub",
             lambda c: _pushed(c, **{f"m{i}": [1.0, 2.0] for i in range(1001)})),
    Producer("9-values-over-8", "value_too_large", "stub",
             lambda c: _pushed(c, v=np.ones((2, 9)).tolist())),
    Producer("name-of-251", "metric_name_too_long", "stub",
             lambda c: _pushed(c, **{"x" * 251: [1.0, 2.0]})),
    Producer("empty-name", "invalid_metric_name", "stub", lambda c: _pushed(c, **{"": [1.0]})),
    Producer("same-step-other-values", "step_conflict", "stub",
             lambda c: _push(c, _job(c), [1.0, 9.0])),
    Producer("unlink-unlinked-job", "job_link_not_found", "stub",
             lambda c: c.delete(f"/v1/jobs/{_job(c)}/plan", headers=AUTH)),
    Producer("calibrate-unlinked-job", "job_not_linked", "stub",
             lambda c: _post(c, "/v1/calibrations", {"kind": "jobs", "jobs": [_job(c)]})),
    Producer("calibrate-without-step-times", "no_measured_steps", "stub", lambda c: _post(
        c, "/v1/calibrations", {"kind": "jobs",
                                "jobs": [_linked_to(c, _abstract_plan(c, **GPU_PLAN))]})),
    Producer("second-host-calibration", "calibration_running", "stub", _calibration_running),
    Producer("delete-published-profile", "calibration_published", "api",
             lambda c: c.delete("/v1/calibrations/published-tpu-jax")),
    Producer("fit-on-3-jobs-past-2-jobs-of-cells", "calibration_too_large", "stub", lambda c: _post(
        c, "/v1/calibrations", {"kind": "jobs", "jobs": ["a", "b", "c"]})),
    Producer("part-of-3-devices", "part_mismatch", "stub", _part_mismatch),
    Producer("whole-point-into-parts", "sources_mismatch", "stub", _sources_mismatch),
    Producer("session-on-abstract-plan", "plan_not_live", "stub",
             lambda c: _session(c, _abstract_plan(c))),
    Producer("session-after-restart", "session_lost", "stub", _with_session(_after_a_restart)),
    Producer("session-idle-2-s", "session_expired", "stub", _with_session(_once_idle)),
    Producer("second-session-of-1", "too_many_sessions", "stub", _with_session(  # of at most 1
        lambda c, plan, _: _session(c, plan))),
    Producer("check-on-abstract-plan", "compile_target_unavailable", "stub",
             _check_on(lambda c: _abstract_plan(c, axes={"data": 8}, num_devices=8,
                                                batch_shape=[64, 512]), MLP_CHECK)),
    Producer("check-of-a-giant", "model_too_large", "stub",
             _check_on(_live_plan, {"model": GIANT, "batch_shape": [2**40]})),
    Producer("third-check-of-1-waiting", "compile_queue_full", "compile_walk",
             lambda walk: walk["compile_queue_full"]),
    Producer("check-past-its-timeout", "compile_failed", "compile_walk",
             lambda walk: walk["compile_failed"]),
    Producer("lane-full", "busy", "stub", _busy),
    Producer("sigterm-during-search", "shutting_down", "stub", _shutting_down),
    Producer("hang-up-before-body", "request_abandoned", "stub", _hang_up),
    Producer("sqlite-max-page-count", "storage_full", "stub", _storage_fault(
        "PRAGMA max_page_count = {pages}", "PRAGMA max_page_count = 1073741823")),
    Producer("sqlite-query-only", "storage_unavailable", "stub", _storage_fault(
        "PRAGMA query_only = 1", "PRAGMA query_only = 0")),
    # the runtime's own errors, as the channel carries them
    Producer("plan-device-99-gone", "devices_changed", "stub", _runtime_reply(  # at session_create
        lambda: from_reply(error_reply(1, _raised(lambda: mesh_from_plan(
            {"axes": {"data": 2}, "device_grid": [0, 99]}), ServiceError))["error"]))),
    Producer("command-misspelt", "unknown_command", "stub",
             _runtime_reply(lambda: _reply({"command": "session_craete"}))),
    Producer("group-command-to-follower", "not_leader", "stub", _runtime_reply(  # on a follower
        lambda: from_reply(_not_here({"id": 1, "command": "session_create"})["error"]))),
    Producer("xla-internal-error", "runtime_error", "stub", _runtime_reply(  # no handler expects it
        lambda: from_reply(error_reply(1, RuntimeError("INTERNAL: RET_CHECK failed"))["error"]))),
    Producer("str-array-to-runtime", "unsupported_dtype", "stub",
             _runtime_reply(_unsupported_dtype)),
    Producer("array-bytes-short", "invalid_array", "stub", _runtime_reply(  # as it reads arrays
        lambda: _reply({"command": "ping"},
                       _raised(lambda: decode_arrays([SHORT_ARRAY], b"\0" * 4), ArrayError)))),
    # the real server's HTTP protocol
    Producer("content-length-abc", "bad_request", "server", _raw(
        b"POST /v1/metrics/reduce HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n{}")),
    Producer("half-a-head", "request_timeout", "server", _raw(  # DATARAX_HEADER_TIMEOUT_S=1
        b"POST /v1/meshes HTTP/1.1\r\ncontent-ty")),
    Producer("third-post-of-2-connections", "too_many_connections", "server",
             _too_many_connections),
]  # fmt: skip


def _problem(response: httpx.Response, code: str) -> dict:
    """The problem the response answers: its body, or for a compile check its outcome
    (``GET /v1/compile-checks/{id}`` answers 200 with the failure in ``error``)."""
    if code == "compile_failed":
        check = response.json()
        assert check["status"] == "failed", check
        assert check["error"]["code"] == code, check
        return check["error"]
    return assert_problem(response, CODES[code].status, code)


WALKED = [code for code in TABLE_CODES if code not in NOT_FROM_OUTSIDE]


def test_the_walk_reads_the_whole_table():
    assert len(TABLE_CODES) == len(set(TABLE_CODES)) == len(CODES), "docs/ERRORS.md's table"
    stray = set(NOT_FROM_OUTSIDE) - set(TABLE_CODES)
    assert not stray, f"NOT_FROM_OUTSIDE names codes docs/ERRORS.md does not list: {stray}"
    produced = {p.code for p in PRODUCERS} & set(NOT_FROM_OUTSIDE)
    assert not produced, f"produced, so no longer NOT_FROM_OUTSIDE: {sorted(produced)}"
    unknown = {p.code for p in PRODUCERS} - set(TABLE_CODES)
    assert not unknown, f"producers of codes docs/ERRORS.md does not list: {sorted(unknown)}"
    ids = [p.id for p in PRODUCERS]
    assert len(ids) == len(set(ids)), "producer ids repeat"


@pytest.mark.parametrize("code", WALKED)
def test_every_code_in_errors_md_reads_as_a_user_can_act_on(request, code):
    producers = [p for p in PRODUCERS if p.code == code]
    if not producers:
        pytest.fail(
            f"docs/ERRORS.md lists {code!r} and nothing here produces it: add a producer to "
            "PRODUCERS, or, if no request can make it on purpose, the reason to "
            "NOT_FROM_OUTSIDE"
        )
    faults = {}
    for producer in producers:
        problem = _problem(producer.answer(request.getfixturevalue(producer.where)), code)
        if found := problem_faults(problem):
            faults[producer.id] = (problem["detail"], found)
    assert not faults, faults


@pytest.mark.parametrize(("change", "code", "suggested"), [t[1:] for t in TYPOS],
                         ids=[t[0] for t in TYPOS])  # fmt: skip
def test_a_typo_is_answered_with_the_nearest_valid_name(api, change, code, suggested):
    # issue 40: "did you mean" for axis, model, hardware, topology, field and value typos,
    # in one sentence without pydantic's internals
    body = assert_problem(api.post("/v1/meshes", json={**TYPO_BASE, **change}), 422, code)
    assert f"(did you mean {suggested}?)" in body["detail"], body["detail"]
    assert not message_faults(body["detail"]), body["detail"]
    if code == "validation_error":
        assert body["errors"][0]["field"] in ("batch_shap", "model.remmat", "model.remat")


@pytest.mark.parametrize(
    ("detail", "faults"),
    [("use 64 or 128", []), ("use 64 or 64", ["repeated 64"]),
     ("Value error, x", ["Value error"]), ("model.named.remat: x", [".named."])],
)  # fmt: skip
def test_the_rules_catch_what_they_name(detail, faults):
    assert message_faults(detail) == faults


def test_a_field_of_another_mode_is_never_its_own_suggestion(api):
    # Issue 58, class 11: "'pipeline' is not a field here (did you mean 'pipeline'?)" on a
    # plain plan body: the name is valid in hardware plans, so it is said so instead.
    body = assert_problem(
        api.post("/v1/meshes", json={"axes": {"data": -1}, "pipeline": {"microbatches": 4}}),
        422,
        "validation_error",
    )
    assert "did you mean 'pipeline'" not in body["detail"], body["detail"]
    assert "'pipeline' is not a field here (it is one of another kind" in body["detail"]
    assert not message_faults(body["detail"]), body["detail"]
