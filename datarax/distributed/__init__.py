"""datarax.distributed: device meshes, sharding, sharded training steps and metric
reductions across devices, as described in the distributed-training guide.

Every name of upstream datarax's ``datarax.distributed`` is here, importable from this
package and from the same submodule as upstream, plus ours. Submodules:

- ``device_mesh``: :class:`DeviceMeshManager`.
- ``device_placement``: explicit placement, batch-size recommendations, prefetching.
- ``planning``: pure layout arithmetic (no devices); ``memory``: plan and memory sizes.
- ``sharding``: logical axis rules (:class:`MeshRules`) and named parameter rules.
- ``data_parallel``: model-state placement; batch placement, the data-parallel steps and
  gradient reductions are re-exported there from ``global_arrays``, ``train_step`` and
  ``collectives``.
- ``train_step``: SPMD, collective and functional pmap-style steps.
- ``metrics``: reductions of stacked per-device metrics; ``collectives``: ``lax.p*``
  over pytrees inside ``pmap``/``shard_map``.
- ``multihost``: multi-process runtime and global arrays (``global_arrays`` below it).
- ``hardware``, ``topology``, ``model_specs``, ``cost``, ``recommend``: hardware-aware
  planning (catalog with sources, JAX's TPU/GPU device order, step estimates, meshes).
- ``typing``: the shared type aliases, re-exported from :mod:`datarax.tree_types`.

Importing this package never touches devices.

Names load on first use (PEP 562): ``from datarax.distributed import PlanError`` or
``import datarax.distributed.planning`` imports no JAX; a name whose submodule needs JAX
imports it then. ``datarax.distributed.<submodule>`` works after ``import datarax.distributed``
as it did when this package imported every submodule.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from datarax.distributed import _moved

_moved.install()

_SUBMODULE_OF: dict[str, str] = {
    "HARDWARE": "datarax.hardware.chips",
    "AxisLink": "datarax.hardware.chips",
    "Hardware": "datarax.hardware.chips",
    "HardwareLayout": "datarax.hardware.topology",
    "estimate_step": "datarax.estimate.cost",
    "get_hardware": "datarax.hardware.chips",
    "memory_estimate": "datarax.estimate.memory",
    "model_spec": "datarax.specs.model_specs",
    "plan_hardware_devices": "datarax.hardware.topology",
    "recommend_meshes": "datarax.estimate.recommend",
    "PARAM_SHARDING_RULES": "datarax.distributed.sharding",
    "BatchSizeRecommendation": "datarax.distributed.device_placement",
    "DeviceMeshManager": "datarax.distributed.device_mesh",
    "DevicePlacement": "datarax.distributed.device_placement",
    "HardwareType": "datarax.distributed.device_placement",
    "MeshRules": "datarax.distributed.sharding",
    "MetricsError": "datarax.errors",
    "PlanError": "datarax.errors",
    "all_gather": "datarax.spmd.collectives",
    "apply_sharding_rules": "datarax.distributed.sharding",
    "batch_partition_spec": "datarax.plan.layout",
    "collect_from_devices": "datarax.distributed.metrics",
    "collective_pmap": "datarax.spmd.train_step",
    "create_data_parallel_sharding": "datarax.distributed.data_parallel",
    "create_named_sharding": "datarax.distributed.sharding",
    "data_parallel_rules": "datarax.distributed.sharding",
    "data_parallel_train_step": "datarax.spmd.train_step",
    "distribute_batch": "datarax.distributed.device_placement",
    "fsdp_rules": "datarax.distributed.sharding",
    "get_batch_size_recommendation": "datarax.distributed.device_placement",
    "model_state_shardings": "datarax.distributed.data_parallel",
    "param_partition_spec": "datarax.distributed.sharding",
    "partition_spec_for_names": "datarax.distributed.sharding",
    "place_batch_on_shards": "datarax.spmd.global_arrays",
    "place_model_state_on_shards": "datarax.distributed.data_parallel",
    "place_nnx_state_on_shards": "datarax.distributed.data_parallel",
    "place_on_device": "datarax.distributed.device_placement",
    "prefetch_to_device": "datarax.distributed.device_placement",
    "reduce_custom": "datarax.distributed.metrics",
    "reduce_gradient_tree": "datarax.distributed.data_parallel",
    "reduce_gradients_across_devices": "datarax.spmd.collectives",
    "reduce_max": "datarax.distributed.metrics",
    "reduce_mean": "datarax.distributed.metrics",
    "reduce_mean_collective": "datarax.spmd.collectives",
    "reduce_min": "datarax.distributed.metrics",
    "reduce_over_devices": "datarax.distributed.metrics",
    "reduce_sum": "datarax.distributed.metrics",
    "reduce_sum_collective": "datarax.spmd.collectives",
    "resolve_axes": "datarax.plan.layout",
    "shard_index_ranges": "datarax.plan.layout",
    "split_by_device": "datarax.distributed.metrics",
    "spmd_train_step": "datarax.spmd.train_step",
}
"""Each public name and the module that defines it."""

__all__ = [
    "HARDWARE",
    "AxisLink",
    "Hardware",
    "HardwareLayout",
    "estimate_step",
    "get_hardware",
    "memory_estimate",
    "model_spec",
    "plan_hardware_devices",
    "recommend_meshes",
    "PARAM_SHARDING_RULES",
    "BatchSizeRecommendation",
    "DeviceMeshManager",
    "DevicePlacement",
    "HardwareType",
    "MeshRules",
    "MetricsError",
    "PlanError",
    "all_gather",
    "apply_sharding_rules",
    "batch_partition_spec",
    "collect_from_devices",
    "collective_pmap",
    "create_data_parallel_sharding",
    "create_named_sharding",
    "data_parallel_rules",
    "data_parallel_train_step",
    "distribute_batch",
    "fsdp_rules",
    "get_batch_size_recommendation",
    "model_state_shardings",
    "param_partition_spec",
    "partition_spec_for_names",
    "place_batch_on_shards",
    "place_model_state_on_shards",
    "place_nnx_state_on_shards",
    "place_on_device",
    "prefetch_to_device",
    "reduce_custom",
    "reduce_gradient_tree",
    "reduce_gradients_across_devices",
    "reduce_max",
    "reduce_mean",
    "reduce_mean_collective",
    "reduce_min",
    "reduce_over_devices",
    "reduce_sum",
    "reduce_sum_collective",
    "resolve_axes",
    "shard_index_ranges",
    "split_by_device",
    "spmd_train_step",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULE_OF:
        value = getattr(importlib.import_module(_SUBMODULE_OF[name]), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:
    from datarax.distributed.data_parallel import (
        create_data_parallel_sharding,
        model_state_shardings,
        place_model_state_on_shards,
        place_nnx_state_on_shards,
        reduce_gradient_tree,
    )
    from datarax.distributed.device_mesh import DeviceMeshManager
    from datarax.distributed.device_placement import (
        BatchSizeRecommendation,
        DevicePlacement,
        HardwareType,
        distribute_batch,
        get_batch_size_recommendation,
        place_on_device,
        prefetch_to_device,
    )
    from datarax.distributed.metrics import (
        MetricsError,
        collect_from_devices,
        reduce_custom,
        reduce_max,
        reduce_mean,
        reduce_min,
        reduce_over_devices,
        reduce_sum,
        split_by_device,
    )
    from datarax.distributed.sharding import (
        PARAM_SHARDING_RULES,
        MeshRules,
        apply_sharding_rules,
        create_named_sharding,
        data_parallel_rules,
        fsdp_rules,
        param_partition_spec,
        partition_spec_for_names,
    )
    from datarax.errors import PlanError
    from datarax.estimate.cost import estimate_step
    from datarax.estimate.memory import memory_estimate
    from datarax.estimate.recommend import recommend_meshes
    from datarax.hardware.chips import HARDWARE, AxisLink, Hardware, get_hardware
    from datarax.hardware.topology import HardwareLayout, plan_hardware_devices
    from datarax.plan.layout import (
        batch_partition_spec,
        resolve_axes,
        shard_index_ranges,
    )
    from datarax.specs.model_specs import model_spec
    from datarax.spmd.collectives import (
        all_gather,
        reduce_gradients_across_devices,
        reduce_mean_collective,
        reduce_sum_collective,
    )
    from datarax.spmd.global_arrays import place_batch_on_shards
    from datarax.spmd.train_step import (
        collective_pmap,
        data_parallel_train_step,
        spmd_train_step,
    )
