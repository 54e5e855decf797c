"""The host profile's constants from its measurements (issue 39, section 2): the
fractions the step model needs to reproduce each measured time."""

from __future__ import annotations

import pytest

from datarax.estimate.calibrations import default_profile
from datarax.estimate.host_fit import STAGES, attention_priced_flops, fit_host_profile
from datarax.hardware.chips import get_hardware

ROWS = [
    {"stage": "overhead", "seconds": 0.002},
    {"stage": "overhead", "seconds": 0.004},
    {"stage": "overhead", "seconds": 0.003},
    {"stage": "matmul", "dtype": "bfloat16", "flops_per_s": 2e14},
    {"stage": "matmul", "dtype": "bfloat16", "flops_per_s": 4e14},
    {"stage": "matmul", "dtype": "float32", "flops_per_s": 1e12},
    {"stage": "attention", "priced_flops_per_s": 1e14},
    {"stage": "hbm", "bytes_per_s": 8e11},
    {"stage": "collectives", "kind": "all-reduce", "ring_bytes_per_s": 1e10},
]


def test_the_constants_reproduce_the_measured_rates():
    hw = get_hardware("h100-sxm")
    profile = fit_host_profile(ROWS, hw, profile_id="host-1", created_at="2026-12-06T00:00:00Z",
                               stack={"framework": "jax", "jax": "0.12"},
                               device_kind=hw.device_kind)  # fmt: skip
    c = profile.constants
    assert c.matmul == pytest.approx(3e14 / hw.peak_flops("bfloat16"))  # the median
    assert c.attention == pytest.approx(1e14 / hw.peak_flops("bfloat16"))
    assert c.hbm == pytest.approx(8e11 / hw.hbm_bytes_per_s)
    assert c.overhead_s == pytest.approx(0.003)
    # what a micro-benchmark does not measure stays the published profile's
    assert c.overlap == default_profile(hw).constants.overlap
    assert profile.kind == "host" and profile.hardware == "h100-sxm" and profile.status == "done"
    assert profile.to_json()["measurements"] == ROWS and "host-1" in c.source
    f32 = fit_host_profile(ROWS, hw, profile_id="h", created_at="", stack={},
                           device_kind=None, dtype="float32")  # fmt: skip
    assert f32.constants.matmul == pytest.approx(1e12 / hw.peak_flops("float32"))


def test_a_missing_stage_is_said():
    hw = get_hardware("cpu")
    with pytest.raises(ValueError, match="no attention rows"):
        fit_host_profile([r for r in ROWS if r["stage"] != "attention"], hw, profile_id="h",
                         created_at="", stack={}, device_kind="cpu")  # fmt: skip


def test_attention_is_priced_as_the_step_model_prices_a_causal_fused_kernel():
    # forward 4 B S^2 H hd, half of it (causal); backward 2.5 times that
    forward = 4.0 * 2 * 128 * 128 * 4 * 32
    assert attention_priced_flops(2, 128, 4, 32) == pytest.approx(0.5 * forward * 3.5)
    assert STAGES[0] == "overhead" and len(set(STAGES)) == 7


def _collective_rows(hw, link: float, per_op_s: float, dispatch_s: float) -> list[dict]:
    """Rows of a host whose collectives reach ``link`` of the catalog's ring time and
    cost ``per_op_s`` each besides, every run paying ``dispatch_s`` to launch."""
    from datarax.estimate.cost import collective_seconds  # noqa: PLC0415
    from datarax.hardware.entry import AxisLink  # noqa: PLC0415

    axis = AxisLink("d", 8, 8, 1, hw.fast_link, hw.fast_link_bytes_per_s)
    rows = []
    for kind in ("all-gather", "reduce-scatter", "all-reduce", "all-to-all"):
        for volume in (1 << 20, 1 << 23):
            seconds = collective_seconds(kind, volume, axis, hw) / link + per_op_s + dispatch_s
            passes = 2 if kind == "all-reduce" else 1
            rows.append({"stage": "collectives", "kind": kind, "bytes_per_device": volume,
                         "devices": 8, "seconds": seconds,
                         "ring_bytes_per_s": passes * 7 / 8 * volume / seconds})  # fmt: skip
    return rows


