"""Sharding rules: which PartitionSpec each parameter (or tensor dimension) gets.

Two vocabularies:

- Logical axis rules (upstream datarax's, in the style of Flax NNX's FSDP examples):
  :class:`MeshRules` maps logical dimension names (``data``, ``embed``, ``mlp``,
  ``heads``) to mesh axes; :func:`data_parallel_rules` and :func:`fsdp_rules` build the
  two usual tables; :func:`partition_spec_for_names` (alias
  :func:`apply_sharding_rules`) turns a tensor's logical names into a ``PartitionSpec``;
  :func:`create_named_sharding` builds the ``NamedSharding``.
- Named parameter rules (the service's ``param_sharding``): :func:`param_partition_spec`
  in :mod:`datarax.plan.param_sharding` (no JAX there), re-exported here.

Also re-exported here, from :mod:`datarax.spmd.global_arrays` where batch placement uses
them: :func:`dim0_shard_count` (how many blocks a sharding splits dimension 0 into) and
:func:`path_to_str` (a pytree key path as ``'layers/0/kernel'``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

# The named parameter rules need no JAX (the HTTP process plans with them): their own module.
from datarax.plan.param_sharding import PARAM_SHARDING_RULES, param_partition_spec
from datarax.spmd.global_arrays import dim0_shard_count, path_to_str

__all__ = [
    "PARAM_SHARDING_RULES",
    "MeshRules",
    "apply_sharding_rules",
    "create_named_sharding",
    "data_parallel_rules",
    "dim0_shard_count",
    "fsdp_rules",
    "param_partition_spec",
    "partition_spec_for_names",
    "path_to_str",
]


# ------------------------------------------------------------------ logical axis rules


@dataclass(frozen=True, slots=True, kw_only=True)
class MeshRules:
    """Logical dimension name -> mesh axis (or ``None``: that dimension is not split).

    Calling the rules with logical names gives the mesh axes, one per name, ready for
    ``PartitionSpec(*rules("data", "embed"))``.

    Attributes:
      data: mesh axis of the batch dimension, e.g. ``"data"``.
      embed: mesh axis of embedding / model-width dimensions.
      mlp: mesh axis of MLP hidden dimensions.
      heads: mesh axis of attention-head dimensions.

    Raises:
      TypeError: a field that is neither a string nor ``None``.

    Example:
      >>> rules = MeshRules(data="data", mlp="model")
      >>> rules("data", "embed", "mlp")
      ('data', None, 'model')
    """

    data: str | None = None
    embed: str | None = None
    mlp: str | None = None
    heads: str | None = None

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if value is not None and not isinstance(value, str):
                raise TypeError(
                    f"MeshRules.{field.name} must be a mesh axis name (str) or None, got "
                    f"{value!r}; e.g. MeshRules(data='data', mlp='model')"
                )

    def __call__(self, *keys: str) -> tuple[str | None, ...]:
        """The mesh axis of each logical name in ``keys``, in order.

        Raises:
          AttributeError: a name that is not a field (``data``, ``embed``, ``mlp``,
            ``heads``); upstream raises the same type.
        """
        known = [field.name for field in fields(self)]
        for key in keys:
            if key not in known:
                raise AttributeError(f"unknown logical axis name {key!r}; MeshRules knows {known}")
        return tuple(getattr(self, key) for key in keys)


def data_parallel_rules(data_axis: str = "data") -> MeshRules:
    """Rules for pure data parallelism: only the batch dimension is split, over
    ``data_axis``; every model dimension is replicated."""
    return MeshRules(data=data_axis)


def fsdp_rules(data_axis: str = "data", model_axis: str = "model") -> MeshRules:
    """Rules for fully sharded training as upstream datarax defines them: the batch
    dimension over ``data_axis``, and ``embed``, ``mlp`` and ``heads`` over
    ``model_axis``."""
    return MeshRules(data=data_axis, embed=model_axis, mlp=model_axis, heads=model_axis)


def create_named_sharding(mesh: Mesh, *axis_names: str | None) -> NamedSharding:
    """``NamedSharding(mesh, PartitionSpec(*axis_names))``: one mesh axis (or ``None``) per
    array dimension; no names means fully replicated.

    Raises:
      ValueError: a name that is not an axis of ``mesh`` (the message lists the axes).
    """
    unknown = [
        name
        for entry in axis_names
        for name in (entry if isinstance(entry, tuple) else (entry,))
        if name is not None and name not in mesh.axis_names
    ]
    if unknown:
        raise ValueError(
            f"axis names {unknown} are not axes of the mesh {dict(mesh.shape)}; use some of "
            f"{list(mesh.axis_names)} or None"
        )
    return NamedSharding(mesh, P(*axis_names))


def partition_spec_for_names(rules: MeshRules, *logical_names: str) -> P:
    """The ``PartitionSpec`` of a tensor whose dimensions have ``logical_names``.

    Example:
      >>> partition_spec_for_names(fsdp_rules(), "data", "embed")
      PartitionSpec('data', 'model')
    """
    if not isinstance(rules, MeshRules):
        raise TypeError(
            f"rules must be a MeshRules, got {type(rules).__name__}; build one with "
            "fsdp_rules() or MeshRules(data='data')"
        )
    return P(*rules(*logical_names))


def apply_sharding_rules(rules: MeshRules, *logical_names: str) -> P:
    """The same as :func:`partition_spec_for_names` (upstream's other name for it)."""
    return partition_spec_for_names(rules, *logical_names)
