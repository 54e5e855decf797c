"""Calibration profiles over HTTP (DESIGN v1.3, "Calibrations"): the answers of
``GET /v1/calibrations`` and ``GET /v1/calibrations/{id}``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class CalibrationStack(BaseModel):
    """The software stack the constants were fitted on."""

    framework: str = Field(examples=["jax"])
    jax: str | None = Field(None, description="JAX's version (None: runs of several)")
    jaxlib: str | None = None
    backend: str | None = Field(None, examples=["tpu"])


class CalibrationConstants(BaseModel):
    """The step-time constants (``datarax.estimate.step_time.Calibration``)."""

    matmul: float = Field(description="fraction of peak the matmuls reach")
    attention: float = Field(description="fraction of peak a fused attention kernel reaches")
    hbm: float = Field(description="fraction of HBM bandwidth memory-bound work reaches")
    overlap: float = Field(description="fraction of a pass's compute hiding its collectives")
    overhead_s: float
    grouped_matmul: float | None = Field(None, description="the routed experts' matmuls")
    all_to_all_overlap: float | None = None
    source: str


class CalibrationProfileEntry(BaseModel):
    """One profile."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(examples=["published-tpu-jax"])
    kind: Literal["published", "host", "jobs"]
    status: str
    created_at: str
    hardware: str | None = Field(None, description="the catalog entry measured (None: any)")
    hardware_kind: str = Field(examples=["tpu"])
    device_kind: str | None = None
    stack: CalibrationStack
    constants: CalibrationConstants
    measurements: list[dict[str, Any]]
    error: dict[str, Any] | None = Field(
        None, description="how the constants fit their rows (mean absolute errors)"
    )


class CalibrationList(BaseModel):
    items: list[CalibrationProfileEntry]
