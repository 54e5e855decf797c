"""datarax.spmd.collectives: lax.p* over pytrees inside shard_map and pmap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from datarax.distributed import metrics
from datarax.distributed.metrics import MetricsError, UnboundAxisError
from datarax.spmd.collectives import (
    all_gather,
    reduce_gradients_across_devices,
    reduce_mean_collective,
    reduce_sum_collective,
)
from tests.conftest import require_devices
from tests.datarax.support import N, assert_metrics_error, data_mesh


def test_collectives_inside_shard_map():
    mesh = data_mesh("batch")
    x = np.arange(N * 2, dtype=np.float32).reshape(N, 2)

    def f(x):
        tree = {"x": x, "name": "tag"}
        return (
            reduce_mean_collective(tree, "batch")["x"],
            reduce_sum_collective({"x": x}, axis_name="batch")["x"],
            all_gather({"x": x}, axis_name="batch")["x"],
        )

    mean, total, gathered = jax.shard_map(f, mesh=mesh, in_specs=P("batch"), out_specs=P())(x)
    np.testing.assert_allclose(mean, x.mean(axis=0, keepdims=True))
    np.testing.assert_allclose(total, x.sum(axis=0, keepdims=True))
    np.testing.assert_allclose(gathered, x[:, None, :])


def test_collectives_inside_pmap():
    require_devices(N)
    x = np.arange(N, dtype=np.float32)

    def f(x):
        return (
            reduce_mean_collective({"x": x}, axis_name="batch")["x"],
            reduce_sum_collective(x, axis_name="batch"),
            all_gather(x, axis_name="batch"),
        )

    mean, total, gathered = jax.pmap(f, axis_name="batch")(x)
    np.testing.assert_allclose(mean, np.full(N, x.mean()))
    np.testing.assert_allclose(total, np.full(N, x.sum()))
    np.testing.assert_allclose(gathered, np.tile(x, (N, 1)))


def test_non_array_leaves_pass_through_unchanged():
    mesh = data_mesh("batch")
    constant = np.arange(3.0)
    seen = {}

    def f(x):
        tree = {"x": x, "count": 1, "scale": 0.5, "const": constant, "tag": "run", "none": None}
        out = reduce_sum_collective(tree, "batch")
        seen.update({k: v for k, v in out.items() if k != "x"})
        return out["x"]

    total = jax.shard_map(f, mesh=mesh, in_specs=P("batch"), out_specs=P())(jnp.ones(N))
    np.testing.assert_allclose(np.asarray(total), [N])
    # As upstream: only jax.Array leaves are reduced; a Python 1 is not psum'ed to N.
    assert seen == {"count": 1, "scale": 0.5, "const": constant, "tag": "run", "none": None}


def test_jax_lax_is_looked_up_at_call_time(monkeypatch):
    # Upstream's collectives call jax.lax.pmean when they run, so wrapping it after import
    # takes effect; ours must too. The wrapper delegates to the real pmean.
    mesh = data_mesh("batch")
    real = jax.lax.pmean
    calls = []

    def counting_pmean(x, axis_name, **kwargs):
        calls.append(axis_name)
        return real(x, axis_name, **kwargs)

    monkeypatch.setattr(jax.lax, "pmean", counting_pmean)
    out = jax.shard_map(
        lambda g: reduce_gradients_across_devices({"w": g, "b": g}, "MEAN"),
        mesh=mesh,
        in_specs=P("batch"),
        out_specs=P(),
    )(jnp.arange(float(N)))
    assert calls == ["batch", "batch"]
    np.testing.assert_allclose(np.asarray(out["w"]), [3.5])


def test_reduce_gradients_sum_and_bad_type():
    mesh = data_mesh("batch")
    grads = {"w": jax.numpy.arange(8.0)}
    summed = jax.shard_map(
        lambda g: reduce_gradients_across_devices(g, "sum"),
        mesh=mesh,
        in_specs=P("batch"),
        out_specs=P(),
    )(grads)
    np.testing.assert_allclose(np.asarray(summed["w"]), [28.0])
    with pytest.raises(ValueError, match="Unsupported reduce_type 'max'"):
        reduce_gradients_across_devices(grads, reduce_type="max")


@pytest.mark.parametrize(
    "call",
    [
        lambda: reduce_mean_collective({"a": jnp.ones(2)}, "batch"),
        lambda: reduce_sum_collective(jnp.ones(2)),
        lambda: all_gather({"a": jnp.ones(2)}, ""),
        lambda: reduce_gradients_across_devices({"a": jnp.ones(2)}),
    ],
    ids=["mean-outside-map", "sum-outside-map", "empty-axis-name", "gradients-outside-map"],
)
def test_unbound_axis_is_a_metrics_error_and_a_name_error(call):
    err = assert_metrics_error("unbound_axis_name", call)
    assert isinstance(err, NameError)  # what upstream (JAX) raises there
    assert isinstance(err, UnboundAxisError)
    assert "jax.pmap" in err.message


def test_collectives_are_reexported_from_metrics():
    assert metrics.reduce_mean_collective is reduce_mean_collective
    assert metrics.all_gather is all_gather
    assert issubclass(UnboundAxisError, MetricsError)
