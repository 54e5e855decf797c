"""datarax.plan.layout: pure planning checked against JAX itself."""

import functools
import itertools
import math
import pickle

import jax
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from datarax.errors import PlanError
from datarax.plan.layout import (
    batch_partition_spec,
    check_divisible,
    device_coords,
    mesh_device_ids,
    nearest_valid_sizes,
    replica_ids,
    resolve_axes,
    shard_index_ranges,
    shard_shape,
    spec_shard_counts,
)
from tests.conftest import require_devices

# ---------------------------------------------------------------------------- test helpers


@functools.cache
def _jax_mesh(names: tuple[str, ...], sizes: tuple[int, ...]) -> jax.sharding.Mesh:
    """A mesh over the first prod(sizes) of the 8 simulated devices."""
    return jax.make_mesh(
        sizes,
        names,
        axis_types=(AxisType.Auto,) * len(sizes),
        devices=jax.devices()[: math.prod(sizes)],
    )


def _jax_ranges(mesh, spec, shape) -> np.ndarray:
    """JAX's devices_indices_map as int64 [n_devices, ndim, 2], in mesh.devices.flat order."""
    index_map = NamedSharding(mesh, PartitionSpec(*spec)).devices_indices_map(tuple(shape))
    return np.array(
        [
            [sl.indices(dim)[:2] for sl, dim in zip(index_map[device], shape, strict=True)]
            for device in mesh.devices.flat
        ],
        dtype=np.int64,
    ).reshape(mesh.devices.size, len(shape), 2)


def _rank_by_equal_index(ranges: np.ndarray) -> np.ndarray:
    """Replica ids as JAX numbers them: rank among devices with an equal index, in order."""
    seen: dict[bytes, int] = {}
    out = []
    for row in ranges:
        key = row.tobytes()
        out.append(seen.get(key, 0))
        seen[key] = out[-1] + 1
    return np.array(out, dtype=np.int64)


def _spec_id(spec) -> str:
    def entry(e):
        if e is None:
            return "-"
        return e if isinstance(e, str) else "*".join(e)

    return "P(" + ",".join(entry(e) for e in spec) + ")"


def _all_specs(names: tuple[str, ...], ndim: int) -> list[tuple]:
    """Every spec of rank ndim: each axis unused or on one dim, in every major-to-minor order."""
    specs = []
    for dims_of_axes in itertools.product(range(-1, ndim), repeat=len(names)):
        groups = [
            [n for n, d in zip(names, dims_of_axes, strict=True) if d == dim] for dim in range(ndim)
        ]
        for orders in itertools.product(*(itertools.permutations(g) for g in groups)):
            specs.append(tuple(None if not o else o[0] if len(o) == 1 else o for o in orders))
    return specs


_NAMES = ("data", "fsdp", "model")
# (sizes, ranks of the specs to try); names are the first len(sizes) of _NAMES.
_MESHES = [
    ((1,), (1, 2, 3)),
    ((2,), (1, 2, 3)),
    ((4,), (1, 2, 3)),
    ((8,), (1, 2, 3)),
    ((2, 4), (1, 2, 3)),
    ((4, 2), (1, 2, 3)),
    ((1, 8), (1, 2)),
    ((2, 2), (1, 2, 3)),
    ((2, 2, 2), (1, 2, 3)),
    ((1, 2, 4), (1, 2)),
    ((4, 1, 2), (1, 2)),
]
_JAX_CASES = [
    pytest.param(
        dict(zip(_NAMES, sizes, strict=False)),
        spec,
        id="x".join(f"{n}{s}" for n, s in zip(_NAMES, sizes, strict=False)) + "-" + _spec_id(spec),
    )
    for sizes, ranks in _MESHES
    for ndim in ranks
    for spec in _all_specs(_NAMES[: len(sizes)], ndim)
]


# --------------------------------------------------------------------------- resolve_axes


