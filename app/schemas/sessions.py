"""Training session requests. The answers are :mod:`datarax.answers.sessions`'."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, Tag

from app.schemas.base import JsonInt, Strict
from app.schemas.hardware import MODEL_DISCRIMINATOR, NamedModel, TransformerModel
from app.schemas.metrics import NumberList, Tensor
from datarax.answers.sessions import LEARNING_RATE_BOUNDS, SessionOptimizer

SESSION_REQUEST_EXAMPLE: dict[str, Any] = {
    "model": {"kind": "mlp", "features": [16, 64, 4]},
    "optimizer": {"name": "adam", "learning_rate": 0.01},
    "loss": "mse",
    "seed": 0,
    "param_sharding": "replicate",
    "strategy": "spmd",
}

STEP_REQUEST_EXAMPLE: dict[str, Any] = {"steps": 10, "synthetic": {"seed": 0, "batch_size": 64}}


class SessionModel(Strict):
    """The built-in MLP a session trains."""

    kind: Literal["mlp"] = Field(description="model family: 'mlp' (or a transformer)")
    features: list[Annotated[JsonInt, Field(ge=1, le=65_536)]] = Field(
        min_length=2, max_length=32, description="layer widths [in, hidden..., out]"
    )


SessionModelField = Annotated[
    Annotated[SessionModel, Tag("mlp")]
    | Annotated[TransformerModel, Tag("transformer")]
    | Annotated[NamedModel, Tag("named")],
    MODEL_DISCRIMINATOR,
]
"""The built-in MLP, or a transformer (explicit or named): data parallel, next-token loss,
synthetic batches of token ids or ``inputs``/``targets`` ``[B, seq_len]`` ids."""


MAX_SESSION_SEQ_LEN = 131_072
"""Tokens a session's sequences hold at most. Plans take up to 1,048,576 (they price a
model, nothing runs); a session runs its steps on this host's devices, where a step of
longer sequences would take hours (CPU) or not fit (one accelerator's memory), and the
attention's ``[S, S]`` arrays past 46,341 tokens are refused anyway (``model_too_large``)."""


def _sequence_in_bounds(value: Any) -> Any:
    seq_len = getattr(value, "seq_len", None)
    if seq_len is not None and seq_len > MAX_SESSION_SEQ_LEN:
        raise ValueError(
            f"seq_len {seq_len} is beyond the {MAX_SESSION_SEQ_LEN:,} tokens a session's "
            "sequences may hold (plans and recommendations price longer ones)"
        )
    return value


def _optimizer_object(value: Any) -> Any:
    # DESIGN v1.2: a bare name is the same optimizer at its default learning rate.
    return {"name": value} if isinstance(value, str) else value


def _learning_rate_in_bounds(value: SessionOptimizer) -> SessionOptimizer:
    low, high = LEARNING_RATE_BOUNDS
    if not low < value.learning_rate <= high:
        raise ValueError(
            f"learning_rate must be above {low:g} and at most {high:g}, got {value.learning_rate}"
        )
    return value


class SessionCreateRequest(Strict):
    model: Annotated[SessionModelField, AfterValidator(_sequence_in_bounds)] = Field(
        description="the built-in MLP, or a transformer (explicit or named); a transformer's "
        f"seq_len at most {MAX_SESSION_SEQ_LEN:,}"
    )
    optimizer: Annotated[
        SessionOptimizer,  # the answer's class: one type for the object in both directions
        BeforeValidator(_optimizer_object),
        AfterValidator(_learning_rate_in_bounds),
    ] = Field(
        default_factory=SessionOptimizer,
        description="a name ('adam', 'adamw', 'sgd') or {'name', 'learning_rate'}",
    )
    loss: Literal["mse", "cross_entropy"] = Field(
        "mse", description="mse: float targets [B, out]; cross_entropy: integer ids [B]"
    )
    seed: JsonInt = Field(0, ge=0, le=2**31 - 1, description="parameter initialisation")
    param_sharding: Literal["replicate", "model", "fsdp"] = "replicate"
    strategy: Literal["spmd", "collective"] = Field(
        "spmd",
        description="spmd: nnx.jit under the mesh (XLA all-reduces); collective: the "
        "guide's pmap path, explicit gradient pmean (needs param_sharding=replicate)",
    )


class SyntheticBatch(Strict):
    seed: JsonInt = Field(0, ge=0, le=2**31 - 1)
    batch_size: JsonInt = Field(ge=1, le=1_048_576)


class StepBatch(Strict):
    inputs: NumberList | Tensor = Field(description="[B, features[0]] numbers")
    targets: NumberList | Tensor | None = Field(
        None, description="[B, features[-1]] floats (mse) or [B] class ids (cross_entropy)"
    )


class GenerateRequest(Strict):
    """``POST /v1/sessions/{id}/generate``: greedy tokens after each row of ``prompt``."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"prompt": [[1, 2, 3]], "steps": 4}]})

    prompt: list[list[Annotated[JsonInt, Field(ge=0)]]] = Field(
        min_length=1,
        max_length=64,
        description="token ids [batch, length]: at most 64 rows of 1..512 ids, rows of one "
        "length, each below the model's vocab",
    )
    steps: JsonInt = Field(1, ge=1, le=64, description="tokens to generate a row (1..64)")


class StepRequest(Strict):
    steps: JsonInt = Field(1, description="training steps to run (1..max_steps_per_call)")
    batch: StepBatch | None = Field(None, description="the same batch for every step")
    synthetic: SyntheticBatch | None = Field(
        None,
        description="one generated batch per step number; depends only on seed, "
        "batch size, model and step number",
    )
