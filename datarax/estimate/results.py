"""The estimates' answers as frozen records: one definition of each result, read by the
library, serialised by the service.

Each record is a frozen dataclass and also a read-only ``Mapping`` of its fields, so
code written when the estimates returned dicts (``estimate["step_s"]``,
``dict(memory)``) keeps working while new code reads attributes that mypy checks.
:meth:`Record.to_json` gives the JSON object of the HTTP answers: fields marked
``internal`` stay out, nested records become objects and tuples lists.

Example:
  >>> c = Collective("fsdp", "all-gather", "forward", "params", 2, 1024, "ici", 1e-6)
  >>> c["kind"], c.to_json()["bytes_per_device"]
  ('all-gather', 1024)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NotRequired, TypedDict

from datarax.json_types import JSONObject

if TYPE_CHECKING:
    from datarax.parallel.axis_roles import ParamSharding


__all__ = [
    "Candidate",
    "Collective",
    "HardwareMemory",
    "MemoryEstimate",
    "Recommendations",
    "Record",
    "StepEstimate",
    "StepPrediction",
]


def _internal() -> Any:
    """A field that the library reads and the HTTP answers leave out."""
    return field(metadata={"internal": True})


def _json(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, (tuple, list)):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


class Record(Mapping[str, Any]):
    """A frozen dataclass read as a mapping of its fields (see the module docstring);
    equal to any mapping of the same items, as the dicts it replaces were."""

    def __getitem__(self, key: str) -> Any:
        if key not in self._names():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    @classmethod
    def _names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))  # type: ignore[arg-type]

    def to_json(self) -> JSONObject:
        """The record as the HTTP answers hold it: plain JSON values, in field order,
        without the ``internal`` fields."""
        return {
            f.name: _json(getattr(self, f.name))
            for f in dataclasses.fields(self)  # type: ignore[arg-type]
            if not f.metadata.get("internal")
        }


class HardwareMemory(TypedDict):
    """The catalog figures :func:`~datarax.estimate.memory.memory_estimate` takes as
    keywords (:func:`~datarax.estimate.memory.hardware_memory`)."""

    hbm_bytes: int | None
    vmem_bytes: int | None
    update_layout_copies: bool
    usable_hbm_bytes: int | None
    host_memory_bytes: int | None


@dataclass(frozen=True, eq=False)
class MemoryEstimate(Record):
    """Bytes per device of one training step at its peak
    (:func:`~datarax.estimate.memory.memory_estimate` says how each is counted).

    Attributes:
      params, optimizer, grads, activations, batch, temporaries: the parts in HBM.
      total: their sum.
      vmem: the working set taken to sit in VMEM instead of HBM (0 if none).
      layout_copies: the transposed update's copies counted in ``temporaries``.
      hbm_bytes: the chip's HBM, or ``None`` without hardware.
      usable_hbm_bytes: the HBM one program may allocate (``hbm_bytes`` if not given).
      host_offload_bytes: activations a remat policy moves to host memory.
      host_memory_bytes: this device's share of host DRAM, or ``None``.
      fits: ``total`` within the usable HBM and the offload within host memory;
        ``None`` without HBM.
    """

    params: int
    optimizer: int
    grads: int
    activations: int
    batch: int
    temporaries: int
    total: int
    vmem: int
    layout_copies: int
    hbm_bytes: int | None
    usable_hbm_bytes: int | None
    host_offload_bytes: int
    host_memory_bytes: int | None
    fits: bool | None


@dataclass(frozen=True, eq=False)
class Collective(Record):
    """One kind of collective on one axis in one pass, its ops summed.

    Attributes:
      axis: the mesh axis.
      kind: ``all-reduce``, ``all-gather`` or ``reduce-scatter``.
      phase: ``forward`` or ``backward``.
      what: ``params``, ``grads`` or ``activations``.
      count: ops.
      bytes_per_device: bytes one device holds whole, summed over the ops.
      link: the slowest network the axis crosses (``ici``, ``nvlink``, ``dcn`` ...).
      seconds: ring alpha-beta time of the ops.
    """

    axis: str
    kind: str
    phase: str
    what: str
    count: int
    bytes_per_device: int
    link: str
    seconds: float


@dataclass(frozen=True, eq=False)
class StepPrediction(Record):
    """Predicted wall time of one step on one device
    (:func:`~datarax.estimate.step_time.predict_step` gives the model).

    Attributes:
      step_s: predicted wall time.
      roofline_s: the ideal: model FLOPs at peak, each pass the longer of its compute
        and its collectives.
      breakdown: ``matmul_s``, ``attention_s``, ``memory_bound_s``, ``exposed_comm_s``,
        ``offload_s``, ``overhead_s``.
      model_flops_per_device: the FLOPs the roofline counts.
      roofline_phases: ``{"forward"|"backward": {"compute_s", "comm_s"}}``.
      gap: one line: what ``step_s - roofline_s`` is made of.
      components: :func:`~datarax.estimate.step_time.step_components`, uncalibrated.
    """

    step_s: float
    roofline_s: float
    breakdown: dict[str, float]
    model_flops_per_device: float
    roofline_phases: dict[str, dict[str, float]]
    gap: str
    components: dict[str, float] = _internal()


@dataclass(frozen=True, eq=False)
class StepEstimate(Record):
    """One training step of a model on a mesh of a chip
    (:func:`~datarax.estimate.cost.estimate_step`).

    The fields up to ``collectives`` are the ones DESIGN v1.1 fixes for a plan's
    ``step_estimate``; the answers carry the rest but ``memory_per_device`` (its own
    member of the answer) and ``predicted_components`` (for calibration).

    Attributes:
      flops: model FLOPs of the step over all devices.
      compute_s: the predicted matmul, attention and memory-bound seconds.
      comm_s: the collectives' seconds, forward and backward.
      step_s: predicted wall time.
      mfu: ``flops / (devices * peak_flops * step_s)``.
      bottleneck: ``compute`` or ``communication`` (of the roofline).
      collectives: one entry per axis, kind, pass and operand.
      bottleneck_link: the link of the slowest collective when communication bounds.
      phases: the roofline's ``compute_s``/``comm_s`` of ``forward`` and ``backward``.
      tokens_per_device: tokens of this device's batch shard.
      roofline_s: the ideal step time.
      roofline_mfu: ``mfu`` at ``roofline_s``.
      peak_flops: the compute dtype's peak of one device.
      breakdown: :attr:`StepPrediction.breakdown`.
      gap: :attr:`StepPrediction.gap`.
      pipeline: with pipeline stages, ``{"stages", "microbatches", "repeats",
        "layers_per_stage", "schedule", "bubble_fraction"}``
        (:meth:`~datarax.parallel.options.PipelineShape.to_json`); else ``None``.
      calibration: the id of the calibration profile whose constants priced the step
        (:mod:`datarax.estimate.calibrations`).
      memory_per_device: the step's :class:`MemoryEstimate`.
      predicted_components: :attr:`StepPrediction.components`.
      param_shardings: each parameter group's spec and shard shape
        (:func:`~datarax.parallel.axis_roles.param_specs`), worked out once for the
        memory, the collectives and the plan's parameter list.
    """

    flops: float
    compute_s: float
    comm_s: float
    step_s: float
    mfu: float
    bottleneck: Literal["compute", "communication"]
    collectives: tuple[Collective, ...]
    bottleneck_link: str | None
    phases: dict[str, dict[str, float]]
    tokens_per_device: int
    roofline_s: float
    roofline_mfu: float
    peak_flops: float
    breakdown: dict[str, float]
    gap: str
    pipeline: dict[str, Any] | None
    calibration: str | None
    memory_per_device: MemoryEstimate = _internal()
    predicted_components: dict[str, float] = _internal()
    param_shardings: tuple[ParamSharding, ...] = _internal()


class Candidate(TypedDict):
    """One mesh :func:`~datarax.estimate.recommend.recommend_meshes` recommends: its
    sizes, its estimates as the answers carry them, and the plan request that lays it
    out."""

    rank: int
    ici: dict[str, int]
    dcn: dict[str, int]
    step_estimate: JSONObject
    memory_per_device: JSONObject
    plan_request: JSONObject
    flags: NotRequired[list[str]]


class Recommendations(TypedDict):
    """:func:`~datarax.estimate.recommend.recommend_meshes`' answer: the best candidates
    first, how many factorisations were considered and why the others were rejected;
    ``note`` only when fewer than ``top_k`` survive."""

    candidates: list[Candidate]
    considered: int
    rejected: dict[str, int]
    ranked_by: str
    note: NotRequired[str]
