"""datarax.metrics._reduce_kernels: the JAX backend of the metric reductions. It keeps
JAX's dtype semantics, reads trees as jax.tree_util does (which the NumPy walk of
datarax.metrics.reductions must equal), and sends each leaf to its own kernel."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from datarax.distributed.metrics import reduce_custom, reduce_mean
from datarax.metrics._numpy_kernels import is_inexact, omit_reduce, omit_weighted_mean
from datarax.metrics._reduce_kernels import JAX_REDUCER
from datarax.metrics.reductions import NumpyReducer
from tests.datarax.support import N, stacked

ML_DTYPES = [
    t
    for t in vars(ml_dtypes).values()
    if isinstance(t, type) and issubclass(t, np.generic) and t.__module__ == "ml_dtypes"
]
NP_DTYPES = ["float16", "float64", "complex64", "int8", "uint64", "bool", "O", "U3", "S2"]
NP_DTYPES += ["datetime64[s]", "timedelta64[s]", "V8"]


@pytest.mark.parametrize(
    "dtype", ML_DTYPES + NP_DTYPES, ids=lambda d: getattr(d, "__name__", str(d))
)
def test_is_inexact_is_jax_issubdtype_inexact(dtype):
    # The JAX-free test must answer as the JAX one it replaced, ml_dtypes included.
    assert len(ML_DTYPES) >= 10  # bfloat16, float8_*, int4, ...: the list is not empty
    assert is_inexact(dtype) == bool(jnp.issubdtype(np.dtype(dtype), jnp.inexact))


TREES = {
    "flat": {"b": np.ones(4), "a": np.arange(4), "": np.float32(1)},
    "nested": {
        "z": {"b": np.ones((4, 2)), "a": [np.arange(4), (np.ones(4), 3, None)]},
        "y": None,
        "": {"": np.zeros(4)},
        "t": (),
        "d": {},
    },
    "list": [np.ones(4), [np.ones(4)], ("a", "b")],
    "array": np.arange(4.0),
    "tuple-keys": {(1, 2): np.ones(4), (0, 5): np.zeros(4)},
}


@pytest.mark.parametrize("tree", list(TREES.values()), ids=list(TREES))
def test_jax_tree_reading_equals_the_numpy_walk(tree):
    jax_named, structure = JAX_REDUCER.flatten(tree)
    np_named, np_structure = NumpyReducer().flatten(tree)
    assert [name for name, _ in jax_named] == [name for name, _ in np_named]
    assert all(a is b for (_, a), (_, b) in zip(jax_named, np_named, strict=True))
    leaves = [object() for _ in jax_named]
    rebuilt = JAX_REDUCER.unflatten(structure, leaves)
    assert rebuilt == NumpyReducer().unflatten(np_structure, leaves)
    assert jax.tree_util.tree_structure(rebuilt, is_leaf=lambda x: x is None) == (
        jax.tree_util.tree_structure(tree, is_leaf=lambda x: x is None)
    )


def test_a_mixed_tree_sends_each_leaf_to_its_backend():
    out = reduce_custom({"j": jnp.arange(4.0), "n": np.arange(4.0)}, {"j": "sum", "n": "sum"})
    assert isinstance(out["j"], jax.Array) and float(out["j"]) == 6.0
    assert type(out["n"]) is np.float64 and out["n"] == 6.0


def test_numpy_values_with_traced_weights_take_the_jax_kernel():
    x = stacked((N,), "float32")

    @jax.jit
    def weighted(w):
        return reduce_mean({"x": x}, weights=w)["x"]

    w = np.arange(1.0, N + 1)
    out = weighted(w)
    assert isinstance(out, jax.Array) and out.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(out), np.average(x, weights=w), rtol=1e-6)


X = np.array([[1.0, np.nan, 2.0], [np.inf, 4.0, 1.0], [3.0, np.nan, -np.inf]], np.float32)


@pytest.mark.parametrize("op", ["mean", "sum", "max", "min"])
def test_the_omit_formulas_run_alike_on_both_array_modules(op):
    with np.errstate(all="ignore"):
        ref = omit_reduce(np, X, op)
    out = omit_reduce(jnp, jnp.asarray(X), op)
    assert isinstance(out, jax.Array) and out.dtype == ref.dtype
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6)
    wn = np.array([[0.5], [0.25], [0.25]], np.float32)
    with np.errstate(all="ignore"):
        ref_w = omit_weighted_mean(np, X, wn, np.float32)
    np.testing.assert_allclose(
        np.asarray(omit_weighted_mean(jnp, jnp.asarray(X), jnp.asarray(wn), jnp.float32)),
        ref_w,
        rtol=1e-6,
    )
