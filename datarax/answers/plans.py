"""Mesh plan answers: ``POST /v1/meshes``, ``GET /v1/meshes/{id}`` and ``GET /v1/meshes``.

A plan's summary (:class:`MeshPlanSummary`: what ``GET /v1/meshes`` lists and
``?view=summary`` reads) is the plan without its per-device members; the whole plan
(:class:`MeshPlan`) is the summary with ``device_grid`` and ``shards``. A hardware plan
adds its cluster (``hardware``, ``topology``, ``slices``, ``hosts``, ``ici``, ``dcn``,
``axes_detail``), and with a model its ``step_estimate`` and the resolved ``model``: those
are :func:`~datarax.answers.base.omitted` members, absent from plain plans.

The two per-device members are typed ``Sequence``: the service fills them with sequences
of its own that hold the devices as columns and write their JSON in one pass (a
65,536-device plan has 65,536 shards; see :mod:`app.services.plans`), and
:meth:`~datarax.answers.base.Answer.to_json` leaves such a sequence to the service's
encoder. A plan the client parses has lists there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from datarax.answers.base import Answer, omitted
from datarax.answers.catalog import ModelSpec
from datarax.answers.estimates import AxisDetail, MemoryEstimate, MemoryPerDevice, StepEstimate
from datarax.answers.serving import ServingEstimate, ServingMemory

__all__ = ["BatchLayout", "MeshPlan", "MeshPlanList", "MeshPlanSummary", "ParamLayout", "Shard"]


@dataclass(frozen=True, eq=False)
class Shard(Answer):
    """One device of a plan, in mesh order: where it sits and the batch block it holds.
    Hardware plans add ``slice``, ``host`` and ``physical`` (TPU: chip coordinates, plus
    ``core`` where a chip has several)."""

    device: int
    """device id"""
    process_index: int
    """JAX process holding the device"""
    coords: dict[str, int]
    """the device's coordinate on every mesh axis"""
    index: list[list[int]]
    """[start, stop) of every batch dimension the device holds; [] without batch_shape.
    Equals NamedSharding(mesh, spec).devices_indices_map(batch_shape)"""
    replica: int
    """rank among the devices holding the same slice"""
    slice: int | None = omitted()
    """hardware plans: the slice (TPU) or NVLink domain (GPU) of the device"""
    host: int | None = omitted()
    """hardware plans: the device's host, numbered over the plan"""
    physical: list[int] | None = omitted()
    """hardware plans: TPU [x, y, z] chip coordinates; GPU [host, local index]"""
    core: int | None = omitted()
    """hardware plans on TPU chips with several cores: the core on the chip"""


@dataclass(frozen=True, eq=False)
class BatchLayout(Answer):
    """How the global batch splits over the mesh."""

    shape: list[int]
    """the global batch shape"""
    spec: list[str | list[str] | None]
    """PartitionSpec entries: null, an axis name, or a list of axis names
    (major-to-minor)"""
    shard_shape: list[int]
    """the block one device holds"""


@dataclass(frozen=True, eq=False)
class ParamLayout(Answer):
    """One parameter of a plan or session: its shape, spec and per-device bytes."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {
        **Answer.__pydantic_config__,
        "json_schema_extra": {
            "examples": [
                {
                    "path": "layers/0/kernel",
                    "shape": [1024, 4096],
                    "spec": [None, "model"],
                    "shard_shape": [1024, 1024],
                    "bytes_per_device": 4194304,
                }
            ]
        },
    }

    path: str
    """the parameter's path in the model's tree, ``/``-joined"""
    shape: list[int]
    spec: list[str | list[str] | None]
    """the mesh axis (or axes, major-to-minor) each dimension is split over (``null``:
    whole)"""
    shard_shape: list[int]
    bytes_per_device: int
    """bytes of one device's block (times ``repeat`` where there are several)"""
    repeat: int | None = omitted()
    """hardware plans: how many such parameters the model has (one per layer of a
    repeated group, whose path writes ``*`` for the layer)"""


_PLAN_EXAMPLE: dict[str, Any] = {
    "id": "m_01JABCDEFGHJKMNPQRSTVWXYZ0",
    "name": "llm-sweep-7",
    "created_at": "2026-11-30T08:00:00Z",
    "live": True,
    "platform": "cpu",
    "axes": {"data": 2},
    "total_devices": 2,
    "batch": {"shape": [256, 1024], "spec": ["data", None], "shard_shape": [128, 1024]},
    "params": [],
    "memory_per_device": {
        "params": 0,
        "optimizer": 0,
        "batch": 524288,
        "total": 524288,
        "program": "datarax",
    },  # fmt: skip
    "warnings": [],
}
_GRID_EXAMPLE: dict[str, Any] = {
    "device_grid": [0, 1],
    "shards": [
        {
            "device": d,
            "process_index": 0,
            "coords": {"data": d},
            "index": [[128 * d, 128 * d + 128], [0, 1024]],
            "replica": 0,
        }
        for d in (0, 1)
    ],
}


