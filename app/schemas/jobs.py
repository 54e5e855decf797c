"""Job metric history requests and answers."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from app.schemas.metrics import METRICS_REQUEST_EXAMPLE, MetricsReduceRequest

JOB_NAME_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"


class JobMetricsRequest(MetricsReduceRequest):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{**METRICS_REQUEST_EXAMPLE, "step": 10}]},
    )

    step: Annotated[StrictInt, Field(ge=0)] = Field(description="training step (>= 0)")


class JobPointOut(BaseModel):
    step: int
    reduced: dict[str, Any]
    received_at: str = Field(description="RFC 3339 UTC")


class JobPointCreated(JobPointOut):
    job: str
    num_devices: int


class JobHistory(BaseModel):
    job: str
    points: list[JobPointOut] = Field(description="in step order")
