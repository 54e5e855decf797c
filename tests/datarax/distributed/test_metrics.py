"""datarax.distributed.metrics: SPMD reductions, weights, NaN policies, errors, and the
per-device views collect_from_devices (upstream's shape) and split_by_device."""

import subprocess
import sys
import textwrap

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.distributed.metrics import (
    REDUCE_OPS,
    collect_from_devices,
    reduce_custom,
    reduce_max,
    reduce_mean,
    reduce_min,
    reduce_over_devices,
    reduce_sum,
    split_by_device,
)
from tests.datarax.support import (
    N,
    assert_metrics_error,
    assert_numpy_result,
    data_mesh,
    stacked,
)

REDUCE_FNS = {"mean": reduce_mean, "sum": reduce_sum, "max": reduce_max, "min": reduce_min}
NP_OPS = {"mean": np.mean, "sum": np.sum, "max": np.max, "min": np.min}


# ------------------------------------------------------------- ops, shapes and dtypes

# (input dtype, op) -> expected NumPy result dtype
NP_DTYPES = {
    ("float32", "mean"): np.float32,
    ("float64", "mean"): np.float64,
    ("int32", "mean"): np.float64,
    ("bool", "mean"): np.float64,
    ("float32", "sum"): np.float32,
    ("int32", "sum"): np.int64,
    ("bool", "sum"): np.int64,
    ("int32", "max"): np.int32,
    ("bool", "max"): np.int64,
    ("float32", "min"): np.float32,
    ("int32", "min"): np.int32,
}
OP_CASES = [
    pytest.param(dtype, op, shape, id=f"{op}-{dtype}-{'x'.join(map(str, shape))}")
    for (dtype, op) in NP_DTYPES
    for shape in [(N,), (N, 3)]
]


@pytest.mark.parametrize(("dtype", "op", "shape"), OP_CASES)
def test_numpy_ops_match_numpy_and_stay_numpy(dtype, op, shape):
    x = stacked(shape, dtype)
    ref = NP_OPS[op](x.astype(np.int64) if dtype == "bool" else x, axis=0)
    for out in (REDUCE_FNS[op]({"m": x})["m"], reduce_over_devices(x, op)):
        assert_numpy_result(out)
        assert out.shape == shape[1:]
        assert out.dtype == NP_DTYPES[(dtype, op)]
        np.testing.assert_allclose(out, ref, rtol=1e-6)


JAX_DTYPES = {
    ("float32", "mean"): jnp.float32,
    ("int32", "mean"): jnp.float32,
    ("bool", "mean"): jnp.float32,
    ("int32", "sum"): jnp.int32,
    ("bool", "sum"): jnp.int32,
    ("float32", "max"): jnp.float32,
    ("bool", "max"): jnp.int32,
    ("int32", "min"): jnp.int32,
}


@pytest.mark.parametrize(
    ("dtype", "op", "shape"),
    [
        pytest.param(d, op, s, id=f"{op}-{d}-{'x'.join(map(str, s))}")
        for (d, op) in JAX_DTYPES
        for s in [(N,), (N, 3)]
    ],
)
def test_jax_ops_match_numpy_and_stay_jax(dtype, op, shape):
    x = stacked(shape, dtype)
    ref = NP_OPS[op](x.astype(np.int64) if dtype == "bool" else x, axis=0)
    out = REDUCE_FNS[op]({"m": jnp.asarray(x)})["m"]
    assert isinstance(out, jax.Array)
    assert out.shape == shape[1:]
    assert out.dtype == JAX_DTYPES[(dtype, op)]
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5)


