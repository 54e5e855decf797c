"""Pushing: single points and batches are stored once, retries are no-ops, conflicts 409."""

from __future__ import annotations

import anyio
import numpy as np
import orjson
import pytest

from app.core.errors import StepConflict
from app.services.jobs.decode import JobBatch, PointInput
from app.services.jobs.push import push_batch, push_single


def _single(step, loss, source="", sources=1) -> JobBatch:
    point = PointInput(step, {"loss": np.asarray(loss)}, {}, None, "propagate", source, sources)
    return JobBatch(points=[point], single=True)


def test_a_single_push_is_stored_once_and_its_retry_is_a_no_op(store):
    first = anyio.run(push_single, store, "j", _single(3, [1.0, 3.0]))
    assert first.created and first.stored == 1
    body = orjson.loads(first.body)
    assert body["reduced"] == {"loss": 2.0} and body["complete"] and body["num_devices"] == 2
    again = anyio.run(push_single, store, "j", _single(3, [1.0, 3.0]))
    assert not again.created and orjson.loads(again.body)["received_at"] == body["received_at"]
    with pytest.raises(StepConflict):
        anyio.run(push_single, store, "j", _single(3, [1.0, 4.0]))


def test_parts_complete_their_step_when_every_source_arrived(store):
    half = orjson.loads(anyio.run(push_single, store, "p", _single(0, [1.0], "h0", 2)).body)
    assert (half["complete"], half["reduced"], half["missing_sources"]) == (False, None, ["h1"])
    done = orjson.loads(anyio.run(push_single, store, "p", _single(0, [3.0], "h1", 2)).body)
    assert done["complete"] and done["reduced"] == {"loss": 2.0}


@pytest.mark.parametrize("columnar", [True, False], ids=["columns", "points"])
def test_a_batch_answer_counts_what_was_new(store, columnar):
    loss = [1.0, 2.0] if columnar else [1, 2]  # integers take the point-by-point path
    body = orjson.dumps({"points": [{"step": s, "metrics": {"loss": loss}} for s in range(4)]})
    answer = anyio.run(push_batch, store, "b", body)
    assert answer.created and answer.stored == 4
    counts = orjson.loads(answer.body)
    assert (counts["points"], counts["created"], counts["completed_steps"]) == (4, 4, 4)
    again = orjson.loads(anyio.run(push_batch, store, "b", body).body)
    assert (again["created"], again["unchanged"], again["completed_steps"]) == (0, 4, 0)
