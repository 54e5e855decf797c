"""The caps of a job point: metrics, name length, reduced numbers, answer text."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from app.core.errors import ServiceError
from app.services.jobs.limits import (
    PointLimits,
    check_batch_text,
    check_point_shape,
    npz_member_count,
    point_text_bound,
    reduced_numbers,
)


def test_each_cap_has_its_code():
    limits = PointLimits(max_values=3, max_metrics=2, max_name=5)
    cases = [
        (["a", "b", "c"], 1, "too_many_metrics"),
        (["abcdef"], 1, "metric_name_too_long"),
        (["a"], 4, "value_too_large"),
    ]
    for names, values, code in cases:
        with pytest.raises(ServiceError) as err:
            check_point_shape(names, values, 7, limits)
        assert err.value.code == code and "point 7" in err.value.detail
    check_point_shape(["a", "b"], 3, None, limits)  # at the caps: accepted


def test_the_text_bound_holds_for_the_longest_numbers():
    names = ["loss", 'q"uote', "\u00e9"]
    values = dict.fromkeys(names, -1.7976931348623157e308)
    assert len(json.dumps(values, ensure_ascii=False).encode()) <= point_text_bound(names, 3)
    with pytest.raises(ServiceError) as err:
        check_point_shape(names, 3, None, PointLimits(max_answer_bytes=100))
    assert err.value.code == "value_too_large"


def test_reduced_numbers_drop_the_leading_axes():
    assert reduced_numbers((8,), 1) == 1
    assert reduced_numbers((8, 3, 2), 1) == 6
    assert reduced_numbers((5, 8, 3), 2) == 3


def test_npz_members_are_counted_from_the_directory():
    buffer = io.BytesIO()
    np.savez(buffer, **{f"m{i}": np.zeros(1) for i in range(7)})
    assert npz_member_count(buffer.getvalue()) == 7
    assert npz_member_count(b"not a zip") is None


def test_a_batch_whose_text_could_pass_the_body_limit_is_refused():
    arrays = {"x" * 200: np.zeros((1000, 4))}
    with pytest.raises(ServiceError) as err:
        check_batch_text(arrays, 1000, max_bytes=100_000)
    assert err.value.code == "value_too_large"
    check_batch_text(arrays, 1000, max_bytes=10_000_000)
