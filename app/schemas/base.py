"""Shared pieces of the request models: strict models and the optimizer names."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """A request model that refuses unknown members (422 naming them)."""

    model_config = ConfigDict(extra="forbid")


OptimizerName = Literal["adam", "adamw", "sgd"]
