"""Type aliases of the library, defined once: trees of arrays and the reduction options
that ``datarax.metrics``, ``datarax.spmd`` and ``datarax.distributed`` take.

Array arguments are typed ``jax.typing.ArrayLike`` in and ``jax.Array`` out; the aliases
here name trees *of* arrays, never an array itself. This module sits directly under
``datarax`` (below every package that uses it) and imports neither JAX nor NumPy at run
time (the aliases are evaluated lazily), so JAX-free modules such as
:mod:`datarax.metrics.reductions` can use them. Upstream datarax's path,
``datarax.distributed.typing``, re-exports the same objects.

Example:
  >>> batch: PyTree = {"inputs": [[0.0, 1.0]], "targets": [1]}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import jax
    import numpy as np
    from numpy.typing import NDArray

type Scalar = bool | int | float | complex | np.generic
"""A Python or NumPy scalar leaf (``0.1``, ``np.float32(2)``)."""

type PyTreeLeaf = jax.Array | NDArray[Any] | Scalar | str | bytes | None
"""A leaf of a :data:`PyTree`: an array (``np.ndarray`` or ``jax.Array``, tracers
included), a scalar, a string or ``None``."""

type PyTree = PyTreeLeaf | Mapping[str, PyTree] | Sequence[PyTree]
"""A JAX pytree as the library takes it: leaves (:data:`PyTreeLeaf`) nested in mappings
and sequences (``{"inputs": [B, F] float32, "targets": [B] int32}``). Mappings include
``nnx.State``; other registered pytree nodes (dataclasses, flax structs) work at run time
but are not described by this static type."""

type ReduceOp = Literal["mean", "sum", "max", "min"]
"""A named reduction over the device axis (``reduce_over_devices``, ``reduce_custom``)."""

type MetricOp = str | Callable[[Any], Any] | None
"""What ``reduce_custom`` does to one metric: an op name (checked against ``REDUCE_OPS``),
a callable on each stacked ``[n_devices, ...]`` array leaf, or None (left unreduced)."""

type NamedLeaves = list[tuple[str, Any]]
"""A flattened metric tree: each leaf with its ``/``-joined path (``"z/a/0"``; the whole
tree is ``"<metrics>"``), in JAX's order (dict keys sorted)."""

type NanPolicy = Literal["propagate", "omit", "raise"]
"""What the ``reduce_*`` functions do with NaN and ±inf entries."""

type GradientReduction = Literal["mean", "sum"]
"""How gradients are combined across devices (``reduce_gradients_across_devices``,
``reduce_gradient_tree``)."""

__all__ = [
    "GradientReduction",
    "MetricOp",
    "NamedLeaves",
    "NanPolicy",
    "PyTree",
    "PyTreeLeaf",
    "ReduceOp",
    "Scalar",
]
