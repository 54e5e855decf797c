"""Devices, liveness and readiness answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class DeviceOut(BaseModel):
    id: int
    kind: str
    platform: str | None = None
    process_index: int
    coords: list[int] | None = Field(None, description="physical coordinates where known")


class MemoryBudget(BaseModel):
    host: int = Field(
        description="bytes sessions may plan to hold in one host's memory (its CPU devices)"
    )
    device: int | None = Field(
        description="bytes sessions may plan to hold on one accelerator; null without one"
    )


class DevicesResponse(BaseModel):
    platform: str
    process_count: int
    process_index: int
    devices: list[DeviceOut]
    memory_budget: MemoryBudget | None = Field(
        None,
        description="what training sessions are admitted against (DATARAX_MEMORY_FRACTION "
        "or DATARAX_MEMORY_BUDGET_MB); beyond it 422 insufficient_memory",
    )


class Liveness(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready"]
    runtime_pid: int | None
    runtime_restarts: int
    store: Literal["ok"]
