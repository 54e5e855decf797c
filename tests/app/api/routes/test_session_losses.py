"""A session's loss history (``GET /v1/sessions/{id}`` ``loss_history``): every step's loss
as the steps answered it, bounded to 2,000 evenly spaced points however long the session
runs. Against a real runtime process (the ``api`` fixture)."""

from __future__ import annotations

import json
import math

from app.services.sessions import LOSS_HISTORY_MAX, extend_loss_history

FEATURES = [16, 32, 4]
SYNTH = {"seed": 3, "batch_size": 16}


def _session(api, **spec) -> str:
    plan = api.post("/v1/meshes", json={"axes": {"data": 8}})
    assert plan.status_code == 201, plan.text
    body = {"model": {"kind": "mlp", "features": FEATURES}, **spec}
    created = api.post(f"/v1/meshes/{plan.json()['id']}/sessions", json=body)
    assert created.status_code == 201, created.text
    assert created.json()["loss_history"] == []
    return created.json()["id"]


def _run(api, sid: str, steps: int, **body) -> dict:
    answer = api.post(
        f"/v1/sessions/{sid}/steps", json={"steps": steps, **(body or {"synthetic": SYNTH})}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_history_holds_every_step_as_the_steps_answered(api):
    sid = _session(api)
    losses = []
    for steps in (5, 7, 3):
        losses += _run(api, sid, steps)["losses"]
    session = api.get(f"/v1/sessions/{sid}").json()
    assert session["step"] == 15
    assert session["loss_history_stride"] == 1
    assert session["loss_history"] == [[i + 1, loss] for i, loss in enumerate(losses)]
    assert session["last_loss"] == losses[-1]
    # Lists stay summaries: no history in them.
    listed = api.get(f"/v1/meshes/{session['mesh_id']}/sessions").json()["items"]
    assert [s["id"] for s in listed] == [sid]
    assert "loss_history" not in listed[0] and "loss_history_stride" not in listed[0]


def test_non_finite_losses_are_null(api):
    sid = _session(api)
    huge = {"inputs": [[1e30] * FEATURES[0]] * 8, "targets": [[0.0] * FEATURES[-1]] * 8}
    answer = _run(api, sid, 2, batch=huge)
    assert answer["losses"][0] is None, answer["losses"]
    history = api.get(f"/v1/sessions/{sid}").json()["loss_history"]
    assert history == [[1, None], [2, answer["losses"][1]]]


def test_the_history_stays_bounded_after_many_calls_of_1000_steps(api):
    sid = _session(api)
    losses = []
    for _ in range(5):
        losses += _run(api, sid, 1000)["losses"]
    answer = api.get(f"/v1/sessions/{sid}")
    session = answer.json()
    history, stride = session["loss_history"], session["loss_history_stride"]
    assert session["step"] == 5000
    # 3,000 points halved to 1,500 (stride 2), 2,000, then 2,500 halved to 1,250 (stride 4)
    assert stride == 4 and len(history) == 1250, (stride, len(history))
    assert [step for step, _ in history] == list(range(4, 5001, 4))
    assert all(loss == losses[step - 1] for step, loss in history)
    assert len(answer.content) < 80_000, len(answer.content)


def test_a_million_step_session_keeps_at_most_2000_points():
    history, stride = [], 1
    for call in range(1000):  # 1,000 calls of 1,000 steps
        first = call * 1000 + 1
        history, stride = extend_loss_history(
            history, stride, first, [1.0 / step for step in range(first, first + 1000)]
        )
        assert len(history) <= LOSS_HISTORY_MAX
    assert stride == 512 and len(history) == 1953, (stride, len(history))
    steps = [step for step, _ in history]
    assert steps == list(range(stride, 1_000_001, stride))
    assert all(loss == 1.0 / step for step, loss in history)
    assert len(json.dumps(history)) < 80_000  # 65 KB here: ~33 bytes a point


def test_out_of_order_calls_merge_by_step_and_non_finite_is_none():
    history, stride = extend_loss_history([], 1, 4, [4.0, math.nan, 6.0])
    history, stride = extend_loss_history(history, stride, 1, [1.0, 2.0, 3.0, 99.0])
    assert stride == 1
    assert history == [[1, 1.0], [2, 2.0], [3, 3.0], [4, 4.0], [5, None], [6, 6.0]]
