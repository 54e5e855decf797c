"""Job history requests: the one source-name rule, step bounds, batches all or nothing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.schemas.jobs import (
    MAX_BATCH_POINTS,
    MAX_STEP,
    JobBatchRequest,
    JobMetricsRequest,
    is_source_name,
)


@pytest.mark.parametrize(
    ("name", "valid"),
    [("", True), ("host-3", True), ("a.b_c:d-e", True), ("x" * 128, True),
     ("x" * 129, False), ("h 1", False), ("h/1", False), ("\u00e9", False)],
)  # fmt: skip
def test_source_names(name, valid):
    assert is_source_name(name) is valid
    body = {"metrics": {"loss": [1.0]}, "step": 1, "source": name}
    if valid:
        assert JobMetricsRequest.model_validate(body).source == name
    else:
        with pytest.raises(ValidationError):
            JobMetricsRequest.model_validate(body)


def test_steps_are_sqlite_integers():
    assert JobMetricsRequest.model_validate({"metrics": {"x": 1}, "step": 10.0}).step == 10
    for step in (-1, MAX_STEP + 1, 1.5):
        with pytest.raises(ValidationError):
            JobMetricsRequest.model_validate({"metrics": {"x": 1}, "step": step})


def test_a_batch_holds_one_to_the_limit_of_points():
    point = {"metrics": {"x": 1}, "step": 1}
    assert len(JobBatchRequest.model_validate({"points": [point]}).points) == 1
    for points in ([], [point] * (MAX_BATCH_POINTS + 1)):
        with pytest.raises(ValidationError):
            JobBatchRequest.model_validate({"points": points})
