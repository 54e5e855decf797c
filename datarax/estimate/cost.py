"""Step estimates: FLOPs, per-device memory and collectives of one training step, priced
on the catalog's hardware. Plain arithmetic; nothing touches a device.

Parallelism is named by axis *roles*: ``data`` (batch split, parameters replicated,
gradients all-reduced), ``fsdp`` (batch split and parameters, gradients and optimizer
state sharded; parameters all-gathered where used, gradients reduce-scattered) and
``tensor`` (Megatron-style: ``col`` parameters split their output dimension, ``row``
ones their input, activations all-reduced after each ``row`` matmul). By default an
axis's role is its name (``model`` means ``tensor``, ``batch`` means ``data``).

FLOPs of one step (the ``flops`` field, "model FLOPs", as MaxText's
``calculate_tflops_training_per_device`` counts them:
:func:`~datarax.estimate.step_time.model_flops_per_token`):
``6 * N * tokens + 6 * layers * seq_len * heads * head_dim * tokens``, where ``N`` is
the parameters every token multiplies through (all but the embedding table and norm
scales for the transformer; every parameter, biases included, for the MLP, which is the
``6 * params * tokens`` of the scaling book) and the second term is attention's
``QK^T`` and ``AV`` under the causal mask (forward ``4 * S * heads * head_dim`` per token
and layer without the mask, half of it with; backward twice the forward). The forward
pass is one third of it, the backward two thirds; ``remat: full`` runs the forward again
in the backward pass (those FLOPs count in ``compute_s`` but not in ``flops`` or
``mfu``). ``tokens_per_s`` is the global batch's tokens over ``step_s``, and
``tflops_per_device`` the model TFLOP/s one device achieves at ``step_s`` (MaxText's
``TFLOP/s/device``).

Memory of one step (``memory_estimate``, in :mod:`datarax.estimate.memory`;
axis roles and parameter shardings in :mod:`datarax.parallel.axis_roles`; both
re-exported here).

Collectives are priced with a ring (alpha-beta) model on the axis's link (``AxisLink``):
over ``n`` devices, an all-gather or reduce-scatter of ``V`` bytes per device costs
``(n - 1) / n * V / W + (n - 1) * alpha`` and an all-reduce twice that, where ``W`` is the
axis's ``bytes_per_s`` (already summing the links a TPU axis uses in both ring
directions) and ``alpha`` the link's per-step latency from the catalog. An axis split
over both networks (``ici > 1`` and ``dcn > 1``) runs hierarchically: the ICI part over
``V`` and the DCN part over ``V / ici`` (each device holds its ICI shard by then),
pipelined, so it costs the slower of the two. An all-to-all has no such reduction: each
device sends ``V / n`` to each of the other ``n - 1``, so its own volume crosses each
link: ``(ici - 1) / n * V`` to the devices of its slice (or NVLink domain) over the fast
network and ``(dcn - 1) / dcn * V`` to those of the other slices over the slow one,
both at once: the slower of ``(ici - 1) / n * V / W_ici + (ici - 1) * alpha_ici`` and
``(dcn - 1) / dcn * V / W_dcn + (dcn - 1) * alpha_dcn``. A send-recv is ``V / W +
alpha`` on the slowest network the axis crosses.

Step time: ``roofline_s`` is the ideal step: within each of the forward and the backward
pass, collectives run one after another and overlap perfectly with that pass's compute at
100% of the compute dtype's peak, the passes in sequence: ``max(fwd_compute, fwd_comm) +
max(bwd_compute, bwd_comm)`` (``phases`` holds those four figures, ``bottleneck`` says
which side is longer). ``step_s`` predicts the measured wall time
(:func:`datarax.estimate.step_time.predict_step`: achieved fractions of peak for
matmuls and attention kernels, memory-bound work at HBM bandwidth, partly exposed
collectives, host-offload transfers, remat recompute; calibrated on published runs, see
BENCHMARKS.md) and ``mfu`` follows from it; ``breakdown`` and ``gap`` say what makes the
difference.

Example:
  >>> from datarax.hardware.chips import AxisLink
  >>> est = estimate_step(
  ...     "tpu-v5p",
  ...     [AxisLink("data", 16, 16, 1, "ici", 1.8e11)],
  ...     {"kind": "mlp", "features": [4096, 16384, 4096], "dtype": "bfloat16"},
  ...     global_batch=16 * 4096)
  >>> est["bottleneck"], [c["kind"] for c in est["collectives"]]
  ('compute', ['all-reduce'])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from datarax.estimate.calibrations import CalibrationProfile, profile_for
from datarax.estimate.memory import check_optimizer, hardware_memory, memory_estimate, step_memory
from datarax.estimate.results import Collective, StepEstimate
from datarax.estimate.step_time import model_flops_per_token, predict_step
from datarax.hardware.chips import AxisLink, Hardware, get_hardware
from datarax.parallel.axis_roles import AXIS_ROLES, axis_roles, param_specs
from datarax.parallel.context import MeshContext, mesh_context
from datarax.parallel.options import ParallelOptions
from datarax.specs.model_specs import ModelSpec, TransformerSpec

__all__ = [
    "AXIS_ROLES",
    "axis_roles",
    "collective_seconds",
    "estimate_step",
    "hardware_memory",
    "memory_estimate",
    "param_specs",
    "step_warnings",
]


def collective_seconds(
    kind: str, bytes_per_device: float, link: AxisLink, hardware: Hardware
) -> float:
    """Ring alpha-beta time of one collective over ``link`` (see the module docstring).

    Args:
      kind: ``all-reduce``, ``all-gather``, ``reduce-scatter``, ``all-to-all`` or
        ``send-recv`` (point to point: ``V / W`` plus one latency, on the slowest
        network the axis crosses).
      bytes_per_device: ``V``: the array one device holds whole (all-gather: after;
        reduce-scatter and all-reduce: before).
      link: the axis.
      hardware: supplies latencies and the ICI figure when ``link.ici_bytes_per_s`` is
        ``None``.
    """
    if kind == "send-recv":
        if link.size <= 1:
            return 0.0
        slow = link.dcn > 1
        alpha = hardware.slow_link_latency_s if slow else hardware.fast_link_latency_s
        return bytes_per_device / link.bytes_per_s + alpha
    passes = 2 if kind == "all-reduce" else 1

    def ring(n: int, volume: float, bandwidth: float, alpha: float) -> float:
        if n <= 1:
            return 0.0
        return passes * ((n - 1) / n * volume / bandwidth + (n - 1) * alpha)

    if link.dcn <= 1:
        # an all-to-all sends (n - 1) / n of V, each device to each other one: every
        # device injects that much at the axis's bandwidth, as one pass of the ring
        alpha = hardware.fast_link_latency_s
        return ring(link.ici, bytes_per_device, link.bytes_per_s, alpha)
    fast = link.ici_bytes_per_s or hardware.fast_link_bytes_per_s
    slow_alpha = hardware.slow_link_latency_s
    if kind == "all-to-all":
        # no reduction shrinks it between the networks: the (dcn - 1) / dcn of V bound
        # for other slices crosses the slow link whole, the rest stays on the fast one
        n = link.size
        ici_s = (link.ici - 1) / n * bytes_per_device / fast
        ici_s += (link.ici - 1) * hardware.fast_link_latency_s
        dcn_s = ring(link.dcn, bytes_per_device, link.bytes_per_s, slow_alpha)
        return max(ici_s, dcn_s)
    ici_s = ring(link.ici, bytes_per_device, fast, hardware.fast_link_latency_s)
    dcn_s = ring(link.dcn, bytes_per_device / link.ici, link.bytes_per_s, slow_alpha)
    return max(ici_s, dcn_s)


def estimate_step(
    hardware: str | Hardware,
    axes_detail: Sequence[AxisLink],
    model: ModelSpec | Mapping[str, Any],
    global_batch: int,
    *,
    roles: Mapping[str, str] | None = None,
    optimizer: str = "adam",
    options: ParallelOptions | None = None,
    calibration: str | CalibrationProfile | None = None,
    context: MeshContext | None = None,
) -> StepEstimate:
    """Estimates one training step of ``model`` on a mesh of ``hardware``.

    Args:
      hardware: catalog name or entry.
      axes_detail: one :class:`AxisLink` per mesh axis, mesh order (a hardware plan's
        ``axes_detail``).
      model: a model spec or a plan request's ``model`` object (dtype default bfloat16).
      global_batch: examples (MLP) or sequences (transformer) per step, split over the
        ``data`` and ``fsdp`` axes.
      roles: ``{axis: role}`` overriding the name-derived roles (see :func:`axis_roles`).
      optimizer: ``adam``, ``adamw`` or ``sgd``.
      options: the pipeline's schedule, the context-parallel strategy and ZeRO-1
        (:class:`~datarax.parallel.options.ParallelOptions`; default: none of them).
      calibration: the id of the calibration profile to price the step with (default:
        :func:`~datarax.estimate.calibrations.default_profile` of the hardware).
      context: the request's :class:`~datarax.parallel.context.MeshContext`, where the
        caller has built it (``model``, the axes, ``roles``, ``options`` and
        ``global_batch`` are then read from it).

    Returns:
      A :class:`~datarax.estimate.results.StepEstimate`: ``step_s`` the predicted wall
      time (``compute_s`` its matmul, attention and memory-bound parts), ``roofline_s``
      the ideal (module docstring), ``mfu`` model FLOPs over ``peak_flops`` (the compute
      dtype's) times ``step_s``; ``collectives`` one
      :class:`~datarax.estimate.results.Collective` per axis, kind, phase and what they
      move (``count`` ops summed); ``bottleneck`` is ``compute`` or ``communication``
      (of the roofline); ``phases`` the roofline's ``compute_s``/``comm_s`` of
      ``forward`` and ``backward``.

    Raises:
      PlanError: ``unknown_hardware``, ``invalid_model``, ``unknown_axis_role``,
        ``batch_not_divisible``, ``tensor_not_divisible``, ``unknown_optimizer``,
        ``invalid_parallelism``, ``unknown_calibration``, ``invalid_calibration``.
    """
    hw = get_hardware(hardware)
    profile = profile_for(hw, calibration)
    check_optimizer(optimizer)
    links = {link.name: link for link in axes_detail}
    if context is None:
        context = mesh_context(
            model,
            {link.name: link.size for link in axes_detail},
            global_batch,
            roles=roles,
            options=options,
        )
    ctx = context
    model = ctx.model
    megatron = profile.stack.framework == "pytorch"
    memory = step_memory(
        ctx,
        optimizer=optimizer,
        dcn_axes=[link.name for link in axes_detail if link.dcn > 1],
        dispatch="routed" if megatron else "maxtext",
        program="maxtext",  # what a hardware plan's launch runs (DESIGN v1.4)
        **hardware_memory(hw),
    )
    n_devices = math.prod(ctx.axes.values())
    shape = ctx.pipeline
    global_tokens = ctx.global_batch * model.tokens_per_example
    flops = model_flops_per_token(model) * global_tokens
    collectives = _step_collectives(ctx, hw, links, padded=megatron)
    predicted = predict_step(
        model,
        hw,
        ctx,
        param_bytes=memory.params,
        collectives=collectives,
        host_offload_bytes=memory.host_offload_bytes,
        optimizer=optimizer,
        calibration=profile.constants,
        padded=megatron,
    )
    parts = predicted.breakdown
    peak = hw.peak_flops(model.dtype)
    roof = predicted.roofline_phases
    comm_bound = any(phase.comm_s > phase.compute_s for phase in (roof.forward, roof.backward))
    slowest = max(collectives, key=lambda e: e.seconds, default=None)
    return StepEstimate(
        flops=float(flops),
        compute_s=parts.matmul_s + parts.attention_s + parts.memory_bound_s,
        comm_s=sum(e.seconds for e in collectives if e.phase == "forward")
        + sum(e.seconds for e in collectives if e.phase == "backward"),
        step_s=predicted.step_s,
        mfu=flops / (n_devices * peak * predicted.step_s),
        tokens_per_s=global_tokens / predicted.step_s,
        tflops_per_device=flops / n_devices / predicted.step_s / 1e12,
        bottleneck="communication" if comm_bound else "compute",
        collectives=collectives,
        bottleneck_link=slowest.link if comm_bound and slowest else None,
        phases=roof,
        tokens_per_device=ctx.tokens,
        roofline_s=predicted.roofline_s,
        roofline_mfu=flops / (n_devices * peak * predicted.roofline_s),
        peak_flops=peak,
        breakdown=parts,
        gap=predicted.gap,
        pipeline=shape,
        calibration=profile.id,
        memory_per_device=memory,
        predicted_components=predicted.components,
        param_shardings=ctx.specs,
    )


def _step_collectives(
    ctx: MeshContext, hw: Hardware, links: Mapping[str, AxisLink], *, padded: bool = False
) -> tuple[Collective, ...]:
    """The step's collectives, one entry per axis, kind, pass and operand: each axis's
    kind's traffic term (:attr:`~datarax.parallel.kinds.ParallelismKind.traffic`,
    :mod:`datarax.parallel.terms`) priced on the axis's link. ``padded``: the framework
    pads the sparse kernel's experts to their capacity before the all-to-all (Megatron's
    ``moe_pad_expert_input_to_capacity`` under a PyTorch profile), so a capacity
    model's all-to-all moves ``capacity_factor`` times the routed rows, as the dense
    kernel's does (:func:`~datarax.parallel.terms.expert_traffic`)."""
    entries: dict[tuple[str, str, str, str], list[float]] = {}
    model = ctx.model
    pad = 1.0
    if padded and isinstance(model, TransformerSpec) and model.is_moe and not model.dropless:
        pad = model.capacity_factor if model.moe_kernel == "sparse" else 1.0

    # Parameter and gradient collectives are combined: XLA's all-gather, reduce-scatter
    # and all-reduce combiners merge the ones of one scanned layer (and of the loose
    # parameters) into one op, and PyTorch frameworks bucket gradients likewise, so the
    # per-op latency is paid once per layer and phase, not once per parameter.
    latency_ops: dict[tuple[str, str, str, str], int] = {}
    free = dataclasses.replace(hw, fast_link_latency_s=0.0, slow_link_latency_s=0.0)
    for axis, traffic in ctx.traffic():
        link = links[axis]
        if link.size <= 1 or traffic.bytes_per_device <= 0:
            continue
        if traffic.op == "all-to-all" and pad != 1.0:
            traffic = dataclasses.replace(traffic, bytes_per_device=traffic.bytes_per_device * pad)
        key = (axis, traffic.op, traffic.phase, traffic.what)
        combined = traffic.what in ("params", "grads")
        one = collective_seconds(
            traffic.op, traffic.bytes_per_device, link, free if combined else hw
        )
        entry = entries.setdefault(key, [0, 0.0, 0.0])
        entry[0] += traffic.count
        entry[1] += traffic.bytes_per_device * traffic.count
        entry[2] += one * traffic.count
        if combined:
            latency_ops[key] = max(latency_ops.get(key, 0), traffic.count)
    return _entries(entries, latency_ops, links, hw, ctx.model)


