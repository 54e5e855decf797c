"""Calibration profiles (datarax.estimate.calibrations): the published ones, the default
per hardware kind, the refusals, and estimates priced with a named profile."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.estimate.calibrations import (
    CalibrationProfile,
    default_profile,
    fit_constants,
    get_profile,
    leave_one_out,
    mean_error,
    profile_for,
    published_profiles,
)
from datarax.estimate.cost import estimate_step
from datarax.estimate.recommend import recommend_meshes
from datarax.estimate.step_time import PUBLISHED_CONSTANTS
from datarax.hardware.chips import get_hardware
from datarax.hardware.topology import plan_hardware_devices

MODEL = {"name": "llama3.1-8b", "remat": "full"}


def test_the_published_profiles_name_their_kind_and_stack():
    ids = [p.id for p in published_profiles()]
    assert {"published-tpu-jax", "published-gpu-jax", "published-gpu-pytorch"} <= set(ids)
    for profile in published_profiles():
        answer = profile.to_json()
        assert answer["kind"] == "published" and answer["status"] == "done"
        assert answer["constants"]["matmul"] == PUBLISHED_CONSTANTS[profile.id].matmul
        assert answer["stack"]["framework"] == profile.id.rsplit("-", 1)[1]
        assert answer["hardware_kind"] == profile.id.split("-")[1]
    fitted = get_profile("published-gpu-jax").to_json()["error"]
    assert fitted is not None and fitted["training_runs"] >= 2


@pytest.mark.parametrize(
    ("hardware", "profile"),
    [("tpu-v5p", "published-tpu-jax"), ("h100-sxm", "published-gpu-jax"),
     ("cpu", "published-cpu-jax")],
)  # fmt: skip
def test_a_plan_defaults_to_its_kinds_jax_profile(hardware, profile):
    assert default_profile(get_hardware(hardware)).id == profile
    assert profile_for(get_hardware(hardware), None).id == profile


def test_unknown_and_foreign_profiles_are_refused_with_what_would_do():
    with pytest.raises(PlanError) as err:
        get_profile("published-gpu-jx")
    assert err.value.code == "unknown_calibration"
    assert "did you mean 'published-gpu-jax'" in err.value.message
    with pytest.raises(PlanError) as err:
        profile_for(get_hardware("tpu-v5p"), "published-gpu-pytorch")
    assert err.value.code == "invalid_calibration"
    assert "published-tpu-jax" in err.value.message


def test_an_estimate_is_priced_with_the_profile_it_names():
    layout = plan_hardware_devices(
        "h100-sxm", hosts=2, ici={"data": 1, "fsdp": 8}, dcn={"data": 2, "fsdp": 1}
    )
    jax = estimate_step("h100-sxm", layout.axes_detail, MODEL, 32)
    torch = estimate_step(
        "h100-sxm", layout.axes_detail, MODEL, 32, calibration="published-gpu-pytorch"
    )
    assert (
        jax.calibration == "published-gpu-jax" and jax.to_json()["calibration"] == jax.calibration
    )
    assert torch.calibration == "published-gpu-pytorch"
    # the same parts, other constants: PyTorch's matmuls reach less of the peak
    assert torch.predicted_components == jax.predicted_components
    assert torch.step_s != jax.step_s and torch.roofline_s == jax.roofline_s


def test_recommendations_price_every_candidate_with_the_profile_and_carry_it():
    out = recommend_meshes(
        "h100-sxm", model=MODEL, global_batch=32, hosts=2, calibration="published-gpu-pytorch"
    )
    for candidate in out["candidates"]:
        assert candidate["step_estimate"]["calibration"] == "published-gpu-pytorch"
        assert candidate["plan_request"]["calibration"] == "published-gpu-pytorch"
    with pytest.raises(PlanError) as err:  # the request's fault, not a rejected candidate
        recommend_meshes("h100-sxm", model=MODEL, global_batch=32, hosts=2, calibration="x")
    assert err.value.code == "unknown_calibration"


def test_the_fit_learns_a_uniform_slowdown_and_leave_one_out_needs_three_rows():
    base = PUBLISHED_CONSTANTS["published-tpu-jax"]
    layout = plan_hardware_devices("tpu-v6e", topology="2x4", ici={"fsdp": 8})
    rows = []
    for batch in (8, 16, 32):
        est = estimate_step("tpu-v6e", layout.axes_detail, MODEL, batch)
        rows.append((est.predicted_components, 1.25 * est.step_s))
    fitted = fit_constants(rows, base)
    assert mean_error(rows, fitted) < 0.03 < mean_error(rows, base)
    assert fitted.overhead_s == base.overhead_s and fitted.attention <= fitted.matmul
    assert fit_constants([], base) is base
    assert leave_one_out(rows[:2], base) is None
    assert leave_one_out(rows, base) < 0.05
    # a stored profile reads back as it was written
    profile = get_profile("published-gpu-pytorch")
    assert CalibrationProfile.from_json(profile.to_json()) == profile
