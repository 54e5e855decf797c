"""Compile checks: ``POST /v1/meshes/{id}/compile-checks``, ``GET /v1/compile-checks/{id}``,
``GET /v1/meshes/{id}/compile-checks``, ``DELETE /v1/compile-checks/{id}`` (DESIGN v1.1,
"Compile checks").

Members that later versions of the service added to a check (``lower_s``,
``hbm_peak_bytes``, ``fits_reason``, ...) default to null, so that a check or a cached
result stored before them still reads; the service sends them all.

Open shapes, kept as objects: a check's ``request`` is the request's body, echoed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from datarax.answers.base import Answer, omitted
from datarax.answers.estimates import MemoryEstimate
from datarax.answers.serving import ServingMemory

__all__ = [
    "CompileCheck",
    "CompileCheckList",
    "CompileError",
    "CompileMemory",
    "CompileProgram",
    "CompileResult",
    "CpuCompileTarget",
    "EstimateError",
    "GpuCompileTarget",
    "TpuCompileTarget",
    "XlaComparison",
]

CompileStatus = Literal["queued", "compiling", "done", "failed", "cancelled"]

_ALWAYS_SENT: dict[str, Any] = {
    **Answer.__pydantic_config__,
    # every member is sent, the defaulted ones too: the answer's schema requires them
    "json_schema_serialization_defaults_required": True,
}


@dataclass(frozen=True, eq=False, kw_only=True)
class CompileMemory(Answer):
    """XLA's per-device memory figures of the compiled step (``memory_analysis()``)."""

    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    peak_bytes: int
    """XLA's peak (``peak_memory_in_bytes``, else argument + output - alias + temp); on TPU
    it also counts on-chip VMEM"""
    hbm_peak_bytes: int | None = None
    """XLA's HBM allocation (total_allocation_bytes): what fits is judged on; peak_bytes
    also counts on-chip VMEM on TPU"""
    generated_code_bytes: int | None = None
    hbm_bytes: int | None = None
    """the memory of one device the step was judged against (null: none known)"""
    host_temp_bytes: int | None = None
    """host memory (``pinned_host``) the program's temporaries take, e.g. activations a
    remat policy offloads"""
    host_argument_bytes: int | None = omitted()
    """where the backend reports it"""
    host_output_bytes: int | None = omitted()
    """where the backend reports it"""
    host_alias_bytes: int | None = omitted()
    """where the backend reports it"""


@dataclass(frozen=True, eq=False, kw_only=True)
class CompileProgram(Answer):
    """The training step a check compiled."""

    name: Literal["datarax", "maxtext"]
    """datarax: the library's own step; maxtext: MaxText's (the maxtext package)"""
    version: str | None
    """the package's version"""
    args: list[str] | None = omitted()
    """maxtext: MaxText's arguments after configs/base.yml (the launch's, then
    compile_topology and compile_topology_num_slices)"""
    env: dict[str, str] | None = omitted()
    """maxtext: the launch's variables the compile ran with (LIBTPU_INIT_ARGS)"""


@dataclass(frozen=True, eq=False, kw_only=True)
class CompileResult(Answer):
    """What XLA said of the compiled step, and whether it fits."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _ALWAYS_SENT

    fits: bool | None
    """XLA's per-device peak (hbm_peak_bytes) within the target's memory (memory.hbm_bytes):
    true or false; null (unknown) where the target has no memory figure to compare with,
    never true by default; false when XLA refused the program for memory (xla_error)"""
    fits_reason: str | None = None
    """why fits is what it is, with the figures compared (or why unknown)"""
    memory: CompileMemory | None
    """null when XLA refused the program for memory"""
    flops: float | None
    bytes_accessed: float | None = None
    collectives: dict[str, int] | None
    """collective ops of the compiled program, by kind"""
    lower_s: float | None = None
    compile_s: float | None
    xla_error: str | None
    """XLA's text when it refused the program for memory"""
    program: CompileProgram | None = None
    """the step compiled (null: a result cached before checks named it)"""


@dataclass(frozen=True, eq=False)
class XlaComparison(Answer):
    """One figure of the estimate against XLA's."""

    estimate: int
    xla: int
    relative: float | None
    """(estimate - xla) / xla; null where XLA's is 0"""


