"""datarax.metrics.reductions: reduce_custom and split_by_device on NumPy input without
JAX. Each test runs on this module and on datarax.distributed.metrics, which must answer
identically for NumPy input (the JAX backend hands NumPy leaves back to this module)."""

import subprocess
import sys
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from datarax.distributed import metrics
from datarax.metrics import reductions
from datarax.metrics.reductions import NAN_POLICIES, REDUCE_OPS
from tests.datarax.support import N, assert_metrics_error, assert_numpy_result, stacked

NP_OPS = {"mean": np.mean, "sum": np.sum, "max": np.max, "min": np.min}


@pytest.fixture(params=[reductions, metrics], ids=["reductions", "metrics"])
def module(request):
    """The JAX-free module and the JAX-aware one: same answers for NumPy input."""
    return request.param


def test_import_leaves_jax_out_of_a_fresh_interpreter():
    # The service's HTTP process imports this module; JAX must not come with it, nor
    # with a reduction and a split of the service's input (a dict of NumPy arrays).
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import datarax.metrics.reductions as r
        r.reduce_custom({"loss": np.arange(8.0), "step": np.arange(8)}, {"step": "max"})
        r.reduce_custom({"loss": np.arange(8.0)}, weights=np.ones(8), nan_policy="raise")
        r.split_by_device({"loss": np.arange(8.0), "lr": 0.1})
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib", "flax"))
        assert not loaded, loaded
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_constants_list_every_op_and_policy():
    assert REDUCE_OPS == ("mean", "sum", "max", "min")
    assert NAN_POLICIES == ("propagate", "omit", "raise")
    # Upstream code imports them from metrics: the same objects.
    assert metrics.REDUCE_OPS is REDUCE_OPS and metrics.NAN_POLICIES is NAN_POLICIES
    assert metrics.MetricsError is reductions.MetricsError


# ------------------------------------------------------------------ reduce_custom


def test_flat_dict_reduction_matches_the_tree_path(module):
    flat = {"b": stacked((N, 3), "float32"), "a": stacked((N,), "int32"), "": np.float32(2)}
    ops = {"a": "max", "b": "sum"}
    fast = module.reduce_custom(flat, ops)
    tree = module.reduce_custom({k: {"leaf": v} for k, v in flat.items()}, ops)
    assert list(fast) == list(flat)
    for name, value in fast.items():
        assert np.asarray(value).tobytes() == np.asarray(tree[name]["leaf"]).tobytes()


@pytest.mark.parametrize("op", ["mean", "sum", "max", "min"])
@pytest.mark.parametrize("nan_policy", ["propagate", "omit"])
def test_flat_dict_fast_path_is_bit_identical_to_numpy(module, op, nan_policy):
    # reduce_custom's {str: ndarray} path calls the ufunc reductions directly for
    # unweighted propagate; every dtype must still answer exactly as numpy (bool as int).
    metrics_in = {
        dtype: stacked(shape, dtype)
        for dtype in ("float64", "float32", "float16", "int32", "uint8", "bool")
        for shape in [(N,)]
    } | {"f64_2d": stacked((N, 3), "float64"), "i64_2d": stacked((N, 2), "int64")}
    out = module.reduce_custom(metrics_in, dict.fromkeys(metrics_in, op), nan_policy=nan_policy)
    assert list(out) == list(metrics_in)
    for name, x in metrics_in.items():
        ref = NP_OPS[op](x.astype(np.int64) if x.dtype == np.bool_ else x, axis=0)
        got = out[name]
        assert type(got) is type(ref), name
        assert np.asarray(got).dtype == np.asarray(ref).dtype, name
        assert np.asarray(got).tobytes() == np.asarray(ref).tobytes(), name


def test_weights_affect_only_mean_in_reduce_custom(module):
    metrics_in = {"loss": np.array([1.0, 3.0]), "count": np.array([5, 7])}
    out = module.reduce_custom(metrics_in, {"count": "sum"}, weights=[3, 1])
    assert out["loss"] == pytest.approx(1.5)
    assert out["count"] == 12 and out["count"].dtype.kind == "i"


