"""One session never takes down the others, and a session says truly where it lives
(issue 58, classes 2, 3 and 11), against the real server.

- A mixture-of-experts step whose received rows times ``moe_d_ff`` pass 2**31 - 1
  elements (the issue's SIGFPE of the runtime), and a ``dot`` attention step of 32,768
  tokens (``[S, S]`` scores and mask), are 422 ``model_too_large`` before anything is
  lowered, under a memory budget that admits everything (``DATARAX_MEMORY_BUDGET_MB``): the
  runtime is the same process after them, and another user's session trains on.
- A session that lives on another replica of a shared PostgreSQL database (one simulated
  by a connection holding that replica's owner lock) answers its reads and its steps 410
  ``session_lost`` naming that replica, not "it was restarted"; once that replica is gone,
  the answer says it is gone.
"""

from __future__ import annotations

import json
import time

import anyio
import psycopg
import pytest

from app.storage import owners
from app.storage import sessions as stored_sessions
from app.storage.postgres import PostgresStore
from tests.helpers import ServiceProcess, assert_problem

pytestmark = pytest.mark.timeout(300)

TINY = {"kind": "transformer", "layers": 1, "d_model": 32, "d_ff": 64, "heads": 4,
        "kv_heads": 2, "vocab": 50, "seq_len": 16}  # fmt: skip
# 2 experts, both per token, 8,192 tokens, over an expert axis of 2: each device receives
# 2 x 8,192 x 2 = 32,768 rows of the experts' 65,536-wide hidden layer: 2**31 elements.
OVERSIZED_MOE = {"kind": "transformer", "layers": 1, "d_model": 8, "d_ff": 16, "heads": 2,
                 "kv_heads": 2, "vocab": 16, "seq_len": 8192, "num_experts": 2,
                 "experts_per_token": 2, "moe_d_ff": 65536}  # fmt: skip
LONG_DOT = {**TINY, "seq_len": 32768, "attention": "dot"}
REPLICA = 12345  # the owner key of the simulated other replica


def _plan(client, axes, **extra) -> str:
    answer = client.post("/v1/meshes", json={"axes": axes, **extra})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def _session(client, plan_id, model) -> str:
    answer = client.post(f"/v1/meshes/{plan_id}/sessions", json={"model": model})
    assert answer.status_code == 201, answer.text
    return answer.json()["id"]


def _step(client, sid, batch_size):
    body = {"steps": 1, "synthetic": {"seed": 0, "batch_size": batch_size}}
    return client.post(f"/v1/sessions/{sid}/steps", json=body)


def test_oversized_steps_are_refused_before_lowering_and_the_runtime_lives_on(tmp_path):
    env = {"DATARAX_MEMORY_BUDGET_MB": str(2**40)}  # admits anything: only sizes refuse
    with ServiceProcess(tmp_path / "datarax.sqlite", tmp_path / "server.log", env=env) as service:
        ready = service.wait_ready()
        with service.client(timeout=120) as client:
            bystander = _session(client, _plan(client, {"data": 8}), TINY)
            assert _step(client, bystander, 8).json()["step"] == 1
            moe = _session(client, _plan(client, {"expert": 2}, batch_axes=["expert"]),
                           OVERSIZED_MOE)  # fmt: skip
            refused = _step(client, moe, 2)
            assert_problem(refused, 422, "model_too_large")
            assert "its expert hidden would hold" in refused.json()["detail"]
            dot = _session(client, _plan(client, {"data": 1}), LONG_DOT)
            refused = _step(client, dot, 1)
            assert_problem(refused, 422, "model_too_large")
            assert "attention scores would hold 4,294,967,296" in refused.json()["detail"]
            assert "nothing was lowered" in refused.json()["detail"]
            for sid in (moe, dot):
                assert client.get(f"/v1/sessions/{sid}").json()["step"] == 0
            now = client.get("/health/ready").json()
            assert (now["runtime_pid"], now["runtime_restarts"]) == (
                ready["runtime_pid"],
                ready["runtime_restarts"],
            )
            after = _step(client, bystander, 8)
            assert after.status_code == 200, after.text
            assert after.json()["step"] == 2


def _insert_as_replica(url: str, record: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores ``record`` as a session that replica :data:`REPLICA` created."""
    store = PostgresStore(url)
    store.open()
    try:
        with monkeypatch.context() as theirs:  # insert_session claims it for owners.OWNER
            theirs.setattr(owners, "OWNER", REPLICA)
            anyio.run(
                stored_sessions.insert_session,
                store,
                record["id"],
                record["mesh_id"],
                record["created_at"],
                json.dumps(record),
            )
    finally:
        store.close()


def test_a_session_on_another_replica_says_so(tmp_path, postgres_url, monkeypatch):
    env = {"DATARAX_DATABASE_URL": postgres_url}
    replica = psycopg.connect(postgres_url, autocommit=True)
    try:
        replica.execute("SELECT pg_advisory_lock_shared(%s, %s)", (owners.OWNER_CLASS, REPLICA))
        with ServiceProcess(tmp_path / "d.sqlite", tmp_path / "server.log", env=env) as service:
            service.wait_ready()
            with service.client(timeout=120) as client:
                plan = _plan(client, {"data": 8})
                mine = _session(client, plan, TINY)
                record = {**client.get(f"/v1/sessions/{mine}").json(), "id": "s_theirs"}
                _insert_as_replica(postgres_url, record, monkeypatch)
                for answer in (_step(client, "s_theirs", 8), client.get("/v1/sessions/s_theirs")):
                    assert_problem(answer, 410, "session_lost")
                    detail = answer.json()["detail"]
                    assert f"lives on replica {REPLICA} of this service" in detail, detail
                    assert "restarted" not in detail, detail
                assert _step(client, mine, 8).status_code == 200  # its own sessions train
                replica.close()  # that replica stops: its lock, and the session, are gone
                deadline = time.monotonic() + 30
                while "lives on replica" in _step(client, "s_theirs", 8).json()["detail"]:
                    assert time.monotonic() < deadline, "the stopped replica's lock stayed"
                    time.sleep(0.1)
                gone = _step(client, "s_theirs", 8)
                assert_problem(gone, 410, "session_lost")
                assert "the replica that created it has stopped" in gone.json()["detail"]
    finally:
        replica.close()