@pytest.mark.parametrize("name", ["cpu", "h100-sxm"])
def test_the_collectives_give_the_links_share_and_each_ops_cost(name):
    hw = get_hardware(name)
    rows = [*ROWS[:8], *_collective_rows(hw, link=0.25, per_op_s=0.004, dispatch_s=0.003)]
    c = fit_host_profile(rows, hw, profile_id="h", created_at="", stack={},
                         device_kind=None).constants  # fmt: skip
    # the overhead rows' median (a program's dispatch) is not the op's own cost
    assert c.link == pytest.approx(0.25) and c.collective_s == pytest.approx(0.004)
    # rows from before ``devices`` was recorded give the same
    old = [{k: v for k, v in r.items() if k != "devices"} for r in rows]
    again = fit_host_profile(old, hw, profile_id="h", created_at="", stack={},
                             device_kind=None).constants  # fmt: skip
    assert (again.link, again.collective_s) == pytest.approx((c.link, c.collective_s))


def test_without_two_sizes_or_on_tpu_the_collectives_keep_the_published_figures():
    for name, rows in (("h100-sxm", ROWS), ("tpu-v5e", ROWS[:8] + _collective_rows(
            get_hardware("tpu-v5e"), link=0.25, per_op_s=0.004, dispatch_s=0.0))):  # fmt: skip
        hw = get_hardware(name)
        c = fit_host_profile(rows, hw, profile_id="h", created_at="", stack={},
                             device_kind=None).constants  # fmt: skip
        base = default_profile(hw).constants
        assert (c.link, c.collective_s) == (base.link, base.collective_s) == (1.0, 0.0)


@pytest.mark.parametrize(("measured", "expected"), [(0.0, 0.0), (1.0, None)])
def test_overlap_is_the_smaller_of_the_measured_and_the_published(measured, expected):
    hw = get_hardware("cpu")
    rows = [*ROWS, {"stage": "overlap", "seconds": 0.01, "compute_s": 0.005,
                    "gather_s": 0.005, "overlap": measured}]  # fmt: skip
    c = fit_host_profile(rows, hw, profile_id="h", created_at="", stack={},
                         device_kind=None).constants  # fmt: skip
    published = default_profile(hw).constants.overlap
    assert c.overlap == (published if expected is None else expected)


def test_hbm_is_the_float32_pass_whatever_the_compute_dtype():
    # a bfloat16 pass bound by its conversions is recorded, not fitted
    hw = get_hardware("h100-sxm")
    rows = [*ROWS[:7], {"stage": "hbm", "dtype": "bfloat16", "bytes_per_s": 4e11},
            {"stage": "hbm", "dtype": "float32", "bytes_per_s": 8e11}]  # fmt: skip
    for dtype in ("bfloat16", "float32"):
        profile = fit_host_profile(rows, hw, profile_id="h", created_at="", stack={},
                                   device_kind=None, dtype=dtype)  # fmt: skip
        assert profile.constants.hbm == pytest.approx(8e11 / hw.hbm_bytes_per_s)


def test_the_tiny_steps_give_a_layers_and_a_steps_fixed_cost():
    from dataclasses import replace  # noqa: PLC0415

    from datarax.estimate.cost import estimate_step  # noqa: PLC0415
    from datarax.estimate.host_calibration import TINY  # noqa: PLC0415
    from datarax.estimate.step_time import combine  # noqa: PLC0415
    from datarax.hardware.entry import AxisLink  # noqa: PLC0415

    hw = get_hardware("cpu")
    without = fit_host_profile(ROWS, hw, profile_id="h", created_at="", stack={},
                               device_kind=None).constants  # fmt: skip
    assert without.layer_s == 0.0  # no step rows: none
    axis = AxisLink("fsdp", 8, 8, 1, hw.fast_link, hw.fast_link_bytes_per_s)
    priced = replace(without, overhead_s=0.0)
    steps = []
    for layers in (1, 2):
        model = {**TINY, "layers": layers}
        parts = estimate_step(hw, [axis], model, 16).predicted_components
        seconds = combine(parts, priced).step_s + layers * 0.005 + 0.010
        steps.append({"stage": "step", "model": model, "batch": 16, "devices": 8,
                      "seconds": seconds})  # fmt: skip
    c = fit_host_profile([*ROWS, *steps], hw, profile_id="h", created_at="", stack={},
                         device_kind=None).constants  # fmt: skip
    assert c.layer_s == pytest.approx(0.005) and c.overhead_s == pytest.approx(0.010)
    # a step cheaper than a program's dispatch leaves the dispatch as the step's cost
    cheap = [{**r, "seconds": r["seconds"] - 0.0095} for r in steps]
    c = fit_host_profile([*ROWS, *cheap], hw, profile_id="h", created_at="", stack={},
                         device_kind=None).constants  # fmt: skip
    assert c.overhead_s == pytest.approx(0.003)  # the overhead rows' median
