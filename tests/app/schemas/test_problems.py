"""Problem bodies: the service's problems validate against the documented schema."""

from __future__ import annotations

import orjson

from app.core.errors import MeshNotFound, problem_bytes, validation_error
from app.schemas.problems import Problem, ValidationProblem


def test_service_problems_are_documented_problems():
    error = MeshNotFound("no mesh plan with id 'm_x'")
    body = orjson.loads(problem_bytes(error.status, error.code, error.detail, title=error.title))
    problem = Problem.model_validate(body)
    assert (problem.status, problem.code) == (404, error.code)


def test_validation_problems_list_each_field():
    error = validation_error([{"loc": ("body", "axes", "data"), "msg": "bad", "type": "x"}])
    body = orjson.loads(
        problem_bytes(error.status, error.code, error.detail, title=error.title, **error.extra)
    )
    problem = ValidationProblem.model_validate(body)
    assert problem.code == "validation_error"
    assert [(e.loc, e.field) for e in problem.errors] == [(["body", "axes", "data"], "axes.data")]