@pytest.mark.parametrize(
    ("axes", "num_devices", "exact", "expected"),
    [
        ({"data": 8}, 8, True, {"data": 8}),
        ({"data": -1}, 8, True, {"data": 8}),
        ({"data": -1, "model": 4}, 8, True, {"data": 2, "model": 4}),
        ({"model": 2, "data": -1}, 8, True, {"model": 2, "data": 4}),
        ([("data", -1), ("model", 2)], 8, True, {"data": 4, "model": 2}),
        ([("model", 4), ("data", 2)], 8, True, {"model": 4, "data": 2}),
        (
            {"data": 256, "fsdp": 16, "model": -1},
            65536,
            True,
            {"data": 256, "fsdp": 16, "model": 16},
        ),
        ({"model": 4}, 8, False, {"model": 4}),
        ({"data": 1, "model": 1}, 8, False, {"data": 1, "model": 1}),
        ({"data": -1, "model": 2}, 8, False, {"data": 4, "model": 2}),
        ({"data": np.int64(2), "model": 4}, 8, True, {"data": 2, "model": 4}),
        ({"_x1": 2, "Y": -1}, 4, True, {"_x1": 2, "Y": 2}),
    ],
    ids=[
        "one-axis",
        "auto-alone",
        "auto-first",
        "auto-last-order-kept",
        "pairs-input",
        "pairs-order-kept",
        "65536-devices",
        "live-fewer-devices",
        "live-one-device",
        "live-auto-fills-all",
        "numpy-int-size",
        "odd-but-valid-names",
    ],
)
def test_resolve_axes_good(axes, num_devices, exact, expected):
    resolved = resolve_axes(axes, num_devices, exact=exact)
    assert resolved == expected
    assert list(resolved) == list(expected)  # order preserved
    assert all(type(size) is int for size in resolved.values())
    assert resolved is not axes


@pytest.mark.parametrize(
    ("axes", "num_devices", "exact", "code", "fragments"),
    [
        ({}, 8, True, "invalid_axis_name", ["empty"]),
        ([], 8, True, "invalid_axis_name", ["empty"]),
        ({"1data": 8}, 8, True, "invalid_axis_name", ["'1data'", "identifier"]),
        ({"da-ta": 8}, 8, True, "invalid_axis_name", ["'da-ta'"]),
        ({"": 8}, 8, True, "invalid_axis_name", ["''"]),
        ({3: 8}, 8, True, "invalid_axis_name", ["3"]),
        ([("data", 2), ("data", 4)], 8, True, "invalid_axis_name", ["'data'", "more than once"]),
        (["data"], 8, True, "invalid_axis_name", ["'data'", "pair"]),
        ("data", 8, True, "invalid_axis_name", ["'data'"]),
        ({"data": 0}, 8, True, "invalid_axis_size", ["'data'", "size 0"]),
        ({"data": -2}, 8, True, "invalid_axis_size", ["-2"]),
        ({"data": 2.0}, 8, True, "invalid_axis_size", ["2.0"]),
        ({"data": True}, 8, True, "invalid_axis_size", ["True"]),
        ({"data": "8"}, 8, True, "invalid_axis_size", ["'8'"]),
        ({"data": -1, "model": -1}, 8, True, "multiple_auto_axes", ["'data'", "'model'"]),
        ({"data": -1, "model": 3}, 8, True, "axes_product_mismatch", ["3", "8"]),
        ({"data": -1, "model": 16}, 8, True, "axes_product_mismatch", ["16", "8"]),
        ({"data": -1, "model": 3}, 8, False, "axes_product_mismatch", ["3", "8"]),
        ({"data": 2, "model": 2}, 8, True, "axes_product_mismatch", ["4", "8"]),
        ({"data": 4, "model": 4}, 8, True, "axes_product_mismatch", ["16", "8"]),
        (
            {"data": 4, "model": 4},
            8,
            False,
            "not_enough_devices",
            [
                "Not enough devices: mesh {'data': 4, 'model': 4} needs 16 devices but only "
                "8 are available"
            ],
        ),
        ({"data": 9}, 8, False, "not_enough_devices", ["9", "8"]),
        ({"data": 1}, 0, True, "invalid_device_count", ["0"]),
        ({"data": 1}, -4, False, "invalid_device_count", ["-4"]),
        ({"data": 1}, True, True, "invalid_device_count", ["True"]),
    ],
    ids=[
        "empty-dict",
        "empty-list",
        "name-starts-with-digit",
        "name-with-dash",
        "name-empty",
        "name-not-str",
        "name-repeated",
        "entry-not-pair",
        "axes-bare-string",
        "size-zero",
        "size-minus-two",
        "size-float",
        "size-bool",
        "size-str",
        "two-auto-axes",
        "auto-not-dividing",
        "auto-leaves-zero",
        "auto-not-dividing-live",
        "exact-too-few",
        "exact-too-many",
        "live-too-many",
        "live-one-axis-too-many",
        "zero-devices",
        "negative-devices",
        "bool-devices",
    ],
)
def test_resolve_axes_errors(axes, num_devices, exact, code, fragments):
    with pytest.raises(PlanError) as info:
        resolve_axes(axes, num_devices, exact=exact)
    assert info.value.code == code
    for fragment in fragments:
        assert fragment in str(info.value)


