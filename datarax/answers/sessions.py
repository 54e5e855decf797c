"""Training sessions.

Transitional: these are the client's TypedDicts, moved here to become
:class:`~datarax.answers.base.Answer` dataclasses (one definition read by the service and
the client)."""

from typing import NotRequired, TypedDict

from datarax.answers.catalog import ModelSpec
from datarax.answers.plans import ParamLayout


class SessionOptimizer(TypedDict):
    name: str
    learning_rate: float


class Session(TypedDict):
    """A training session (``POST /v1/meshes/{id}/sessions``, ``GET /v1/sessions/{id}``).
    ``loss_history`` is ``[[step, loss], ...]``, every ``loss_history_stride``-th step."""

    id: str
    mesh_id: str
    created_at: str
    step: int
    last_loss: float | None
    model: ModelSpec
    optimizer: SessionOptimizer
    loss: str
    seed: int
    param_sharding: str
    strategy: str
    params: list[ParamLayout]
    loss_history: NotRequired[list[tuple[int, float | None]] | None]
    loss_history_stride: NotRequired[int | None]


class StepTiming(TypedDict):
    compile_s: float
    run_s: float
    cache_hit: bool


class StepAnswer(TypedDict):
    """``POST /v1/sessions/{id}/steps``: the losses of the steps just run (null where not
    finite)."""

    step: int
    losses: list[float | None]
    timing: StepTiming
    examples_per_s: float | None


__all__ = ["SessionOptimizer", "Session", "StepTiming", "StepAnswer"]
