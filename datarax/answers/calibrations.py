"""Calibration profiles: ``GET /v1/calibrations``, ``GET /v1/calibrations/{id}`` and
``POST /v1/calibrations`` (DESIGN v1.3, "Calibrations").

One definition each: the library's step-time constants
(:class:`datarax.estimate.step_time.Calibration`) are :class:`CalibrationConstants`, and
its profiles (:mod:`datarax.estimate.calibrations`, the published ones and those a service
fits) are :class:`CalibrationProfile`, the answer itself.

Open shapes, kept as objects: a profile's ``measurements`` are the rows the constants
were fitted on, whose members depend on the profile's kind and, for a host profile, on the
stage that measured them (a matmul's ``flops_per_s``, a collective's ``bytes_per_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from datarax.answers.base import Answer, omitted

__all__ = [
    "CalibrationConstants",
    "CalibrationList",
    "CalibrationProblem",
    "CalibrationProfile",
    "CalibrationProgress",
    "CalibrationStack",
    "JobsFitError",
    "PublishedFitError",
]


_ALWAYS_SENT: dict[str, Any] = {
    **Answer.__pydantic_config__,
    # every member is sent, the defaulted ones too: the answer's schema requires them
    "json_schema_serialization_defaults_required": True,
}


@dataclass(frozen=True, eq=False)
class CalibrationStack(Answer):
    """The software stack the constants were fitted on."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {
        **_ALWAYS_SENT,
        "json_schema_extra": {
            "examples": [{"framework": "jax", "jax": None, "jaxlib": None, "backend": "tpu"}]
        },
    }

    framework: str = "jax"
    """the framework of the programs measured (``jax``, ``pytorch``)"""
    jax: str | None = None
    """JAX's version (null: runs of several)"""
    jaxlib: str | None = None
    """jaxlib's version (null: runs of several)"""
    backend: str | None = None
    """the backend the programs ran on (``tpu``, ``cuda``, ``cpu``)"""


@dataclass(frozen=True, eq=False)
class CalibrationConstants(Answer):
    """The step-time constants of one accelerator kind: achieved fractions of peak and the
    overlap model (:func:`datarax.estimate.step_time.predict_step` prices a step with
    them). The library's ``datarax.estimate.step_time.Calibration`` is this class."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _ALWAYS_SENT

    matmul: float
    """fraction of the dtype's peak FLOP/s the projections and MLP matmuls reach"""
    attention: float
    """fraction of peak a fused (flash) attention kernel reaches on its FLOPs; ``dot``
    attention is priced as matmuls"""
    hbm: float
    """fraction of HBM bandwidth memory-bound work reaches"""
    overlap: float
    """fraction of a pass's compute time behind which its collectives (and offload
    transfers) run; the rest of them is exposed"""
    overhead_s: float
    """fixed time per step (launch, host loop, the loss's reduction)"""
    source: str
    """how the figures were obtained"""
    grouped_matmul: float | None = None
    """fraction of peak the routed experts' matmuls reach (the sparse kernel's grouped
    matmuls, megablox / ``ragged_dot`` on TPU, grouped GEMMs on GPU; the dense kernel's
    capacity-padded einsums over the experts); null: ``matmul``'s"""
    all_to_all_overlap: float | None = None
    """fraction of the work independent of the experts' all-to-all (dispatch and combine
    over the expert axes: the shared experts, the experts' weight gradients) behind which
    the all-to-all hides; the rest is exposed. null: ``overlap``"""
    link: float = 1.0
    """fraction of the catalog's link figures (its ring model's time) the collectives
    reach; 1: the catalog's"""
    collective_s: float = 0.0
    """fixed time of each collective op on top of the ring model's (a runtime's rendezvous
    and launch, which the catalog's per-step latencies leave out); 0: none"""
    layer_s: float = 0.0
    """fixed time of each transformer layer a device runs in a step, forward and backward
    (its kernels' launches, whatever their size); 0: none"""

    @property
    def grouped(self) -> float:
        """The routed experts' matmul fraction: ``grouped_matmul``, else ``matmul``."""
        return self.matmul if self.grouped_matmul is None else self.grouped_matmul


