"""TPU topologies and the device order within one slice (datarax.hardware.tpu_slices): parsing
against the catalog, JAX's small-slice ring orders, whole and split physical axes. The
comparison with libtpu's own meshes over whole plans is in test_topology.py."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.hardware.tpu_slices import (
    format_tpu_topology,
    parse_tpu_topology,
    tpu_slice_order,
)


def test_parse_and_format_topology():
    hw, shape = parse_tpu_topology("v5e:16x16")
    assert (hw.name, shape) == ("tpu-v5e", (16, 16, 1))
    assert parse_tpu_topology("4x4x8", "tpu-v5p")[1] == (4, 4, 8)
    assert format_tpu_topology("tpu-v6e", (16, 16, 1)) == "v6e:16x16"
    assert format_tpu_topology("tpu-v4", (2, 2, 1)) == "v4:2x2x1"


def test_tpu_slice_order_is_a_permutation_of_chips():
    order, split = tpu_slice_order("tpu-v5p", (4, 4, 8), (8, 2, 8), allow_split_physical_axes=True)
    assert split and order.shape == (8, 2, 8)
    assert sorted(order.ravel().tolist()) == list(range(128))


@pytest.mark.parametrize(
    ("topology", "hardware", "says"),
    [
        ("v5p:4x4x4", "tpu-v5e", "names 'v5p'"),
        ("3x3", "tpu-v5e", "not a tpu-v5e slice shape"),
        ("16x16", "h100-sxm", "no TPU topologies"),
    ],
    ids=["other-prefix", "unsupported-shape", "gpu"],
)
def test_parse_refuses_with_invalid_topology(topology, hardware, says):
    with pytest.raises(PlanError) as caught:
        parse_tpu_topology(topology, hardware)
    assert caught.value.code == "invalid_topology" and says in caught.value.message


@pytest.mark.parametrize(
    ("chips", "order"),
    [
        ((2, 2, 1), [0, 1, 3, 2]),  # jax's _TRAY_2x2_RING_ORDER
        ((4, 4, 1), [0, 1, 2, 3, 7, 6, 5, 9, 10, 11, 15, 14, 13, 12, 8, 4]),  # _TRAY_4x4
    ],
    ids=["2x2", "4x4"],
)
def test_small_v5e_slices_take_jaxs_ring_orders(chips, order):
    got, split = tpu_slice_order("tpu-v5e", chips, (len(order),))
    assert got.tolist() == order and split is False


def test_split_physical_axes_are_refused_unless_allowed():
    with pytest.raises(PlanError) as caught:
        tpu_slice_order("tpu-v5p", (4, 4, 8), (8, 2, 8))
    assert caught.value.code == "physical_axes_split_required"
    assert "allow_split_physical_axes" in caught.value.message
