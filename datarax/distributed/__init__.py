"""datarax.distributed: device meshes, sharding, sharded training steps and metric
reductions across devices, as described in the distributed-training guide.

Every name of upstream datarax's ``datarax.distributed`` is here, importable from this
package and from the same submodule as upstream, plus ours. Submodules:

- ``device_mesh``: :class:`DeviceMeshManager`.
- ``device_placement``: explicit placement, batch-size recommendations, prefetching.
- ``planning``: pure layout arithmetic (no devices); ``memory``: plan and memory sizes.
- ``sharding``: logical axis rules (:class:`MeshRules`) and named parameter rules.
- ``data_parallel``: batch and model-state placement; the data-parallel steps and
  gradient reductions are re-exported there from ``train_step`` and ``collectives``.
- ``train_step``: SPMD, collective and functional pmap-style steps.
- ``metrics``: reductions of stacked per-device metrics; ``collectives``: ``lax.p*``
  over pytrees inside ``pmap``/``shard_map``.
- ``multihost``: multi-process runtime and global arrays (``global_arrays`` below it).
- ``hardware``, ``topology``, ``model_specs``, ``cost``, ``recommend``: hardware-aware
  planning (catalog with sources, JAX's TPU/GPU device order, step estimates, meshes).
- ``typing``: shared type aliases.

Importing this package never touches devices.

Names load on first use (PEP 562): ``from datarax.distributed import PlanError`` or
``import datarax.distributed.planning`` imports no JAX; a name whose submodule needs JAX
imports it then. ``datarax.distributed.<submodule>`` works after ``import datarax.distributed``
as it did when this package imported every submodule.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_SUBMODULE_OF: dict[str, str] = {
    "HARDWARE": "hardware",
    "AxisLink": "hardware",
    "Hardware": "hardware",
    "HardwareLayout": "topology",
    "estimate_step": "cost",
    "get_hardware": "hardware",
    "memory_estimate": "cost",
    "model_spec": "model_specs",
    "plan_hardware_devices": "topology",
    "recommend_meshes": "recommend",
    "PARAM_SHARDING_RULES": "sharding",
    "BatchSizeRecommendation": "device_placement",
    "DeviceMeshManager": "device_mesh",
    "DevicePlacement": "device_placement",
    "HardwareType": "device_placement",
    "MeshRules": "sharding",
    "MetricsError": "errors",
    "PlanError": "errors",
    "all_gather": "collectives",
    "apply_sharding_rules": "sharding",
    "batch_partition_spec": "planning",
    "collect_from_devices": "metrics",
    "collective_pmap": "train_step",
    "create_data_parallel_sharding": "data_parallel",
    "create_named_sharding": "sharding",
    "data_parallel_rules": "sharding",
    "data_parallel_train_step": "train_step",
    "distribute_batch": "device_placement",
    "fsdp_rules": "sharding",
    "get_batch_size_recommendation": "device_placement",
    "model_state_shardings": "data_parallel",
    "param_partition_spec": "sharding",
    "partition_spec_for_names": "sharding",
    "place_batch_on_shards": "data_parallel",
    "place_model_state_on_shards": "data_parallel",
    "place_nnx_state_on_shards": "data_parallel",
    "place_on_device": "device_placement",
    "prefetch_to_device": "device_placement",
    "reduce_custom": "metrics",
    "reduce_gradient_tree": "data_parallel",
    "reduce_gradients_across_devices": "collectives",
    "reduce_max": "metrics",
    "reduce_mean": "metrics",
    "reduce_mean_collective": "collectives",
    "reduce_min": "metrics",
    "reduce_over_devices": "metrics",
    "reduce_sum": "metrics",
    "reduce_sum_collective": "collectives",
    "resolve_axes": "planning",
    "shard_index_ranges": "planning",
    "split_by_device": "metrics",
    "spmd_train_step": "train_step",
}
"""Each public name and the submodule that defines it."""

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
        value = getattr(importlib.import_module(f"{__name__}.{_SUBMODULE_OF[name]}"), name)
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
    from datarax.distributed.collectives import (
        all_gather,
        reduce_gradients_across_devices,
        reduce_mean_collective,
        reduce_sum_collective,
    )
    from datarax.distributed.cost import estimate_step, memory_estimate
    from datarax.distributed.data_parallel import (
        create_data_parallel_sharding,
        model_state_shardings,
        place_batch_on_shards,
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
    from datarax.distributed.hardware import HARDWARE, AxisLink, Hardware, get_hardware
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
    from datarax.distributed.model_specs import model_spec
    from datarax.distributed.planning import (
        PlanError,
        batch_partition_spec,
        resolve_axes,
        shard_index_ranges,
    )
    from datarax.distributed.recommend import recommend_meshes
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
    from datarax.distributed.topology import HardwareLayout, plan_hardware_devices
    from datarax.distributed.train_step import (
        collective_pmap,
        data_parallel_train_step,
        spmd_train_step,
    )