def test_numpy_reductions_never_start_a_jax_backend():
    # The REST process reduces NumPy arrays and must not grab an accelerator.
    code = textwrap.dedent(
        """
        import numpy as np
        from jax._src import xla_bridge
        from datarax.distributed import metrics as m
        x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
        x[0, 0] = np.nan
        tree = {"loss": [1.0, 2.0], "acc": x, "step": np.arange(8)}
        m.reduce_custom(tree | {"loss": x[:, 1]}, {"step": "max"}, weights=np.ones(8))
        m.reduce_mean({"acc": x}, nan_policy="omit", weights=np.arange(1, 9))
        m.reduce_sum({"acc": x}, nan_policy="omit")
        m.reduce_over_devices([[1, 2], [3, 4]], "max")
        m.collect_from_devices({"acc": x})
        m.split_by_device({"acc": x})
        try:
            m.reduce_mean({"acc": x}, nan_policy="raise")
        except m.MetricsError:
            pass
        assert not xla_bridge.backends_are_initialized(), "a JAX backend was started"
        """
    )
    env_python = [sys.executable, "-W", "error", "-c", code]
    done = subprocess.run(env_python, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


# ------------------------------------------------------------------ weighted mean


@pytest.mark.parametrize("as_jax", [False, True], ids=["numpy", "jax"])
@pytest.mark.parametrize("shape", [(4,), (4, 3)], ids=["n", "n-k"])
def test_weighted_mean_uneven_last_batch(as_jax, shape):
    x = stacked(shape, np.float32)
    w = [32, 32, 32, 16]
    values = jnp.asarray(x) if as_jax else x
    out = reduce_mean({"loss": values}, weights=w)["loss"]
    ref = np.average(x, axis=0, weights=np.asarray(w, np.float64))
    assert isinstance(out, jax.Array) if as_jax else isinstance(out, (np.ndarray, np.generic))
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5)


def test_weighted_mean_of_integers_is_float64_for_numpy():
    out = reduce_over_devices(np.array([1, 2, 3, 4]), "mean", weights=np.array([1, 1, 1, 5]))
    assert_numpy_result(out)
    assert out.dtype == np.float64
    assert out == pytest.approx(3.25)


def test_equal_weights_equal_plain_mean():
    x = stacked((N, 5), np.float64)
    np.testing.assert_allclose(reduce_mean(x, weights=np.full(N, 7.0)), np.mean(x, axis=0))


def test_zero_weight_drops_a_device():
    out = reduce_over_devices(np.array([1.0, 100.0, 3.0]), weights=[1, 0, 1])
    assert out == pytest.approx(2.0)


WEIGHT_ERRORS = [
    pytest.param([1, 2, 3], "weights_mismatch", id="too-short"),
    pytest.param(np.ones(5), "weights_mismatch", id="too-long"),
    pytest.param([1, -1, 1, 1], "invalid_weights", id="negative"),
    pytest.param([1, np.nan, 1, 1], "invalid_weights", id="nan"),
    pytest.param([1, np.inf, 1, 1], "invalid_weights", id="inf"),
    pytest.param([0, 0, 0, 0], "invalid_weights", id="all-zero"),
    pytest.param(np.ones((4, 1)), "invalid_weights", id="2-d"),
    pytest.param(2.0, "invalid_weights", id="scalar"),
    pytest.param(["a", "b", "c", "d"], "invalid_weights", id="strings"),
    pytest.param([1j, 1, 1, 1], "invalid_weights", id="complex"),
]


@pytest.mark.parametrize(("weights", "code"), WEIGHT_ERRORS)
def test_weight_errors(weights, code):
    err = assert_metrics_error(code, reduce_mean, {"loss": np.ones(4)}, weights=weights)
    assert "weight" in str(err)


def test_weights_with_a_non_mean_op_are_rejected():
    assert_metrics_error(
        "invalid_weights", reduce_over_devices, np.ones(4), "sum", weights=np.ones(4)
    )


# -------------------------------------------------------------------- NaN policies

NAN = np.nan
INF = np.inf
# column 0: one NaN; column 1: NaN and +inf; column 2: nothing finite; column 3: clean
X_NAN = np.array(
    [
        [1.0, NAN, NAN, 1.0],
        [NAN, 2.0, INF, 2.0],
        [3.0, INF, -INF, 3.0],
        [5.0, 4.0, NAN, 4.0],
    ],
    dtype=np.float32,
)
OMIT_EXPECTED = {
    "mean": [3.0, 3.0, NAN, 2.5],
    "sum": [9.0, 6.0, NAN, 10.0],
    "max": [5.0, 4.0, NAN, 4.0],
    "min": [1.0, 2.0, NAN, 1.0],
}


