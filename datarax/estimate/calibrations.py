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
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

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
from datarax.plan.layout import PlanCancelled

__all__ = [
    "GRID_POINTS",
    "CalibrationProfile",
    "JobsFit",
    "default_constants",
    "default_profile",
    "fit_constants",
    "fit_jobs",
    "fit_work",
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

_AXES = (("matmul", MATMUL), ("attention", ATTENTION), ("overlap", OVERLAP), ("hbm", HBM))
_GRID = np.array([g for g in itertools.product(MATMUL, ATTENTION, OVERLAP, HBM) if g[1] <= g[0]])
_INDEX = {tuple(point): i for i, point in enumerate(_GRID.tolist())}
GRID_POINTS = len(_GRID)
"""The grid's points (23,760): each row of a fit is priced at every one."""

ROW_CHUNK = 16
"""Rows priced over the whole grid at once (~3 MB a temporary array), between two
``should_stop`` checks."""


@dataclass(frozen=True)
class JobsFit:
    """:func:`fit_jobs`' answer: the constants and how they fit their rows (mean absolute
    relative errors of the step time)."""

    constants: Calibration
    training_mae: float
    leave_one_out_mae: float | None
    """each row predicted by the fit of the others (``None`` under 3 rows)"""
    published_mae: float
    """``base``'s constants on the same rows"""
    warnings: tuple[str, ...] = ()
    """a constant fitted at an edge of the grid, the error growing away from it"""


def fit_work(rows: int) -> int:
    """Grid cells a fit of ``rows`` rows computes (:func:`fit_jobs`; the unit a service
    budgets): each row priced at every grid point, and from 3 rows one pass over the
    grid per leave-one-out refit (each refit takes the whole fit's sums less its row)."""
    refits = rows if rows >= 3 else 0
    return (rows + refits) * GRID_POINTS


def _stop_if(should_stop: Callable[[], bool] | None) -> None:
    if should_stop is not None and should_stop():
        raise PlanCancelled("the calibration fit was abandoned")


def _checked(rows: Sequence[tuple[Mapping[str, float], float]]) -> None:
    """Refuses rows no fit can take: a measured step that is not a finite time above 0,
    or step parts that are not finite numbers.

    Raises:
      PlanError: ``invalid_calibration``.
    """
    for i, (parts, measured) in enumerate(rows):
        number = isinstance(measured, int | float) and not isinstance(measured, bool)
        if not number or not (0 < measured < math.inf):
            raise PlanError(
                "invalid_calibration",
                f"row {i}'s measured step is {measured!r} s; a fit needs a finite time above 0",
            )
        bad = sorted(k for k, v in parts.items() if not math.isfinite(v))
        if bad:
            raise PlanError(
                "invalid_calibration",
                f"row {i}'s step parts {bad} are not finite numbers, so no constants can price it",
            )


def _errors(
    rows: Sequence[tuple[Mapping[str, float], float]],
    base: Calibration,
    should_stop: Callable[[], bool] | None = None,
) -> np.ndarray:
    """``(rows, grid points)``: each row's absolute relative error at every grid point
    (the formula of :func:`~datarax.estimate.step_time.combine`), :data:`ROW_CHUNK` rows
    at a time."""
    mm, at, ov, hbm = (_GRID[:, i][None, :] for i in range(4))
    out = np.empty((len(rows), GRID_POINTS))
    for start in range(0, len(rows), ROW_CHUNK):
        _stop_if(should_stop)
        chunk = rows[start : start + ROW_CHUNK]

        def col(key: str, chunk: Sequence[tuple[Mapping[str, float], float]] = chunk) -> np.ndarray:
            return np.array([parts.get(key, 0.0) for parts, _ in chunk])[:, None]

        with np.errstate(over="ignore", invalid="ignore"):
            fwd = (
                (col("mm_fwd") + col("dot_fwd")) / mm + col("flash_fwd") / at + col("mem_fwd") / hbm
            )
            bwd = (
                (col("mm_bwd") + col("dot_bwd")) / mm + col("flash_bwd") / at + col("mem_bwd") / hbm
            )
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
            measured = np.array([m for _, m in chunk])[:, None]
            out[start : start + len(chunk)] = np.abs(step - measured) / measured
    return out


def _best(mean: np.ndarray) -> int:
    """The grid point of the least finite mean error.

    Raises:
      PlanError: ``invalid_calibration`` when no grid point prices the rows finitely.
    """
    finite = np.isfinite(mean)
    if not finite.any():
        raise PlanError(
            "invalid_calibration",
            "the steps these rows price to overflow at every constant the fit searches: "
            "their step parts are too large for any fit",
        )
    return int(np.argmin(np.where(finite, mean, np.inf)))


def _at(base: Calibration, point: int) -> Calibration:
    m, a, o, h = (float(x) for x in _GRID[point])
    return replace(base, matmul=m, attention=a, overlap=o, hbm=h)


def fit_constants(
    rows: Iterable[tuple[Mapping[str, float], float]], base: Calibration
) -> Calibration:
    """The grid point with the least mean absolute relative error over ``rows``
    (``(step_components, measured seconds)``; the formula of
    :func:`~datarax.estimate.step_time.combine`, the whole grid at once); ``base``'s
    ``overhead_s``, mixture-of-experts and collective constants are kept. No rows:
    ``base``.

    Raises:
      PlanError: ``invalid_calibration`` for rows no fit can take (a measured step that
        is not a finite time above 0, parts that are not finite).
    """
    rows = list(rows)
    if not rows:
        return base
    _checked(rows)
    return _at(base, _best(_errors(rows, base).mean(axis=0)))


def mean_error(rows: Sequence[tuple[Mapping[str, float], float]], cal: Calibration) -> float:
    """Mean absolute relative error of ``cal``'s steps over ``rows``.

    Raises:
      PlanError: ``invalid_calibration`` for rows no fit can take.
    """
    _checked(rows)
    errors = [abs(combine(parts, cal).step_s / measured - 1) for parts, measured in rows]
    if not errors:
        return float("nan")
    mean = sum(errors) / len(errors)
    if not math.isfinite(mean):
        raise PlanError(
            "invalid_calibration",
            "the steps these rows price to overflow against their measured times: a "
            "measured step that small, or parts that large, cannot be fitted",
        )
    return mean


def _leave_one_out(
    rows: Sequence[tuple[Mapping[str, float], float]],
    base: Calibration,
    errors: np.ndarray,
    should_stop: Callable[[], bool] | None = None,
) -> float:
    """:func:`leave_one_out` on the rows' grid errors: the fit of all rows but one is the
    least of the whole sums less that row's, one pass over the grid a row."""
    total = errors.sum(axis=0)
    out = []
    for i, (parts, measured) in enumerate(rows):
        if i % ROW_CHUNK == 0:
            _stop_if(should_stop)
        with np.errstate(invalid="ignore"):
            rest = (total - errors[i]) / (len(rows) - 1)
        cal = _at(base, _best(rest))
        out.append(abs(combine(parts, cal).step_s / measured - 1))
    return sum(out) / len(out)


def leave_one_out(
    rows: Sequence[tuple[Mapping[str, float], float]], base: Calibration
) -> float | None:
    """Mean absolute relative error of each row predicted by the fit of the others;
    ``None`` under 3 rows (a fit on one row says nothing of another).

    Raises:
      PlanError: ``invalid_calibration`` for rows no fit can take.
    """
    if len(rows) < 3:
        return None
    _checked(rows)
    return _leave_one_out(rows, base, _errors(rows, base))


def _edges(mean: np.ndarray, best: int) -> tuple[str, ...]:
    """A line for each constant the fit put at an edge of its grid while the error grows
    away from it (one step inward is worse): its best value may lie beyond the grid. A
    constant that changes no row's step (the error flat along it) is not named."""
    point = _GRID[best].tolist()
    out = []
    for axis, (name, values) in enumerate(_AXES):
        at = values.index(point[axis])
        for edge, inward, word in ((0, 1, "lowest"), (len(values) - 1, len(values) - 2, "highest")):
            if at != edge:
                continue
            near = list(point)
            near[axis] = values[inward]
            if near[1] > near[0]:  # attention never above the matmuls
                near[1] = max(a for a in ATTENTION if a <= near[0])
            j = _INDEX.get(tuple(near))
            if j is not None and mean[j] > mean[best]:
                out.append(
                    f"{name} {point[axis]:.2f} is the {word} value the fit searches "
                    f"({values[0]:.2f} to {values[-1]:.2f}) and the error grows away from it: "
                    f"the jobs' best {name} may lie beyond the grid; check their plans and "
                    "step times"
                )
    return tuple(out)


def fit_jobs(
    rows: Sequence[tuple[Mapping[str, float], float]],
    base: Calibration,
    should_stop: Callable[[], bool] | None = None,
) -> JobsFit:
    """:func:`fit_constants` on ``rows`` with its errors: on the rows, ``base``'s on the
    same rows, each row predicted by the fit of the others (from 3 rows), and a warning
    for each constant fitted at an edge of the grid. :func:`fit_work` cells in all, the
    leave-one-out refits included; ``should_stop`` is checked every :data:`ROW_CHUNK`
    rows.

    Raises:
      PlanError: ``invalid_calibration`` (no rows; rows no fit can take; errors that
        overflow).
      PlanCancelled: ``should_stop`` answered true.
    """
    if not rows:
        raise PlanError("invalid_calibration", "a fit needs at least one row")
    _checked(rows)
    errors = _errors(rows, base, should_stop)
    mean = errors.mean(axis=0)
    best = _best(mean)
    constants = _at(base, best)
    fit = JobsFit(
        constants=constants,
        training_mae=mean_error(rows, constants),
        leave_one_out_mae=(
            _leave_one_out(rows, base, errors, should_stop) if len(rows) >= 3 else None
        ),
        published_mae=mean_error(rows, base),
        warnings=_edges(mean, best),
    )
    figures = (fit.training_mae, fit.published_mae, fit.leave_one_out_mae or 0.0)
    if not all(math.isfinite(x) for x in figures):
        raise PlanError(
            "invalid_calibration",
            "the fitted steps of these rows overflow: their step parts are too large to fit",
        )
    return fit


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
