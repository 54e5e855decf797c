"""The merge rules of multi-source parts: the merge of completed steps (the library's, as
one push of every device)."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from app.core.errors import ServiceError
from app.services.jobs.parts import merge_rows


def _signature(ops: dict, nan_policy: str = "propagate") -> str:
    return orjson.dumps({"metrics": {}, "reduce": ops, "nan_policy": nan_policy}).decode()


@pytest.mark.parametrize("weighted", [False, True], ids=["stacked", "step-by-step"])
def test_merged_rows_are_one_push_of_every_device(weighted):
    rng = np.random.default_rng(4)
    host0, host1 = rng.normal(size=(3, 2)), rng.normal(size=(3, 3))
    parts = [("h0", {"loss": host0}), ("h1", {"loss": host1})]
    if weighted:
        parts[0][1]["_weights"] = np.full((3, 2), 2.0)
    merged = merge_rows(parts, _signature({"loss": "mean"}))
    for k, row in enumerate(merged):
        every = np.concatenate([host0[k], host1[k]])
        weights = np.r_[[2.0 if weighted else 1.0] * 2, [1.0] * 3]
        want = float((every * weights).sum() / weights.sum())
        assert row.values["loss"] == pytest.approx(want, rel=1e-12)
        assert orjson.loads(row.reduced)["loss"] == pytest.approx(want, rel=1e-12)
        assert row.num_devices == 5


def test_a_merge_the_library_refuses_is_the_librarys_problem():
    parts = [("h0", {"x": np.ones((1, 2))}), ("h1", {"x": np.ones((1, 2))})]
    with pytest.raises(ServiceError) as err:
        merge_rows(parts, _signature({"x": "median"}))
    assert (err.value.code, err.value.status) == ("unknown_reduce_op", 422)


def test_a_segment_push_says_what_it_stored_and_completed(store):
    import dataclasses

    from app.services.jobs.parts import PART_RULES
    from app.storage import jobs as store_jobs
    from app.storage.parts import PartSegment, SegmentPush, SegmentTable

    def segment(source: str, loss: list[float]) -> PartSegment:
        return PartSegment(
            source=source,
            sources=2,
            signature=_signature({"loss": "sum"}),
            num_devices=1,
            steps=[0, 1],
            columns={"loss": np.asarray(loss).reshape(2, 1)},
        )

    half = store._write(lambda c: PART_RULES(SegmentTable(c, "j"), segment("a", [1, 2]), "t0", {}))
    assert isinstance(half, SegmentPush) and dataclasses.is_dataclass(half)
    with pytest.raises(dataclasses.FrozenInstanceError):
        half.received_at = "later"  # type: ignore[misc]
    assert (half.created_steps, half.completed, half.complete) == ({0, 1}, (), {})
    push = store_jobs.PushBatch(parts=segment("b", [3, 4]))
    done = store_jobs.store_batch_here(store, "j", push, PART_RULES)
    assert (done.created, done.completed) == (2, 2)