@pytest.mark.parametrize("as_jax", [False, True], ids=["numpy", "jax"])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_omit_ignores_non_finite_per_position(op, as_jax):
    x = jnp.asarray(X_NAN) if as_jax else X_NAN
    out = REDUCE_FNS[op]({"m": x}, nan_policy="omit")["m"]
    assert out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), OMIT_EXPECTED[op], rtol=1e-6)


@pytest.mark.parametrize("as_jax", [False, True], ids=["numpy", "jax"])
def test_omit_with_weights_drops_their_weights(as_jax):
    w = np.array([1.0, 2.0, 3.0, 4.0])
    x = jnp.asarray(X_NAN) if as_jax else X_NAN
    out = np.asarray(reduce_mean({"m": x}, weights=w, nan_policy="omit")["m"])
    col0 = (1 * 1 + 3 * 3 + 4 * 5) / (1 + 3 + 4)
    col1 = (2 * 2 + 4 * 4) / (2 + 4)
    col3 = np.average(X_NAN[:, 3], weights=w)
    np.testing.assert_allclose(out, [col0, col1, NAN, col3], rtol=1e-6)


def test_omit_where_only_zero_weight_values_are_finite_is_nan():
    out = reduce_over_devices(np.array([NAN, 2.0, NAN]), weights=[1, 0, 1], nan_policy="omit")
    assert np.isnan(out)


@pytest.mark.parametrize("as_jax", [False, True], ids=["numpy", "jax"])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_propagate_keeps_plain_semantics(op, as_jax):
    x = jnp.asarray(X_NAN) if as_jax else X_NAN
    out = np.asarray(REDUCE_FNS[op]({"m": x})["m"])
    with np.errstate(all="ignore"):
        ref = NP_OPS[op](X_NAN, axis=0)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_allclose(out[3], ref[3])


def test_all_nan_metric_with_omit_gives_nan_without_warnings():
    # pytest turns warnings into errors, so "Mean of empty slice" would fail here.
    out = reduce_mean({"m": np.full((N, 2), np.nan)}, nan_policy="omit")["m"]
    assert np.isnan(out).all()


def test_integers_are_untouched_by_omit():
    out = reduce_sum({"step": np.array([1, 2, 3], np.int32)}, nan_policy="omit")["step"]
    assert out == 6 and out.dtype.kind == "i"


@pytest.mark.parametrize("as_jax", [False, True], ids=["numpy", "jax"])
def test_raise_names_metric_and_count(as_jax):
    x = jnp.asarray(X_NAN) if as_jax else X_NAN
    metrics = {"ok": np.ones(4), "acc": x}
    err = assert_metrics_error("non_finite_values", reduce_mean, metrics, nan_policy="raise")
    assert "'acc'" in err.message and "7 non-finite" in err.message


def test_raise_accepts_finite_and_integer_values():
    out = reduce_max({"a": np.ones(3), "step": np.array([1, 5, 2])}, nan_policy="raise")
    assert out["step"] == 5


def test_raise_under_jit_is_a_trace_time_error():
    def f(x):
        return reduce_mean({"loss": x}, nan_policy="raise")

    err = assert_metrics_error("nan_policy_traced", jax.jit(f), jnp.ones(4))
    assert "'loss'" in err.message and "omit" in err.message
    # Integer values cannot be non-finite, so they are fine under tracing.
    assert int(jax.jit(lambda s: reduce_max(s, nan_policy="raise"))(jnp.arange(4))) == 3


# ------------------------------------------------------------------ error codes


def _ragged():
    return reduce_mean({"a": [[1, 2], [3]]})