def _entries(
    entries: Mapping[tuple[str, str, str, str], list[float]],
    latency_ops: Mapping[tuple[str, str, str, str], int],
    links: Mapping[str, AxisLink],
    hw: Hardware,
    model: ModelSpec,
) -> tuple[Collective, ...]:
    """The collected ``(count, volume, seconds)`` as :class:`Collective` records, with
    the combined parameter and gradient collectives' latency paid once per layer."""
    entries = {key: list(value) for key, value in entries.items()}
    for key, ops in latency_ops.items():
        # one combined op per layer, plus one for the unstacked parameters
        extra = 1 if isinstance(model, TransformerSpec) else 0
        entries[key][2] += (ops + extra) * collective_seconds(key[1], 0.0, links[key[0]], hw)
    return tuple(
        Collective(
            axis=axis,
            kind=kind,
            phase=phase,
            what=what,
            count=int(count),
            bytes_per_device=int(volume),
            link=links[axis].link,
            seconds=seconds,
        )
        for (axis, kind, phase, what), (count, volume, seconds) in entries.items()
    )


def step_warnings(
    ctx: MeshContext,
    hardware: str | Hardware,
    calibration: str | CalibrationProfile | None = None,
) -> list[str]:
    """What a step estimate assumes that the request does not say, one line each, for a
    plan's ``warnings``: how a capacity factor prices the experts (padded compute, dropped
    tokens, or unread by MaxText's sparse kernel), and under a PyTorch profile how the
    dispatch is sized and which optimizer sharding is priced.

    Args:
      ctx: the request's mesh context.
      hardware: catalog name or entry.
      calibration: the profile the estimate is priced with (as :func:`estimate_step`).
    """
    model = ctx.model
    framework = profile_for(get_hardware(hardware), calibration).stack.framework
    out: list[str] = []
    if isinstance(model, TransformerSpec) and model.is_moe:
        out.extend(_capacity_warnings(model, framework))
    if framework == "pytorch":
        out.append(_optimizer_sharding_line(ctx))
    return out


