"""Compile-check requests: a hardware model, an optimizer, an optional bounded batch."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.schemas.compile_checks import CompileCheckRequest
from app.schemas.hardware import HardwareMlpModel

MLP = {"kind": "mlp", "features": [8, 4]}


def test_a_request_needs_only_a_model():
    request = CompileCheckRequest.model_validate({"model": MLP})
    assert isinstance(request.model, HardwareMlpModel)
    assert request.optimizer == "adam" and request.batch_shape is None


@pytest.mark.parametrize(
    "change",
    [{"batch_shape": []}, {"batch_shape": [0]}, {"batch_shape": [2.0]}, {"optimizer": "lion"}],
    ids=["empty", "zero", "float", "optimizer"],
)
def test_bad_requests_are_refused(change):
    with pytest.raises(ValidationError):
        CompileCheckRequest.model_validate({"model": MLP, **change})