ERROR_CASES = [
    pytest.param(
        "unknown_reduce_op", lambda: reduce_over_devices(np.ones(4), "median"), id="op-median"
    ),
    pytest.param(
        "unknown_nan_policy",
        lambda: reduce_mean({"a": np.ones(2)}, nan_policy="ignore"),
        id="policy-mean",
    ),
    pytest.param(
        "unknown_nan_policy",
        lambda: reduce_over_devices(np.ones(2), nan_policy=None),
        id="policy-none",
    ),
    pytest.param(
        "device_count_mismatch",
        lambda: reduce_mean({"loss": np.ones(8), "acc": np.ones((4, 2))}),
        id="device-count",
    ),
    pytest.param("empty_metrics", lambda: reduce_mean({}), id="empty-dict"),
    pytest.param("empty_metrics", lambda: reduce_sum([]), id="empty-list"),
    pytest.param("empty_metrics", lambda: reduce_mean({"a": np.ones((0, 3))}), id="zero-devices"),
    pytest.param("ragged_array", _ragged, id="ragged-list"),
]


@pytest.mark.parametrize(("code", "call"), ERROR_CASES)
def test_error_codes(code, call):
    assert_metrics_error(code, call)


def test_device_count_message_names_each_metric():
    err = assert_metrics_error(
        "device_count_mismatch", reduce_mean, {"loss": np.ones(8), "acc": np.ones((4, 2))}
    )
    assert "loss: 8" in err.message and "acc: 4" in err.message


# ------------------------------------------------------------- reduce_custom, lists


def test_top_level_lists_are_read_as_arrays():
    out = reduce_custom(
        {"loss": [0.9, 1.1], "per_class": [[1, 2], [3, 4]], "step": [10, 12]},
        {"per_class": "sum", "step": "max"},
        weights=[1, 1],
    )
    assert out["loss"] == pytest.approx(1.0)
    np.testing.assert_array_equal(out["per_class"], [4, 6])
    assert out["step"] == 12
    assert reduce_over_devices([[1, 2], [3, 4]], "max").tolist() == [3, 4]
    # Deeper lists stay pytree nodes of scalars, which pass through.
    assert reduce_mean({"nested": {"a": [1.0, 2.0]}}) == {"nested": {"a": [1.0, 2.0]}}


SCALARS = {
    "python-float": 0.1,
    "python-int": 3,
    "numpy-scalar": np.float32(2.0),
    "numpy-0d": np.array(4.0),
    "string": "run-7",
    "none": None,
}


@pytest.mark.parametrize("value", list(SCALARS.values()), ids=list(SCALARS))
def test_scalars_and_non_arrays_pass_through(value):
    out = reduce_mean({"x": value, "loss": np.ones(2)})
    assert out["x"] is value
    assert reduce_over_devices(value, "max") is value


def test_jax_0d_passes_through():
    x = jnp.float32(3.0)
    assert reduce_sum({"x": x, "y": jnp.ones(2)})["x"] is x


# ------------------------------------------- collect_from_devices (upstream's shape)


def test_collect_from_devices_splits_stacked_values_into_per_device_lists():
    metrics = {
        "loss": jnp.arange(4.0),
        "per_class": np.arange(8).reshape(4, 2),
        "lr": 0.1,
        "zero_d": np.array(3.0),
        "tags": ("a", "b"),
        "nested": {"x": np.ones(4)},
    }
    out = collect_from_devices(metrics)
    assert type(out) is dict and list(out) == list(metrics)
    assert isinstance(out["loss"], list) and len(out["loss"]) == 4
    assert all(isinstance(row, jax.Array) and row.shape == () for row in out["loss"])
    assert float(out["loss"][3]) == 3.0  # upstream code indexes it like this
    assert [row.tolist() for row in out["per_class"]] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    for row in out["per_class"]:
        assert_numpy_result(row)
    # Scalars, 0-d arrays and non-arrays (a nested dict included) come back unchanged.
    for name in ("lr", "zero_d", "tags", "nested"):
        assert out[name] is metrics[name], name


