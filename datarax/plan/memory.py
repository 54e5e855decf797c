"""Plan and memory arithmetic: the built-in MLP's parameter layouts under a sharding rule,
and bytes per device. Pure arithmetic over shapes (no devices), shared by the HTTP
process (plans) and the runtime process (memory admission).

Example:
  >>> entries, warnings = param_layouts([16, 64, 4], {"data": 2, "model": 4}, "model")
  >>> entries[0].path, entries[0].spec, entries[0].shard_shape
  ('layers/0/kernel', [None, 'model'], [16, 16])
  >>> memory_per_device(entries, "adam", [8, 16]).optimizer
  2696

Both build the plan's answer parts (:class:`~datarax.answers.plans.ParamLayout`,
:class:`~datarax.answers.estimates.MemoryPerDevice`) directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from datarax.answers.estimates import MemoryPerDevice
from datarax.answers.plans import ParamLayout
from datarax.plan.layout import shard_shape
from datarax.plan.param_sharding import param_partition_spec

__all__ = [
    "BYTES_PER_ELEMENT",
    "OPTIMIZER_STATE_FACTOR",
    "memory_per_device",
    "mlp_param_shapes",
    "param_layouts",
]

BYTES_PER_ELEMENT = 4
"""float32: parameters, optimizer state and batches of the built-in models."""

OPTIMIZER_STATE_FACTOR: dict[str, int] = {"adam": 2, "adamw": 2, "sgd": 0}
"""Optimizer state bytes as a multiple of parameter bytes: adam and adamw keep a first
and a second moment per parameter (optax ``scale_by_adam``: ``mu`` and ``nu``); plain sgd
(no momentum) keeps none."""


def mlp_param_shapes(features: Sequence[int]) -> list[tuple[str, tuple[int, ...]]]:
    """The parameters of ``datarax.models.MLP(features)``, without building it.

    Args:
      features: widths ``[in, hidden..., out]``, at least two positive ints.

    Returns:
      ``[(path, shape), ...]`` in layer order, kernel before bias:
      ``("layers/{i}/kernel", (f_i, f_{i+1}))``, ``("layers/{i}/bias", (f_{i+1},))``.

    Raises:
      ValueError: fewer than two widths or a width below 1.
    """
    widths = [int(f) for f in features]
    if len(widths) < 2 or any(f < 1 for f in widths):
        raise ValueError(
            f"features must list at least 2 positive sizes [in, ..., out], got {list(features)}"
        )
    shapes: list[tuple[str, tuple[int, ...]]] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        shapes.append((f"layers/{i}/kernel", (fan_in, fan_out)))
        shapes.append((f"layers/{i}/bias", (fan_out,)))
    return shapes


def param_layouts(
    features: Sequence[int], axes: Mapping[str, int], param_sharding: str
) -> tuple[list[ParamLayout], list[str]]:
    """Layouts of the built-in MLP's parameters under a sharding rule.

    The rule table is :func:`datarax.distributed.sharding.param_partition_spec`, the one
    sessions place parameters with, so a plan predicts a session's layout exactly. A
    parameter the rule cannot split (axis missing, no divisible dimension) stays
    replicated and adds a warning.

    Args:
      features: MLP widths ``[in, hidden..., out]``.
      axes: resolved mesh axes ``{name: size}``.
      param_sharding: ``replicate``, ``model`` or ``fsdp``.

    Returns:
      ``(entries, warnings)``: a plan's ``params`` (``bytes_per_device``: float32 bytes of
      one device's block) and the warnings for its ``warnings``.

    Raises:
      ValueError: an unknown rule or bad ``features``.
    """
    entries: list[ParamLayout] = []
    warnings: list[str] = []
    for path, shape in mlp_param_shapes(features):
        spec, warning = param_partition_spec(shape, axes, param_sharding, path)
        if warning:
            warnings.append(warning)
        block = shard_shape(axes, spec, shape, what="parameter")
        entries.append(
            ParamLayout(
                path=path,
                shape=list(shape),
                spec=list(spec),
                shard_shape=list(block),
                bytes_per_device=math.prod(block) * BYTES_PER_ELEMENT,
            )
        )
    return entries, warnings


def memory_per_device(
    params: Sequence[ParamLayout], optimizer: str, batch_shard_shape: Sequence[int] | None
) -> MemoryPerDevice:
    """Bytes per device: parameters, optimizer state (a multiple of them) and one batch
    shard, all float32.

    Args:
      params: a plan's parameters (:func:`param_layouts`; only ``bytes_per_device`` is
        read).
      optimizer: a key of :data:`OPTIMIZER_STATE_FACTOR`.
      batch_shard_shape: one device's batch block, or ``None`` for no batch.

    Returns:
      a plan's ``memory_per_device``: params, optimizer, batch and total, in bytes.

    Raises:
      ValueError: an unknown optimizer (the message lists the known ones).
    """
    if optimizer not in OPTIMIZER_STATE_FACTOR:
        raise ValueError(
            f"unknown optimizer {optimizer!r}; use one of {sorted(OPTIMIZER_STATE_FACTOR)}"
        )
    param_bytes = sum(int(entry.bytes_per_device) for entry in params)
    optimizer_bytes = param_bytes * OPTIMIZER_STATE_FACTOR[optimizer]
    batch_bytes = (
        0 if batch_shard_shape is None else math.prod(batch_shard_shape) * BYTES_PER_ELEMENT
    )
    return MemoryPerDevice(
        params=param_bytes,
        optimizer=optimizer_bytes,
        batch=batch_bytes,
        total=param_bytes + optimizer_bytes + batch_bytes,
    )
