"""Launch requests: a target, and container fields without spaces or unbounded length."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.schemas.launch import LAUNCH_EXAMPLE, LaunchRequest
from datarax.answers.launch import EnvLaunch, JobSetLaunch, LaunchConfig, MaxTextLaunch, SlurmLaunch


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
    body = {"target": "slurm", "script": "#!/bin/bash", "notes": [], "warnings": []}
    answer = LaunchConfig.from_json({**body, "x": 1})  # a newer service's member: ignored
    assert isinstance(answer, SlurmLaunch) and answer.script == "#!/bin/bash"
    assert answer.notes == [] and answer.to_json() == body
    env = {"target": "env", "process_model": "m", "num_processes": 1,
           "coordinator_address": "h:1", "process_list_limit": 64, "processes": None,
           "rule": {"process_id": "host", "ranges": {"host": [0, 0]}, "hostname": "h",
                    "local_device_ids": [0], "num_processes": 1, "coordinator_address": "h:1"},
           "notes": [], "warnings": []}  # fmt: skip
    read = LaunchConfig.from_json(env)
    assert isinstance(read, EnvLaunch) and read.rule.ranges == {"host": [0, 0]}
    assert read.processes is None and read.to_json()["processes"] is None
    for cls in (MaxTextLaunch, JobSetLaunch, SlurmLaunch, EnvLaunch):
        assert issubclass(cls, LaunchConfig)
