"""The host calibration's stages on the 8 simulated CPU devices (issue 39, section 2):
each measures every device at once and answers its rows."""

from __future__ import annotations

import pytest

from datarax.estimate.host_calibration import STAGES, measure_stage


def test_each_stage_measures_every_device(eight_devices):
    rows = {stage: measure_stage(stage, quick=True, devices=eight_devices) for stage in STAGES}
    assert rows["overhead"][0]["seconds"] > 0
    assert {r["dtype"] for r in rows["matmul"]} == {"bfloat16", "float32"}
    assert all(r["flops_per_s"] > 0 for r in rows["matmul"])
    (attention,) = rows["attention"]
    assert attention["platform"] == "cpu" and attention["priced_flops_per_s"] > 0
    assert rows["hbm"][0]["bytes_per_s"] > 0
    kinds = {r["kind"] for r in rows["collectives"]}
    assert kinds == {"all-gather", "reduce-scatter", "all-reduce", "all-to-all"}
    assert all(r["ring_bytes_per_s"] > 0 for r in rows["collectives"])


def test_one_device_has_no_collectives_and_unknown_stages_are_refused(eight_devices):
    assert measure_stage("collectives", devices=eight_devices[:1]) == []
    with pytest.raises(ValueError, match="not one of"):
        measure_stage("network")