def test_plan_error_is_value_error_and_pickles():
    error = PlanError("not_enough_devices", "needs 16 devices but only 8 are available")
    assert isinstance(error, ValueError)
    assert str(error) == error.message == "needs 16 devices but only 8 are available"
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.code, str(copy)) == (error.code, str(error))


# ------------------------------------------------------------------- batch_partition_spec


@pytest.mark.parametrize(
    ("axes", "batch_axes", "ndim", "expected"),
    [
        ({"data": 2, "model": 4}, None, 2, ("data", None)),
        ({"model": 8}, None, 2, (None, None)),
        ({"data": 8}, None, 1, ("data",)),
        ({"data": 2, "model": 4}, [], 3, (None, None, None)),
        ({"data": 2, "model": 4}, ["model"], 2, ("model", None)),
        ({"data": 2, "model": 4}, "model", 2, ("model", None)),
        ({"data": 2, "fsdp": 2, "model": 2}, ["data", "fsdp"], 2, (("data", "fsdp"), None)),
        ({"data": 2, "fsdp": 2, "model": 2}, ("fsdp", "data"), 1, (("fsdp", "data"),)),
    ],
    ids=[
        "default-data",
        "default-replicated",
        "default-rank1",
        "explicit-empty",
        "explicit-model",
        "bare-string",
        "two-axes",
        "two-axes-reversed",
    ],
)
def test_batch_partition_spec(axes, batch_axes, ndim, expected):
    assert batch_partition_spec(axes, batch_axes, ndim) == expected


@pytest.mark.parametrize(
    ("batch_axes", "ndim", "code", "fragment"),
    [
        (["fsdp"], 2, "unknown_batch_axis", "'fsdp'"),
        ([0], 2, "unknown_batch_axis", "0"),
        (["data", "data"], 2, "duplicate_batch_axis", "'data'"),
        (["data"], 0, "invalid_batch_shape", "0"),
        (None, True, "invalid_batch_shape", "True"),
    ],
    ids=["unknown-axis", "axis-not-str", "repeated-axis", "rank-zero", "rank-bool"],
)
def test_batch_partition_spec_errors(batch_axes, ndim, code, fragment):
    with pytest.raises(PlanError) as info:
        batch_partition_spec({"data": 2, "model": 4}, batch_axes, ndim)
    assert info.value.code == code
    assert fragment in str(info.value)


# ----------------------------------------------------------------- counts, shapes, sizes

_AXES_248 = {"data": 2, "fsdp": 4, "model": 8}


@pytest.mark.parametrize(
    ("spec", "shape", "counts", "expected"),
    [
        ((), (3, 5), (), (3, 5)),
        ((None,), (3, 5), (1,), (3, 5)),
        (("data",), (8, 5), (2,), (4, 5)),
        ((None, "model"), (3, 16), (1, 8), (3, 2)),
        ((("data", "fsdp"), "model"), (16, 8), (8, 8), (2, 1)),
        ((("model", "data"), None, "fsdp"), (32, 3, 4), (16, 1, 4), (2, 3, 1)),
        (PartitionSpec("fsdp", None), (4, 7), (4, 1), (1, 7)),
        (("data",), (0, 5), (2,), (0, 5)),
        ((), (), (), ()),
    ],
    ids=[
        "empty-spec",
        "none",
        "data",
        "model-on-dim1",
        "tuple-and-name",
        "rank3",
        "partition-spec-object",
        "zero-size",
        "scalar",
    ],
)
def test_spec_shard_counts_and_shard_shape(spec, shape, counts, expected):
    assert spec_shard_counts(_AXES_248, spec) == counts
    assert shard_shape(_AXES_248, spec, shape) == expected
    check_divisible(_AXES_248, spec, shape)  # no error


