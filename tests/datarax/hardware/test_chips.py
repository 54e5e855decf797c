"""Hardware lookups (datarax.hardware.chips): get_hardware's errors, TPU topology
shapes and wraparound. The entries are tested in test_hardware_catalog.py."""

from __future__ import annotations

import pytest

from datarax.distributed.errors import PlanError
from datarax.hardware.chips import (
    get_hardware,
    has_wraparound,
    topology_shape,
)


def test_unknown_hardware_names_the_catalog():
    with pytest.raises(PlanError) as err:
        get_hardware("tpu-v9")
    assert err.value.code == "unknown_hardware"
    assert "tpu-v5e" in err.value.message and "'tpu-v9'" in err.value.message


@pytest.mark.parametrize(
    ("name", "topology", "shape"),
    [("tpu-v5e", "16x16", (16, 16)), ("tpu-v5e", "v5e:2x4", (2, 4)),
     ("tpu-v5p", "4x4x8", (4, 4, 8)), ("tpu-v4", "v4:2x2x1", (2, 2, 1))],
)  # fmt: skip
def test_topology_shape(name, topology, shape):
    assert topology_shape(name, topology) == shape


@pytest.mark.parametrize(
    ("name", "topology"),
    [("tpu-v5e", "32x32"), ("tpu-v5e", "v5p:4x4x4"), ("tpu-v5e", "axb"), ("h100-sxm", "2x4")],
)
def test_bad_topology_is_invalid_topology(name, topology):
    with pytest.raises(PlanError) as err:
        topology_shape(name, topology)
    assert err.value.code == "invalid_topology"
    assert repr(topology) in err.value.message or "hosts" in err.value.message


def test_wraparound_rules():
    assert has_wraparound("tpu-v5p", (4, 4, 8), 2)
    assert not has_wraparound("tpu-v5p", (2, 4, 4), 1)
    assert has_wraparound("tpu-v5e", (8, 16), 1) and not has_wraparound("tpu-v5e", (8, 16), 0)
    assert not has_wraparound("h100-sxm", (8,), 0)