def _capacity_warnings(model: TransformerSpec, framework: str) -> list[str]:
    cf = model.capacity_factor
    s, k, e = model.seq_len, model.experts_per_token, model.num_experts
    if model.dropless:
        if framework == "pytorch":
            return [
                "moe dispatch priced as Megatron's all-to-all dispatcher runs it dropless: "
                "buffers of the routed tokens (k per token), no worst-case buffer"
            ]
        return []
    capacity = max(math.ceil(s * k / e) * cf, cf)
    if model.moe_kernel == "sparse" and framework != "pytorch":
        return [
            f"capacity_factor {cf:g} is not read by MaxText's sparse kernel "
            "(sparse_matmul is dropless; ragged_buffer_factor bounds its buffer): priced "
            "dropless, no token dropped; use moe_kernel 'dense' to pad each expert to "
            "its capacity and drop what passes it"
        ]
    dropped = (
        f"at least {1 - cf:.0%} of the routed tokens"
        if cf < 1
        else ("none if routing is balanced; those routed past an expert's capacity otherwise")
    )
    return [
        f"capacity_factor {cf:g}: each expert takes at most {int(capacity)} of a "
        f"sequence's {s * k} routed tokens (ceil({s} x {k} / {e}) x {cf:g}); its "
        f"matmuls and all-to-all are priced padded to that capacity ({cf:g}x the routed "
        f"work), and tokens past it are dropped (their expert output is zero): "
        f"{dropped}"
    ]


def _optimizer_sharding_line(ctx: MeshContext) -> str:
    fsdp = ctx.axes_where(lambda k: k.gathers_params)
    if ctx.options.shard_over_data and ctx.replica_axes:
        over = ", ".join(ctx.replica_axes)
        return (
            f"optimizer state priced sharded over the data axes ({over}) as Megatron's "
            "distributed optimizer (ZeRO-1) shards it"
        )
    if fsdp:
        return (
            f"optimizer state priced sharded with the parameters over {', '.join(fsdp)} "
            "(PyTorch FSDP / ZeRO-3); set shard_optimizer_over_data for Megatron's "
            "distributed optimizer over the data axes"
        )
    return (
        "optimizer state priced whole on every data-parallel rank (Megatron without "
        "--use-distributed-optimizer); set shard_optimizer_over_data to price the "
        "distributed optimizer (ZeRO-1)"
    )