def test_reduce_custom_as_in_the_guide(module):
    metrics_in = {
        "loss": np.array([0.9, 1.1, 1.0, 1.0]),
        "accuracy": np.array([0.5, 0.6, 0.7, 0.8], np.float32),
        "step": np.array([10, 10, 10, 11]),
    }
    out = module.reduce_custom(
        metrics_in, reduce_fn={"loss": "mean", "accuracy": "mean", "step": "max"}
    )
    assert list(out) == ["loss", "accuracy", "step"]
    assert out["loss"] == pytest.approx(1.0)
    assert out["accuracy"] == pytest.approx(0.65) and out["accuracy"].dtype == np.float32
    assert out["step"] == 11 and out["step"].dtype == np.int64
    for value in out.values():
        assert_numpy_result(value)


def test_reduce_custom_defaults_and_callables(module):
    metrics_in = {
        "loss": np.array([1.0, 3.0]),
        "hist": {"a": np.array([[1, 2], [3, 4]]), "b": np.array([5, 6])},
        "median": np.array([1.0, 9.0]),
    }
    out = module.reduce_custom(
        metrics_in, {"hist": "sum", "median": lambda x: np.median(x, axis=0)}
    )
    assert out["loss"] == 2.0
    np.testing.assert_array_equal(out["hist"]["a"], [4, 6])
    assert out["hist"]["b"] == 11
    assert out["median"] == 5.0
    assert module.reduce_custom({"x": np.array([1.0, 2.0])})["x"] == 1.5


def test_reduce_custom_none_op_keeps_the_value_unreduced(module):
    # Upstream's reduce_fn={"name": None}: that metric is returned as it is.
    x = np.arange(4.0)
    out = module.reduce_custom({"loss": x, "raw": x}, {"raw": None})
    assert out["loss"] == 1.5 and out["raw"] is x


def test_unknown_op_message_lists_choices(module):
    err = assert_metrics_error(
        "unknown_reduce_op", module.reduce_custom, {"loss": np.ones(2)}, {"loss": "avg"}
    )
    assert "'avg'" in err.message and "'loss'" in err.message and "'mean'" in err.message


# Nested dicts, lists, tuples, None, scalars and strings, top-level lists read as arrays.
TREE = {
    "z": {"b": np.arange(8.0).reshape(4, 2), "a": [np.arange(4), (np.ones(4, np.float32), 3)]},
    "lists": [[1, 2], [3, 4], [5, 6], [7, 8]],
    "": np.arange(4, dtype=np.uint8),
    "none": None,
    "tag": "run-7",
    "nested_none": {"x": None, "y": np.array([True, False, True, True])},
}


