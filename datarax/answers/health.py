"""Health and device answers: ``GET /health/live``, ``GET /health/ready``,
``GET /v1/devices``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from datarax.answers.base import Answer, examples

__all__ = ["Device", "Devices", "Liveness", "MemoryBudget", "Readiness"]


@dataclass(frozen=True, eq=False)
class Liveness(Answer):
    """``GET /health/live``: the HTTP process serves requests."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples({"status": "ok"})

    status: Literal["ok"] = "ok"


@dataclass(frozen=True, eq=False)
class Readiness(Answer):
    """``GET /health/ready``: the store takes writes and the device runtime is up."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(
        {"status": "ready", "runtime_pid": 4242, "runtime_restarts": 0, "store": "ok"}
    )

    status: Literal["ready"]
    runtime_pid: int | None
    """the device runtime's process id"""
    runtime_restarts: int
    """how often the runtime was restarted since the service started"""
    store: Literal["ok"]


@dataclass(frozen=True, eq=False)
class Device(Answer):
    """One global device of the runtime."""

    id: int
    kind: str
    platform: str | None
    process_index: int
    coords: list[int] | None
    """physical coordinates where known"""


@dataclass(frozen=True, eq=False)
class MemoryBudget(Answer):
    """What training sessions are admitted against."""

    host: int
    """bytes sessions may plan to hold in one host's memory (its CPU devices)"""
    device: int | None
    """bytes sessions may plan to hold on one accelerator; null without one"""


@dataclass(frozen=True, eq=False)
class Devices(Answer):
    """``GET /v1/devices``: platform, process count and index, and every global device."""

    __pydantic_config__: ClassVar[dict[str, Any]] = examples(
        {
            "platform": "cpu",
            "process_count": 1,
            "process_index": 0,
            "devices": [
                {"id": 0, "kind": "cpu", "platform": "cpu", "process_index": 0, "coords": None},
                {"id": 1, "kind": "cpu", "platform": "cpu", "process_index": 0, "coords": None},
            ],
            "memory_budget": {"host": 27487790694, "device": None},
        }
    )

    platform: str
    process_count: int
    process_index: int
    devices: list[Device]
    memory_budget: MemoryBudget | None
    """what training sessions are admitted against (DATARAX_MEMORY_FRACTION or
    DATARAX_MEMORY_BUDGET_MB); beyond it 422 insufficient_memory"""
