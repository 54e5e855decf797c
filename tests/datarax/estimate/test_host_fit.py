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
    assert STAGES[0] == "overhead" and len(set(STAGES)) == 5
