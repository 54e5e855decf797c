"""RFC 9457 problem bodies as documented in the OpenAPI schema."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Problem(BaseModel):
    """RFC 9457 problem details (``application/problem+json``)."""

    model_config = ConfigDict(extra="allow")
    type: str = Field(examples=["urn:datarax:problem:not_enough_devices"])
    title: str
    status: int
    detail: str
    code: str = Field(description="machine-readable snake_case reason")


class FieldError(BaseModel):
    loc: list[str | int] = Field(examples=[["body", "axes", "data"]])
    field: str = Field(examples=["axes.data"])
    msg: str
    type: str


class ValidationProblem(Problem):
    errors: list[FieldError] = Field(default_factory=list)
