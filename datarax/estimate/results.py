"""The estimates' results: the answers of :mod:`datarax.answers.estimates`, and the
library's own records built on them.

:class:`MemoryEstimate` and :class:`Collective` are their answers as they are; a
:class:`StepEstimate` is the answer's
:class:`~datarax.answers.estimates.StepEstimate` with what the library reads besides
(the step's memory, its uncalibrated components and its parameter shardings), left out of
the JSON. Each is a frozen dataclass and also a read-only ``Mapping`` of its JSON members,
so code written when the estimates returned dicts (``estimate["step_s"]``,
``dict(memory)``) keeps working while new code reads attributes that mypy checks;
:meth:`~datarax.answers.base.Answer.to_json` gives the JSON object of the HTTP answers.

Example:
  >>> c = Collective("fsdp", "all-gather", "forward", "params", 2, 1024, "ici", 1e-6)
  >>> c["kind"], c.to_json()["bytes_per_device"]
  ('all-gather', 1024)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from datarax.answers import estimates as answers
from datarax.answers.base import Answer, internal
from datarax.answers.estimates import (
    Candidate,
    Collective,
    MemoryEstimate,
    Recommendations,
    RooflinePhases,
    StepBreakdown,
)
from datarax.parallel.axis_roles import ParamSharding

__all__ = [
    "Candidate",
    "Collective",
    "HardwareMemory",
    "MemoryEstimate",
    "Recommendations",
    "StepEstimate",
    "StepPrediction",
]


class HardwareMemory(TypedDict):
    """The catalog figures :func:`~datarax.estimate.memory.memory_estimate` takes as
    keywords (:func:`~datarax.estimate.memory.hardware_memory`)."""

    hbm_bytes: int | None
    vmem_bytes: int | None
    update_layout_copies: bool
    usable_hbm_bytes: int | None
    host_memory_bytes: int | None


@dataclass(frozen=True, eq=False)
class StepPrediction(Answer):
    """Predicted wall time of one step on one device
    (:func:`~datarax.estimate.step_time.predict_step` gives the model).

    Attributes:
      step_s: predicted wall time.
      roofline_s: the ideal: model FLOPs at peak, each pass the longer of its compute
        and its collectives.
      breakdown: what ``step_s`` is made of (``matmul_s``, ``attention_s``,
        ``memory_bound_s``, ``exposed_comm_s``, ``offload_s``, ``overhead_s``,
        ``bubble_s``).
      model_flops_per_device: the FLOPs the roofline counts.
      roofline_phases: the ``compute_s`` and ``comm_s`` of the forward and the backward
        pass.
      gap: one line: what ``step_s - roofline_s`` is made of.
      components: :func:`~datarax.estimate.step_time.step_components`, uncalibrated
        (internal).
    """

    step_s: float
    roofline_s: float
    breakdown: StepBreakdown
    model_flops_per_device: float
    roofline_phases: RooflinePhases
    gap: str
    components: dict[str, float] = internal(default_factory=dict)


@dataclass(frozen=True, eq=False)
class StepEstimate(answers.StepEstimate):
    """One training step of a model on a mesh of a chip
    (:func:`~datarax.estimate.cost.estimate_step`): the answer's
    :class:`~datarax.answers.estimates.StepEstimate` (a plan's and a candidate's
    ``step_estimate``, whose fields document themselves) and what the library reads
    besides, which the JSON leaves out.

    Attributes:
      memory_per_device: the step's :class:`MemoryEstimate` (its own member of a plan
        and of a candidate).
      predicted_components: :attr:`StepPrediction.components` (for calibration).
      param_shardings: each parameter group's spec and shard shape
        (:func:`~datarax.parallel.axis_roles.param_specs`), worked out once for the
        memory, the collectives and the plan's parameter list.
    """

    memory_per_device: MemoryEstimate = internal()
    predicted_components: dict[str, float] = internal(default_factory=dict)
    param_shardings: tuple[ParamSharding, ...] = internal(())
