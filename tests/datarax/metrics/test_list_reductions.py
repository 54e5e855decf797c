"""The numpy-free reduction of small metric lists answers exactly as the general path.

Every case compares :func:`reduce_number_lists` with ``reduce_custom`` over the arrays the
service would build from the same JSON (``decode_json_arrays``), value and type kind,
signed zeros included, or checks that it hands the case to the general path (None).
"""

from __future__ import annotations

import math
import random

import numpy as np
import orjson
import pytest

from app.codecs.json_arrays import decode_json_arrays
from app.schemas.metrics import MetricsReduceRequest
from app.services.metrics import (
    decode_metrics_body,
    encode_reduced,
    reduce_metrics,
    reduce_small_json,
)
from datarax.errors import MetricsError
from datarax.metrics._list_reductions import MAX_DEVICES, reduce_number_lists
from datarax.metrics.reductions import reduce_custom

OPS = ("mean", "sum", "max", "min")


def _general(metrics: dict, ops: dict) -> dict:
    return reduce_custom(decode_json_arrays(metrics), reduce_fn=ops)


def _same(fast: object, general: object) -> bool:
    if isinstance(general, np.floating):
        return (
            type(fast) is float
            and fast == float(general)
            and math.copysign(1, fast) == math.copysign(1, float(general))
        )
    assert isinstance(general, np.integer), type(general)
    return type(fast) is int and fast == int(general)


def _value(rng: random.Random, kind: str) -> float | int:
    if kind == "int":
        return rng.choice([rng.randint(-5, 5), rng.randint(-(2**62), 2**62)])
    return rng.choice(
        [
            rng.uniform(-1, 1) * 10.0 ** rng.randint(-30, 30),
            rng.random(),
            float(rng.randint(-3, 3)),
            -0.0,
            0.0,
            rng.randint(-100, 100),  # an int in a float list
        ]
    )


def test_random_lists_answer_as_the_general_path() -> None:
    rng = random.Random(20261207)
    answered = 0
    for _ in range(3000):
        n = rng.randint(1, MAX_DEVICES)
        metrics, ops = {}, {}
        for i in range(rng.randint(1, 4)):
            kind = rng.choice(["float", "int"])
            metrics[f"m{i}"] = [_value(rng, kind) for _ in range(n)]
            if rng.random() < 0.8:
                ops[f"m{i}"] = rng.choice(OPS)
        done = reduce_number_lists(metrics, ops)
        if done is None:
            continue
        answered += 1
        reduced, devices = done
        assert devices == n
        general = _general(metrics, ops)
        assert reduced.keys() == general.keys()
        for name, value in reduced.items():
            assert _same(value, general[name]), (name, metrics[name], ops, value, general[name])
    assert answered > 2500  # the common case really takes this path


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 63, 64])
def test_summation_order_is_numpys(n: int) -> None:
    """Values whose sum depends on the order of additions, at every block boundary of
    NumPy's pairwise summation."""
    values = [1e16 if i % 3 == 0 else (-1e16 if i % 3 == 1 else 1.0 + i) for i in range(n)]
    for op in ("sum", "mean"):
        reduced, _ = reduce_number_lists({"x": values}, {"x": op})
        general = _general({"x": values}, {"x": op})
        assert _same(reduced["x"], general["x"]), (op, reduced["x"], general["x"])


@pytest.mark.parametrize(
    ("metrics", "ops"),
    [
        ({"x": [1e308, 1e308]}, {"x": "sum"}),  # overflows: the general path's scaled sum
        ({"x": [1e308, 1e308]}, {}),  # the same for the mean
        ({"x": [0.0, -0.0]}, {"x": "max"}),  # numpy's choice of zero
        ({"x": [2**62, 2**62]}, {"x": "sum"}),  # int64 overflow: integer_overflow
        ({"x": [2**63, 1]}, {}),  # not an int64 list
        ({"x": [2**60 + 1, 0.5]}, {}),  # an int float64 cannot hold exactly
        ({"x": [True, False]}, {}),  # bools count as ints there
        ({"x": [[1.0], [2.0]]}, {}),  # nested
        ({"x": []}, {}),  # empty
        ({"x": [1.0] * (MAX_DEVICES + 1)}, {}),  # large
        ({"x": [1.0, 2.0], "y": [1.0]}, {}),  # device counts differ
        ({"x": [1.0, 2.0]}, {"y": "sum"}),  # unknown metric
        ({"x": [1.0, 2.0]}, {"x": "median"}),  # unknown op
        ({"x": [1.0, 2.0]}, {"x": ["sum"]}),  # not an op name
        ({}, {}),  # no metrics
    ],
)
def test_what_it_leaves_to_the_general_path(metrics: dict, ops: dict) -> None:
    assert reduce_number_lists(metrics, ops) is None


def test_unknown_nan_policy_is_left_to_the_general_path() -> None:
    assert reduce_number_lists({"x": [1.0]}, {}, "drop") is None
    assert reduce_number_lists({"x": [1.0]}, {}, ["omit"]) is None
    for policy in ("propagate", "omit", "raise"):
        assert reduce_number_lists({"x": [1.0, 2.0]}, {}, policy) == ({"x": 1.5}, 2)


def test_integer_overflow_stays_the_general_paths_error() -> None:
    with pytest.raises(MetricsError) as err:
        _general({"x": [2**62, 2**62]}, {"x": "sum"})
    assert err.value.code == "integer_overflow"


def _general_bytes(body: bytes) -> bytes:
    data = decode_metrics_body(
        body, "application/json", "application/json", MetricsReduceRequest, max_bytes=1 << 20
    )
    return encode_reduced(*reduce_metrics(data))


def test_small_json_answers_the_general_paths_bytes() -> None:
    rng = random.Random(7)
    answered = 0
    for _ in range(500):
        n = rng.randint(1, 16)
        # Typical metrics (losses, accuracies, step counters); the adversarial values are
        # the test above's.
        metrics = {
            f"m{i}": [rng.uniform(0.01, 10) for _ in range(n)]
            if i % 2 == 0
            else [rng.randint(1, 10**6) for _ in range(n)]
            for i in range(rng.randint(1, 3))
        }
        body: dict = {"metrics": metrics}
        if rng.random() < 0.7:
            body["reduce"] = {name: rng.choice(OPS) for name in metrics}
        if rng.random() < 0.3:
            body["nan_policy"] = rng.choice(["propagate", "omit", "raise"])
        encoded = orjson.dumps(body)
        small = reduce_small_json(encoded)
        if small is None:
            continue
        answered += 1
        assert small == _general_bytes(encoded), body
    assert answered > 400


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"metrics": {"x": [1.0, 2.0]}, "weights": [1, 2]}',  # weights: the general path
        b'{"metrics": {"x": [1.0, 2.0]}, "extra": 1}',  # a member the model refuses
        b'{"metrics": {"x": [1.0, 2.0]}, "reduce": {"x": 1}}',  # not an op name
        b'{"metrics": {"x": {"shape": [2], "datatype": "FP32", "data": [1, 2]}}}',  # a tensor
        b"[1, 2]",
    ],
)
def test_small_json_leaves_other_bodies_to_the_general_path(body: bytes) -> None:
    assert reduce_small_json(body) is None
