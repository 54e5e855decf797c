"""What both clients share (datarax.client._core): npz bodies, Retry-After delays and problem
details turned into ApiError."""

from __future__ import annotations

import json

import numpy as np
import pytest

from datarax.client import ApiError, from_npz, to_npz
from datarax.client._core import MAX_BACKOFF_S, raise_for_problem, retry_delay


def test_npz_helpers_round_trip():
    arrays = {"loss": np.arange(4.0), "per_class": np.ones((4, 3), np.float32)}
    back = from_npz(to_npz(arrays))
    assert set(back) == set(arrays)
    for name, value in arrays.items():
        np.testing.assert_array_equal(back[name], value)
        assert back[name].dtype == value.dtype


@pytest.mark.parametrize(
    ("attempt", "retry_after", "backoff_s", "delay"),
    [(0, None, 0.5, 0.5), (3, None, 0.5, 4.0), (0, "7", 0.1, 7.0), (9, None, 1.0, 30.0)],
    ids=["first", "doubling", "retry-after-seconds", "capped"],
)
def test_retry_delay_doubles_honours_retry_after_and_is_capped(
    attempt, retry_after, backoff_s, delay
):
    assert retry_delay(attempt, retry_after, backoff_s) == delay == min(MAX_BACKOFF_S, delay)


def test_problem_details_become_api_errors():
    raise_for_problem(200, {}, b"ignored")  # below 400: nothing
    body = json.dumps({"status": 409, "code": "step_conflict", "detail": "step 3 differs"})
    with pytest.raises(ApiError) as info:
        raise_for_problem(409, {"content-type": "application/problem+json"}, body.encode())
    assert (info.value.status, info.value.code) == (409, "step_conflict")
    assert "step 3 differs" in str(info.value)
    with pytest.raises(ApiError) as info:
        raise_for_problem(502, {"content-type": "text/html"}, b"<html>bad gateway</html>")
    assert info.value.code == "http_502"
