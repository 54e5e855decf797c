"""Sharded training steps: the SPMD path (``nnx.jit`` under a mesh) and the collective
path (the guide's pmap section, in a form that works with NNX objects).

Why not ``jax.pmap(train_step, axis_name="batch")`` as the guide writes it: with current
JAX it does not work on NNX objects. With the default ``in_axes`` it fails with
``IndivisibleError`` (pmap tries to map the model's arrays over devices); with
``in_axes=(None, None, 0)`` it runs, but ``optimizer.update`` mutates traced copies and
the parameter updates are silently lost. :func:`collective_pmap` keeps the guide's call
shape (``train_step = collective_pmap(train_step, axis_name="batch")``) and runs the same
per-device function under ``jax.shard_map``, writing the new state back into the model
and optimizer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

PyTree = Any
LossFn = Callable[[nnx.Module, PyTree], jax.Array]


@functools.partial(nnx.jit, static_argnums=(2,))
def spmd_train_step(
    model: nnx.Module, optimizer: nnx.Optimizer, loss_fn: LossFn, batch: PyTree
) -> jax.Array:
    """One SPMD training step: ``nnx.value_and_grad`` then ``optimizer.update``.

    Call it under ``with jax.set_mesh(mesh):`` with a batch placed by
    ``place_batch_on_shards``; XLA inserts the gradient all-reduce. Compiled once per
    (model graph, ``loss_fn``, batch shapes and shardings).

    Args:
      model: an NNX module; its parameters are updated in place.
      optimizer: ``nnx.Optimizer(model, tx, wrt=nnx.Param)``.
      loss_fn: ``loss_fn(model, batch) -> scalar``; a static argument (hashable, ideally
        a module-level function so the compiled step is reused).
      batch: e.g. ``{"inputs": [B, F], "targets": [B, ...]}`` sharded over 'data'.

    Returns:
      The scalar loss before the update, float32.
    """
    loss, grads = nnx.value_and_grad(lambda m: loss_fn(m, batch))(model)
    optimizer.update(model, grads)
    return loss


def collective_pmap(
    step_fn: Callable[[nnx.Module, nnx.Optimizer, PyTree], jax.Array],
    axis_name: str = "batch",
    mesh: Mesh | None = None,
) -> Callable[[nnx.Module, nnx.Optimizer, PyTree], jax.Array]:
    """The guide's ``jax.pmap(train_step, axis_name="batch")``, working with NNX.

    ``step_fn(model, optimizer, batch)`` is the guide's per-device function: it sees the
    device's slice of the batch (``[B / n, ...]``) and must reduce gradients itself with
    ``reduce_mean_collective(grads, axis_name=axis_name)`` (or
    ``reduce_gradients_across_devices``) before ``optimizer.update``. Like pmap, the
    result holds one loss per device.

    Args:
      step_fn: the per-device training step.
      axis_name: the collective axis name used inside ``step_fn``.
      mesh: devices to run on, in order; default: all devices
        (``DeviceMeshManager.create_data_parallel_mesh()``). Only its devices are used:
        they are renamed to one axis ``axis_name``.

    Returns:
      ``train_step(model, optimizer, batch) -> losses: [n_devices] float32``. The
      model's and optimizer's state are updated in place (kept replicated); the batch
      may be placed with ``place_batch_on_shards`` over the same devices or be host
      arrays; its leading dimension must divide by the device count.
    """

    def run(model: nnx.Module, optimizer: nnx.Optimizer, batch: PyTree) -> jax.Array:
        devices = _devices_of(mesh)
        graphdef, state = nnx.split((model, optimizer))
        compiled = compiled_collective_step(step_fn, graphdef, axis_name, devices)
        new_state, losses = compiled(state, batch)
        nnx.update((model, optimizer), new_state)
        return losses

    functools.update_wrapper(run, step_fn)
    return run


def _devices_of(mesh: Mesh | None) -> tuple[jax.Device, ...]:
    if mesh is None:
        return tuple(jax.devices())
    return tuple(mesh.devices.flat)


@functools.lru_cache(maxsize=64)
def compiled_collective_step(
    step_fn: Callable, graphdef: Any, axis_name: str, devices: tuple[jax.Device, ...]
) -> Callable:
    """The jitted ``shard_map`` program behind :func:`collective_pmap`, cached.

    ``(state, batch) -> (new_state, losses [n_devices])`` for ``state`` from
    ``nnx.split((model, optimizer))`` with ``graphdef``; the batch is split over
    ``devices`` (renamed to one axis ``axis_name``). Exposed for callers that lower and
    compile ahead of time (the service's runtime).
    """
    mesh = Mesh(np.asarray(devices), (axis_name,), axis_types=(AxisType.Auto,))

    def per_device(state: PyTree, batch: PyTree) -> tuple[PyTree, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)
        loss = step_fn(model, optimizer, batch)
        _, new_state = nnx.split((model, optimizer))
        return new_state, jax.numpy.reshape(loss, (1,))

    # check_vma=False gives pmap semantics: gradients stay device-local until step_fn
    # reduces them with pmean, and the replicated out_spec is the caller's promise.
    mapped = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(P(), P(axis_name)),
        out_specs=(P(), P(axis_name)),
        check_vma=False,
    )
    return jax.jit(mapped)
