"""Shared pieces of the request models: strict models and the optimizer names."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic import Strict as StrictMode


class Strict(BaseModel):
    """A request model that refuses unknown members (422 naming them)."""

    model_config = ConfigDict(extra="forbid")


OptimizerName = Literal["adam", "adamw", "sgd"]


class OptimizerSpec(BaseModel):
    """An optimizer as an object: ``{"name", "learning_rate", ...}`` (DESIGN v1.2: the one
    form sessions, compile checks and estimates all take, beside a bare name)."""

    model_config = ConfigDict(extra="allow")
    name: OptimizerName = "adam"
    learning_rate: float | None = Field(None, gt=0)


OptimizerField = OptimizerName | OptimizerSpec
"""A name (``"adamw"``) or ``{"name", "learning_rate", ...}``."""


def optimizer_name(value: OptimizerField | None, default: str = "adam") -> str:
    """The optimizer's name, whichever form it came in."""
    if value is None:
        return default
    return value if isinstance(value, str) else value.name


def _integral(value: Any) -> Any:
    # JSON Schema's "integer" includes 62.0 (any number with a zero fraction), so a
    # schema-valid request may send one; bools, strings and 62.5 stay refused.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral), StrictMode()]
"""An integer as the OpenAPI schema describes it: ``62`` or ``62.0``, never ``true`` or
``"62"``. Use instead of ``StrictInt`` in request models."""
