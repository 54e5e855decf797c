"""Calibration requests (DESIGN v1.3, "Calibrations"): the bodies of
``POST /v1/calibrations``. The answers are :mod:`datarax.answers.calibrations`'."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictBool, model_validator
from pydantic.json_schema import SkipJsonSchema

from app.schemas.base import Strict


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
    quick: StrictBool = Field(
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
