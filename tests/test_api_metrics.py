"""Metric reductions, per-device collection and job history over HTTP."""

from __future__ import annotations

import numpy as np
import pytest
from service_helpers import npz_bytes

from app.metrics_io import to_jsonable

pytest_plugins = ["service_helpers"]

DESIGN_BODY = {
    "metrics": {
        "loss": [0.9, 1.1, 1.0, 1.0],
        "accuracy": {"shape": [4], "datatype": "FP32", "data": [0.5, 0.6, 0.7, 0.8]},
        "step": [10, 10, 10, 10],
    },
    "reduce": {"loss": "mean", "accuracy": "mean", "step": "max"},
    "weights": [32, 32, 32, 16],
    "nan_policy": "propagate",
}

JSON = {"content-type": "application/json"}
NPZ = {"content-type": "application/x-npz"}


def test_reduce_design_example(api):
    response = api.post("/v1/metrics/reduce", json=DESIGN_BODY)
    assert response.status_code == 200, response.text
    body = response.json()
    w = np.array([32, 32, 32, 16]) / 112
    assert body["num_devices"] == 4
    assert body["reduced"]["loss"] == pytest.approx(float(w @ [0.9, 1.1, 1.0, 1.0]))
    assert body["reduced"]["accuracy"] == pytest.approx(float(w @ [0.5, 0.6, 0.7, 0.8]), rel=1e-6)
    assert body["reduced"]["step"] == 10 and isinstance(body["reduced"]["step"], int)


REDUCE_CASES = [
    ("per-class-sum", {"per_class": [[1, 2], [3, 4], [12, 14]]}, {"per_class": "sum"}, [16, 20]),
    ("max-2d", {"x": [[1.5, -1], [0.5, 7]]}, {"x": "max"}, [1.5, 7]),
    ("min", {"x": [3, 1, 2]}, {"x": "min"}, 1),
    ("default-mean", {"x": [1, 2]}, {}, 1.5),
    ("bool-sum", {"hit": [True, False, True]}, {"hit": "sum"}, 2),
    (
        "int32-tensor",
        {"n": {"shape": [2, 2], "datatype": "INT32", "data": [1, 2, 3, 4]}},
        {"n": "sum"},
        [4, 6],
    ),
    ("fp16-tensor", {"h": {"shape": [2], "datatype": "FP16", "data": [0.5, 1.5]}}, {}, 1.0),
    (
        "uint8-tensor",
        {"u": {"shape": [3], "datatype": "UINT8", "data": [1, 255, 3]}},
        {"u": "max"},
        255,
    ),
    (
        "bool-tensor",
        {"b": {"shape": [2], "datatype": "BOOL", "data": [True, True]}},
        {"b": "min"},
        1,
    ),
]


@pytest.mark.parametrize(
    ("metrics", "ops", "expected"),
    [case[1:] for case in REDUCE_CASES],
    ids=[case[0] for case in REDUCE_CASES],
)
def test_reduce_cases(api, metrics, ops, expected):
    response = api.post("/v1/metrics/reduce", json={"metrics": metrics, "reduce": ops})
    assert response.status_code == 200, response.text
    (value,) = response.json()["reduced"].values()
    assert value == pytest.approx(expected)


def test_non_finite_values(api):
    raw = b'{"metrics": {"loss": [1.0, NaN, 3.0], "other": [null, 1, 2]}, "nan_policy": "%s"}'
    propagate = api.post("/v1/metrics/reduce", content=raw % b"propagate", headers=JSON)
    assert propagate.status_code == 200, propagate.text
    assert propagate.json()["reduced"] == {"loss": None, "other": None}  # NaN -> null
    omit = api.post("/v1/metrics/reduce", content=raw % b"omit", headers=JSON)
    assert omit.json()["reduced"] == {"loss": 2.0, "other": 1.5}
    inf = b'{"metrics": {"x": [Infinity, 1.0]}, "reduce": {"x": "max"}}'
    assert api.post("/v1/metrics/reduce", content=inf, headers=JSON).json()["reduced"] == {
        "x": None
    }


def test_to_jsonable_shapes_and_floats():
    assert to_jsonable(np.float32(0.65)) == 0.65
    assert to_jsonable(np.array([1.0, np.nan, np.inf], np.float32)) == [1.0, None, None]
    assert to_jsonable(np.float64(np.nan)) is None
    assert to_jsonable(np.int64(3)) == 3
    assert to_jsonable(np.array([[1, 2]], np.int8)) == [[1, 2]]


def test_collect(api):
    body = {"metrics": {"loss": [0.9, 1.1], "per_class": [[1, 2], [3, 4]]}}
    response = api.post("/v1/metrics/collect", json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "devices": [
            {"device": 0, "metrics": {"loss": 0.9, "per_class": [1, 2]}},
            {"device": 1, "metrics": {"loss": 1.1, "per_class": [3, 4]}},
        ]
    }
    # The reduce body is accepted as is.
    assert api.post("/v1/metrics/collect", json=DESIGN_BODY).status_code == 200


def test_npz_reduce_and_collect(api):
    loss = np.array([0.5, 1.5, 1.0, 1.0], np.float32)
    step = np.array([7, 7, 7, 8], np.int64)
    content = npz_bytes(loss=loss, step=step, _weights=np.array([1, 1, 1, 1]))
    response = api.post(
        "/v1/metrics/reduce",
        content=content,
        headers=NPZ,
        params={"reduce": "loss:mean,step:max", "nan_policy": "omit"},
    )
    assert response.status_code == 200, response.text
    assert response.json() == {"reduced": {"loss": 1.0, "step": 8}, "num_devices": 4}
    collected = api.post("/v1/metrics/collect", content=npz_bytes(loss=loss), headers=NPZ).json()
    assert [d["metrics"]["loss"] for d in collected["devices"]] == [0.5, 1.5, 1.0, 1.0]


def test_job_history_in_step_order_and_replace(api):
    job = "run-1.a_b"
    for step, loss in [(20, [2.0, 2.0]), (0, [4.0, 6.0]), (10, [3.0, 3.0])]:
        response = api.post(
            f"/v1/jobs/{job}/metrics", json={"metrics": {"loss": loss}, "step": step}
        )
        assert response.status_code == 201, response.text
        point = response.json()
        assert point["step"] == step and point["job"] == job
        assert point["received_at"].endswith("Z")
    replaced = api.post(f"/v1/jobs/{job}/metrics", json={"metrics": {"loss": [1, 1]}, "step": 10})
    assert replaced.status_code == 200
    npz = api.post(
        f"/v1/jobs/{job}/metrics",
        content=npz_bytes(loss=np.array([0.25, 0.75])),
        headers=NPZ,
        params={"step": 30},
    )
    assert npz.status_code == 201, npz.text
    history = api.get(f"/v1/jobs/{job}/metrics").json()
    assert history["job"] == job
    assert [(p["step"], p["reduced"]["loss"]) for p in history["points"]] == [
        (0, 5.0),
        (10, 1.0),
        (20, 2.0),
        (30, 0.5),
    ]
    assert all(set(p) == {"step", "reduced", "received_at"} for p in history["points"])


def test_unknown_job_has_empty_history(api):
    assert api.get("/v1/jobs/never-posted/metrics").json() == {"job": "never-posted", "points": []}
