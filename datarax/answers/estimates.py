"""Estimate answers: a step's predicted time and collectives, its memory per device, a
hardware plan's axes, the recommendations (``POST /v1/recommendations``).

One definition each, read by the library, the service and the client: the library's
estimates (:mod:`datarax.estimate`) build these classes, or subclasses of them that add
internal fields (:class:`datarax.estimate.results.StepEstimate` keeps the step's memory,
its uncalibrated components and its parameter shardings;
:class:`datarax.parallel.options.PipelineShape` the share of microbatches in flight;
:class:`datarax.hardware.entry.AxisLink` the ICI bandwidth of an axis that also crosses
DCN), and the service serialises them as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from datarax.answers.base import Answer, examples, omitted

__all__ = [
    "AxisDetail",
    "Candidate",
    "Collective",
    "MemoryEstimate",
    "MemoryPerDevice",
    "PipelineEstimate",
    "Recommendations",
    "RooflinePhase",
    "RooflinePhases",
    "SplitCandidate",
    "SplitPhysicalAxes",
    "StepBreakdown",
    "StepEstimate",
]

LinkClass = Literal["ici", "nvlink", "dcn", "infiniband", "host"]
"""A network class, fastest first (:data:`datarax.hardware.entry.LINK_CLASSES`)."""

Program = Literal["maxtext", "datarax"]
"""The training step a memory estimate prices (DESIGN v1.4, "The program users launch")."""

Schedule = Literal["gpipe", "circular", "1f1b", "interleaved_1f1b"]
"""A pipeline schedule (:data:`datarax.parallel.options.SCHEDULES`)."""


# ------------------------------------------------------------------------------ memory


@dataclass(frozen=True, eq=False)
class MemoryPerDevice(Answer):
    """Bytes per device of a plan without a step estimate: its parameters, their optimizer
    state and its batch block."""

    params: int
    optimizer: int
    batch: int
    total: int
    program: Program | None = omitted()
    """the program the figures price: ``maxtext`` for hardware plans (what ``launch``
    runs), ``datarax`` for plans of the live host's devices and abstract plans"""


@dataclass(frozen=True, eq=False)
class MemoryEstimate(Answer):
    """Bytes per device of one training step at its peak: a hardware plan's with a model,
    and each recommended candidate's (:func:`datarax.estimate.memory.memory_estimate`
    says how each is counted)."""

    params: int
    optimizer: int
    grads: int
    activations: int
    batch: int
    temporaries: int
    total: int
    """the sum of params, optimizer, grads, activations, batch and temporaries"""
    vmem: int
    """the working set taken to sit in VMEM instead of HBM (0 if none)"""
    layout_copies: int
    """the transposed optimizer update's copies, counted in temporaries"""
    hbm_bytes: int | None
    """the chip's HBM; null without hardware"""
    usable_hbm_bytes: int | None
    """the HBM one program may allocate (hbm_bytes where not known apart)"""
    host_offload_bytes: int
    """activations a remat policy moves to host memory"""
    host_memory_bytes: int | None
    """this device's share of host DRAM; null where unknown"""
    fits: bool | None
    """total within the usable HBM and the offload within host memory; null without HBM"""
    program: Program | None = omitted()
    """the program the estimate prices: ``maxtext`` (MaxText's training step, what
    ``launch`` runs) for hardware plans and their candidates, ``datarax`` (the library's
    own step) elsewhere"""


# ------------------------------------------------------------------------------ axes


@dataclass(frozen=True, eq=False)
class AxisDetail(Answer):
    """A hardware plan's mesh axis (``axes_detail``): its sizes and the slowest network it
    crosses."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(
        {"name": "data", "size": 16, "ici": 8, "dcn": 2, "link": "dcn", "bytes_per_s": 3.125e9}
    )

    name: str
    size: int
    """ici * dcn"""
    ici: int
    """the axis's factor inside one slice / NVLink domain"""
    dcn: int
    """the axis's factor across slices / domains"""
    link: LinkClass
    """the slowest network the axis crosses"""
    bytes_per_s: float
    """one-way bandwidth a device drives on that link"""


# ------------------------------------------------------------------------------ a step


@dataclass(frozen=True, eq=False)
class Collective(Answer):
    """One kind of collective on one axis in one pass, its ops summed."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(
        {
            "axis": "fsdp",
            "kind": "all-gather",
            "phase": "forward",
            "what": "params",
            "count": 2,
            "bytes_per_device": 1048576,
            "link": "ici",
            "seconds": 1.2e-5,
        }
    )

    axis: str
    """the mesh axis"""
    kind: str
    """all-reduce, all-gather, reduce-scatter, all-to-all or send-recv"""
    phase: str
    """forward or backward"""
    what: str
    """params, grads or activations"""
    count: int
    """ops"""
    bytes_per_device: int
    """bytes one device holds whole, summed over the ops"""
    link: str
    """the slowest network the axis crosses (ici, nvlink, dcn ...)"""
    seconds: float
    """ring alpha-beta time of the ops"""


@dataclass(frozen=True, eq=False)
class RooflinePhase(Answer):
    """One pass of the roofline: its compute at peak and its collectives."""

    compute_s: float
    comm_s: float


@dataclass(frozen=True, eq=False)
class RooflinePhases(Answer):
    """``step_estimate.phases``: the roofline's forward and backward pass."""

    forward: RooflinePhase
    backward: RooflinePhase


@dataclass(frozen=True, eq=False)
class StepBreakdown(Answer):
    """``step_estimate.breakdown``: what the predicted step time is made of."""

    matmul_s: float
    attention_s: float
    memory_bound_s: float
    exposed_comm_s: float
    offload_s: float
    overhead_s: float
    bubble_s: float
    """the pipeline's bubble (stages idle); 0 without stages"""


