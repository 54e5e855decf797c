"""Pipeline parallelism in the real program: the decoder layers run as stages over a
``stage`` axis, microbatch by microbatch, as MaxText's pipeline does
(``MaxText/layers/pipeline.py``): SPMD, the stages one ``vmap``ped dimension split over
the stage axes, the hand-off from stage to stage a roll of that dimension (XLA's
collective-permute), the schedule a ``lax.scan`` over iterations.

Schedules built: ``gpipe`` (every microbatch forward through the stages, then the
backward pass by autodiff of the loop) and ``circular`` (MaxText's: a stage holds
``layers_per_stage`` layers of each of ``repeats`` passes; a microbatch goes round the
stages ``repeats`` times, waiting in a buffer between passes, so ``microbatches`` must be
a multiple of the stages when ``repeats > 1``). ``1f1b`` and ``interleaved_1f1b`` hold
fewer activations by interleaving forward and backward passes, which an autodiffed loop
does not do: the library does not build them.

Iteration ``t`` of ``microbatches x repeats + stages - 1``: stage ``s`` runs item
``t - s`` (item ``i`` is microbatch ``i mod M`` on pass ``i // M``) through its layers of
that pass; stage 0 reads its item from the buffer (the microbatch's input, or its output
of the pass before); what the last stage finishes goes back into the buffer; each stage
then hands its output to the next. Items outside ``[0, M x repeats)`` (the bubble) are
computed and dropped.

Layer order: the layers stacked ``[layers, ...]`` split over the stage axes in
contiguous blocks, so stage ``s`` holds stored layers ``s x repeats x per`` onward; stored
layer ``s x repeats x per + r x per + j`` is layer ``r x stages x per + s x per + j`` of
the model (:func:`stored_layer_order`): the same order when ``repeats`` is 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = ["WEIGHTS", "StagePlan", "pipelined_layers", "stored_layer_order"]

WEIGHTS = "pipeline_stage_weights"
"""The name of a circular stage's per-iteration weight slices (never saved)."""


@dataclass(frozen=True)
class StagePlan:
    """How the layers run as a pipeline.

    Attributes:
      axes: the mesh's stage axes (their product is the number of stages).
      stages: the number of stages.
      microbatches: microbatches per step (each data shard's sequences split evenly).
      repeats: passes round the stages (``layers / (stages * layers_per_stage)``).
    """

    axes: tuple[str, ...]
    stages: int
    microbatches: int
    repeats: int = 1


def stored_layer_order(layers: int, stages: int, repeats: int) -> np.ndarray:
    """``order[i]``: the model layer that stored layer ``i`` is (see the module)."""
    per = layers // (stages * repeats)
    index = np.arange(layers).reshape(repeats, stages, per)  # [r, s, j] -> model layer
    return index.transpose(1, 0, 2).reshape(-1)


def _entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def pipelined_layers(
    x: jax.Array,
    stack: Mapping[str, jax.Array],
    step: Callable[[jax.Array, Mapping[str, jax.Array]], tuple[jax.Array, None]],
    plan: StagePlan,
    layout: Any,
    keep: Any = None,
) -> jax.Array:
    """``x [B, S, d]`` through the stacked layers ``stack`` (``{path: [layers, ...]}``)
    as a pipeline; ``step(x, layer_params)`` is one layer (its remat included).
    ``keep``: the checkpoint policy of a stage's pass (what the layers' remat saves),
    which leaves out the weight slices (named :data:`WEIGHTS`) of a circular schedule.

    Returns:
      ``[B, S, d]``, as the layers in model order would give it.
    """
    st, repeats, m = plan.stages, plan.repeats, plan.microbatches
    b = x.shape[0]
    layers = next(iter(stack.values())).shape[0]
    per = layers // (st * repeats)
    stage = _entry(plan.axes)
    mesh = layout.mesh
    batch = layout.batch

    def pin(a: jax.Array, *lead: Any) -> jax.Array:
        spec = P(*lead, *([None] * (a.ndim - len(lead))))
        pinned: jax.Array = jax.lax.with_sharding_constraint(a, NamedSharding(mesh, spec))
        return pinned

    # weights: [stages, repeats, per, ...], the stages dimension over the stage axes
    weights = {k: v.reshape(st, repeats, per, *v.shape[1:]) for k, v in stack.items()}
    # microbatch k is rows k, k + M, ...: every data shard holds its share of each
    buffer = pin(x.reshape(b // m, m, *x.shape[1:]).swapaxes(0, 1), None, batch)
    state = pin(jnp.zeros((st, *buffer.shape[1:]), x.dtype), stage, batch)
    items = m * repeats

    def run_stage(h: jax.Array, w: Mapping[str, jax.Array], r: jax.Array) -> jax.Array:
        if repeats == 1:  # one pass: the stage's weights, the same every iteration
            mine = {k: v[0] for k, v in w.items()}
        else:
            mine = {
                k: checkpoint_name(jax.lax.dynamic_index_in_dim(v, r, 0, keepdims=False), WEIGHTS)
                for k, v in w.items()
            }
        out, _ = jax.lax.scan(step, h, mine)
        return out

    run = run_stage
    if repeats > 1 and keep is not None:
        # each iteration slices its pass's weights: sliced again in the backward pass,
        # not kept for every iteration (the layers' own residuals are, by their names)
        run = jax.checkpoint(run_stage, policy=keep, prevent_cse=False)
    stages = jax.vmap(run, spmd_axis_name=plan.axes)

    def iteration(
        carry: tuple[jax.Array, jax.Array], t: jax.Array
    ) -> tuple[tuple[jax.Array, jax.Array], None]:
        state, buffer = carry
        buffer = pin(buffer, None, batch)
        # stage 0 takes its item from the buffer: a select per stage (an update at index
        # 0 of the stage-split dimension would gather every stage's state first)
        first = (jnp.arange(st) == 0).reshape(st, *([1] * (state.ndim - 1)))
        state = jnp.where(first, buffer[t % m][None], state)
        item = t - jnp.arange(st)
        passes = jnp.clip(item // m, 0, repeats - 1)
        out = pin(stages(pin(state, stage, batch), weights, passes), stage, batch)
        done = t - (st - 1)
        valid = (done >= 0) & (done < items)
        slot = jnp.clip(done, 0, items - 1) % m
        last = pin(out[st - 1], batch)
        buffer = pin(buffer.at[slot].set(jnp.where(valid, last, buffer[slot])), None, batch)
        # each stage hands its output to the next (a collective-permute over the stages)
        return (pin(jnp.roll(out, 1, axis=0), stage, batch), buffer), None

    (_, buffer), _ = jax.lax.scan(iteration, (state, buffer), jnp.arange(items + st - 1))
    return buffer.swapaxes(0, 1).reshape(x.shape)
