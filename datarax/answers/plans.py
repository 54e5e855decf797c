"""Plan answers: layouts, estimates, recommendations.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from datarax.answers.base import Answer
from datarax.answers.catalog import ModelSpec
from datarax.answers.estimates import AxisDetail, MemoryPerDevice, StepEstimate


class Shard(TypedDict):
    """One device of a plan. Hardware plans add ``slice``, ``host`` and ``physical``
    (TPU: chip coordinates, plus ``core`` where a chip has several)."""

    device: int
    process_index: int
    coords: dict[str, int]
    index: list[list[int]]
    replica: int
    slice: NotRequired[int]
    host: NotRequired[int]
    physical: NotRequired[list[int]]
    core: NotRequired[int]


class BatchLayout(TypedDict):
    shape: list[int]
    spec: list[str | list[str] | None]
    shard_shape: list[int]


@dataclass(frozen=True, eq=False)
class ParamLayout(Answer):
    """One parameter of a plan or session: its shape, spec and per-device bytes."""

    path: str
    """the parameter's path in the model's tree, ``/``-joined"""
    shape: list[int]
    spec: list[str | None]
    """the mesh axis each dimension is split over (``null``: whole)"""
    shard_shape: list[int]
    bytes_per_device: int


class MeshPlan(TypedDict):
    """A stored plan (``POST /v1/meshes``, ``GET /v1/meshes/{id}``). A hardware plan adds
    ``hardware``, ``topology``, ``slices``, ``hosts``, ``ici``, ``dcn`` and
    ``axes_detail``; with a model, ``step_estimate`` and the resolved ``model``."""

    id: str
    name: str | None
    created_at: str
    live: bool
    platform: str | None
    axes: dict[str, int]
    total_devices: int
    device_grid: list[Any]  # device ids nested as deep as the mesh has axes
    batch: BatchLayout | None
    shards: list[Shard]
    params: list[ParamLayout]
    memory_per_device: MemoryPerDevice
    warnings: list[str]
    hardware: NotRequired[str]
    topology: NotRequired[str | None]
    slices: NotRequired[int]
    hosts: NotRequired[int | None]
    ici: NotRequired[dict[str, int]]
    dcn: NotRequired[dict[str, int]]
    axes_detail: NotRequired[list[AxisDetail]]
    step_estimate: NotRequired[StepEstimate]
    model: NotRequired[ModelSpec]
    context_parallel: NotRequired[dict[str, Any]]
    shard_over_data: NotRequired[bool]


class MeshPlanList(TypedDict):
    """``GET /v1/meshes``: stored plans, newest first."""

    items: list[MeshPlan]
    total: int


__all__ = ["BatchLayout", "MeshPlan", "MeshPlanList", "ParamLayout", "Shard"]
