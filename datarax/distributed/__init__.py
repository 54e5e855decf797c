"""datarax.distributed: device meshes, sharding, sharded training steps and metric
reductions across devices, as described in the distributed-training guide.

Submodules: ``device_mesh`` (meshes), ``planning`` (pure layout arithmetic),
``data_parallel`` (placement), ``sharding`` (parameter rules), ``train_step`` and
``metrics``. Importing this package never touches devices.
"""

from datarax.distributed.data_parallel import (
    create_data_parallel_sharding,
    model_state_shardings,
    place_batch_on_shards,
    place_model_state_on_shards,
    reduce_gradients_across_devices,
)
from datarax.distributed.device_mesh import DeviceMeshManager
from datarax.distributed.metrics import (
    MetricsError,
    all_gather,
    collect_from_devices,
    reduce_custom,
    reduce_max,
    reduce_mean,
    reduce_mean_collective,
    reduce_min,
    reduce_over_devices,
    reduce_sum,
    reduce_sum_collective,
)
from datarax.distributed.planning import (
    PlanError,
    batch_partition_spec,
    resolve_axes,
    shard_index_ranges,
)
from datarax.distributed.sharding import PARAM_SHARDING_RULES, param_partition_spec
from datarax.distributed.train_step import collective_pmap, spmd_train_step

__all__ = [
    "PARAM_SHARDING_RULES",
    "DeviceMeshManager",
    "MetricsError",
    "PlanError",
    "all_gather",
    "batch_partition_spec",
    "collect_from_devices",
    "collective_pmap",
    "create_data_parallel_sharding",
    "model_state_shardings",
    "param_partition_spec",
    "place_batch_on_shards",
    "place_model_state_on_shards",
    "reduce_custom",
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
    "spmd_train_step",
]
