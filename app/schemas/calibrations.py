"""Calibration profiles over HTTP (DESIGN v1.3, "Calibrations"): the answers of
``GET /v1/calibrations`` and ``GET /v1/calibrations/{id}``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.json_schema import SkipJsonSchema

from app.schemas.base import Strict


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
    link: float = Field(1.0, description="fraction of the catalog's link figures collectives reach")
    collective_s: float = Field(0.0, description="fixed seconds of each collective op")
    layer_s: float = Field(0.0, description="fixed seconds of each transformer layer a step")
    source: str


class CalibrationProfileEntry(BaseModel):
    """One profile."""

    model_config = ConfigDict(extra="allow")
    id: str = Field(examples=["published-tpu-jax"])
    kind: Literal["published", "host", "jobs"]
    status: str = Field(description="done; a host profile: running, then done or failed")
    created_at: str
    hardware: str | None = Field(None, description="the catalog entry measured (None: any)")
    hardware_kind: str = Field(examples=["tpu"])
    device_kind: str | None = None
    stack: CalibrationStack
    constants: CalibrationConstants | None = Field(
        description="null while a host profile is measured, or when its measuring failed"
    )
    measurements: list[dict[str, Any]]
    error: dict[str, Any] | None = Field(
        None, description="how the constants fit their rows (mean absolute errors)"
    )
    progress: dict[str, Any] | None = Field(
        None,
        description="a host profile's measuring: the stages, those done, the one running",
    )
    problem: dict[str, Any] | None = Field(
        None, description="why a host profile failed (status failed): its code and detail"
    )


class CalibrationList(BaseModel):
    items: list[CalibrationProfileEntry]


class JobsCalibrationRequest(Strict):
    """``POST /v1/calibrations`` ``{"kind": "jobs"}``: fit a profile on the measured
    steps of jobs linked to their plans (``PATCH /v1/jobs/{job}`` with ``plan``)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"kind": "jobs", "jobs": ["run-1"]}]}
    )

    kind: Literal["jobs"] = Field(description="jobs: fit on linked jobs' measured steps")
    jobs: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        min_length=1, max_length=256, description="the linked jobs to fit on"
    )
    framework: str = Field("jax", max_length=32, description="the jobs' software stack")


class HostCalibrationRequest(Strict):
    """``POST /v1/calibrations`` ``{"kind": "host"}``: the runtime measures its live
    devices (matmuls, the attention kernel, HBM bandwidth, collectives) and the
    constants are fitted on what it measured."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"kind": "host", "quick": True}]}
    )

    kind: Literal["host"] = Field(description="host: measure the live devices")
    quick: bool = Field(
        True,
        description="fewer and smaller cases: under a minute on a two-core host with 8 "
        "simulated CPU devices; false adds the larger sizes",
    )
    hardware: SkipJsonSchema[None] | Annotated[str, Field(min_length=1, max_length=64)] = Field(
        None,
        description="the catalog entry the devices are (GET /v1/hardware); default: the "
        "entry whose device_kind the devices report",
    )

    @model_validator(mode="before")
    @classmethod
    def _hardware_not_null(cls, data: Any) -> Any:
        if isinstance(data, dict) and "hardware" in data and data["hardware"] is None:
            raise ValueError("hardware is a catalog name (GET /v1/hardware); leave it out "
                             "for the entry the devices report")  # fmt: skip
        return data


CalibrationRequest = Annotated[
    JobsCalibrationRequest | HostCalibrationRequest, Field(discriminator="kind")
]
