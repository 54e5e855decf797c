"""Devices, liveness and readiness answers."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


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
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "platform": "cpu",
                    "process_count": 1,
                    "process_index": 0,
                    "devices": [
                        {
                            "id": 0,
                            "kind": "cpu",
                            "platform": "cpu",
                            "process_index": 0,
                            "coords": None,
                        },
                        {
                            "id": 1,
                            "kind": "cpu",
                            "platform": "cpu",
                            "process_index": 0,
                            "coords": None,
                        },
                    ],
                    "memory_budget": {"host": 27487790694, "device": None},
                }
            ]
        }
    )

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
    model_config = ConfigDict(json_schema_extra={"examples": [{"status": "ok"}]})

    status: Literal["ok"]


class Readiness(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {"status": "ready", "runtime_pid": 4242, "runtime_restarts": 0, "store": "ok"}
            ]
        }
    )

    status: Literal["ready"]
    runtime_pid: int | None
    runtime_restarts: int
    store: Literal["ok"]
