"""Calibration profiles (DESIGN v1.3, "Calibrations"): the step-time constants
(:class:`~datarax.estimate.step_time.Calibration`) as named profiles, each with the
accelerator kind and the software stack it was fitted on.

The ``published`` profiles ship with the library, read-only: the constants
``benchmarks/calibrate.py`` fits on published measured runs, one profile per accelerator
kind and stack (:data:`~datarax.estimate.step_time.PUBLISHED_CONSTANTS`). A plan names
one with ``calibration``; without it, a plan on hardware of a kind uses that kind's
``jax`` profile (:func:`default_profile`), since the program it prices is a JAX one.
Plain data; nothing touches a device. A profile is
:class:`~datarax.answers.calibrations.CalibrationProfile`, the service's answer itself.

Example:
  >>> from datarax.hardware.chips import get_hardware
  >>> default_profile(get_hardware("tpu-v5p")).id
  'published-tpu-jax'
  >>> get_profile("published-gpu-pytorch").stack["framework"]
  'pytorch'
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

import numpy as np

from datarax.answers.calibrations import CalibrationProfile, CalibrationStack, PublishedFitError
from datarax.errors import PlanError
from datarax.estimate.step_time import (
    PUBLISHED_CONSTANTS,
    PUBLISHED_ERRORS,
    Calibration,
    combine,
)
from datarax.hardware.entry import Hardware

__all__ = [
    "CalibrationProfile",
    "default_constants",
    "default_profile",
    "fit_constants",
    "is_published",
    "leave_one_out",
    "mean_error",
    "get_profile",
    "profile_for",
    "published_profiles",
]

_PUBLISHED_AT = "2026-12-06T00:00:00Z"
"""When the shipped tables were last fitted (the commit that wrote them)."""


MATMUL = [x / 100 for x in range(30, 101, 1)]
ATTENTION = [x / 100 for x in range(30, 101, 5)]
OVERLAP = [x / 10 for x in range(0, 11)]
HBM = [0.3, 0.5, 0.7, 0.9]
"""The grid :func:`fit_constants` searches (a fused attention kernel never beats the
matmuls: ``attention <= matmul``)."""


def fit_constants(
    rows: Iterable[tuple[Mapping[str, float], float]], base: Calibration
) -> Calibration:
    """The grid point with the least mean absolute relative error over ``rows``
    (``(step_components, measured seconds)``; the formula of
    :func:`~datarax.estimate.step_time.combine`, the whole grid at once); ``base``'s
    ``overhead_s``, mixture-of-experts and collective constants are kept. No rows:
    ``base``."""
    rows = list(rows)
    if not rows:
        return base
    grid = np.array([g for g in itertools.product(MATMUL, ATTENTION, OVERLAP, HBM) if g[1] <= g[0]])
    mm, at, ov, hbm = (grid[:, i][None, :] for i in range(4))

    def col(key: str) -> np.ndarray:
        return np.array([parts.get(key, 0.0) for parts, _ in rows])[:, None]

    fwd = (col("mm_fwd") + col("dot_fwd")) / mm + col("flash_fwd") / at + col("mem_fwd") / hbm
    bwd = (col("mm_bwd") + col("dot_bwd")) / mm + col("flash_bwd") / at + col("mem_bwd") / hbm
    off = col("offload")
    comm_fwd = col("comm_fwd") / base.link + col("calls_fwd") * base.collective_s
    comm_bwd = col("comm_bwd") / base.link + col("calls_bwd") * base.collective_s
    step = (
        fwd
        + bwd
        + np.maximum(0.0, comm_fwd + off - ov * fwd)
        + np.maximum(0.0, comm_bwd + off - ov * bwd)
        + base.overhead_s
        + col("layers") * base.layer_s
    )
    measured = np.array([m for _, m in rows])[:, None]
    best = int(np.argmin((np.abs(step - measured) / measured).mean(axis=0)))
    m, a, o, h = (float(x) for x in grid[best])
    return replace(base, matmul=m, attention=a, overlap=o, hbm=h)


def mean_error(rows: Sequence[tuple[Mapping[str, float], float]], cal: Calibration) -> float:
    """Mean absolute relative error of ``cal``'s steps over ``rows``."""
    errors = [abs(combine(parts, cal).step_s / measured - 1) for parts, measured in rows]
    return sum(errors) / len(errors) if errors else float("nan")


