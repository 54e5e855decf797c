"""The serving profiles against the published serving runs of
benchmarks/serving_calibration.py (issue 57, item 6): the shipped errors are what the
shipped constants give on the rows, the held-out rows within the issue's bounds, every
run judged to fit."""

from __future__ import annotations

import pytest

from benchmarks import serving_calibration as cal
from datarax.estimate.serving_profiles import SERVING_CONSTANTS, SERVING_ERRORS

FITTED = ("published-gpu-tensorrt-llm", "published-tpu-jetstream")


def _rows(profile: str, held_out: bool) -> list[cal.ServingRun]:
    return [r for r in cal.RUNS if cal.profile_id(r) == profile and r.held_out == held_out]


@pytest.mark.parametrize("profile", FITTED)
def test_the_shipped_errors_are_the_shipped_constants_on_the_rows(profile):
    errors = SERVING_ERRORS[profile]
    for held_out, key in ((False, "training"), (True, "held_out")):
        rows = _rows(profile, held_out)
        assert len(rows) == errors[f"{key}_runs"] >= 2
        mae = sum(abs(cal.error(r)) for r in rows) / len(rows)
        assert mae == pytest.approx(errors[f"{key}_mae"], abs=5e-4), (
            f"{profile}: re-run python -m benchmarks.serving_calibration and copy its fit"
        )


def test_held_out_runs_within_the_issues_bounds():
    held = [r for r in cal.RUNS if r.held_out]
    assert {cal.profile_id(r) for r in held} == set(FITTED)
    mae = sum(abs(cal.error(r)) for r in held) / len(held)
    assert mae <= 0.20
    for run in held:
        est = cal.predict(run)
        if run.tpot_s is not None:
            assert abs(est.tpot_s / run.tpot_s - 1) <= 0.25, run.name


def test_every_published_run_is_judged_to_fit():
    for run in cal.RUNS:
        hw = cal.get_hardware(run.hardware)
        links = cal.plan_hardware_devices(hw, ici=dict(run.ici), **run.where).axes_detail
        plan = cal.estimate_serving(hw, links, {"name": run.model}, run.serving)
        assert plan.memory_per_device.fits, run.name
        # the run's configured batch is what is priced (the cache holds it)
        assert plan.serving_estimate.batch == min(
            run.serving["max_batch"],
            -(-run.serving.get("concurrency", 10**9) // plan.layout.replicas),
        ), run.name


def test_vllm_profiles_reuse_the_fits_of_their_kind():
    gpu, tpu = SERVING_CONSTANTS["published-gpu-vllm"], SERVING_CONSTANTS["published-tpu-vllm"]
    trt, jet = (
        SERVING_CONSTANTS["published-gpu-tensorrt-llm"],
        SERVING_CONSTANTS["published-tpu-jetstream"],
    )
    assert (gpu.matmul, gpu.hbm, gpu.overlap) == (trt.matmul, trt.hbm, trt.overlap)
    assert (tpu.matmul, tpu.hbm, tpu.overlap) == (jet.matmul, jet.hbm, jet.overlap)
