"""Compile checks (DESIGN v1.1 "Compile checks"): the request. The answers are
:mod:`datarax.answers.compile_checks`'."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt

from app.schemas.base import OptimizerField, Strict
from app.schemas.hardware import HardwareModel

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
    program: Literal["datarax", "maxtext"] = Field(
        "datarax",
        description="the training step compiled: 'datarax', the library's own; 'maxtext', "
        "MaxText's (the maxtext package), with the configuration that launch (target "
        "maxtext) writes for the plan with this model, optimizer and batch, for TPU "
        "hardware plans only",
    )
