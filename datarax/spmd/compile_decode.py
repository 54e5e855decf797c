"""The serving program compiled from shapes: one KV-cached decode step
(:func:`datarax.models.decode.decode_step`) of a serving plan's replica layout, lowered
and compiled ahead of time for a mesh whose devices need not be attached (a TPU
topology libtpu describes), and what XLA says of its memory.

The step's arguments are the weights (``ShapeDtypeStruct``\\ s in ``weight_dtype``,
sharded as :func:`datarax.spmd.compile_step` shards a training step's parameters over
the tensor and expert axes, whole over the data axes), the cache of ``batch`` sequences
per replica of ``max_len`` positions (:func:`datarax.models.decode.cache_shapes`: the
batch over the data axes, heads over tensor), one token per sequence and the position.
The cache is donated, so the new cache aliases it: ``argument_bytes`` is weights plus
cache plus the tokens, the figure the serving estimate's ``weights + kv_cache`` prices.
The cache takes the layout XLA chooses (``Layout.AUTO``), as an engine that allocates it
for its compiled step would: in the default row-major layout XLA copies it into the
batch-minor layout its decode attention wants and back, every step (a second cache in
``temp``).

Weight dtypes: ``bfloat16`` (and ``float32``) only. ``float8``, ``int8`` and ``int4``
weights need a quantized matmul the library's transformer does not have; asking for
them raises ``PlanError("compile_target_unavailable")``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental.layout import Format, Layout
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.errors import PlanError
from datarax.models.decode import DecodeLayout, cache_shapes, decode_step
from datarax.specs.model_specs import ModelSpec, TransformerSpec, model_spec
from datarax.spmd.compile_step import _param_tree, compiled_figures

__all__ = [
    "DECODE_WEIGHT_DTYPES",
    "AbstractDecodeStep",
    "DecodeStepFigures",
    "abstract_decode_step",
    "compile_decode_step",
]

DECODE_WEIGHT_DTYPES: tuple[str, ...] = ("bfloat16", "float32")
"""Weight dtypes the compiled decode step takes (module docstring)."""


class AbstractDecodeStep(NamedTuple):
    """A decode step to lower: ``fn.lower(*args)``."""

    fn: Any
    """the jitted step (its cache donated, in XLA's chosen layout)"""
    args: tuple[Any, ...]
    """abstract ``(params, cache, token, position)``"""
    params: Mapping[str, Any]
    """the weights' abstract arrays with their shardings"""
    cache_formats: Mapping[str, Any]
    """the cache entries' ``Format`` (``Layout.AUTO`` and sharding)"""


@dataclass(frozen=True)
class DecodeStepFigures:
    """What XLA says of a compiled decode step, per device."""

    figures: Mapping[str, Any]
    """:func:`~datarax.spmd.compile_step.compiled_figures`' figures (``memory``, ``fits``,
    ``flops``, ...) and ``lower_s``, ``compile_s``"""
    weights_bytes: int
    """the weights' shard, from their shardings"""
    cache_bytes: int
    """the cache's shard, unpadded (XLA's tiles may pad it: ``argument_bytes`` says)"""

    @property
    def memory(self) -> Mapping[str, Any]:
        """``argument_bytes``, ``temp_bytes``, ``alias_bytes``, ``hbm_peak_bytes``, ..."""
        memory: Mapping[str, Any] = self.figures["memory"]
        return memory


def _axes_of(mesh: Mesh, roles: Mapping[str, str], kind: str) -> tuple[str, ...]:
    return tuple(a for a in mesh.axis_names if roles.get(a) == kind and mesh.shape[a] > 1)


def abstract_decode_step(
    spec: ModelSpec | Mapping[str, Any],
    mesh: Mesh,
    roles: Mapping[str, str],
    batch: int,
    max_len: int,
    weight_dtype: str = "bfloat16",
) -> AbstractDecodeStep:
    """One decode step of ``batch`` sequences a replica (``batch x replicas`` in all)
    over a cache of ``max_len`` positions, ready to lower.

    Raises:
      PlanError: ``compile_target_unavailable`` for a weight dtype the step cannot hold.
    """
    if weight_dtype not in DECODE_WEIGHT_DTYPES:
        raise PlanError(
            "compile_target_unavailable",
            f"the library's decode step holds weights in {list(DECODE_WEIGHT_DTYPES)}; "
            f"{weight_dtype} weights need a quantized matmul it does not have",
        )
    resolved = model_spec(spec)
    if not isinstance(resolved, TransformerSpec):
        raise PlanError("invalid_model", "the decode step is a transformer's; this model is an MLP")
    spec = replace(resolved, param_dtype=weight_dtype, dtype="bfloat16")
    layout = DecodeLayout(
        mesh,
        _axes_of(mesh, roles, "data"),
        _axes_of(mesh, roles, "tensor"),
        _axes_of(mesh, roles, "expert"),
    )
    replicas = math.prod(mesh.shape[a] for a in _axes_of(mesh, roles, "data"))
    total = batch * replicas
    params = _param_tree(spec, mesh, roles)
    shapes = cache_shapes(spec, total, max_len, layout.t)
    # the cache in the layout XLA picks for the step (an engine allocates it so): with
    # the default row-major layout XLA copies the whole cache into its preferred layout
    # and back each step, a second cache in temp
    formats = {
        n: Format(Layout.AUTO, layout.cache_sharding(n, shape)) for n, shape in shapes.items()
    }
    batch_sharding = NamedSharding(mesh, P(layout.batch))
    whole = NamedSharding(mesh, P())

    def step(p: Any, c: Any, tok: Any, pos: Any) -> Any:
        return decode_step(spec, p, c, tok, pos, layout=layout)

    fn = jax.jit(
        step,
        in_shardings=({k: v.sharding for k, v in params.items()}, formats, batch_sharding, whole),
        out_shardings=(batch_sharding, formats),
        donate_argnums=(1,),
    )
    args = (
        {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in params.items()},
        {n: jax.ShapeDtypeStruct(shape, jnp.bfloat16) for n, shape in shapes.items()},
        jax.ShapeDtypeStruct((total,), jnp.int32),
        jax.ShapeDtypeStruct((), jnp.int32),
    )
    return AbstractDecodeStep(fn, args, params, formats)


def compile_decode_step(
    spec: ModelSpec | Mapping[str, Any],
    mesh: Mesh,
    roles: Mapping[str, str],
    batch: int,
    max_len: int,
    *,
    weight_dtype: str = "bfloat16",
    hbm_bytes: int | None = None,
) -> DecodeStepFigures:
    """Lowers and compiles one decode step (:func:`abstract_decode_step`).

    Returns:
      :class:`DecodeStepFigures`.
    """
    fn, args, params, formats = abstract_decode_step(
        spec, mesh, roles, batch, max_len, weight_dtype
    )
    start = time.perf_counter()
    lowered = fn.lower(*args)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    figures = compiled_figures(compiled, hbm_bytes)
    figures["lower_s"] = round(lowered_at - start, 3)
    figures["compile_s"] = round(done - lowered_at, 3)
    cache = sum(
        _shard_bytes(args[1][n].shape, args[1][n].dtype, f.sharding) for n, f in formats.items()
    )
    return DecodeStepFigures(figures, _per_device_bytes(params.values()), cache)


def _shard_bytes(shape: Sequence[int], dtype: Any, sharding: Any) -> int:
    return int(math.prod(sharding.shard_shape(tuple(shape))) * jnp.dtype(dtype).itemsize)


def _per_device_bytes(leaves: Any) -> int:
    """Bytes of one device's shard of each abstract array, summed."""
    return sum(_shard_bytes(leaf.shape, leaf.dtype, leaf.sharding) for leaf in leaves)