@dataclass(frozen=True, eq=False)
class MeshPlanSummary(Answer):
    """A stored plan without ``device_grid`` and ``shards`` (``GET /v1/meshes``,
    ``GET /v1/meshes/{id}?view=summary``)."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {
        **Answer.__pydantic_config__,
        "json_schema_extra": {"examples": [_PLAN_EXAMPLE]},
    }

    id: str
    """the plan's id (``m_`` and a ULID)"""
    name: str | None
    """the request's free-form label"""
    created_at: str
    """RFC 3339 UTC, e.g. 2026-11-30T08:00:00Z"""
    live: bool
    """true: planned on this service's devices"""
    platform: str | None
    """live: the runtime's platform (cpu/gpu/tpu); hardware: the hardware's kind;
    abstract: the request's platform or null"""
    axes: dict[str, int]
    """resolved axis sizes, in mesh order"""
    total_devices: int
    batch: BatchLayout | None
    """the batch's layout; null without batch_shape"""
    params: list[ParamLayout]
    """the model's parameters; [] without a model"""
    memory_per_device: MemoryEstimate | ServingMemory | MemoryPerDevice
    """bytes per device; params and optimizer are 0 without a model, batch is 0 without a
    batch_shape. A hardware plan with a model: the step estimate's memory; a serving plan:
    its weights, KV cache and activations"""
    warnings: list[str]
    hardware: str | None = omitted()
    """hardware plans: the catalog name (GET /v1/hardware)"""
    topology: str | None = omitted()
    """hardware plans on TPU: the slice topology, e.g. v5p:4x4x4"""
    slices: int | None = omitted()
    """hardware plans: slices (TPU) or NVLink domains (GPU)"""
    hosts: int | None = omitted()
    """hardware plans: hosts of the whole plan"""
    ici: dict[str, int] | None = omitted()
    """hardware plans: each axis's factor inside one slice or NVLink domain"""
    dcn: dict[str, int] | None = omitted()
    """hardware plans: each axis's factor across slices or domains"""
    axes_detail: list[AxisDetail] | None = omitted()
    """hardware plans: one entry per mesh axis, the slowest network it crosses"""
    step_estimate: StepEstimate | None = omitted()
    """hardware plans with a model: one training step's predicted time"""
    model: ModelSpec | None = omitted()
    """hardware plans with a model: the model resolved (a named model's figures with the
    request's overrides; a transformer's seq_len is batch_shape[1])"""
    total_params: int | None = omitted()
    """hardware plans with a model: every parameter of the model"""
    active_params: int | None = omitted()
    """hardware plans with a model: the parameters a token sees (a mixture-of-experts
    model's routed experts experts_per_token times, not num_experts); total_params for a
    dense model"""
    pipeline: dict[str, Any] | None = omitted()
    """hardware plans whose request has pipeline: its microbatches, layers_per_stage and
    schedule (null: derived)"""
    context_parallel: dict[str, Any] | None = omitted()
    """hardware plans whose request has context_parallel: its strategy and load_balance"""
    shard_over_data: bool | None = omitted()
    """hardware plans: true where the optimizer state is split over the data axes too
    (ZeRO-1)"""
    serving_estimate: ServingEstimate | None = omitted()
    """serving plans: the deployment's capacity, latency and throughput"""
    serving: dict[str, Any] | None = omitted()
    """serving plans: the request's serving options, defaults filled in"""


@dataclass(frozen=True, eq=False, kw_only=True)
class MeshPlan(MeshPlanSummary):
    """A stored mesh plan (``POST /v1/meshes``, ``GET /v1/meshes/{id}``): its summary and
    every device, in mesh order."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {
        **Answer.__pydantic_config__,
        "json_schema_extra": {"examples": [{**_PLAN_EXAMPLE, **_GRID_EXAMPLE}]},
    }

    device_grid: Sequence[Any]
    """device ids nested like the mesh (abstract plans: 0..n-1 row-major)"""
    shards: Sequence[Shard]
    """one entry per device, in mesh order"""

    def summary(self) -> MeshPlanSummary:
        """The plan without ``device_grid`` and ``shards``."""
        return MeshPlanSummary(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(MeshPlanSummary)}
        )


@dataclass(frozen=True, eq=False)
class MeshPlanList(Answer):
    """``GET /v1/meshes``: stored plans, newest first."""

    # The member is named like Mapping.items, which it shadows on instances: field() keeps
    # the dataclass from taking that method as the member's default.
    items: list[MeshPlan | MeshPlanSummary] = dataclasses.field()  # type: ignore[assignment]
    """stored plans, newest first: whole plans (view=full) or summaries without
    device_grid and shards (view=summary)"""
    total: int
    """number of stored plans"""
