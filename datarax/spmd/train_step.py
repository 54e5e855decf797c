"""Sharded training steps: the SPMD path (``nnx.jit`` under a mesh), the collective path
(the guide's pmap section, in a form that works with NNX objects) and upstream's
functional pmap-era step, :func:`data_parallel_train_step`.

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
import optax
from flax import nnx
from jax.sharding import AxisType, Mesh
from jax.sharding import PartitionSpec as P

from datarax.tree_types import PyTree

__all__ = [
    "collective_pmap",
    "compiled_collective_step",
    "data_parallel_train_step",
    "spmd_train_step",
]

LossFn = Callable[[nnx.Module, PyTree], jax.Array]
Optimizer = nnx.Optimizer[nnx.Module]
"""An NNX optimizer over a module's parameters (``nnx.Optimizer(model, tx, wrt=...)``)."""
StepFn = Callable[[nnx.Module, Optimizer, PyTree], jax.Array]
"""A per-device training step ``step_fn(model, optimizer, batch) -> loss``."""


@functools.partial(nnx.jit, static_argnums=(2,))
def spmd_train_step(
    model: nnx.Module, optimizer: Optimizer, loss_fn: LossFn, batch: PyTree
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
    loss: jax.Array
    loss, grads = nnx.value_and_grad(lambda m: loss_fn(m, batch))(model)
    optimizer.update(model, grads)
    return loss


def collective_pmap(
    step_fn: StepFn,
    axis_name: str = "batch",
    mesh: Mesh | None = None,
) -> StepFn:
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

    def run(model: nnx.Module, optimizer: Optimizer, batch: PyTree) -> jax.Array:
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
    step_fn: StepFn, graphdef: Any, axis_name: str, devices: tuple[jax.Device, ...]
) -> Callable[[PyTree, PyTree], tuple[PyTree, jax.Array]]:
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


# ------------------------------------------------------- upstream's functional pmap step

_STEP_AXIS = "batch"


def data_parallel_train_step(
    loss_fn: Callable[..., jax.Array],
    optimizer: optax.GradientTransformation,
    batch: PyTree,
    state: Any,
    rngs: PyTree | None = None,
) -> tuple[Any, dict[str, jax.Array]]:
    """One data-parallel step on a functional train state, pmap-style (upstream's API).

    Each device computes ``loss_fn`` and gradients on its slice of the batch, the
    gradients are averaged across devices (``pmean`` over ``"batch"``), and every device
    applies the same optax update, so parameters stay replicated. It runs as a cached,
    jitted ``jax.shard_map`` over the first ``n`` local devices rather than ``jax.pmap``:
    same per-device semantics, and the returned state really holds the new parameters.

    Args:
      loss_fn: ``loss_fn(variables, batch, rngs=rngs) -> scalar`` where ``variables`` is
        ``{"params": state.params, **state.model_state}`` and ``batch`` is one device's
        slice (``[per_device, ...]``). Hashable (a module-level function), so the
        compiled step is reused.
      optimizer: an ``optax.GradientTransformation`` (e.g. ``optax.adam(1e-3)``).
      batch: pytree of arrays stacked per device as pmap takes them: every leaf
        ``[n_devices, per_device, ...]``, e.g. ``inputs: [8, 4, F] float32``.
      state: a pytree dataclass with ``params``, ``opt_state``, ``step`` and
        ``replace(**changes)`` (``flax.training.train_state.TrainState`` or a
        ``flax.struct.dataclass``); an optional ``model_state`` mapping (e.g. batch
        statistics) joins ``params`` in ``variables``. Not stacked per device: the same
        state is used on every device.
      rngs: optional PRNG key (or pytree of keys) passed to ``loss_fn`` as ``rngs=``,
        the same on every device.

    Returns:
      ``(new_state, metrics)``: ``new_state`` has ``step + 1``, the updated ``params``
      and ``opt_state`` (not stacked per device); ``metrics["loss"]`` is ``[n_devices]``
      float32 (each device's loss, as pmap returns it) and, when the optimizer exposes
      one (``optimizer.learning_rate`` as a number or a schedule of the step, or
      ``optax.inject_hyperparams``), ``metrics["learning_rate"]`` is ``[n_devices]``.

    Raises:
      TypeError: ``state`` lacks ``params``/``opt_state``/``step``/``replace``, or
        ``optimizer`` has no ``update``.
      ValueError: batch leaves that are not arrays, disagree on the leading (device)
        size, or ask for more devices than exist (message starts "Not enough devices").
    """
    missing = [a for a in ("params", "opt_state", "step", "replace") if not hasattr(state, a)]
    if missing:
        raise TypeError(
            f"state ({type(state).__name__}) has no {missing}; pass a "
            "flax.training.train_state.TrainState or a flax.struct.dataclass with params, "
            "opt_state and step"
        )
    if not callable(getattr(optimizer, "update", None)):
        raise TypeError(
            f"optimizer must be an optax.GradientTransformation, got {type(optimizer).__name__}"
            "; pass e.g. optax.adam(1e-3)"
        )
    leaves = jax.tree.leaves(batch)
    bad = [type(x).__name__ for x in leaves if not isinstance(x, np.ndarray | jax.Array)]
    if not leaves or bad:
        raise ValueError(
            f"batch must be a pytree of arrays stacked per device [n_devices, ...]; got "
            f"{'no leaves' if not leaves else 'leaves of type ' + str(sorted(set(bad)))}"
        )
    sizes = sorted({x.shape[0] if x.ndim else 0 for x in leaves})
    if len(sizes) != 1 or sizes[0] < 1:
        raise ValueError(
            f"every batch leaf needs the same leading device axis >= 1, got sizes {sizes}; "
            "stack each leaf as [n_devices, per_device, ...]"
        )
    n = sizes[0]
    available = jax.local_devices()
    if n > len(available):
        raise ValueError(
            f"Not enough devices: the batch is stacked for {n} devices but only "
            f"{len(available)} are available; stack it as [{len(available)}, ...] or fewer"
        )
    devices = tuple(available[:n])
    try:
        compiled = _compiled_data_parallel_step(loss_fn, optimizer, devices)
    except TypeError:  # an unhashable loss_fn or optimizer: build it uncached
        compiled = _compiled_data_parallel_step.__wrapped__(loss_fn, optimizer, devices)
    return compiled(state, batch, rngs)


