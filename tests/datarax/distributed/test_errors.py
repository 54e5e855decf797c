"""``datarax.errors`` and the lazy package: the error types load without JAX."""

import pickle
import subprocess
import sys

import pytest

import datarax.distributed as dist
from datarax.distributed import errors, metrics
from datarax.plan import layout as planning


def _fresh(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_error_types_and_the_package_import_no_jax():
    out = _fresh(
        "import sys\n"
        "import datarax.distributed\n"
        "from datarax.distributed import PlanError, MetricsError\n"
        "from datarax.errors import UnboundAxisError\n"
        "print(sorted(m for m in ('jax', 'flax', 'optax', 'numpy') if m in sys.modules))\n"
    )
    assert out == "[]"


def test_a_name_whose_module_needs_jax_loads_it_on_first_use():
    out = _fresh(
        "import sys\n"
        "import datarax.distributed as d\n"
        "before = 'jax' in sys.modules\n"
        "d.DeviceMeshManager\n"
        "print(before, 'jax' in sys.modules)\n"
    )
    assert out == "False True"


def test_the_classes_are_the_ones_planning_and_metrics_raise():
    assert planning.PlanError is errors.PlanError is dist.PlanError
    assert metrics.MetricsError is errors.MetricsError is dist.MetricsError
    assert metrics.UnboundAxisError is errors.UnboundAxisError
    assert issubclass(errors.UnboundAxisError, NameError)


def test_every_public_name_resolves_and_unknown_ones_do_not():
    for name in dist.__all__:
        assert getattr(dist, name) is not None, name
    assert dist.metrics.reduce_sum is metrics.reduce_sum
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = dist.nope
    assert set(dist.__all__) <= set(dir(dist))


def test_plan_error_keeps_its_code_through_pickle():
    err = pickle.loads(pickle.dumps(errors.PlanError("not_enough_devices", "needs 16")))
    assert (err.code, err.message, str(err)) == ("not_enough_devices", "needs 16", "needs 16")
    m = errors.MetricsError("weights_mismatch", "3 weights for 4 devices")
    assert str(m) == "[weights_mismatch] 3 weights for 4 devices"