def test_collect_from_devices_accepts_what_split_by_device_rejects():
    # Upstream semantics: no common device count, no stacked value, empty: all fine.
    assert collect_from_devices({}) == {}
    assert collect_from_devices({"lr": 0.1}) == {"lr": 0.1}
    out = collect_from_devices({"a": np.ones(2), "b": np.ones(3)})
    assert [len(out["a"]), len(out["b"])] == [2, 3]


def test_collect_from_devices_rejects_a_non_mapping():
    with pytest.raises(TypeError, match="mapping.*ndarray.*split_by_device"):
        collect_from_devices(np.ones(4))


def test_collect_from_devices_as_the_guide_uses_it():
    metrics = {"loss": np.array([0.9, 1.1, 1.0, 1.0], np.float32), "step": np.array([1, 1, 1, 2])}
    device_metrics = collect_from_devices(metrics)
    assert len(device_metrics["loss"]) == 4
    assert device_metrics["step"][3] == 2


# -------------------------------------------- split_by_device (the service's collect)


def test_split_by_device_jax_and_lists():
    out = split_by_device({"loss": jnp.arange(3.0), "tags": ("a", "b")})
    assert len(out) == 3
    assert all(isinstance(d["loss"], jax.Array) for d in out)
    assert [float(d["loss"]) for d in out] == [0.0, 1.0, 2.0]
    assert out[2]["tags"] == ("a", "b")
    assert split_by_device({"step": [5, 6]})[1]["step"] == 6


# ------------------------------------------------------------------------ under jit


def test_reductions_under_jit_on_a_sharded_axis():
    mesh = data_mesh()
    x = stacked((N, 3), np.float32)
    x[2, 1] = np.nan
    steps = np.arange(N, dtype=np.int32)
    w = np.array([32.0] * (N - 1) + [16.0], np.float32)
    sharding = NamedSharding(mesh, P("data"))
    xs, ss, ws = (jax.device_put(a, sharding) for a in (x, steps, w))
    assert xs.sharding.shard_shape(xs.shape) == (1, 3)

    @jax.jit
    def step(xs, ss, ws):
        return {
            "mean": reduce_mean({"x": xs}, nan_policy="omit")["x"],
            "wmean": reduce_mean({"x": xs}, weights=ws, nan_policy="omit")["x"],
            "sum": reduce_sum({"s": ss})["s"],
            "max": reduce_max({"x": xs}, nan_policy="omit")["x"],
            "min": reduce_min({"s": ss})["s"],
            "custom": reduce_custom({"x": xs, "s": ss}, {"s": "max"}, weights=ws),
        }

    with jax.set_mesh(mesh):
        out = step(xs, ss, ws)

    x_np = np.asarray(x)
    mask = np.isfinite(x_np)
    np.testing.assert_allclose(out["mean"], np.nanmean(x_np, axis=0), rtol=1e-5)
    wm = (np.where(mask, x_np, 0) * w[:, None]).sum(0) / (mask * w[:, None]).sum(0)
    np.testing.assert_allclose(out["wmean"], wm, rtol=1e-5)
    np.testing.assert_allclose(out["max"], np.nanmax(x_np, axis=0))
    assert int(out["sum"]) == steps.sum() and int(out["min"]) == 0
    assert int(out["custom"]["s"]) == N - 1
    assert np.isnan(out["custom"]["x"][1])  # propagate: the NaN reaches the mean
    assert out["mean"].sharding.is_fully_replicated


def test_reduce_mean_under_nnx_jit():
    mesh = data_mesh()
    loss = jax.device_put(np.arange(N, dtype=np.float32), NamedSharding(mesh, P("data")))

    @nnx.jit
    def report(loss):
        return reduce_mean({"loss": loss, "accuracy": loss / N})

    with jax.set_mesh(mesh):
        out = report(loss)
    assert float(out["loss"]) == pytest.approx(3.5)
    assert float(out["accuracy"]) == pytest.approx(3.5 / N)
