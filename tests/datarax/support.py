"""Helpers shared by the library tests: stacked test arrays, the 8-device data mesh and
the assertions on metric results and errors."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from datarax.distributed.metrics import MetricsError
from tests.conftest import require_devices

N = 8
"""Simulated CPU devices (tests/conftest.py)."""


def assert_numpy_result(out):
    """NumPy in must give NumPy out: an ndarray or a NumPy scalar, never a jax.Array."""
    assert isinstance(out, (np.ndarray, np.generic)), type(out)
    assert not isinstance(out, jax.Array)


def assert_metrics_error(code, fn, *args, match=None, **kwargs):
    """Calls ``fn`` and checks it raises a ``MetricsError`` (a ``ValueError``) with ``code``."""
    with pytest.raises(MetricsError, match=match) as info:
        fn(*args, **kwargs)
    assert info.value.code == code, str(info.value)
    assert isinstance(info.value, ValueError)
    return info.value


def data_mesh(axis="data", n=N):
    """A 1-D Auto mesh over the first ``n`` devices; skips loudly with fewer."""
    require_devices(n)
    return jax.make_mesh(
        (n,), (axis,), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n]
    )


def stacked(shape, dtype):
    """Deterministic test values of ``shape`` and ``dtype`` (bools, ints in [-50, 50))."""
    rng = np.random.default_rng(0)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) > 0.5
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-50, 50, size=shape).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


def placed_blocks(array):
    """``{device id: (index ranges per dimension)}`` of a placed array, as
    ``devices_indices_map`` reports it, with ``slice`` turned into ``(start, stop)``."""
    out = {}
    for device, index in array.sharding.devices_indices_map(array.shape).items():
        out[device.id] = tuple(
            (s.start or 0, array.shape[d] if s.stop is None else s.stop)
            for d, s in enumerate(index)
        )
    return out
