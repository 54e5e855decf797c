"""The guards and error handlers between a request and the routes."""

from __future__ import annotations

from tests.helpers import assert_problem


def test_not_found_is_a_problem(api):
    assert_problem(api.get("/v2/anything"), 404, "not_found")
