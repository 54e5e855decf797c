"""The metrics service without HTTP: bodies in, reduced values out."""

from __future__ import annotations

import io

import numpy as np
import orjson
import pytest

from app.core.errors import ReservedMetricName, UnsupportedMediaType
from app.schemas.metrics import MetricsCollectRequest, MetricsReduceRequest
from app.services.metrics import (
    collect_metrics,
    decode_metrics_body,
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


def test_npz_answer_reserves_the_device_count_name():
    assert reduced_npz_arrays({"loss": 1.0}, 4)["_num_devices"] == 4
    with pytest.raises(ReservedMetricName):
        reduced_npz_arrays({"_num_devices": 1.0}, 4)
