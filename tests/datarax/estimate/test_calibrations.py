"""Calibration profiles (datarax.estimate.calibrations): the published ones, the default
per hardware kind, the refusals, and estimates priced with a named profile."""

from __future__ import annotations

import itertools
import math

import pytest

from datarax.errors import PlanError
from datarax.estimate.calibrations import (
    GRID_POINTS,
    CalibrationProfile,
    default_profile,
    fit_constants,
    fit_jobs,
    fit_work,
    get_profile,
    leave_one_out,
    mean_error,
    profile_for,
    published_profiles,
)
from datarax.estimate.cost import estimate_step
from datarax.estimate.recommend import recommend_meshes
from datarax.estimate.step_time import PUBLISHED_CONSTANTS, combine
from datarax.hardware.chips import get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.plan.layout import PlanCancelled

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


def _rows(slowdowns):
    """Rows of plans of several shapes, each measured ``slowdown`` x its published step."""
    out = []
    for (topology, ici), batch in itertools.product(
        (("2x4", {"fsdp": 8}), ("4x4", {"fsdp": 4, "tensor": 4})), (16, 32, 64)
    ):
        layout = plan_hardware_devices("tpu-v6e", topology=topology, ici=ici)
        est = estimate_step("tpu-v6e", layout.axes_detail, MODEL, batch)
        out.append((est.predicted_components, est.step_s))
    return [(parts, step * s) for (parts, step), s in zip(out, slowdowns, strict=False)]


def test_the_leave_one_out_refits_take_the_whole_fit_less_one_row_in_one_pass():
    # issue 58, class 4: each refit is the whole fit's sums less its row (one pass over
    # the grid), not a fit of its own over the other rows: the same answer as refitting
    base = PUBLISHED_CONSTANTS["published-tpu-jax"]
    rows = _rows([1.1, 1.3, 1.2, 1.6, 1.05, 1.4])
    refit = []
    for i, (parts, measured) in enumerate(rows):
        cal = fit_constants(rows[:i] + rows[i + 1 :], base)
        refit.append(abs(combine(parts, cal).step_s / measured - 1))
    fit = fit_jobs(rows, base)
    assert fit.leave_one_out_mae == pytest.approx(sum(refit) / len(refit), rel=1e-12)
    assert fit.constants == fit_constants(rows, base)
    assert fit.training_mae == mean_error(rows, fit.constants)
    assert fit.published_mae == mean_error(rows, base)
    # the work counted: each row at each grid point, and once more per refit from 3 rows
    assert fit_work(2) == 2 * GRID_POINTS and fit_work(6) == 12 * GRID_POINTS
    assert fit_work(256) <= 20_000_000  # DATARAX_MAX_CALIBRATION_CELLS' default
    with pytest.raises(PlanCancelled):
        fit_jobs(rows, base, should_stop=lambda: True)


@pytest.mark.parametrize("measured", [0.0, -1.0, 1e-320, math.inf, math.nan, True])
def test_a_measured_step_no_fit_can_take_is_refused_by_every_fit(measured):
    # issue 58, class 6: 0 was a ZeroDivisionError, 1e-320 an overflow to infinity
    base = PUBLISHED_CONSTANTS["published-tpu-jax"]
    rows = [*_rows([1.2, 1.3]), (_rows([1.0])[0][0], measured)]
    for fit in (fit_jobs, fit_constants, mean_error, leave_one_out):
        with pytest.raises(PlanError) as err:
            fit(rows, base)
        assert err.value.code == "invalid_calibration", fit


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e308])
def test_step_parts_no_fit_can_price_are_refused(value):
    base = PUBLISHED_CONSTANTS["published-tpu-jax"]
    parts, measured = _rows([1.2])[0]
    rows = [({**parts, "mm_fwd": value, "mm_bwd": value}, measured)] * 3
    with pytest.raises(PlanError) as err:
        fit_jobs(rows, base)
    assert err.value.code == "invalid_calibration"
    assert "finite" in err.value.message or "overflow" in err.value.message


def test_a_constant_fitted_at_an_edge_of_the_grid_is_named_with_its_edge():
    # issue 58, class 11: steps faster than the matmuls' peak allows put matmul at the
    # top of its grid (1.00), the error growing away from it: the fit says so
    base = PUBLISHED_CONSTANTS["published-tpu-jax"]
    fast = fit_jobs(_rows([0.2] * 6), base)
    assert fast.constants.matmul == 1.0
    assert any(w.startswith("matmul 1.00 is the highest value the fit searches (0.30 to 1.00)")
               for w in fast.warnings), fast.warnings  # fmt: skip
    # a fit well inside the grid names no matmul edge
    inside = fit_jobs(_rows([1.3, 1.3, 1.3, 1.3, 1.3, 1.3]), base)
    assert 0.3 < inside.constants.matmul < 1.0
    assert not any(w.startswith("matmul") for w in inside.warnings), inside.warnings