@dataclass(frozen=True, eq=False, kw_only=True)
class EstimateError(Answer):
    """The plan's memory estimate against XLA's figures, field by field, and whether they
    agree on ``fits``."""

    argument_bytes: XlaComparison | None = omitted()
    """params + optimizer + batch: what the step takes in"""
    temp_bytes: XlaComparison | None = omitted()
    """grads + activations + temporaries: what it makes"""
    peak_bytes: XlaComparison | None = omitted()
    """the estimate's total against XLA's peak (which on TPU also counts on-chip VMEM)"""
    hbm_peak_bytes: XlaComparison | None = omitted()
    """the estimate's total against XLA's HBM allocation (what fits is judged on)"""
    fits_agrees: bool | None = omitted()
    """the estimate's fits is XLA's (where both are known)"""


@dataclass(frozen=True, eq=False)
class CompileError(Answer):
    """Why a check failed."""

    code: str
    """compile_failed, or the library's code (model_too_large, ...)"""
    detail: str


@dataclass(frozen=True, eq=False)
class TpuCompileTarget(Answer):
    """A TPU topology, compiled through libtpu without the chips."""

    kind: Literal["tpu"]
    hardware: str
    """the catalog entry"""
    topology: str
    slices: int
    hbm_source: str | None
    """where the memory fits is judged against comes from (``catalog:<entry>``)"""


@dataclass(frozen=True, eq=False)
class GpuCompileTarget(Answer):
    """The host's own GPUs, which a live GPU plan names."""

    kind: Literal["gpu"]
    platform: str
    """JAX's platform (``cuda``, ``rocm``)"""
    platform_version: str | None
    device_kind: str
    """the GPUs' device kinds, comma-separated"""
    devices: int
    """GPUs the compile worker sees"""
    hbm_source: str | None
    """where the memory fits is judged against comes from (``DATARAX_MEMORY_BUDGET_MB``,
    ``bytes_limit``, ``catalog:<entry>``; null: none known)"""


@dataclass(frozen=True, eq=False)
class CpuCompileTarget(Answer):
    """The compile worker's CPU devices, which a live CPU plan names."""

    kind: Literal["cpu"]
    devices: int
    """CPU devices the compile worker has (DATARAX_CPU_DEVICES)"""
    hbm_source: str | None
    """where the memory fits is judged against comes from (null: the host's memory is
    unknown)"""


CompileTarget = TpuCompileTarget | GpuCompileTarget | CpuCompileTarget
"""What a check compiles for: a TPU topology, the host's GPUs or its CPU devices."""


@dataclass(frozen=True, eq=False, kw_only=True)
class CompileCheck(Answer):
    """One check: XLA's verdict on a plan's training step, from the compile worker."""

    id: str
    mesh_id: str
    status: CompileStatus
    created_at: str
    finished_at: str | None = omitted()
    """once it ended (done, failed or cancelled)"""
    position: int | None = omitted()
    """queued: checks ahead of this one + 1"""
    phase: Literal["starting", "lowering", "compiling"] | None = omitted()
    """compiling: starting (the compile worker is starting), lowering, or compiling (XLA)"""
    cached: bool = False
    """done from the result of an identical check (the same program and compiler)"""
    request: dict[str, Any]
    """the request's body"""
    target: CompileTarget
    """what it compiles for"""
    estimate: MemoryEstimate | None
    """the plan's memory estimate for the request (null for a serving plan)"""
    serving_memory: ServingMemory | None = omitted()
    """a serving plan: its memory_per_device, which the compiled decode step judges"""
    result: CompileResult | None = omitted()
    """done: what XLA said"""
    estimate_error: EstimateError | None = omitted()
    """done: the estimate against XLA's figures (left out where there is nothing to
    compare)"""
    error: CompileError | None = omitted()
    """failed: why"""

    __pydantic_config__: ClassVar[dict[str, Any]] = {
        **Answer.__pydantic_config__,
        "json_schema_extra": {
            "examples": [
                {
                    "id": "c_01JABCDEFGHJKMNPQRSTVWXYZ0",
                    "mesh_id": "m_01JABCDEFGHJKMNPQRSTVWXYZ0",
                    "status": "queued",
                    "created_at": "2026-12-01T08:00:00Z",
                    "position": 1,
                    "cached": False,
                    "request": {"model": {"kind": "mlp", "features": [1024, 4096, 1024]}},
                    "target": {
                        "kind": "tpu",
                        "hardware": "tpu-v5e",
                        "topology": "4x4",
                        "slices": 1,
                        "hbm_source": "catalog:tpu-v5e",
                    },
                    "estimate": None,
                }
            ]
        },
    }


@dataclass(frozen=True, eq=False)
class CompileCheckList(Answer):
    """A plan's checks, newest first."""

    # field(): no default (else the dataclass takes Mapping.items, inherited, for one)
    items: list[CompileCheck] = field()  # type: ignore[assignment]
    total: int
