"""step_s against the published measured runs of benchmarks/calibration_runs.py."""

from __future__ import annotations

import pytest

from benchmarks import calibrate
from datarax.estimate.step_time import CALIBRATION, PUBLISHED_CONSTANTS, PUBLISHED_ERRORS


@pytest.fixture(scope="module")
def study():
    return calibrate.study()


def test_the_shipped_constants_are_the_fit_of_the_training_rows(study):
    assert set(study["fitted"]) >= {"published-tpu-jax", "published-gpu-jax",
                                    "published-gpu-pytorch"}  # fmt: skip
    for profile, fitted in study["fitted"].items():
        shipped = PUBLISHED_CONSTANTS[profile]
        assert (shipped.matmul, shipped.attention, shipped.hbm, shipped.overlap) == (
            fitted.matmul, fitted.attention, fitted.hbm, fitted.overlap,
        ), f"{profile}: re-run python -m benchmarks.calibrate and copy its fit"  # fmt: skip
    # a plan's default is its kind's jax profile
    assert CALIBRATION["gpu"] is PUBLISHED_CONSTANTS["published-gpu-jax"]
    # and the profiles' errors are the fit's
    assert calibrate.profile_errors(study) == PUBLISHED_ERRORS


def test_held_out_runs_are_predicted_within_15_percent_on_average(study):
    summary = calibrate.summary(study)
    assert summary["held_out_runs"] >= 15
    assert summary["held_out_mae"] <= 0.15, calibrate.markdown(study)


def test_every_run_is_planned_and_slower_than_its_roofline(study):
    assert len(study["rows"]) >= 60
    for row in study["rows"]:
        assert row["predicted"] > row["roofline_s"] > 0, row["run"]["id"]
        assert row["measured"] > 0


def test_the_shipped_moe_constants_are_the_fit_of_the_named_moe_runs():
    from benchmarks import calibration_moe  # noqa: PLC0415

    study = calibration_moe.study()
    for profile, fitted in study["fitted"].items():
        shipped = PUBLISHED_CONSTANTS[profile]
        assert (shipped.grouped_matmul, shipped.all_to_all_overlap) == (
            fitted.grouped_matmul, fitted.all_to_all_overlap,
        ), f"{profile}: re-run python -m benchmarks.calibration_moe and copy its fit"  # fmt: skip
    # every named run is planned and priced; the held-out one is reported, not fitted
    assert len(study["rows"]) == len(calibration_moe.MOE_RUNS) >= 5
    assert any(row["run"]["held_out"] for row in study["rows"])
    assert all(row["predicted"] > 0 for row in study["rows"])


def test_a_profiles_link_share_and_per_op_cost_price_the_collectives():
    from dataclasses import replace  # noqa: PLC0415

    from datarax.estimate.cost import estimate_step  # noqa: PLC0415
    from datarax.estimate.step_time import combine  # noqa: PLC0415
    from datarax.hardware.topology import plan_hardware_devices  # noqa: PLC0415

    layout = plan_hardware_devices("h100-sxm", hosts=2, ici={"fsdp": 8}, dcn={"fsdp": 2})
    model = {"kind": "transformer", "layers": 4, "d_model": 1024, "d_ff": 4096, "heads": 8,
             "kv_heads": 8, "vocab": 32000, "seq_len": 2048}  # fmt: skip
    parts = estimate_step("h100-sxm", layout.axes_detail, model, 32).predicted_components
    calls = sum(c.count for c in estimate_step(
        "h100-sxm", layout.axes_detail, model, 32)["collectives"])  # fmt: skip
    assert parts["calls_fwd"] + parts["calls_bwd"] == calls > 0
    # nothing hidden: the step grows by the collectives' extra time exactly
    base = replace(PUBLISHED_CONSTANTS["published-gpu-jax"], overlap=0.0)
    slower = replace(base, link=0.5, collective_s=1e-3)
    extra = combine(parts, slower).step_s - combine(parts, base).step_s
    assert extra == pytest.approx(parts["comm_fwd"] + parts["comm_bwd"] + calls * 1e-3)