@pytest.mark.parametrize(
    ("size", "shards", "expected"),
    [
        (250, 8, (248, 256)),
        (256, 8, (256, 256)),
        (257, 8, (256, 264)),
        (5, 8, (8, 8)),
        (0, 8, (8, 8)),
        (9, 8, (8, 16)),
        (7, 1, (7, 7)),
        (1000, 3, (999, 1002)),
    ],
    ids=[
        "below-256",
        "exact",
        "above-256",
        "smaller-than-shards",
        "zero",
        "just-above",
        "one",
        "3",
    ],
)
def test_nearest_valid_sizes(size, shards, expected):
    assert nearest_valid_sizes(size, shards) == expected


@pytest.mark.parametrize(
    ("size", "shards", "fragment"),
    [
        (-1, 8, "size is -1"),
        (8, 0, "shards is 0"),
        (8, -2, "shards is -2"),
        (8.0, 2, "size is 8.0"),
    ],
    ids=["negative-size", "zero-shards", "negative-shards", "float-size"],
)
def test_nearest_valid_sizes_rejects(size, shards, fragment):
    with pytest.raises(ValueError, match=fragment):
        nearest_valid_sizes(size, shards)


@pytest.mark.parametrize(
    ("axes", "spec", "shape", "what", "code", "fragments"),
    [
        (
            {"data": 8},
            ("data", None),
            (250, 1024),
            "batch",
            "batch_not_divisible",
            [
                "batch dimension 0 of shape (250, 1024) is split into 8 shards; "
                "250 is not divisible by 8; nearest valid sizes: 248 or 256",
                "data",
            ],
        ),
        (
            {"data": 2, "fsdp": 4},
            (("data", "fsdp"),),
            (5,),
            "batch",
            "batch_not_divisible",
            ["dimension 0 of shape (5,)", "8 shards", "nearest valid size: 8", "data, fsdp"],
        ),
        (
            {"data": 2, "model": 4},
            (None, "model"),
            (4, 1030),
            "parameter",
            "batch_not_divisible",
            ["parameter dimension 1 of shape (4, 1030)", "4 shards", "1028 or 1032", "model"],
        ),
        ({"data": 2}, ("data", None, None), (4, 2), "batch", "invalid_batch_shape", ["3", "2"]),
        ({"data": 2}, ("data",), (4, -1), "batch", "invalid_batch_shape", ["-1"]),
        ({"data": 2}, ("data",), (4.0,), "batch", "invalid_batch_shape", ["4.0"]),
        ({"data": 2}, ("data",), (True,), "batch", "invalid_batch_shape", ["True"]),
        ({"data": 2}, ("data",), 4, "batch", "invalid_batch_shape", ["4"]),
        ({"data": 2}, ("fsdp",), (4,), "batch", "unknown_batch_axis", ["'fsdp'"]),
        ({"data": 2}, "data", (4,), "batch", "unknown_batch_axis", ["'data'", "('data',)"]),
        ({"data": 2}, (3,), (4,), "batch", "unknown_batch_axis", ["3"]),
        ({"data": 2, "m": 2}, ("data", "data"), (4, 4), "batch", "duplicate_batch_axis", ["data"]),
        ({"data": 2, "m": 2}, (("m", "m"),), (4,), "batch", "duplicate_batch_axis", ["'m'"]),
        ({"data": -1}, ("data",), (4,), "batch", "invalid_axis_size", ["-1", "resolve_axes"]),
    ],
    ids=[
        "250-over-8",
        "too-small-for-shards",
        "parameter-dim-1",
        "spec-longer-than-shape",
        "negative-dim",
        "float-dim",
        "bool-dim",
        "shape-not-sequence",
        "unknown-axis",
        "spec-bare-string",
        "spec-entry-not-name",
        "axis-on-two-dims",
        "axis-twice-in-tuple",
        "unresolved-axes",
    ],
)
def test_check_divisible_errors(axes, spec, shape, what, code, fragments):
    with pytest.raises(PlanError) as info:
        check_divisible(axes, spec, shape, what=what)
    assert info.value.code == code
    for fragment in fragments:
        assert fragment in str(info.value)


