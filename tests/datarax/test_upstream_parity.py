"""Drop-in parity with upstream datarax (avitai/datarax): all 30 names of its
``datarax.distributed.__all__`` import from the package and from upstream's submodule,
with upstream's signatures.

The table below is upstream's, read from ``src/datarax/distributed/*.py``: parameter
names, kinds and defaults in order. Our functions may add parameters only after
upstream's and only with defaults (a call written for upstream stays valid); each such
addition is listed in ``EXTRA`` and in the table of ``docs/UPSTREAM.md`` ("Differences
from upstream datarax"), which a test below reads.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
from pathlib import Path

import pytest

import datarax.distributed as dd

EMPTY = inspect.Parameter.empty
PK = inspect.Parameter.POSITIONAL_OR_KEYWORD
VAR = inspect.Parameter.VAR_POSITIONAL
KW = inspect.Parameter.KEYWORD_ONLY

# name -> (upstream submodule, [(parameter, kind, default), ...] or a kind marker)
UPSTREAM = {
    "DeviceMeshManager": ("device_mesh", "class"),
    "DevicePlacement": ("device_placement", [("default_device", PK, None)]),
    "HardwareType": ("device_placement", "enum"),
    "BatchSizeRecommendation": (
        "device_placement",
        [
            ("min_batch_size", PK, EMPTY),
            ("optimal_batch_size", PK, EMPTY),
            ("critical_batch_size", PK, EMPTY),
            ("max_memory_batch_size", PK, None),
            ("notes", PK, ""),
        ],
    ),
    "place_on_device": ("device_placement", [("data", PK, EMPTY), ("device", PK, None)]),
    "distribute_batch": ("device_placement", [("data", PK, EMPTY), ("sharding", PK, EMPTY)]),
    "get_batch_size_recommendation": ("device_placement", [("hardware_type", PK, None)]),
    "prefetch_to_device": (
        "device_placement",
        [
            ("data_iterator", PK, EMPTY),
            ("size", PK, 2),
            ("device", PK, None),
            ("cpu_buffer_size", PK, None),
        ],
    ),
    "create_data_parallel_sharding": (
        "data_parallel",
        [("mesh", PK, EMPTY), ("data_axis", PK, "data")],
    ),
    "place_batch_on_shards": ("data_parallel", [("batch", PK, EMPTY), ("sharding", PK, EMPTY)]),
    "spmd_train_step": (
        "data_parallel",
        [
            ("model", PK, EMPTY),
            ("optimizer", PK, EMPTY),
            ("loss_fn", PK, EMPTY),
            ("batch", PK, EMPTY),
        ],
    ),
    "data_parallel_train_step": (
        "data_parallel",
        [
            ("loss_fn", PK, EMPTY),
            ("optimizer", PK, EMPTY),
            ("batch", PK, EMPTY),
            ("state", PK, EMPTY),
            ("rngs", PK, None),
        ],
    ),
    "place_model_state_on_shards": (
        "data_parallel",
        [("state", PK, EMPTY), ("mesh", PK, EMPTY), ("param_sharding", PK, None)],
    ),
    "place_nnx_state_on_shards": (
        "data_parallel",
        [("state", PK, EMPTY), ("mesh", PK, EMPTY), ("filter_sharding", PK, EMPTY)],
    ),
    "reduce_gradients_across_devices": (
        "data_parallel",
        [("gradients", PK, EMPTY), ("reduce_type", PK, "mean"), ("axis_name", PK, "batch")],
    ),
    "reduce_gradient_tree": (
        "data_parallel",
        [("gradients", PK, EMPTY), ("reduce_type", PK, "mean")],
    ),
    "reduce_mean": ("metrics", [("metrics", PK, EMPTY)]),
    "reduce_sum": ("metrics", [("metrics", PK, EMPTY)]),
    "reduce_max": ("metrics", [("metrics", PK, EMPTY)]),
    "reduce_min": ("metrics", [("metrics", PK, EMPTY)]),
    "reduce_custom": ("metrics", [("metrics", PK, EMPTY), ("reduce_fn", PK, None)]),
    "reduce_mean_collective": (
        "metrics",
        [("metrics", PK, EMPTY), ("axis_name", PK, "batch")],
    ),
    "reduce_sum_collective": ("metrics", [("metrics", PK, EMPTY), ("axis_name", PK, "batch")]),
    "all_gather": ("metrics", [("metrics", PK, EMPTY), ("axis_name", PK, "batch")]),
    "collect_from_devices": ("metrics", [("metrics", PK, EMPTY)]),
    "MeshRules": (
        "sharding",
        [("data", KW, None), ("embed", KW, None), ("mlp", KW, None), ("heads", KW, None)],
    ),
    "data_parallel_rules": ("sharding", [("data_axis", PK, "data")]),
    "fsdp_rules": ("sharding", [("data_axis", PK, "data"), ("model_axis", PK, "model")]),
    "create_named_sharding": ("sharding", [("mesh", PK, EMPTY), ("axis_names", VAR, EMPTY)]),
    "partition_spec_for_names": (
        "sharding",
        [("rules", PK, EMPTY), ("logical_names", VAR, EMPTY)],
    ),
}

# Upstream's DeviceMeshManager static methods.
MESH_METHODS = {
    "create_device_mesh": [("mesh_shape", PK, EMPTY), ("devices", PK, None)],
    "create_data_parallel_mesh": [("num_devices", PK, None)],
    "create_model_parallel_mesh": [("num_devices", PK, EMPTY)],
    "create_hybrid_mesh": [("data_parallel_size", PK, EMPTY), ("model_parallel_size", PK, EMPTY)],
    "get_mesh_info": [("mesh", PK, EMPTY)],
}

# Our additions after upstream's parameters (all defaulted): name -> parameter names.
EXTRA = {
    "reduce_mean": ["weights", "nan_policy"],
    "reduce_sum": ["nan_policy"],
    "reduce_max": ["nan_policy"],
    "reduce_min": ["nan_policy"],
    "reduce_custom": ["weights", "nan_policy"],
    "create_device_mesh": ["axis_types"],
}

DIFFERENCES = Path(__file__).resolve().parents[2] / "docs" / "UPSTREAM.md"

UPSTREAM_HARDWARE = ["TPU_V5E", "TPU_V5P", "TPU_V4", "H100", "A100", "V100", "CPU", "UNKNOWN"]


def test_the_table_has_upstreams_30_names():
    assert len(UPSTREAM) == 30


@pytest.mark.parametrize("name", sorted(UPSTREAM))
def test_importable_from_the_package_and_upstreams_submodule(name):
    module = importlib.import_module(f"datarax.distributed.{UPSTREAM[name][0]}")
    assert name in dd.__all__
    assert getattr(module, name) is getattr(dd, name)


def _check(qualname, obj, expected):
    params = list(inspect.signature(obj).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    got = [(p.name, p.kind, p.default) for p in params[: len(expected)]]
    assert got == expected, f"{qualname}: {got} != upstream {expected}"
    extra = params[len(expected) :]
    assert [p.name for p in extra] == EXTRA.get(qualname, []), qualname
    for p in extra:  # calls written for upstream must stay valid
        assert p.default is not EMPTY and p.kind in (PK, KW), f"{qualname}.{p.name}"


@pytest.mark.parametrize("name", sorted(n for n, v in UPSTREAM.items() if isinstance(v[1], list)))
def test_signature_matches_upstream(name):
    obj = getattr(dd, name)
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        _check(name, obj, UPSTREAM[name][1])
    elif inspect.isclass(obj):
        _check(name, obj.__init__, UPSTREAM[name][1])
    else:
        _check(name, obj, UPSTREAM[name][1])


@pytest.mark.parametrize("method", sorted(MESH_METHODS))
def test_device_mesh_manager_methods_match_upstream(method):
    assert isinstance(inspect.getattr_static(dd.DeviceMeshManager, method), staticmethod)
    _check(method, getattr(dd.DeviceMeshManager, method), MESH_METHODS[method])


def test_hardware_type_has_upstreams_members_and_values():
    assert issubclass(dd.HardwareType, enum.Enum)
    for member in UPSTREAM_HARDWARE:
        assert dd.HardwareType[member].value == member.lower()


def test_apply_sharding_rules_is_upstreams_other_name():
    assert dd.apply_sharding_rules.__name__ == "apply_sharding_rules"
    _check("apply_sharding_rules", dd.apply_sharding_rules, UPSTREAM["partition_spec_for_names"][1])


def _difference_rows(name: str) -> list[str]:
    """The rows of docs/UPSTREAM.md's table about ``name`` (``reduce_*`` covers the four
    reductions and ``reduce_custom``)."""
    rows = [line for line in DIFFERENCES.read_text().splitlines() if line.startswith("| ")]
    return [
        row
        for row in rows
        if f"`{name}`" in row
        or f"{name}`" in row.split("|")[1]
        or (name.startswith("reduce_") and "`reduce_*`" in row)
    ]


def test_the_differences_table_is_found():
    assert len(_difference_rows("reduce_custom")) >= 2
    assert not _difference_rows("no_such_function")


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_every_added_parameter_is_a_documented_difference(name):
    rows = _difference_rows(name)
    assert rows, f"docs/UPSTREAM.md has no row about {name}"
    for param in EXTRA[name]:
        assert any(f"`{param}=" in row for row in rows), (name, param, rows)
