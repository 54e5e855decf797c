"""Training steps (app.runtime.steps): in a real runtime (the compiled-step cache, a given
batch, bad batches that change nothing) and the batch checks in this process."""

from __future__ import annotations

import numpy as np
import pytest

from app.core.errors import InvalidBatch, ServiceError
from app.runtime.steps import check_batch
from tests.app.runtime.test_sessions import _create, _losses, _session


def test_cache_hit_on_second_call_and_step_count(shared_runtime):
    sid, _ = _create(shared_runtime, {"data": 8})
    first = _losses(shared_runtime, sid, 2)
    second = _losses(shared_runtime, sid, 3)
    assert first["timing"]["cache_hit"] in (True, False)
    assert second["timing"]["cache_hit"] is True and second["timing"]["compile_s"] == 0.0
    assert second["step"] == 5 and len(second["losses"]) == 3
    info, _ = shared_runtime.call("session_info", {"id": sid})
    assert info["last_loss"] == second["losses"][-1]


BAD_BATCHES = [
    (
        {"inputs": np.zeros((8, 5), np.float32), "targets": np.zeros((8, 8), np.float32)},
        "batch_shape_mismatch",
    ),
    ({"inputs": np.zeros((8, 16), np.float32)}, "missing_targets"),
    ({"targets": np.zeros((8, 8), np.float32)}, "missing_inputs"),
    (
        {"inputs": np.zeros((12, 16), np.float32), "targets": np.zeros((12, 8), np.float32)},
        "batch_not_divisible",
    ),
]


@pytest.mark.parametrize(
    ("arrays", "code"),
    BAD_BATCHES,
    ids=["wrong-features", "missing-targets", "missing-inputs", "indivisible"],
)
def test_bad_batches_change_nothing(shared_runtime, arrays, code):
    sid, _ = _create(shared_runtime, {"data": 8})
    with pytest.raises(ServiceError) as err:
        shared_runtime.call("session_step", {"id": sid, "steps": 1}, arrays)
    assert err.value.status == 422 and err.value.code == code
    info, _ = shared_runtime.call("session_info", {"id": sid})
    assert info["step"] == 0
    shared_runtime.call("session_delete", {"id": sid})


def test_given_batch_trains(shared_runtime):
    sid, _ = _create(shared_runtime, {"data": 8}, loss="cross_entropy")
    rng = np.random.default_rng(0)
    arrays = {
        "inputs": rng.standard_normal((16, 16)).astype(np.float32),
        "targets": rng.integers(0, 8, 16).astype(np.int32),
    }
    result, _ = shared_runtime.call("session_step", {"id": sid, "steps": 5}, arrays)
    assert result["losses"][-1] < result["losses"][0] and result["step"] == 5
    shared_runtime.call("session_delete", {"id": sid})


BATCH_CHECKS = [
    ("mse", {"targets": np.zeros((8, 8))}, "missing_inputs"),
    ("mse", {"inputs": np.zeros((8, 16))}, "missing_targets"),
    ("mse", {"inputs": np.zeros((8, 15)), "targets": np.zeros((8, 8))}, "batch_shape_mismatch"),
    ("mse", {"inputs": np.zeros(8), "targets": np.zeros((8, 8))}, "batch_shape_mismatch"),
    ("mse", {"inputs": np.zeros((8, 16)), "targets": np.zeros((8, 7))}, "batch_shape_mismatch"),
    ("mse", {"inputs": np.zeros((8, 16), bool), "targets": np.zeros((8, 8))}, "invalid_inputs"),
    ("cross_entropy", {"inputs": np.zeros((8, 16)), "targets": np.zeros(8)}, "invalid_targets"),
    (
        "cross_entropy",
        {"inputs": np.zeros((8, 16)), "targets": np.full(8, 8, np.int32)},
        "invalid_targets",
    ),
    ("mse", {"inputs": np.zeros((6, 16)), "targets": np.zeros((6, 8))}, "batch_not_divisible"),
    ("mse", {"inputs": np.zeros((0, 16)), "targets": np.zeros((0, 8))}, "batch_not_divisible"),
]


@pytest.mark.parametrize(
    ("loss", "batch", "code"),
    BATCH_CHECKS,
    ids=[
        "no-inputs", "no-targets", "features", "inputs-1d", "target-width", "bool-inputs",
        "float-class-ids", "class-id-range", "indivisible", "empty",
    ],
)  # fmt: skip
def test_check_batch_names_the_batch_field(loss, batch, code):
    session = _session({"data": 4, "model": 2}, loss)
    with pytest.raises(InvalidBatch) as err:
        check_batch(session, batch)
    assert (err.value.status, err.value.code) == (422, code)
    assert "metric" not in str(err.value)
    if code == "batch_not_divisible":
        rows = batch["inputs"].shape[0]
        nearest = "sizes: 4 or 8" if rows else "size: 4"
        assert f"batch size {rows} is not divisible by 4 data shards; nearest valid {nearest}" in (
            str(err.value)
        )


def test_check_batch_accepts_good_batches():
    check_batch(
        _session({"data": 4, "model": 2}),
        {"inputs": np.zeros((8, 16), np.float32), "targets": np.zeros((8, 8), np.float32)},
    )
    check_batch(
        _session({"data": 4, "model": 2}, "cross_entropy"),
        {"inputs": np.zeros((4, 16), np.int8), "targets": np.arange(4, dtype=np.int64)},
    )
