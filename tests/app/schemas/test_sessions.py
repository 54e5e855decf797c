"""Session requests: the model (an MLP or a transformer), an optimizer name or object,
step batches given or synthetic."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.schemas.hardware import NamedModel
from app.schemas.sessions import (
    MAX_SESSION_SEQ_LEN,
    SESSION_REQUEST_EXAMPLE,
    STEP_REQUEST_EXAMPLE,
    SessionCreateRequest,
    SessionModel,
    StepRequest,
)
from datarax.specs.model_specs import model_spec
from datarax.specs.named_models import MODELS

MLP = {"kind": "mlp", "features": [4, 2]}


def test_the_examples_are_valid():
    session = SessionCreateRequest.model_validate(SESSION_REQUEST_EXAMPLE)
    assert isinstance(session.model, SessionModel)
    assert session.optimizer.learning_rate == 0.01
    step = StepRequest.model_validate(STEP_REQUEST_EXAMPLE)
    assert step.steps == 10 and step.synthetic is not None and step.synthetic.batch_size == 64


def test_an_optimizer_name_is_that_optimizer_at_its_default_rate():
    plain = SessionCreateRequest.model_validate({"model": MLP})
    named = SessionCreateRequest.model_validate({"model": MLP, "optimizer": "sgd"})
    assert (plain.optimizer.name, plain.optimizer.learning_rate) == ("adam", 1e-3)
    assert (named.optimizer.name, named.optimizer.learning_rate) == ("sgd", 1e-3)
    with pytest.raises(ValidationError):
        SessionCreateRequest.model_validate({"model": MLP, "optimizer": {"learning_rate": 11}})


def test_a_named_model_and_bounds():
    named = SessionCreateRequest.model_validate({"model": {"name": "llama3.1-8b", "layers": 1}})
    assert isinstance(named.model, NamedModel)
    for bad in ({"kind": "mlp", "features": [4]}, {"kind": "rnn"}):
        with pytest.raises(ValidationError):
            SessionCreateRequest.model_validate({"model": bad})
    with pytest.raises(ValidationError):
        StepRequest.model_validate({"synthetic": {"batch_size": 0}})


def test_a_sessions_sequences_are_bounded_below_a_plans():
    # issue 58 (3): plans price up to 1,048,576 tokens; a session runs its steps here
    model = {"kind": "transformer", "layers": 1, "d_model": 8, "d_ff": 8, "heads": 2,
             "kv_heads": 2, "vocab": 8}  # fmt: skip
    ok = SessionCreateRequest.model_validate({"model": {**model, "seq_len": MAX_SESSION_SEQ_LEN}})
    assert ok.model.seq_len == 131_072
    for body in ({**model, "seq_len": MAX_SESSION_SEQ_LEN + 1},
                 {"name": "llama3.1-8b", "seq_len": 1_048_576}):  # fmt: skip
        with pytest.raises(ValidationError, match="131,072 tokens a session"):
            SessionCreateRequest.model_validate({"model": body})
    # every catalog model's own sequence fits a session
    assert all(model_spec({"name": name}).seq_len <= MAX_SESSION_SEQ_LEN for name in MODELS)
