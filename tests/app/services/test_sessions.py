"""The session service without HTTP: its records in the store, its caps and states, over
a stand-in for the runtime client (no device work)."""

from __future__ import annotations

import json
from typing import Any, cast

import anyio
import pytest

from app.core.errors import (
    InvalidParameter,
    MeshNotFound,
    PlanNotLive,
    SessionLost,
    SessionNotFound,
    TooManySessions,
    UnsupportedMediaType,
    WorkerLost,
)
from app.schemas.sessions import SessionCreateRequest
from app.services.sessions import SessionService, decode_step_body
from app.storage import plans, sessions
from app.storage.db import Store
from app.workers.runtime_client import RuntimeClient
from tests.helpers import make_settings

LIVE_PLAN = {"id": "m_live", "live": True, "axes": {"data": 2}, "device_grid": [[0, 1]]}
LAYOUT = {"path": "w", "shape": [4, 2], "dtype": "float32", "spec": [None, None],
          "shard_shape": [4, 2], "bytes_per_device": 32}  # fmt: skip
BODY = SessionCreateRequest.model_validate({"model": {"kind": "mlp", "features": [4, 2]}})


class Runtime:
    """What the service asks of the runtime client, answered in memory."""

    def __init__(self) -> None:
        self.ready = True
        self.restarts = 0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.step = 0
        self.sent: list[tuple[Any, float | None]] = []  # (arrays, timeout) of each call

    def memory_budget(self) -> dict[str, int | None] | None:
        return {"device": 1 << 30}

    async def call(self, command, payload=None, arrays=None, *, timeout=None):  # noqa: ASYNC109
        self.calls.append((command, payload))
        self.sent.append((arrays, timeout))
        if command == "session_create":
            return {"params": [LAYOUT], "reserved": {"device:0": 64}}, {}
        if command == "session_step":
            losses = [float(self.step + i) for i in range(payload["steps"])]
            self.step += payload["steps"]
            timing = {"compile_s": 0.0, "run_s": 0.1, "cache_hit": True}
            answer = {"step": self.step, "losses": losses, "timing": timing}
            return {**answer, "examples_per_s": None}, {}
        return {}, {}


@pytest.fixture
def service(tmp_path):
    settings = make_settings(tmp_path, max_sessions=2)
    store = Store(settings.db)
    store.open()
    plans.insert_plan_sync(store, "m_live", "t", None, True, json.dumps(LIVE_PLAN))
    plans.insert_plan_sync(store, "m_abstract", "t", None, False, '{"live":false}')
    runtime = Runtime()
    yield SessionService(store, cast(RuntimeClient, runtime), settings), runtime
    store.close()


def test_a_session_is_created_stepped_read_listed_and_deleted(service):
    sessions_, runtime = service

    async def main():
        record = await sessions_.create("m_live", BODY)
        sid = record["id"]
        assert record["mesh_id"] == "m_live" and record["step"] == 0
        assert record["params"] == [LAYOUT]
        assert sessions_.memory_reserved() == {"device:0": 64}
        create = runtime.calls[0][1]
        assert create["mesh"]["batch_axes"] is None and create["memory_budget"]
        body = json.dumps({"steps": 3, "synthetic": {"batch_size": 4}}).encode()
        result = await sessions_.run_steps(sid, body, "application/json", None, None)
        assert result["step"] == 3
        settings = sessions_.settings
        assert [t for _, t in runtime.sent] == [
            settings.runtime_start_timeout_s,
            settings.step_timeout_s,
        ]
        read = await sessions_.read(sid)
        assert (read["step"], read["last_loss"]) == (3, 2.0)
        assert read.to_json()["loss_history"] == [[1, 0.0], [2, 1.0], [3, 2.0]]
        assert read.loss_history == [(1, 0.0), (2, 1.0), (3, 2.0)]
        # The stored record is what the service answered.
        stored = json.loads(await sessions.get_session(sessions_.store, sid))
        assert stored["step"] == 3
        listed = await sessions_.list_sessions(10, 0, "m_live")
        assert listed["total"] == 1 and listed["items"][0]["state"] == "live"
        assert "params" not in listed["items"][0] and "loss_history" not in listed["items"][0]
        await sessions_.delete(sid)
        await sessions_.settle()  # the free is sent after the delete has answered
        assert runtime.calls[-1] == ("session_delete", {"id": sid})
        with pytest.raises(SessionNotFound):
            await sessions_.read(sid)
        with pytest.raises(SessionNotFound):
            await sessions_.delete(sid)

    anyio.run(main)


def test_creation_needs_a_live_plan_a_ready_runtime_and_a_free_slot(service):
    sessions_, runtime = service

    async def main():
        with pytest.raises(MeshNotFound):
            await sessions_.create("m_missing", BODY)
        with pytest.raises(PlanNotLive):
            await sessions_.create("m_abstract", BODY)
        runtime.ready = False
        with pytest.raises(WorkerLost):
            await sessions_.create("m_live", BODY)
        runtime.ready = True
        for _ in range(2):
            await sessions_.create("m_live", BODY)
        with pytest.raises(TooManySessions):
            await sessions_.create("m_live", BODY)
        assert sessions_.live_count() == 2
        with pytest.raises(MeshNotFound):
            await sessions_.list_sessions(10, 0, "m_missing")

    anyio.run(main)


def test_a_session_of_a_restarted_runtime_is_lost_but_its_record_stays(service):
    sessions_, runtime = service

    async def main():
        sid = (await sessions_.create("m_live", BODY))["id"]
        runtime.restarts += 1
        assert sessions_.state_of(sid) == "lost" and sessions_.live_count() == 0
        with pytest.raises(SessionLost):
            await sessions_.read(sid)
        assert (await sessions_.record(sid))["id"] == sid
        assert (await sessions_.list_sessions(10, 0))["items"][0]["state"] == "lost"

    anyio.run(main)


def test_step_bodies_are_decoded_and_refused_before_any_device_work(tmp_path):
    settings = make_settings(tmp_path)
    body = json.dumps({"steps": 2, "batch": {"inputs": [[1, 2]], "targets": [[3]]}}).encode()
    payload, arrays = decode_step_body(body, "application/json", None, None, settings)
    assert payload == {"steps": 2} and arrays["inputs"].shape == (1, 2)
    with pytest.raises(InvalidParameter):  # both batch and synthetic
        decode_step_body(
            json.dumps({"batch": {"inputs": [[1]]}, "synthetic": {"batch_size": 1}}).encode(),
            "application/json",
            None,
            None,
            settings,
        )
    with pytest.raises(InvalidParameter):  # steps out of range
        decode_step_body(body, "application/json", None, 0, settings)
    with pytest.raises(UnsupportedMediaType):
        decode_step_body(b"x", "text/plain", "text/plain", None, settings)
