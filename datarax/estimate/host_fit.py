"""The constants of a ``host`` calibration profile from its measurements: arithmetic
on the rows :mod:`datarax.estimate.host_calibration` measures (see that module), with
no JAX, so the HTTP process fits them.

``matmul`` and ``attention`` are the fraction of the catalog's peak that reproduces the
measured time of the FLOPs the step model prices for that work
(:func:`datarax.estimate.step_time.step_components`), ``hbm`` the fraction of the
catalog's bandwidth an elementwise pass reached, ``overhead_s`` a trivial step's time;
``overlap`` stays the published profile's, which a micro-benchmark does not measure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypedDict

from datarax.estimate.calibrations import CalibrationProfile, default_profile
from datarax.hardware.entry import Hardware

__all__ = ["STAGES", "Measurement", "attention_priced_flops", "fit_host_profile"]


class Measurement(TypedDict, total=False):
    """One measured row; ``stage`` says which members it has."""

    stage: str  # overhead, matmul, attention, hbm, collectives
    seconds: float  # one run (overhead, collectives) or one iteration (the others)
    dtype: str  # matmul, attention
    shape: list[int]  # matmul [m, k, n]; attention [batch, seq, heads, head_dim]
    flops_per_s: float  # matmul
    platform: str  # attention: the kernel's platform
    priced_flops_per_s: float  # attention: the FLOPs the step model prices, a second
    elements: int  # hbm
    bytes_per_s: float  # hbm: one read and one write a second
    kind: str  # collectives: all-gather, reduce-scatter, all-reduce, all-to-all
    bytes_per_device: float  # collectives: V, as the ring model reads it
    ring_bytes_per_s: float  # collectives: what the ring model prices, a second


STAGES: tuple[str, ...] = ("overhead", "matmul", "attention", "hbm", "collectives")
"""The measurement stages, in the order a calibration runs them."""


def attention_priced_flops(batch: int, seq: int, heads: int, head_dim: int) -> float:
    """The FLOPs the step model prices for one causal fused attention, forward and
    backward (:func:`datarax.estimate.step_time.step_components`: the causal half
    skipped, the backward kernel 2.5 times the forward)."""
    forward = batch * seq * 2.0 * seq * heads * (2 * head_dim)
    return 0.5 * forward + 0.5 * 2.5 * forward


def _median(values: Sequence[float], what: str) -> float:
    if not values:
        raise ValueError(f"the measurements hold no {what} rows")
    return float(statistics.median(values))


def fit_host_profile(
    measurements: Sequence[Mapping[str, Any]],
    hw: Hardware,
    *,
    profile_id: str,
    created_at: str,
    stack: Mapping[str, str | None],
    device_kind: str | None,
    dtype: str = "bfloat16",
) -> CalibrationProfile:
    """The ``host`` profile of ``hw`` from :func:`measure_stage`'s rows (see the module).

    Args:
      measurements: every stage's rows.
      hw: the catalog entry the devices are (its peaks and bandwidth are the references).
      profile_id, created_at, stack, device_kind: the profile's own.
      dtype: the compute dtype whose matmul rows give ``matmul``.

    Raises:
      ValueError: a stage's rows are missing.
    """
    base = default_profile(hw).constants
    matmul = _median(
        [r["flops_per_s"] for r in measurements if r["stage"] == "matmul" and r["dtype"] == dtype],
        f"{dtype} matmul",
    ) / hw.peak_flops(dtype)
    attention = _median(
        [r["priced_flops_per_s"] for r in measurements if r["stage"] == "attention"], "attention"
    ) / hw.peak_flops("bfloat16")
    hbm = _median([r["bytes_per_s"] for r in measurements if r["stage"] == "hbm"], "hbm") / max(
        hw.hbm_bytes_per_s, 1.0
    )
    overhead = _median([r["seconds"] for r in measurements if r["stage"] == "overhead"], "overhead")
    constants = replace(
        base,
        matmul=matmul,
        attention=attention,
        hbm=hbm,
        overhead_s=overhead,
        source=f"host calibration {profile_id}: measured on the live devices",
    )
    return CalibrationProfile(
        id=profile_id,
        kind="host",
        hardware_kind=hw.kind,
        stack=dict(stack),
        constants=constants,
        hardware=hw.name,
        device_kind=device_kind,
        measurements=tuple(dict(m) for m in measurements),
        created_at=created_at,
        status="done",
    )
