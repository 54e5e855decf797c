"""Training sessions: ``POST /v1/meshes/{id}/sessions``, ``GET /v1/sessions/{id}``,
``GET /v1/sessions``, ``POST /v1/sessions/{id}/steps``.

:class:`SessionOptimizer` is one type in both directions: the request's ``optimizer``
object (the service parses it into this class, adding its bounds) and what a session's
answer says it trains with.

Open shapes, kept as objects: a session's ``model`` is the request's, echoed
(:data:`~datarax.answers.catalog.ModelSpec`; a transformer's resolved to every field).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from datarax.answers.base import Answer
from datarax.answers.catalog import ModelSpec
from datarax.answers.plans import ParamLayout

__all__ = [
    "Session",
    "SessionList",
    "SessionOptimizer",
    "SessionParam",
    "SessionSummary",
    "GeneratedTokens",
    "StepAnswer",
    "StepTiming",
]

LEARNING_RATE_BOUNDS = (0.0, 10.0)
"""A session optimizer's learning rate is above the first and at most the second."""


@dataclass(frozen=True, eq=False)
class SessionOptimizer(Answer):
    """The optimizer a session trains with. A request may give its name alone: that
    optimizer at the default learning rate."""

    __pydantic_config__: ClassVar[dict[str, Any]] = {
        **Answer.__pydantic_config__,
        # a request's optimizer object: unknown members are refused (422 naming them)
        "extra": "forbid",
        "json_schema_extra": {"examples": [{"name": "adam", "learning_rate": 0.01}]},
    }

    name: Literal["adam", "adamw", "sgd"] = "adam"
    learning_rate: float = 1e-3
    """above 0, at most 10"""

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> Any:
        """The schema with the learning rate's bounds (the service checks them)."""
        schema = super().__get_pydantic_json_schema__(core_schema, handler)
        rate = handler.resolve_ref_schema(schema)["properties"]["learning_rate"]
        low, high = LEARNING_RATE_BOUNDS
        rate.update(exclusiveMinimum=low, maximum=high)
        return schema


@dataclass(frozen=True, eq=False, kw_only=True)
class SessionParam(ParamLayout):
    """One parameter of a session as placed on the devices: its layout, read from the
    array's real sharding, and its dtype."""

    __pydantic_config__: ClassVar[dict[str, Any]] = Answer.__pydantic_config__

    dtype: str
    """the array's dtype, e.g. float32"""


@dataclass(frozen=True, eq=False, kw_only=True)
class _SessionFields(Answer):
    """What every answer about a session carries: its stored record without layouts."""

    id: str
    mesh_id: str
    created_at: str
    step: int
    """steps run so far"""
    last_loss: float | None
    """the last step's loss; null before a step, or where it is not finite"""
    model: ModelSpec
    """the request's model (a transformer's with every field resolved)"""
    optimizer: SessionOptimizer
    loss: str
    """mse, cross_entropy, or next_token (a transformer)"""
    seed: int
    param_sharding: str
    strategy: str


@dataclass(frozen=True, eq=False, kw_only=True)
class Session(_SessionFields):
    """A training session (``POST /v1/meshes/{id}/sessions``, ``GET /v1/sessions/{id}``)."""

    params: list[SessionParam]
    """the parameters' layouts as placed (they never change)"""
    loss_history: list[tuple[int, float | None]]
    """[[step, loss], ...] by step, null where the loss is not finite: every
    loss_history_stride-th step, at most 2,000 points (past them every other point is
    dropped and the stride doubles)"""
    loss_history_stride: int
    """steps between two points of loss_history"""


@dataclass(frozen=True, eq=False, kw_only=True)
class SessionSummary(_SessionFields):
    """A session in a list: its record without ``params``, and where its state is."""

    state: Literal["live", "expired", "lost"]
    """live: the runtime holds it; expired: freed after DATARAX_SESSION_IDLE_S without a
    step; lost: the runtime restarted since"""


@dataclass(frozen=True, eq=False)
class SessionList(Answer):
    """``GET /v1/sessions``, ``GET /v1/meshes/{id}/sessions``."""

    # field(): no default (else the dataclass takes Mapping.items, inherited, for one)
    items: list[SessionSummary] = field()  # type: ignore[assignment]
    """newest first"""
    total: int
    """number of stored sessions (of the plan, when listed by plan)"""


@dataclass(frozen=True, eq=False)
class StepTiming(Answer):
    """Where a steps call's time went."""

    compile_s: float
    """seconds compiling the step (0 on a cache hit)"""
    run_s: float
    """seconds running the steps"""
    cache_hit: bool
    """the compiled step was cached"""


@dataclass(frozen=True, eq=False)
class GeneratedTokens(Answer):
    """``POST /v1/sessions/{id}/generate``: greedy tokens of a transformer session."""

    id: str
    """the session"""
    tokens: list[list[int]]
    """``steps`` new token ids a prompt row, after the prompt (greedy: the most likely
    next token each time, from a KV-cached decode step)"""


@dataclass(frozen=True, eq=False)
class StepAnswer(Answer):
    """``POST /v1/sessions/{id}/steps``: the losses of the steps just run."""

    step: int
    """steps run so far"""
    losses: list[float | None]
    """one per step; null where the loss is not finite (JSON has no NaN)"""
    timing: StepTiming
    examples_per_s: float | None