# ------------------------------------------------------------------- coords and device ids


def test_device_coords_and_ids_are_row_major():
    axes = {"data": 2, "model": 3}
    np.testing.assert_array_equal(
        device_coords(axes), [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    )
    assert device_coords(axes).dtype == np.int64
    np.testing.assert_array_equal(mesh_device_ids(axes), [[0, 1, 2], [3, 4, 5]])
    assert mesh_device_ids(axes).dtype == np.int64


def test_small_plan_by_hand():
    axes = {"data": 2, "model": 2}
    ranges = shard_index_ranges(axes, ("data",), (4, 3))
    np.testing.assert_array_equal(ranges[:, 0], [[0, 2], [0, 2], [2, 4], [2, 4]])
    np.testing.assert_array_equal(ranges[:, 1], [[0, 3]] * 4)
    np.testing.assert_array_equal(replica_ids(axes, ("data",)), [0, 1, 0, 1])
    np.testing.assert_array_equal(replica_ids(axes, (None, "model")), [0, 0, 1, 1])
    np.testing.assert_array_equal(replica_ids(axes, ()), [0, 1, 2, 3])
    # A split dimension of size 0 gives every device the same (empty) slice.
    np.testing.assert_array_equal(replica_ids(axes, ("data",), shape=(0, 3)), [0, 1, 2, 3])


# ------------------------------------------------------------------------- against JAX


@pytest.mark.parametrize(("axes", "spec"), _JAX_CASES)
def test_ranges_and_replicas_match_jax(axes, spec):
    require_devices(8)
    mesh = _jax_mesh(tuple(axes), tuple(axes.values()))
    counts = spec_shard_counts(axes, spec)
    split = [d for d, c in enumerate(counts) if c > 1]
    shapes = [
        tuple(3 * c if c > 1 else 5 for c in counts),  # chunks of 3
        tuple(counts) + (2,),  # chunks of 1, one trailing dimension the spec leaves out
    ]
    if split:
        shapes.append(tuple(0 if d == split[0] else 2 * c for d, c in enumerate(counts)))
    for shape in shapes:
        expected = _jax_ranges(mesh, spec, shape)
        got = shard_index_ranges(axes, spec, shape)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, expected, err_msg=f"shape {shape}")
        np.testing.assert_array_equal(
            replica_ids(axes, spec, shape=shape), _rank_by_equal_index(expected)
        )
        assert shard_shape(axes, spec, shape) == tuple(expected[0, :, 1] - expected[0, :, 0])
    # Without a shape, replica ids assume non-empty split dimensions (the first shape).
    np.testing.assert_array_equal(
        replica_ids(axes, spec), _rank_by_equal_index(_jax_ranges(mesh, spec, shapes[0]))
    )


@pytest.mark.parametrize(
    ("axes", "spec", "shape"),
    [
        ({"data": 4, "model": 2}, ("data",), (10, 3)),
        ({"data": 4, "model": 2}, ("data",), (3, 3)),
        ({"data": 4, "model": 2}, (("data", "model"),), (12,)),
        ({"data": 4, "model": 2}, (None, "model"), (4, 5)),
        ({"data": 8}, ("data",), (1,)),
        ({"data": 2, "fsdp": 2, "model": 2}, (("model", "data"), "fsdp"), (4, 3)),
    ],
    ids=["10-over-4", "3-over-4", "12-over-8", "dim1-5-over-2", "1-over-8", "rank2-both-dims"],
)
def test_indivisible_raises_like_jax(axes, spec, shape):
    require_devices(8)
    mesh = _jax_mesh(tuple(axes), tuple(axes.values()))
    with pytest.raises(ValueError, match="should evenly divide"):
        NamedSharding(mesh, PartitionSpec(*spec)).devices_indices_map(shape)
    for call in (shard_index_ranges, shard_shape, check_divisible):
        with pytest.raises(PlanError) as info:
            call(axes, spec, shape)
        assert info.value.code == "batch_not_divisible"


