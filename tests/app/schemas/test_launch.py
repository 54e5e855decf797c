"""Launch requests: a target, and container fields without spaces or unbounded length."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.schemas.launch import LAUNCH_EXAMPLE, LaunchConfig, LaunchRequest


def test_the_example_is_a_jobset_launch():
    request = LaunchRequest.model_validate(LAUNCH_EXAMPLE)
    assert request.target == "jobset" and request.image == LAUNCH_EXAMPLE["image"]


@pytest.mark.parametrize(
    "body",
    [{"target": "k8s"}, {"target": "env", "image": "a b"}, {"target": "env", "name": "x" * 64},
     {"target": "env", "other": 1}],
    ids=["target", "image-space", "long-name", "unknown"],
)  # fmt: skip
def test_bad_launch_requests_are_refused(body):
    with pytest.raises(ValidationError):
        LaunchRequest.model_validate(body)


def test_a_launch_answer_keeps_the_targets_own_members():
    answer = LaunchConfig.model_validate({"target": "slurm", "script": "#!/bin/bash", "x": 1})
    assert answer.notes == [] and answer.model_dump()["x"] == 1
