"""The metrics service without HTTP: bodies in, reduced values out."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pytest

from app.core.errors import InvalidParameter, ReservedMetricName, UnsupportedMediaType
from app.schemas.metrics import MetricsCollectRequest, MetricsReduceRequest
from app.services.metrics import (
    collect_metrics,
    decode_metrics_body,
    decode_npz_metrics,
    library_options,
    parse_reduce_query,
    plain_metrics_fields,
    reduce_metrics,
    reduced_npz_arrays,
)


def test_json_and_npz_bodies_reduce_alike():
    metrics = {"loss": [1.0, 2.0, 3.0, 6.0], "step": [1, 2, 3, 4]}
    json_body = orjson.dumps(
        {"metrics": metrics, "reduce": {"step": "max"}, "weights": [1, 1, 1, 3]}
    )
    buffer = io.BytesIO()
    np.savez(
        buffer, **{k: np.array(v) for k, v in metrics.items()}, _weights=np.array([1, 1, 1, 3.0])
    )
    from_json = decode_metrics_body(
        json_body, "application/json", None, MetricsReduceRequest, max_bytes=1 << 20
    )
    from_npz = decode_metrics_body(
        buffer.getvalue(),
        "application/x-npz",
        None,
        MetricsReduceRequest,
        max_bytes=1 << 20,
        reduce_query="step:max",
    )
    for data in (from_json, from_npz):
        reduced, n = reduce_metrics(data)
        assert n == 4 and reduced["step"] == 4
        assert reduced["loss"] == pytest.approx((1 + 2 + 3 + 18) / 6)


def test_collect_splits_per_device():
    data = decode_metrics_body(
        b'{"metrics": {"x": [[1, 2], [3, 4]]}}',
        "application/json",
        None,
        MetricsCollectRequest,
        max_bytes=1 << 20,
    )
    devices = collect_metrics(data)
    assert [d["device"] for d in devices] == [0, 1]
    assert devices[1]["metrics"]["x"].tolist() == [3, 4]


def test_other_media_types_are_refused():
    with pytest.raises(UnsupportedMediaType, match="text/plain"):
        decode_metrics_body(b"x", "text/plain", "text/plain", MetricsReduceRequest, max_bytes=1)


def test_reduce_query_parsing():
    assert parse_reduce_query("loss:mean, step:max") == {"loss": "mean", "step": "max"}
    with pytest.raises(InvalidParameter, match="listed twice"):
        parse_reduce_query("a:mean,a:sum")
    with pytest.raises(InvalidParameter, match="not name:op"):
        parse_reduce_query("loss")


def test_npz_answer_reserves_the_device_count_name():
    assert reduced_npz_arrays({"loss": 1.0}, 4)["_num_devices"] == 4
    with pytest.raises(ReservedMetricName):
        reduced_npz_arrays({"_num_devices": 1.0}, 4)


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
