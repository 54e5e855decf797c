"""Hardware lookups (datarax.hardware.chips): get_hardware's errors, TPU topology
shapes and wraparound. The entries are tested in test_hardware_catalog.py."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.hardware.chips import (
    accelerator_type,
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
     ("tpu-v5p", "4x4x8", (4, 4, 8)), ("tpu-v4", "v4:2x2x1", (2, 2, 1)),
     # Cloud TPU accelerator types: v4, v5p and TPU7x count TensorCores, v5e and v6e chips
     ("tpu-v5p", "v5p-512", (4, 8, 8)), ("tpu-v5p", "v5p-8", (2, 2, 1)),
     ("tpu-v6e", "v6e-256", (16, 16)), ("tpu-v5e", "v5litepod-16", (4, 4)),
     ("tpu7x", "tpu7x-128", (4, 4, 4)), ("tpu-v4", "v4-2048", (8, 8, 16))],
)  # fmt: skip
def test_topology_shape(name, topology, shape):
    assert topology_shape(name, topology) == shape


@pytest.mark.parametrize(
    ("name", "topology"),
    [
        ("tpu-v5e", "32x32"),
        ("tpu-v5e", "v5p:4x4x4"),
        ("tpu-v5e", "axb"),
        ("h100-sxm", "2x4"),
        ("tpu-v5p", "v5p-500"),
        ("tpu-v5p", "v5p-9"),
        ("tpu-v5e", "v6e-256"),
    ],
)
def test_bad_topology_is_invalid_topology(name, topology):
    with pytest.raises(PlanError) as err:
        topology_shape(name, topology)
    assert err.value.code == "invalid_topology"
    assert repr(topology) in err.value.message or "hosts" in err.value.message


def test_an_accelerator_type_that_is_no_slice_lists_the_ones_that_are():
    with pytest.raises(PlanError) as err:
        topology_shape("tpu-v5p", "v5p-500")
    assert "v5p-N for N in [8, 16," in err.value.message and "512" in err.value.message
    assert accelerator_type("v5p-512") == ("tpu-v5p", 512, 2)
    assert accelerator_type("16x16") is None and accelerator_type("v5e:4x4") is None


def test_wraparound_rules():
    assert has_wraparound("tpu-v5p", (4, 4, 8), 2)
    assert not has_wraparound("tpu-v5p", (2, 4, 4), 1)
    assert has_wraparound("tpu-v5e", (8, 16), 1) and not has_wraparound("tpu-v5e", (8, 16), 0)
    assert not has_wraparound("h100-sxm", (8,), 0)