@pytest.mark.parametrize(
    ("axes", "spec", "shape"),
    [
        ({"data": 8}, ("data",), (16, 2)),
        ({"data": 8}, (), (3,)),
        ({"data": 2, "model": 4}, ("data",), (4, 2)),
        ({"data": 2, "model": 4}, (None, "model"), (3, 8)),
        ({"data": 2, "model": 4}, (("model", "data"),), (8,)),
        ({"data": 4, "model": 2}, ("model",), (0, 2)),
        ({"data": 2, "fsdp": 2, "model": 2}, ("fsdp",), (4, 2)),
        ({"data": 2, "fsdp": 2, "model": 2}, (("model", "data"),), (4,)),
        ({"data": 2, "fsdp": 2, "model": 2}, (None, "data"), (3, 0)),
        ({"data": 2, "fsdp": 2}, ("fsdp", "data"), (2, 2)),
        ({"data": 1, "model": 2}, ("data", "model"), (3, 4)),
        ({"model": 4}, (None, None, "model"), (1, 2, 8)),
    ],
    ids=[
        "data8",
        "replicated",
        "data2-of-2x4",
        "model-dim1",
        "model-major-tuple",
        "zero-size-split-dim",
        "middle-axis",
        "3axis-tuple",
        "zero-size-dim1",
        "two-dims-4-devices",
        "size-1-axis",
        "rank3-last-dim",
    ],
)
def test_replica_ids_match_device_put(axes, spec, shape):
    require_devices(8)
    mesh = _jax_mesh(tuple(axes), tuple(axes.values()))
    array = jax.device_put(np.zeros(shape, np.float32), NamedSharding(mesh, PartitionSpec(*spec)))
    by_device = {shard.device: shard for shard in array.addressable_shards}
    flat = list(mesh.devices.flat)
    assert set(by_device) == set(flat)
    expected = [by_device[device].replica_id for device in flat]
    np.testing.assert_array_equal(replica_ids(axes, spec, shape=shape), expected)
    ranges = shard_index_ranges(axes, spec, shape)
    for device, row in zip(flat, ranges, strict=True):
        index = by_device[device].index
        assert [list(sl.indices(d)[:2]) for sl, d in zip(index, shape, strict=True)] == row.tolist()
        assert by_device[device].data.shape == shard_shape(axes, spec, shape)


# ------------------------------------------------------------------- large abstract plan


def test_large_abstract_plan_invariants():
    axes = resolve_axes({"data": 256, "fsdp": 16, "model": -1}, 65536)
    spec = batch_partition_spec(axes, ["data", "fsdp"], 2)
    assert spec == (("data", "fsdp"), None)
    shape = (8192, 1024)
    ranges = shard_index_ranges(axes, spec, shape)
    assert ranges.shape == (65536, 2, 2)
    assert shard_shape(axes, spec, shape) == (2, 1024)
    np.testing.assert_array_equal(ranges[:, 0, 1] - ranges[:, 0, 0], 2)
    np.testing.assert_array_equal(ranges[:, 1], np.broadcast_to([0, 1024], (65536, 2)))
    starts = np.unique(ranges[:, 0, 0])
    stops = np.unique(ranges[:, 0, 1])
    # The distinct ranges tile dimension 0 exactly: back to back, from 0 to 8192.
    assert len(starts) == len(stops) == 4096
    np.testing.assert_array_equal(starts[1:], stops[:-1])
    assert (starts[0], stops[-1]) == (0, 8192)
    # Each slice is held by 16 devices (the model axis), numbered 0..15 in mesh order.
    replicas = replica_ids(axes, spec)
    slice_of = ranges[:, 0, 0] // 2
    order = np.lexsort((np.arange(65536), slice_of))
    np.testing.assert_array_equal(
        replicas[order].reshape(4096, 16), np.tile(np.arange(16), (4096, 1))
    )
    # Slice index is data-major: device (d, f, m) holds slice d * 16 + f.
    coords = device_coords(axes)
    np.testing.assert_array_equal(slice_of, coords[:, 0] * 16 + coords[:, 1])
    np.testing.assert_array_equal(replicas, coords[:, 2])
    assert mesh_device_ids(axes).shape == (256, 16, 16)
