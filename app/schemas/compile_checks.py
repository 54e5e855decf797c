"""Compile checks (DESIGN v1.1 "Compile checks"): the request and the answers."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictInt

from app.schemas.base import OptimizerField, Strict
from app.schemas.hardware import HardwareModel

CompileStatus = Literal["queued", "compiling", "done", "failed", "cancelled"]

COMPILE_CHECK_EXAMPLE = {
    "model": {"kind": "mlp", "features": [8192, 32768, 8192], "dtype": "bfloat16"},
    "optimizer": "adam",
    "batch_shape": [4096, 8192],
}


class CompileCheckRequest(Strict):
    """What to compile on the plan's mesh: the model, the optimizer and the batch."""

    model: HardwareModel
    optimizer: OptimizerField = "adam"
    batch_shape: list[Annotated[StrictInt, Field(ge=1, le=2**40)]] | None = Field(
        None,
        min_length=1,
        max_length=8,
        description="global batch shape; its first entry is the batch size (default: the "
        "plan's batch_shape)",
    )


class CompileMemory(BaseModel):
    argument_bytes: int
    output_bytes: int
    temp_bytes: int
    alias_bytes: int
    peak_bytes: int
    hbm_peak_bytes: int | None = Field(
        None,
        description="XLA's HBM allocation (total_allocation_bytes): what fits is judged on; "
        "peak_bytes also counts on-chip VMEM on TPU",
    )
    generated_code_bytes: int | None = None
    hbm_bytes: int | None = None


class CompileResult(BaseModel):
    fits: bool | None = Field(
        description="XLA's per-device peak (hbm_peak_bytes) within the target's memory "
        "(memory.hbm_bytes): true or false; null (unknown) where the target has no memory "
        "figure to compare with, never true by default; false when XLA refused the program "
        "for memory (xla_error)"
    )
    fits_reason: str | None = Field(
        None, description="why fits is what it is, with the figures compared (or why unknown)"
    )
    memory: CompileMemory | None
    flops: float | None
    bytes_accessed: float | None = None
    collectives: dict[str, int] | None
    lower_s: float | None = None
    compile_s: float | None
    xla_error: str | None


class CompileCheck(BaseModel):
    id: str
    mesh_id: str
    status: CompileStatus
    created_at: str
    finished_at: str | None = None
    position: int | None = Field(None, description="queued: checks ahead of this one + 1")
    phase: Literal["starting", "lowering", "compiling"] | None = Field(
        None,
        description="compiling: starting (the compile worker is starting), lowering, or "
        "compiling (XLA)",
    )
    cached: bool = False
    request: dict[str, Any]
    target: dict[str, Any]
    estimate: dict[str, Any] | None = None
    result: CompileResult | None = None
    estimate_error: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class CompileCheckList(BaseModel):
    items: list[CompileCheck]
    total: int