@dataclass(frozen=True, eq=False)
class PipelineEstimate(Answer):
    """``step_estimate.pipeline`` (DESIGN v1.3), with stage axes: the stages' schedule and
    its bubble."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(
        {
            "stages": 8,
            "microbatches": 4,
            "repeats": 1,
            "layers_per_stage": 10,
            "schedule": "1f1b",
            "bubble_fraction": 0.6363636363636364,
        }
    )

    stages: int
    """the stage axes' product"""
    microbatches: int
    """microbatches a step runs through the pipeline"""
    repeats: int
    """passes round the stages (layers / (stages * layers_per_stage))"""
    layers_per_stage: int
    """layers a stage runs each time a microbatch passes it"""
    schedule: Schedule
    bubble_fraction: float
    """(stages - 1) / (repeats * microbatches + stages - 1)"""


@dataclass(frozen=True, eq=False)
class StepEstimate(Answer):
    """A step's predicted time (``step_estimate``): ``step_s`` the calibrated wall time,
    ``roofline_s`` the ideal (:func:`datarax.estimate.cost.estimate_step`)."""

    flops: float
    """model FLOPs of the step over all devices, as MaxText's
    calculate_tflops_training_per_device counts them: 6 x the parameters a token
    multiplies through x tokens, plus attention with the causal mask counted (half of
    the full QK^T and AV)"""
    compute_s: float
    """the predicted matmul, attention and memory-bound seconds"""
    comm_s: float
    """the collectives' seconds, forward and backward"""
    step_s: float
    """predicted wall time of one step (calibrated)"""
    mfu: float
    """flops / (devices * peak of the compute dtype * step_s): model FLOPs utilisation
    as MaxText reports it"""
    bottleneck: Literal["compute", "communication"]
    """the longer side of the roofline"""
    collectives: tuple[Collective, ...]
    """one entry per axis, kind, pass and operand"""
    bottleneck_link: str | None
    """the link of the slowest collective when communication bounds; else null"""
    phases: RooflinePhases
    """the roofline's compute_s and comm_s of the forward and the backward pass"""
    tokens_per_device: int
    """tokens of one device's batch shard"""
    tokens_per_s: float
    """tokens the whole mesh trains on a second at step_s: global sequences x sequence
    length / step_s (examples / step_s for the MLP)"""
    tflops_per_device: float
    """model TFLOP/s one device achieves at step_s, counted as flops is (MaxText's
    TFLOP/s/device): flops / devices / step_s / 1e12"""
    roofline_s: float
    """the ideal: model FLOPs at peak, collectives hidden behind compute"""
    roofline_mfu: float
    """mfu at roofline_s"""
    peak_flops: float
    """the compute dtype's peak FLOP/s of one device"""
    breakdown: StepBreakdown
    gap: str
    """one line: what step_s - roofline_s is made of"""
    pipeline: PipelineEstimate | None
    """with stage axes; else null"""
    calibration: str | None
    """the calibration profile whose constants priced step_s (GET /v1/calibrations/{id}),
    e.g. published-tpu-jax"""


# ------------------------------------------------------------------------------ recommendations


@dataclass(frozen=True, eq=False)
class Candidate(Answer):
    """One recommended mesh: its sizes, its estimates and the plan request that lays it
    out."""

    rank: int
    """1 for the best"""
    ici: dict[str, int]
    dcn: dict[str, int]
    step_estimate: StepEstimate
    memory_per_device: MemoryEstimate
    plan_request: dict[str, Any]
    """a POST /v1/meshes body, as it is"""
    flags: list[str] | None = omitted()
    """tensor or expert axes across DCN or InfiniBand, and why the candidate ranks where it
    does anyway"""


@dataclass(frozen=True, eq=False)
class Recommendations(Answer):
    """``POST /v1/recommendations``: the candidates, fastest estimated step first, how many
    factorisations were considered and why the others were rejected."""

    candidates: list[Candidate]
    """best (fastest estimated step) first"""
    considered: int
    """(ici, dcn) factorisations priced or rejected"""
    rejected: dict[str, int]
    """rejected factorisations by code"""
    ranked_by: str
    """the order of candidates, ties included"""
    note: str | None = omitted()
    """why fewer than top_k candidates came back"""
    split_physical_axes: SplitPhysicalAxes | None = omitted()
    """only when allow_split_physical_axes is false and some layouts were skipped for
    needing it: the best of them, priced aside (not ranked)"""


@dataclass(frozen=True, eq=False)
class SplitCandidate(Answer):
    """The best of the layouts a recommendation skipped for splitting a physical torus
    axis, priced as a candidate is: the fastest that fits, else the smallest."""

    ici: dict[str, int]
    dcn: dict[str, int]
    step_estimate: StepEstimate
    memory_per_device: MemoryEstimate
    fits: bool
    plan_request: dict[str, Any]
    """a POST /v1/meshes body, as it is (allow_split_physical_axes: true)"""


@dataclass(frozen=True, eq=False)
class SplitPhysicalAxes(Answer):
    """The layouts a recommendation skipped because JAX lays them out only with
    allow_split_physical_axes, and what the best of them would have been."""

    skipped: int
    """(ici, dcn) factorisations skipped: rejected's physical_axes_split_required"""
    best: SplitCandidate | None
    """null when none of them could be priced"""
    would_rank: int | None
    """its rank among the top_k had it been ranked; null below them or not fitting"""
    note: str
    """one sentence: what was skipped, where the best would rank, how to consider them"""
