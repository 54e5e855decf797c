"""What the metrics endpoints and the job push share: the plain-form check, the npz
decoding, the reduce query, the library's options."""

from __future__ import annotations

import io

import numpy as np
import pytest

from app.core.errors import InvalidParameter
from app.services.metric_inputs import (
    decode_npz_metrics,
    library_options,
    parse_reduce_query,
    plain_metrics_fields,
)


def test_reduce_query_parsing():
    assert parse_reduce_query("loss:mean, step:max") == {"loss": "mean", "step": "max"}
    with pytest.raises(InvalidParameter, match="listed twice"):
        parse_reduce_query("a:mean,a:sum")
    with pytest.raises(InvalidParameter, match="not name:op"):
        parse_reduce_query("loss")


def test_the_plain_form_takes_job_points_only_when_asked():
    point = {"metrics": {"loss": [1.0], "lr": 0.1}, "step": 3, "source": "h-1", "sources": 2}
    fields = plain_metrics_fields(point, options=True, point=True)
    assert fields is not None
    assert (fields["step"], fields["source"], fields["sources"]) == (3, "h-1", 2)
    assert fields["nan_policy"] == "propagate" and fields["reduce"] == {}
    # A reduce body takes no step, source or scalar metric: the model answers those.
    assert plain_metrics_fields(point, options=True) is None
    assert plain_metrics_fields({"metrics": {"lr": 0.1}}, options=True) is None
    for other in (
        {"step": -1},
        {"step": 2**63},
        {"step": True},
        {"source": "a b"},
        {"sources": 0},
        {"sources": 4097},
    ):
        assert plain_metrics_fields({**point, **other}, options=True, point=True) is None


def test_npz_metrics_take_their_options_from_the_query():
    buffer = io.BytesIO()
    np.savez(buffer, loss=np.array([1.0, 5.0]), _weights=np.array([1.0, 3.0]))
    data = decode_npz_metrics(
        buffer.getvalue(), max_bytes=1 << 20, reduce_query="loss:max", nan_policy_query="omit"
    )
    assert (data.reduce, data.nan_policy, data.weights.tolist()) == (
        {"loss": "max"},
        "omit",
        [1.0, 3.0],
    )
    assert list(data.metrics) == ["loss"]


def test_library_options_pass_the_request_strings_unchanged():
    assert library_options({"x": "median"}, "sometimes") == ({"x": "median"}, "sometimes")
