"""What a check answers (app.services.compile_checks.results): ``fits`` is judged here,
never defaulted to the library's true."""

from __future__ import annotations

import pytest

from app.services.compile_checks import results as compile_checks

FIGURES = {"fits": True, "memory": {"hbm_peak_bytes": 3 * 2**40, "peak_bytes": 2**40},
           "xla_error": None}  # fmt: skip


@pytest.mark.parametrize(
    ("result", "bound", "fits", "reason"),
    [
        (FIGURES, None, None, "unknown"),  # the library's default true is not kept
        (FIGURES, 4 * 2**40, True, "within"),
        (FIGURES, 2 * 2**40, False, "beyond"),
        ({**FIGURES, "memory": {"peak_bytes": 2**40}}, 2 * 2**40, True, "within"),
        ({**FIGURES, "memory": None}, 2**40, None, "no memory figures"),
        ({"fits": False, "memory": None, "xla_error": "RESOURCE_EXHAUSTED"}, None, False, "XLA"),
    ],
    ids=["no-bound", "within", "beyond", "peak-only", "no-figures", "xla-refused"],
)
def test_fits_is_judged_never_defaulted(result, bound, fits, reason):
    judged = compile_checks.judge_fits(result, bound, "test bound")
    assert judged["fits"] is fits, judged
    assert reason in judged["fits_reason"], judged
