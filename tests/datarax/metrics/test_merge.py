"""datarax.metrics.merge: merged parts reduce exactly as one push of every device."""

from __future__ import annotations

import numpy as np
import pytest

from datarax.errors import MetricsError
from datarax.metrics.merge import PartialMetrics, merge_parts, merge_steps
from datarax.metrics.reductions import reduce_custom

OPS = ["mean", "sum", "max", "min"]
POLICIES = ["propagate", "omit"]


def _split(array: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    return np.split(array, np.cumsum(sizes)[:-1])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("nan_policy", POLICIES)
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_merged_parts_reduce_bit_for_bit_like_the_concatenation(op, nan_policy, weighted):
    rng = np.random.default_rng(7)
    sizes = [3, 1, 4]
    loss = rng.normal(size=8)
    loss[[1, 6]] = np.nan
    per_class = rng.normal(size=(8, 3)).astype(np.float32)
    per_class[2, 1] = np.inf
    weights = rng.uniform(0.5, 4.0, size=8) if weighted else None
    whole = reduce_custom(
        {"loss": loss, "per_class": per_class},
        {"loss": op, "per_class": op},
        weights=weights,
        nan_policy=nan_policy,
    )
    parts = [
        PartialMetrics(
            {"loss": a, "per_class": b},
            weights=None if weights is None else w,
        )
        for a, b, w in zip(
            _split(loss, sizes),
            _split(per_class, sizes),
            _split(weights if weights is not None else np.ones(8), sizes),
            strict=True,
        )
    ]
    merged = merge_parts(parts).reduce({"loss": op, "per_class": op}, nan_policy=nan_policy)
    np.testing.assert_array_equal(merged["loss"], whole["loss"])
    np.testing.assert_array_equal(merged["per_class"], whole["per_class"])
    assert merged["per_class"].dtype == whole["per_class"].dtype


def test_a_part_without_weights_counts_each_device_once():
    a = PartialMetrics({"x": np.array([1.0, 3.0])}, weights=np.array([3.0, 1.0]))
    b = PartialMetrics({"x": np.array([5.0])})
    assert a.merge(b).reduce()["x"] == (1 * 3 + 3 * 1 + 5 * 1) / 5


def test_values_every_device_agrees_on_pass_through():
    a = PartialMetrics({"x": np.array([1.0]), "lr": np.float64(0.1)})
    b = PartialMetrics({"x": np.array([2.0]), "lr": np.float64(0.1)})
    assert a.merge(b).reduce() == {"x": 1.5, "lr": 0.1}
    with pytest.raises(MetricsError) as info:
        a.merge(PartialMetrics({"x": np.array([2.0]), "lr": np.float64(0.2)}))
    assert info.value.code == "part_mismatch"


@pytest.mark.parametrize(
    ("other", "code"),
    [
        ({"y": np.ones(2)}, "part_mismatch"),
        ({"x": np.ones((2, 3))}, "part_mismatch"),
    ],
    ids=["names", "per-device-shape"],
)
def test_mismatched_parts_are_refused_with_a_code(other, code):
    with pytest.raises(MetricsError) as info:
        merge_parts([PartialMetrics({"x": np.ones(2)}), PartialMetrics(other)])
    assert info.value.code == code
    with pytest.raises(MetricsError) as info:
        merge_parts([])
    assert info.value.code == "empty_metrics"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("form", ["stacked", "weighted", "omit", "float32"], ids=lambda form: form)
def test_merged_steps_reduce_like_each_steps_concatenation(op, form):
    rng = np.random.default_rng(11)
    sizes, steps = [2, 3], 4
    dtype = np.float32 if form == "float32" else np.float64
    loss = rng.normal(size=(steps, sum(sizes))).astype(dtype)
    loss[1, 3] = np.nan
    weights = rng.uniform(0.5, 2.0, size=(steps, sum(sizes))) if form == "weighted" else None
    policy = "omit" if form == "omit" else "propagate"
    ops = {"loss": op if weights is None else "mean"}
    parts = [{"loss": block} for block in np.split(loss, np.cumsum(sizes)[:-1], axis=1)]
    split_weights = (
        None if weights is None else list(np.split(weights, np.cumsum(sizes)[:-1], axis=1))
    )
    merged = merge_steps(parts, ops, weights=split_weights, nan_policy=policy)
    assert merged.count == steps and merged.num_devices == sum(sizes)
    assert (merged.columns is not None) == (form == "stacked")
    for k in range(steps):
        want = reduce_custom(
            {"loss": loss[k]},
            ops,
            weights=None if weights is None else weights[k],
            nan_policy=policy,
        )["loss"]
        got = merged.columns["loss"][k] if merged.columns is not None else merged.reduced[k]["loss"]
        np.testing.assert_array_equal(got, want)


def test_merged_steps_refuse_what_a_merge_refuses():
    with pytest.raises(MetricsError) as err:
        merge_steps([{"x": np.ones((1, 2))}, {"x": np.ones((1, 2, 3))}], {}, nan_policy="omit")
    assert err.value.code == "part_mismatch"
    with pytest.raises(MetricsError):
        merge_steps([], {})
