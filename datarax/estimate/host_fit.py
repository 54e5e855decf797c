"""The constants of a ``host`` calibration profile from its measurements: arithmetic
on the rows :mod:`datarax.estimate.host_calibration` measures (see that module), with
no JAX, so the HTTP process fits them.

``matmul`` and ``attention`` are the fraction of the catalog's peak that reproduces the
measured time of the FLOPs the step model prices for that work
(:func:`datarax.estimate.step_time.step_components`), ``hbm`` the fraction of the
catalog's bandwidth a float32 elementwise pass reached, ``overhead_s`` a trivial step's
time.

From the collectives (GPU and CPU devices: their ring is the catalog's fast link, one
device's egress): each kind's times against the ring model's at the catalog's figures,
a line through its sizes, whose slope gives ``link`` (the share of the catalog's link the
collectives reach) and whose intercept, less a program's dispatch (``overhead``), gives
``collective_s`` (what each op costs besides its bytes: a runtime's rendezvous); the
medians over the kinds. On TPU the ring over one host's chips depends on the slice's
torus, which the measurement does not pin down: ``link`` and ``collective_s`` stay the
published profile's there, as they do with one device.

``overlap`` is the smaller of the published profile's and the ``overlap`` stage's share:
a loop of matmuls and an all-gather side by side show what the runtime can hide at best,
and a training step's dependencies hide less (the published fit's figure).

``layer_s`` and ``overhead_s`` come last, from the ``step`` stage: what the tiny
transformer's measured steps take beyond the work the constants above price for them,
the difference between two layers and one (``layer_s``) and what one layer leaves
besides (``overhead_s``, at least the dispatch of the ``overhead`` stage).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, TypedDict

from datarax.answers.calibrations import CalibrationStack
from datarax.estimate.calibrations import CalibrationProfile, default_constants
from datarax.estimate.cost import collective_seconds, estimate_step
from datarax.estimate.step_time import Calibration, combine
from datarax.hardware.entry import AxisLink, Hardware

__all__ = ["STAGES", "Measurement", "attention_priced_flops", "fit_host_profile"]


class Measurement(TypedDict, total=False):
    """One measured row; ``stage`` says which members it has."""

    stage: str  # one of STAGES
    seconds: float  # one run (overhead, collectives) or one iteration (the others)
    dtype: str  # matmul, attention, hbm
    shape: list[int]  # matmul [m, k, n]; attention [batch, seq, heads, head_dim]
    flops_per_s: float  # matmul
    platform: str  # attention: the kernel's platform
    priced_flops_per_s: float  # attention: the FLOPs the step model prices, a second
    elements: int  # hbm (``dtype`` too: the pass's)
    bytes_per_s: float  # hbm: one read and one write a second
    kind: str  # collectives: all-gather, reduce-scatter, all-reduce, all-to-all
    bytes_per_device: float  # collectives: V, as the ring model reads it
    ring_bytes_per_s: float  # collectives: what the ring model prices, a second
    devices: int  # collectives: the ring's devices
    compute_s: float  # overlap: the matmuls alone
    gather_s: float  # overlap: the all-gather alone
    overlap: float  # overlap: the share of the shorter hidden behind the other
    model: dict[str, Any]  # step: the tiny transformer timed (``batch``, ``devices`` too)
    batch: int  # step


STAGES: tuple[str, ...] = (
    "overhead", "matmul", "attention", "hbm", "collectives", "overlap", "step",
)  # fmt: skip
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
    base = default_constants(hw)
    matmul = _median(
        [r["flops_per_s"] for r in measurements if r["stage"] == "matmul" and r["dtype"] == dtype],
        f"{dtype} matmul",
    ) / hw.peak_flops(dtype)
    attention = _median(
        [r["priced_flops_per_s"] for r in measurements if r["stage"] == "attention"], "attention"
    ) / hw.peak_flops("bfloat16")
    # the float32 passes (rows from before dtypes were recorded are): the bandwidth the
    # memory reaches. A bfloat16 pass is recorded beside them, not fitted: on CPU devices
    # and on TPU v5e it is bound by the conversions (a third and a half the rate a byte),
    # and pricing the model's passes at that rate made TPU v5e steps 17-48% too slow
    # where the float32 rate gave 13.5% (BENCHMARKS.md, "Host calibration").
    hbm_rows = [r for r in measurements if r["stage"] == "hbm"]
    f32 = [r for r in hbm_rows if r.get("dtype", "float32") == "float32"]
    hbm = _median([r["bytes_per_s"] for r in f32 or hbm_rows], "hbm") / max(hw.hbm_bytes_per_s, 1.0)
    overhead = _median([r["seconds"] for r in measurements if r["stage"] == "overhead"], "overhead")
    link, collective_s = _collective_constants(measurements, hw, overhead)
    overlaps = [r["overlap"] for r in measurements if r["stage"] == "overlap"]
    constants = replace(
        base,
        matmul=matmul,
        attention=attention,
        hbm=hbm,
        overhead_s=overhead,
        overlap=min(base.overlap, float(statistics.median(overlaps))) if overlaps else base.overlap,
        link=base.link if link is None else link,
        collective_s=base.collective_s if collective_s is None else collective_s,
        source=f"host calibration {profile_id}: measured on the live devices",
    )
    layer_s, step_s = _fixed_costs(measurements, hw, constants)
    if layer_s is not None and step_s is not None:
        constants = replace(constants, layer_s=layer_s, overhead_s=max(overhead, step_s))
    return CalibrationProfile(
        id=profile_id,
        kind="host",
        hardware_kind=hw.kind,
        stack=CalibrationStack.from_json(stack),
        constants=constants,
        hardware=hw.name,
        device_kind=device_kind,
        measurements=tuple(dict(m) for m in measurements),
        created_at=created_at,
        status="done",
    )


def _collective_constants(
    measurements: Sequence[Mapping[str, Any]], hw: Hardware, dispatch_s: float
) -> tuple[float | None, float | None]:
    """``(link, collective_s)`` from the collectives rows (see the module); ``None``
    where they do not say (TPU, one device, fewer than two sizes of any kind)."""
    if hw.kind == "tpu":
        return None, None
    slopes, intercepts = [], []
    for kind in sorted({r["kind"] for r in measurements if r["stage"] == "collectives"}):
        rows = [r for r in measurements if r["stage"] == "collectives" and r["kind"] == kind
                and "bytes_per_device" in r and "seconds" in r]  # fmt: skip
        points = sorted({(_priced(r, hw), float(r["seconds"])) for r in rows})
        if len(points) < 2 or points[-1][0] <= points[0][0]:
            continue
        (x0, y0), (x1, y1) = points[0], points[-1]
        slope = (y1 - y0) / (x1 - x0)
        if slope <= 0:
            continue
        slopes.append(slope)
        intercepts.append(y0 - slope * x0)
    if not slopes:
        return None, None
    link = 1.0 / float(statistics.median(slopes))
    return link, max(0.0, float(statistics.median(intercepts)) - dispatch_s)


def _priced(row: Mapping[str, Any], hw: Hardware) -> float:
    """The ring model's seconds of one measured collective at the catalog's fast link
    (:func:`datarax.estimate.cost.collective_seconds` over one axis of the devices)."""
    volume = float(row["bytes_per_device"])
    passes = 2 if row["kind"] == "all-reduce" else 1
    # rows from before ``devices`` was recorded: the ring's share of V gives n
    n = int(row.get("devices") or round(1.0 / (1.0 - row["ring_bytes_per_s"] * row["seconds"]
                                                 / (passes * volume))))  # fmt: skip
    return collective_seconds(row["kind"], volume, _host_axis(hw, n), hw)


def _host_axis(hw: Hardware, n: int) -> AxisLink:
    """One mesh axis over ``n`` devices of one host, on the catalog's fast link."""
    return AxisLink(name="fsdp", size=n, ici=n, dcn=1, link=hw.fast_link,
                    bytes_per_s=hw.fast_link_bytes_per_s)  # fmt: skip


def _fixed_costs(
    measurements: Sequence[Mapping[str, Any]], hw: Hardware, constants: Calibration
) -> tuple[float | None, float | None]:
    """``(layer_s, step's fixed seconds)`` from the ``step`` rows (see the module), or
    ``(None, None)`` without a one-layer and a two-layer row."""
    priced = replace(constants, overhead_s=0.0, layer_s=0.0)
    residual: dict[int, list[float]] = {}
    for row in measurements:
        if row["stage"] != "step":
            continue
        axis = _host_axis(hw, int(row["devices"]))
        parts = estimate_step(hw, [axis], row["model"], int(row["batch"]))
        work = combine(parts.predicted_components, priced).step_s
        residual.setdefault(int(row["model"]["layers"]), []).append(row["seconds"] - work)
    if 1 not in residual or 2 not in residual:
        return None, None
    one, two = statistics.median(residual[1]), statistics.median(residual[2])
    layer_s = max(0.0, two - one)
    return layer_s, max(0.0, one - layer_s)