@dataclass(frozen=True, eq=False)
class PublishedFitError(Answer):
    """How a published profile's constants fit the measured runs (mean absolute relative
    errors of the step time)."""

    training_mae: float
    """on the runs the constants were fitted on"""
    training_runs: int
    held_out_mae: float | None
    """on runs the fit did not see (null: none held out)"""
    held_out_runs: int


@dataclass(frozen=True, eq=False)
class JobsFitError(Answer):
    """How a ``jobs`` profile's constants fit the jobs' measured steps (mean absolute
    relative errors of the step time)."""

    training_mae: float
    """on the jobs fitted on"""
    training_runs: int
    """the jobs fitted on"""
    leave_one_out_mae: float | None
    """each job predicted by the fit of the others (null under 3 jobs)"""
    published_mae: float
    """the published profile's constants on the same jobs"""


@dataclass(frozen=True, eq=False)
class CalibrationProgress(Answer):
    """A host profile's measuring: its stages, those done, the one running."""

    quick: bool
    """the quick mode (fewer and smaller cases)"""
    stages: tuple[str, ...]
    """every stage, in the order they run"""
    done: tuple[str, ...]
    """the stages measured so far"""
    stage: str | None
    """the stage measuring now (null once measured)"""


@dataclass(frozen=True, eq=False)
class CalibrationProblem(Answer):
    """Why a host profile failed."""

    code: str
    """the problem's code (``worker_lost``, ``runtime_error``, ``shutting_down``, ...)"""
    detail: str


@dataclass(frozen=True, eq=False, kw_only=True)
class CalibrationProfile(Answer):
    """One profile (``GET /v1/calibrations/{id}``, ``POST /v1/calibrations``): its
    step-time constants, the accelerator kind and software stack they were fitted on, and
    how well they fit. The library's profiles are these (:mod:`datarax.estimate.
    calibrations`): the published ones, and the ``host`` and ``jobs`` profiles a service
    measures and stores."""

    id: str
    """``published-<kind>-<framework>`` for the shipped ones, ``host-...``, ``jobs-...``"""
    kind: Literal["published", "host", "jobs"]
    """published: shipped with the library; host: measured on the service's devices;
    jobs: fitted on the measured steps of jobs linked to their plans"""
    status: Literal["running", "done", "failed"] = "done"
    """done; a host profile: running, then done or failed"""
    created_at: str
    hardware: str | None = None
    """the catalog entry measured (null: any of the kind)"""
    hardware_kind: str
    """the accelerator kind the constants are for (``tpu``, ``gpu``, ``cpu``)"""
    device_kind: str | None = None
    """JAX's ``device_kind`` measured (null: any)"""
    stack: CalibrationStack
    constants: CalibrationConstants | None
    """null while a host profile is measured, or when its measuring failed"""
    measurements: tuple[dict[str, Any], ...] = ()
    """the rows or raw measurements behind the fit: a job's (``job``, ``plan``,
    ``hardware``, ``measured_step_s``, ``points``) or a host stage's measurement (its
    members are the stage's)"""
    error: JobsFitError | PublishedFitError | None = None
    """how the constants fit their rows (mean absolute errors); null where they are not
    fitted on rows of their own (a host profile's are measured)"""
    progress: CalibrationProgress | None = omitted()
    """a host profile's measuring: the stages, those done, the one running"""
    problem: CalibrationProblem | None = omitted()
    """why a host profile failed (status failed): its code and detail"""
    warnings: tuple[str, ...] | None = omitted()
    """what to doubt in the fit: a ``jobs`` profile's constant fitted at an edge of the
    grid it searches, the error growing away from it (which constant, which edge)"""


@dataclass(frozen=True, eq=False)
class CalibrationList(Answer):
    """``GET /v1/calibrations``: the published profiles, then those fitted here (newest
    first), a page at a time (``limit``, ``offset``)."""

    # field(): no default (else the dataclass takes Mapping.items, inherited, for one)
    items: list[CalibrationProfile] = field()  # type: ignore[assignment]
    """this page's profiles"""
    total: int
    """the profiles listed in all (published and stored), not just this page's"""