def _learning_rate(optimizer: Any, opt_state: Any, step: Any) -> jax.Array | None:
    rate = getattr(optimizer, "learning_rate", None)
    if callable(rate):
        return jax.numpy.asarray(rate(step), dtype=jax.numpy.float32)
    if isinstance(rate, int | float):
        return jax.numpy.asarray(rate, dtype=jax.numpy.float32)
    hyperparams = getattr(opt_state, "hyperparams", None)
    if isinstance(hyperparams, dict) and "learning_rate" in hyperparams:
        return jax.numpy.asarray(hyperparams["learning_rate"], dtype=jax.numpy.float32)
    return None


@functools.lru_cache(maxsize=32)
def _compiled_data_parallel_step(
    loss_fn: Callable[..., jax.Array],
    optimizer: optax.GradientTransformation,
    devices: tuple[jax.Device, ...],
) -> Callable[[Any, PyTree, PyTree], tuple[Any, dict[str, jax.Array]]]:
    mesh = Mesh(np.asarray(devices), (_STEP_AXIS,), axis_types=(AxisType.Auto,))

    def per_device(state: Any, batch: PyTree, rngs: PyTree) -> tuple[Any, dict[str, Any]]:
        local = jax.tree.map(lambda x: x[0], batch)  # this device's [1, per, ...] block
        model_state = dict(getattr(state, "model_state", None) or {})

        def loss_of(params: PyTree) -> jax.Array:
            return loss_fn({"params": params, **model_state}, local, rngs=rngs)

        loss, grads = jax.value_and_grad(loss_of)(state.params)
        grads = jax.lax.pmean(grads, _STEP_AXIS)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {"loss": jax.numpy.reshape(loss, (1,))}
        rate = _learning_rate(optimizer, state.opt_state, state.step)
        if rate is not None:
            metrics["learning_rate"] = jax.numpy.reshape(rate, (1,))
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        return new_state, metrics

    # check_vma=False: pmap semantics, the replicated out_spec of the state is kept
    # true by the pmean above (every device applies the same update).
    mapped = jax.shard_map(
        per_device,
        mesh=mesh,
        in_specs=(P(), P(_STEP_AXIS), P()),
        out_specs=(P(), P(_STEP_AXIS)),
        check_vma=False,
    )
    return jax.jit(mapped)
