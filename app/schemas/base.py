"""Shared pieces of the request models: strict models and the optimizer names."""

from __future__ import annotations

from collections.abc import Collection
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    ValidationError,
    model_validator,
)
from pydantic import Strict as StrictMode
from pydantic_core import InitErrorDetails, PydanticCustomError


class Strict(BaseModel):
    """A request model that refuses unknown members (422 naming them)."""

    model_config = ConfigDict(extra="forbid")


OptimizerName = Literal["adam", "adamw", "sgd"]

MAX_OPTIMIZER_EXTRAS = 16
"""Optimizer members besides ``name`` and ``learning_rate``, at most."""
MAX_NAME_CHARS = 64
MAX_VALUE_CHARS = 256


class OptimizerSpec(BaseModel):
    """An optimizer as an object: ``{"name", "learning_rate", ...}`` (DESIGN v1.2: the one
    form sessions, compile checks and estimates all take, beside a bare name)."""

    model_config = ConfigDict(extra="allow")
    name: OptimizerName = "adam"
    learning_rate: float | None = Field(None, gt=0)
    shard_over_data: StrictBool = Field(
        False,
        strict=True,
        description="hardware plans: optimizer state split over the data axes as well "
        "(ZeRO-1; MaxText's shard_optimizer_over_data)",
    )

    @model_validator(mode="after")
    def _bounded_extras(self) -> OptimizerSpec:
        # Other members (b1, weight_decay, ...) are taken as the contract's "..." but
        # bounded like every client string: a few scalars with short names.
        extra = self.model_extra or {}
        if len(extra) > MAX_OPTIMIZER_EXTRAS:
            raise ValueError(f"at most {MAX_OPTIMIZER_EXTRAS} optimizer members besides name")
        for key, value in extra.items():
            if len(key) > MAX_NAME_CHARS:
                raise ValueError(f"optimizer member names are at most {MAX_NAME_CHARS} characters")
            if isinstance(value, str) and len(value) > MAX_VALUE_CHARS:
                raise ValueError(f"optimizer member {key!r}: at most {MAX_VALUE_CHARS} characters")
            if value is not None and not isinstance(value, (bool, int, float, str)):
                raise ValueError(f"optimizer member {key!r} must be a number, string or boolean")
        return self


OptimizerField = OptimizerName | OptimizerSpec
"""A name (``"adamw"``) or ``{"name", "learning_rate", ...}``."""


def optimizer_name(value: OptimizerField | None, default: str = "adam") -> str:
    """The optimizer's name, whichever form it came in."""
    if value is None:
        return default
    return value if isinstance(value, str) else value.name


def shards_over_data(value: OptimizerField | None) -> bool:
    """Whether the optimizer object asks for ZeRO-1 (``shard_over_data``)."""
    return isinstance(value, OptimizerSpec) and value.shard_over_data


def unread_optimizer_notes(value: OptimizerField | None) -> list[str]:
    """The plan ``warnings`` for the optimizer members a plan does not read: the optimizer
    takes one form everywhere (DESIGN v1.2: a name or ``{"name", "learning_rate", ...}``),
    so a plan accepts what sessions read (``learning_rate``, other members) and says that
    they change nothing in it (DESIGN v1.4: every input used or refused, never silently
    dropped)."""
    if not isinstance(value, OptimizerSpec):
        return []
    said = ["learning_rate"] if value.learning_rate is not None else []
    said += [key for key, item in (value.model_extra or {}).items() if item is not None]
    if not said:
        return []
    return [
        f"optimizer.{', optimizer.'.join(said)}: read by sessions, not by plans (a plan's "
        "memory and step time read the optimizer's name and shard_over_data); changes "
        "nothing here"
    ]


def _integral(value: Any) -> Any:
    # JSON Schema's "integer" includes 62.0 (any number with a zero fraction), so a
    # schema-valid request may send one; bools, strings and 62.5 stay refused.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


JsonInt = Annotated[int, BeforeValidator(_integral), StrictMode()]
"""An integer as the OpenAPI schema describes it: ``62`` or ``62.0``, never ``true`` or
``"62"``. Use instead of ``StrictInt`` in request models."""


def untagged(error: ValidationError, tags: Collection[tuple[str, ...]]) -> ValidationError:
    """``error`` with a union's tag (one of ``tags``, as a location prefix) taken out of
    every location: bodies without a tag name the member sent (``axes.data``), not the arm
    pydantic tried (``live.axes.data``)."""
    return ValidationError.from_exception_data(
        error.title,
        [
            InitErrorDetails(
                type=PydanticCustomError(
                    str(e["type"]),
                    str(e["msg"]).replace("{", "{{").replace("}", "}}"),
                    e.get("ctx"),
                ),
                loc=tuple(e["loc"][1:] if e["loc"][:1] in tags else e["loc"]),
                input=e.get("input"),
            )
            for e in error.errors(include_url=False)
        ],
    )