def leave_one_out(
    rows: Sequence[tuple[Mapping[str, float], float]], base: Calibration
) -> float | None:
    """Mean absolute relative error of each row predicted by the fit of the others;
    ``None`` under 3 rows (a fit on one row says nothing of another)."""
    if len(rows) < 3:
        return None
    errors = []
    for i, (parts, measured) in enumerate(rows):
        cal = fit_constants([r for j, r in enumerate(rows) if j != i], base)
        errors.append(abs(combine(parts, cal).step_s / measured - 1))
    return sum(errors) / len(errors)


def _published(profile_id: str, constants: Calibration) -> CalibrationProfile:
    _, hardware_kind, framework = profile_id.split("-", 2)
    backend = {"tpu": "tpu", "gpu": "cuda", "cpu": "cpu"}[hardware_kind]
    error = PUBLISHED_ERRORS.get(profile_id)
    return CalibrationProfile(
        id=profile_id,
        kind="published",
        created_at=_PUBLISHED_AT,
        hardware_kind=hardware_kind,
        stack=CalibrationStack(framework=framework, backend=backend),
        constants=constants,
        error=None if error is None else PublishedFitError.from_json(error),
    )


_PUBLISHED = {pid: _published(pid, cal) for pid, cal in PUBLISHED_CONSTANTS.items()}


def is_published(profile_id: str) -> bool:
    return profile_id in _PUBLISHED


def published_profiles() -> list[CalibrationProfile]:
    """The shipped profiles, by id."""
    return [_PUBLISHED[pid] for pid in sorted(_PUBLISHED)]


def get_profile(profile_id: str) -> CalibrationProfile:
    """The profile ``profile_id``.

    Raises:
      PlanError: ``unknown_calibration`` (with the nearest id, and the list).
    """
    if isinstance(profile_id, str) and profile_id in _PUBLISHED:
        return _PUBLISHED[profile_id]
    near = difflib.get_close_matches(str(profile_id), list(_PUBLISHED), n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise PlanError(
        "unknown_calibration",
        f"calibration {profile_id!r} is no profile; {hint}the profiles are "
        f"{sorted(_PUBLISHED)} (GET /v1/calibrations)",
    )


def default_profile(hw: Hardware) -> CalibrationProfile:
    """The profile a plan on ``hw`` uses without ``calibration``: the published one of
    its kind for the ``jax`` stack."""
    return _PUBLISHED[f"published-{hw.kind}-jax"]


def default_constants(hw: Hardware) -> Calibration:
    """The constants of :func:`default_profile` (a published profile's are always there;
    a profile's ``constants`` are null only while a host profile measures)."""
    return PUBLISHED_CONSTANTS[f"published-{hw.kind}-jax"]


def profile_for(hw: Hardware, profile_id: str | CalibrationProfile | None) -> CalibrationProfile:
    """``profile_id``'s profile (a published id, or a profile the caller resolved, a
    stored one), checked against ``hw``'s kind; ``None``: the default.

    Raises:
      PlanError: ``unknown_calibration``; ``invalid_calibration`` for a profile of
        another accelerator kind.
    """
    if profile_id is None:
        return default_profile(hw)
    profile = profile_id if isinstance(profile_id, CalibrationProfile) else get_profile(profile_id)
    if profile.hardware_kind != hw.kind:
        same = [p.id for p in published_profiles() if p.hardware_kind == hw.kind]
        raise PlanError(
            "invalid_calibration",
            f"calibration {profile.id!r} is for {profile.hardware_kind} hardware and "
            f"{hw.name} is {hw.kind}; use one of {same}",
        )
    return profile
