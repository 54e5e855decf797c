"""Type aliases shared by the modules of :mod:`datarax.distributed`, defined once.

Array arguments are typed ``jax.typing.ArrayLike`` in and ``jax.Array`` out; there is no
array alias here on purpose.
"""

from __future__ import annotations

from typing import Any, Literal

type PyTree = Any
"""Any JAX pytree: nested dicts, lists, tuples, ``nnx.State``, dataclasses with arrays as
leaves (``{"inputs": [B, F] float32, "targets": [B] int32}``). JAX has no static type for
it; the alias documents intent."""

type ReduceOp = Literal["mean", "sum", "max", "min"]
"""A named reduction over the device axis (``reduce_over_devices``, ``reduce_custom``)."""

type NanPolicy = Literal["propagate", "omit", "raise"]
"""What the ``reduce_*`` functions do with NaN and ±inf entries."""

type GradientReduction = Literal["mean", "sum"]
"""How gradients are combined across devices (``reduce_gradients_across_devices``,
``reduce_gradient_tree``)."""

__all__ = ["GradientReduction", "NanPolicy", "PyTree", "ReduceOp"]
