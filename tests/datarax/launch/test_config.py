"""Launch configs of a stored plan (datarax.launch.config): the one entry point's
targets, refusals and the plan summary. Each target's output is tested in its own module
(test_maxtext.py, test_k8s.py, test_slurm.py)."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.launch.config import DEFAULT_IMAGE, LAUNCH_TARGETS, launch_config, plan_summary
from datarax.launch.maxtext import maxtext_args

V5E_PLAN = {
    "id": "m_1", "hardware": "tpu-v5e", "topology": "v5e:2x2", "slices": 1, "hosts": 1,
    "ici": {"fsdp": 4}, "dcn": {"fsdp": 1}, "axes": {"fsdp": 4}, "total_devices": 4,
    "shards": [{"device": 0}], "device_grid": [0, 1, 2, 3],
}  # fmt: skip


def test_maxtext_target_is_maxtext_args_with_a_command():
    config = launch_config(V5E_PLAN, "maxtext")
    expected = maxtext_args(V5E_PLAN)
    assert config["target"] == "maxtext" and config["args"] == expected["args"]
    # the plan's id rides along, for the job's pusher to link itself to the plan
    assert config["env"] == {**expected["env"], "DATARAX_PLAN_ID": "m_1"} and config["command"]
    assert set(LAUNCH_TARGETS) == {"maxtext", "jobset", "slurm", "env"}


def test_every_target_carries_the_plan_id_and_the_service_url_when_given():
    url = "http://datarax.example:8000/"
    for target in ("maxtext", "jobset", "env"):
        config = launch_config(V5E_PLAN, target, service_url=url)
        env = config.get("env") or {
            item["name"]: item.get("value")
            for item in config["manifest"]["spec"]["replicatedJobs"][0]["template"]["spec"][
                "template"
            ]["spec"]["containers"][0]["env"]
        }
        assert env["DATARAX_PLAN_ID"] == "m_1", target
        assert env["DATARAX_URL"] == "http://datarax.example:8000", target
    assert "DATARAX_URL" not in launch_config(V5E_PLAN, "maxtext")["env"]


@pytest.mark.parametrize(
    ("plan", "target", "says"),
    [
        (V5E_PLAN, "docker", "not one of"),
        ({"axes": {"data": 8}}, "maxtext", "names no hardware"),
        ({**V5E_PLAN, "hardware": "cpu"}, "maxtext", "simulated devices"),
        (V5E_PLAN, "slurm", "is a TPU"),
    ],
    ids=["unknown-target", "no-hardware", "cpu", "slurm-on-tpu"],
)
def test_targets_that_do_not_apply_are_refused_with_the_reason(plan, target, says):
    with pytest.raises(PlanError) as caught:
        launch_config(plan, target)
    assert caught.value.code == "launch_target_unavailable" and says in caught.value.message


def test_summary_keeps_what_launch_configs_read():
    summary = plan_summary(V5E_PLAN)
    assert "shards" not in summary and "device_grid" not in summary
    assert summary["ici"] == {"fsdp": 4} and summary["id"] == "m_1"
    assert launch_config(summary, "maxtext")["args"] == launch_config(V5E_PLAN, "maxtext")["args"]
    assert DEFAULT_IMAGE == "maxtext:latest"