def _same(a, b):
    """Equal structure, types, dtypes and bits (dict key order included)."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, (np.ndarray, np.generic)):
        assert a.dtype == b.dtype and np.asarray(a).tobytes() == np.asarray(b).tobytes()
    else:
        assert a == b


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("nan_policy", NAN_POLICIES)
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_nested_trees_answer_as_the_jax_backend(op, nan_policy, weighted):
    weights = np.array([1.0, 2.0, 0.0, 4.0]) if weighted else None
    ops = dict.fromkeys(TREE, op)
    got = reductions.reduce_custom(TREE, ops, weights=weights, nan_policy=nan_policy)
    _same(got, metrics.reduce_custom(TREE, ops, weights=weights, nan_policy=nan_policy))


@pytest.mark.parametrize("tree", [TREE, TREE["z"], [np.arange(3), (np.ones(3),)]], ids=str)
def test_split_nested_trees_answer_as_the_jax_backend(tree):
    _same(reductions.split_by_device(tree), metrics.split_by_device(tree))


# ---------------------------------------------------------------- split_by_device


def test_split_by_device_numpy(module):
    metrics_in = {"loss": np.array([0.9, 1.1]), "cls": np.array([[1, 2], [3, 4]]), "lr": 0.1}
    out = module.split_by_device(metrics_in)
    assert len(out) == 2
    assert out[1]["loss"] == pytest.approx(1.1)
    np.testing.assert_array_equal(out[0]["cls"], [1, 2])
    assert [d["lr"] for d in out] == [0.1, 0.1]
    for device in out:
        assert_numpy_result(device["loss"])
        assert_numpy_result(device["cls"])


def test_split_by_device_flat_dict_matches_the_tree_path(module):
    flat = {"b": stacked((N, 3), "float32"), "a": stacked((N,), "int32"), "": np.float32(2)}
    per_device = module.split_by_device(flat)
    nested = module.split_by_device({"m": flat})
    assert [list(d) for d in per_device] == [["", "a", "b"]] * N  # tree_unflatten's order
    for fast_d, tree_d in zip(per_device, nested, strict=True):
        for name, value in fast_d.items():
            np.testing.assert_array_equal(value, tree_d["m"][name])


# ------------------------------------------------------------------------- errors

ERROR_CASES = [
    pytest.param(
        "unknown_reduce_op",
        lambda m: m.reduce_custom({"loss": np.ones(4)}, {"loss": "avg"}),
        id="custom-op-string",
    ),
    pytest.param(
        "unknown_reduce_op",
        lambda m: m.reduce_custom({"loss": np.ones(4)}, {"loss": 3}),
        id="custom-op-int",
    ),
    pytest.param(
        "unknown_reduce_op",
        lambda m: m.reduce_custom({"loss": np.ones(4)}, ["loss"]),
        id="custom-not-mapping",
    ),
    pytest.param(
        "unknown_nan_policy",
        lambda m: m.reduce_custom({"a": np.ones(2)}, nan_policy="ignore"),
        id="policy-custom",
    ),
    pytest.param(
        "device_count_mismatch",
        lambda m: m.reduce_custom({"loss": [1.0, 2.0], "step": [1, 2, 3]}),
        id="device-count-lists",
    ),
    pytest.param("empty_metrics", lambda m: m.reduce_custom({}, {}), id="empty-custom"),
    pytest.param("empty_metrics", lambda m: m.split_by_device({}), id="split-empty"),
    pytest.param(
        "empty_metrics", lambda m: m.split_by_device({"lr": 0.1}), id="split-scalars-only"
    ),
    pytest.param(
        "device_count_mismatch",
        lambda m: m.split_by_device({"loss": np.ones(8), "acc": np.ones(4)}),
        id="split-device-count",
    ),
    pytest.param(
        "ragged_array", lambda m: m.split_by_device({"a": [[1, 2], [3]]}), id="split-ragged"
    ),
    pytest.param(
        "unknown_metric",
        lambda m: m.reduce_custom({"loss": np.ones(4)}, {"loss": "mean", "acc": "max"}),
        id="unknown-metric",
    ),
    pytest.param(
        "unknown_metric",
        lambda m: m.reduce_custom(np.ones(4), {"loss": "mean"}),
        id="metrics-not-mapping",
    ),
    pytest.param(
        "integer_overflow",
        lambda m: m.reduce_custom({"n": np.array([2**63 - 1, 1])}, {"n": "sum"}),
        id="integer-overflow",
    ),
    pytest.param(
        "non_finite_values",
        lambda m: m.reduce_custom({"x": {"y": np.array([1.0, np.nan])}}, nan_policy="raise"),
        id="raise-nested",
    ),
]


@pytest.mark.parametrize(("code", "call"), ERROR_CASES)
def test_error_codes(module, code, call):
    assert_metrics_error(code, call, module)


def test_error_messages_are_the_jax_backends():
    for case in ERROR_CASES:
        code, call = case.values
        mine = assert_metrics_error(code, call, reductions)
        assert mine.message == assert_metrics_error(code, call, metrics).message, case.id


def test_a_jax_array_is_refused_with_a_pointer_to_metrics():
    with pytest.raises(TypeError, match=r"'loss/0'.*datarax\.distributed\.metrics"):
        reductions.reduce_custom({"loss": [jnp.ones(2)]})
    with pytest.raises(TypeError, match="datarax.distributed.metrics"):
        reductions.split_by_device({"loss": jnp.ones(2)})


def test_other_containers_are_refused_not_reduced_differently():
    from collections import OrderedDict, namedtuple

    pair = namedtuple("pair", "a b")
    for tree in ({"m": OrderedDict(a=np.ones(2))}, {"m": pair(np.ones(2), np.ones(2))}):
        with pytest.raises(TypeError, match="node at 'm'"):
            reductions.reduce_custom(tree)
        metrics.reduce_custom(tree)  # a JAX pytree: the JAX-aware module reduces it


def test_unsortable_keys_are_refused_as_jax_refuses_them():
    tree = {"m": {1: np.ones(2), "a": np.ones(2)}}
    with pytest.raises(ValueError, match="sorting pytree dictionary keys"):
        metrics.split_by_device(tree)
    with pytest.raises(ValueError, match="sorting pytree dictionary keys"):
        reductions.split_by_device(tree)
