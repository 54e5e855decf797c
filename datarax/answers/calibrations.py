"""Calibration profiles.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from typing import Any, Literal, NotRequired, TypedDict


class CalibrationProfile(TypedDict):
    """``GET /v1/calibrations/{id}`` and ``POST /v1/calibrations``: a profile's step-time
    constants, what they were fitted on and how well they fit."""

    id: str
    kind: Literal["published", "host", "jobs"]
    status: str
    created_at: str
    hardware: str | None
    hardware_kind: str
    device_kind: str | None
    stack: dict[str, str | None]
    constants: dict[str, Any] | None  # None while a host profile measures, or failed
    measurements: list[dict[str, Any]]
    error: dict[str, Any] | None
    progress: NotRequired[dict[str, Any] | None]  # a host profile's stages done, running
    problem: NotRequired[dict[str, Any] | None]  # why a host profile failed


__all__ = ["CalibrationProfile"]
