"""XLA's own verdict on a plan: the real training step, lowered and compiled from shapes.

:func:`abstract_train_step` builds the training step a plan describes (forward pass,
backward pass and optimizer update, as :mod:`datarax.estimate.cost` shards it) over
``jax.ShapeDtypeStruct`` arguments that carry ``NamedSharding``\\ s on a mesh; nothing is
allocated. :func:`compile_train_step` lowers and compiles it for that mesh and reads what
the compiler says: ``memory_analysis()`` (per-device bytes), ``cost_analysis()`` (FLOPs
and bytes accessed), the collectives in the compiled HLO, and, when the program does not
fit, XLA's own error text (``RESOURCE_EXHAUSTED ... CompileTimeHbmOom``).

The mesh may be made of devices that are not attached: TPU devices of a topology
described by libtpu on a CPU-only host (:func:`tpu_topology_devices`, with
``JAX_PLATFORMS=cpu`` and ``TPU_SKIP_MDS_QUERY=1`` set before JAX starts), in the plan's
own device order (:func:`mesh_from_ids`), or the host's own devices.

The step, per model:

- MLP: ``inputs [B, in]`` float32 cast to the model dtype, ``x @ W + b`` with ReLU
  between layers; ``mse`` against ``targets [B, out]`` float32 or ``cross_entropy``
  against ``[B]`` int32 class ids, in float32; ``remat: full`` wraps the forward pass in
  ``jax.checkpoint``.
- Transformer: the model of :mod:`datarax.models.transformer` itself
  (:func:`datarax.models.transformer_loss_fn`), the one users train: ``tokens [B, S]``
  int32, a ``lax.scan`` over the layers' stacked parameters (in ``param_dtype``, cast to
  ``dtype`` for the matmuls), MaxText's remat policies over its named tensors (offloaded
  ones to ``pinned_host``), ``flash`` attention as Pallas splash attention under
  ``shard_map`` on TPU, and a vocabulary-tiled float32 cross-entropy.
- Activations are pinned to the plan's layout (``jax.lax.with_sharding_constraint``,
  :class:`datarax.models.ActivationLayout`): batch dimension over the data and fsdp axes;
  ``col`` outputs, attention heads, the MLP hidden and the logits' vocabulary over the
  tensor axes (Megatron-style). Without them XLA's sharding propagation may compile
  another program (e.g. keep FSDP weights sharded and all-reduce activations over the
  whole global batch) than the one the estimate prices.
- Update: ``optax`` (``adam``, ``adamw`` or ``sgd`` as the service's sessions use them),
  parameters and optimizer state donated, outputs sharded as inputs.

Example:
  >>> import jax
  >>> from jax.sharding import Mesh
  >>> mesh = Mesh(jax.devices()[:8], ("data",))  # doctest: +SKIP
  >>> out = compile_train_step({"kind": "mlp", "features": [64, 256, 64]}, mesh, 64)
  ... # doctest: +SKIP
  >>> out["fits"], sorted(out["memory"])  # doctest: +SKIP
  (True, ['alias_bytes', 'argument_bytes', ...])
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.tree_util import PyTreeDef

from datarax.errors import PlanError
from datarax.models import ActivationLayout, make_optimizer, transformer_loss_fn
from datarax.models.pipeline import StagePlan
from datarax.parallel.axis_roles import (
    axis_roles,
    batch_split_axes,
    param_specs,
    replica_axes,
)
from datarax.parallel.kinds import axes_where, check_compiled
from datarax.parallel.options import Pipeline, check_program_builds, pipeline_shape
from datarax.specs.model_specs import MLPSpec, ModelSpec, TransformerSpec, model_spec

__all__ = [
    "COLLECTIVE_KINDS",
    "AbstractStep",
    "abstract_train_step",
    "compile_train_step",
    "count_collectives",
    "mesh_from_ids",
    "stage_plan",
    "step_loss",
    "tpu_topology_devices",
]

COLLECTIVE_KINDS: tuple[str, ...] = (
    "all-reduce",
    "all-gather",
    "reduce-scatter",
    "all-to-all",
    "collective-permute",
)
"""Collective ops counted in the compiled HLO (async ``-start`` forms count once)."""

Params = dict[str, jax.Array]
"""Flat parameters (or a batch) by name, e.g. ``{"layers/0/kernel": [F, H] float32}``."""
StepLoss = Callable[[Params, Params], jax.Array]
"""``loss(params, batch) -> scalar`` of a compiled step."""

_JNP_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_LEARNING_RATE = 1e-3
# An HLO instruction: "%name = type op-name(" or "op-name-start(" after the "=".
_HLO_OP = re.compile(r"=\s*[^=]*?\s(" + "|".join(COLLECTIVE_KINDS) + r")(?:-start)?\(")


@dataclass(frozen=True)
class AbstractStep:
    """A training step and its abstract arguments, ready for ``jax.jit(...).lower``.

    Attributes:
      fn: ``fn(params, opt_state, batch) -> (params, opt_state, loss)``.
      args: ``(params, opt_state, batch)`` as ``ShapeDtypeStruct`` trees with shardings.
      out_shardings: shardings of ``fn``'s outputs (parameters and state as they came in).
      donate_argnums: ``(0, 1)``: parameters and optimizer state are updated in place.
    """

    fn: Callable[..., Any]
    args: tuple[Any, Any, Any]
    out_shardings: tuple[Any, Any, Any]
    donate_argnums: tuple[int, ...] = (0, 1)

    def jitted(self) -> Any:
        """``jax.jit`` of the step, with its output shardings and donations."""
        return jax.jit(
            self.fn, out_shardings=self.out_shardings, donate_argnums=self.donate_argnums
        )


# ------------------------------------------------------------------------------ devices


def tpu_topology_devices(hardware: str, topology: str, slices: int = 1) -> Sequence[jax.Device]:
    """The devices libtpu describes for a TPU topology, attached or not.

    Args:
      hardware: catalog name, ``"tpu-v5e"``.
      topology: slice shape, ``"16x16"``, or JAX's whole name, ``"v5e:16x16"``.
      slices: number of slices (devices of slice ``s`` have ids ``(s + 1) * 100000 + i``).

    Raises:
      PlanError: ``compile_target_unavailable`` when libtpu cannot describe it (libtpu
        missing, or a name it does not know), quoting its reason.
    """
    from jax.experimental import topologies  # noqa: PLC0415 - only compile checks need it

    # v4 exposes both cores of a chip unless asked for megacore, JAX's default mode there.
    kwargs = {"chip_config_name": "megacore"} if hardware == "tpu-v4" else {}
    name = topology if ":" in topology else hardware.removeprefix("tpu-") + ":" + topology
    try:
        desc = topologies.get_topology_desc(
            platform="tpu", topology_name=name, num_slices=slices, **kwargs
        )
    except Exception as error:  # libtpu raises RuntimeError/ValueError/XlaRuntimeError
        raise PlanError(
            "compile_target_unavailable",
            f"libtpu cannot describe TPU topology {name!r} x {slices} slices here: "
            f"{str(error).splitlines()[0] if str(error) else type(error).__name__}",
        ) from error
    return desc.devices


def mesh_from_ids(devices: Sequence[jax.Device], grid_ids: Any, axis_names: Sequence[str]) -> Mesh:
    """A mesh whose device at each position has the id a plan put there.

    Args:
      devices: the devices to choose from (their ``id`` must be unique).
      grid_ids: integer array (or nested lists), one id per mesh position, shape = axes.
      axis_names: mesh axis names, in order.

    Raises:
      PlanError: ``devices_changed`` when an id is not among ``devices``.
    """
    by_id = {d.id: d for d in devices}
    ids = np.asarray(grid_ids, dtype=np.int64)
    try:
        grid = np.array([by_id[int(i)] for i in ids.reshape(-1)], dtype=object)
    except KeyError as missing:
        raise PlanError(
            "devices_changed",
            f"the plan names device id {missing.args[0]} but the compile target has ids "
            f"{min(by_id)}..{max(by_id)} ({len(by_id)} devices)",
        ) from None
    return Mesh(grid.reshape(ids.shape), tuple(axis_names))


# ------------------------------------------------------------------------ the programme


def _param_tree(spec: ModelSpec, mesh: Mesh, roles: Mapping[str, str]) -> dict[str, Any]:
    """``{group path: ShapeDtypeStruct}``; a repeated group is stacked ``[repeat, ...]``."""
    axes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    # weights (and so gradients and optimizer moments) in the transformer's param_dtype
    dtype = _JNP_DTYPES[getattr(spec, "param_dtype", spec.dtype)]
    # a pipeline's stacked layers split over the stage axes in contiguous blocks
    stages = _entry(axes_where(axes, _SPLITS_LAYERS, roles))
    tree = {}
    for group, entries, _, _ in param_specs(spec, axes, roles):
        shape, pspec = group.shape, entries
        if group.repeat > 1 or "*" in group.path:
            lead = stages if _staged(spec, group.path) else None
            shape, pspec = (group.repeat, *shape), (lead, *entries)
        tree[group.path] = jax.ShapeDtypeStruct(
            shape, dtype, sharding=NamedSharding(mesh, P(*pspec))
        )
    return tree


def _staged(spec: ModelSpec, path: str) -> bool:
    """Whether the stacked group ``path`` runs inside a pipeline's stages: a dense
    model's layers; a mixture-of-experts model's MoE layers, and its dense layers when
    they all sit inside the units of :meth:`datarax.models.transformer` (no
    ``first_dense_layers``, none left after the last MoE layer)."""
    if path.startswith("layers/") or path.startswith("moe_layers/"):
        return True
    if not path.startswith("dense_layers/") or not isinstance(spec, TransformerSpec):
        return False
    return spec.first_dense_layers == 0 and spec.dense_layers == (spec.moe_every - 1) * (
        spec.moe_layers
    )


def _over_data(leaf: Any, mesh: Mesh, data: tuple[str, ...]) -> NamedSharding:
    """ZeRO-1: ``leaf``'s sharding with the data axes added to the first dimension they
    divide along with what already splits it (its own sharding where none does)."""
    sharding: NamedSharding = leaf.sharding
    sizes = dict(mesh.shape)
    dims = list(sharding.spec) + [None] * (len(leaf.shape) - len(sharding.spec))
    for i, entry in enumerate(dims):
        have = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        if leaf.shape[i] % math.prod(sizes[a] for a in (*have, *data)) == 0:
            dims[i] = (*have, *data)
            return NamedSharding(mesh, P(*dims))
    return sharding


def _opt_state_tree(
    params: dict[str, Any], optimizer: Any, mesh: Mesh, data: tuple[str, ...] = ()
) -> Any:
    """The optimizer state's shapes, each moment sharded like its parameter (and over
    the ``data`` axes as well for ZeRO-1)."""
    shapes = jax.eval_shape(optimizer.init, params)
    params_def: PyTreeDef = jax.tree.structure(params)
    replicated = NamedSharding(mesh, P())

    def is_params_like(node: Any) -> bool:
        if not isinstance(node, dict):
            return False
        node_def: PyTreeDef = jax.tree.structure(node)
        return bool(node_def == params_def)

    def place(node: Any) -> Any:
        if is_params_like(node):
            return {
                k: jax.ShapeDtypeStruct(
                    v.shape,
                    v.dtype,
                    sharding=_over_data(params[k], mesh, data) if data else params[k].sharding,
                )
                for k, v in node.items()
            }
        return jax.ShapeDtypeStruct(node.shape, node.dtype, sharding=replicated)

    return jax.tree.map(place, shapes, is_leaf=is_params_like)


def _entry(axes: Sequence[str]) -> str | tuple[str, ...] | None:
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


_SPLITS_LAYERS = attrgetter("splits_layers")


def _sequence_axes(axes: Mapping[str, int], roles: Mapping[str, str]) -> tuple[str, ...]:
    return axes_where(axes, attrgetter("splits_sequence"), roles)


def _batch_tree(
    spec: ModelSpec, mesh: Mesh, roles: Mapping[str, str], global_batch: int
) -> dict[str, Any]:
    axes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    batch_axes = batch_split_axes(axes, roles)
    shards = math.prod(axes[a] for a in batch_axes)
    if global_batch % shards:
        raise PlanError(
            "batch_not_divisible",
            f"global batch {global_batch} does not split over the {shards} data x fsdp shards",
        )
    lead = _entry(batch_axes)
    sharded = NamedSharding(mesh, P(lead))
    if isinstance(spec, TransformerSpec):
        shape = (global_batch, spec.seq_len)
        # the tokens of a context split: each device holds its share of every sequence
        sequence = _entry(_sequence_axes(axes, roles))
        tokens = NamedSharding(mesh, P(lead, sequence) if sequence else P(lead))
        return {
            "inputs": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=tokens),
            "targets": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=tokens),
        }
    inputs = jax.ShapeDtypeStruct((global_batch, spec.features[0]), jnp.float32, sharding=sharded)
    if spec.loss == "cross_entropy":
        targets = jax.ShapeDtypeStruct((global_batch,), jnp.int32, sharding=sharded)
    else:
        targets = jax.ShapeDtypeStruct(
            (global_batch, spec.features[-1]), jnp.float32, sharding=sharded
        )
    return {"inputs": inputs, "targets": targets}


def _activation_layout(
    mesh: Mesh,
    roles: Mapping[str, str],
    load_balance: bool = True,
    pipeline: StagePlan | None = None,
    strategy: str = "all_gather",
) -> ActivationLayout:
    """The plan's activation layout: batch over the axes that split it (data, fsdp,
    expert), the sequence over the context axes (load-balanced or not), tensor-split
    dimensions over the tensor axes, the tokens dispatched to the experts over the expert
    axes, the layers as pipeline stages (:class:`datarax.models.ActivationLayout`)."""
    axes = dict(zip(mesh.axis_names, mesh.devices.shape, strict=True))
    return ActivationLayout(
        mesh,
        batch_split_axes(axes, roles),
        axes_where(axes, attrgetter("splits_width"), roles),
        axes_where(axes, attrgetter("splits_experts"), roles),
        axes_where(axes, attrgetter("gathers_params"), roles),
        sequence_axes=_sequence_axes(axes, roles),
        load_balance=load_balance,
        pipeline=pipeline,
        strategy=strategy,
    )


def stage_plan(
    spec: ModelSpec,
    axes: Mapping[str, int],
    roles: Mapping[str, str],
    global_batch: int,
    pipeline: Mapping[str, Any] | None = None,
) -> StagePlan | None:
    """The pipeline the program runs over the mesh's stage axes (``None`` without
    them), from a plan's ``pipeline`` object.

    Raises:
      PlanError: ``invalid_parallelism`` for a pipeline
        :func:`~datarax.parallel.options.pipeline_shape` refuses (what the program does
        not build is refused before it: :func:`~datarax.parallel.options.check_program_builds`).
    """
    names = axes_where(axes, _SPLITS_LAYERS, roles)
    stages = math.prod(axes[a] for a in names)
    if stages <= 1 or not isinstance(spec, TransformerSpec):
        return None
    given = Pipeline(**{k: v for k, v in (pipeline or {}).items() if v is not None})
    shards = math.prod(axes[a] for a in batch_split_axes(axes, roles))
    # a mixture-of-experts model's stages hold whole units (its dense layers between
    # two MoE layers, then the MoE layer): the stages and passes divide the units
    units = spec.moe_layers if spec.is_moe else spec.layers
    shape = pipeline_shape(
        given, stages=stages, layers=units, local_batch=global_batch // max(shards, 1)
    )
    return StagePlan(names, stages, shape.microbatches, shape.repeats)


def _mlp_loss(spec: MLPSpec, constrain: ActivationLayout) -> StepLoss:
    dtype = _JNP_DTYPES[spec.dtype]
    n = len(spec.features) - 1

    def forward(params: Params, inputs: jax.Array) -> jax.Array:
        x = constrain(inputs.astype(dtype))
        for i in range(n):
            x = x @ params[f"layers/{i}/kernel"] + params[f"layers/{i}/bias"]
            # a col layer's output features are tensor-split, a row layer's are summed
            x = constrain(x, 1 if i % 2 == 0 else None)
            if i < n - 1:
                x = jax.nn.relu(x)
        return x

    if spec.remat == "full":
        forward = jax.checkpoint(forward)

    def loss(params: Params, batch: Params) -> jax.Array:
        out = forward(params, batch["inputs"]).astype(jnp.float32)
        if spec.loss == "cross_entropy":
            losses: jax.Array = optax.softmax_cross_entropy_with_integer_labels(
                out, batch["targets"]
            )
            return losses.mean()
        return jnp.mean((out - batch["targets"]) ** 2)

    return loss


def step_loss(
    spec: ModelSpec,
    mesh: Mesh,
    roles: Mapping[str, str] | None = None,
    *,
    load_balance: bool = True,
    pipeline: StagePlan | None = None,
    strategy: str = "all_gather",
) -> StepLoss:
    """``loss(params, batch)`` of the step: the MLP, or :mod:`datarax.models`'
    transformer (:func:`datarax.models.transformer_loss_fn`), with activations pinned to
    the plan's layout (``load_balance``: a context split's sequence order; ``strategy``:
    its ``all_gather`` or ``ring`` attention; ``pipeline``: the layers as stages)."""
    roles = axis_roles(list(mesh.axis_names), roles)
    layout = _activation_layout(mesh, roles, load_balance, pipeline, strategy)
    if isinstance(spec, MLPSpec):
        return _mlp_loss(spec, layout)
    return transformer_loss_fn(spec, layout)


def abstract_train_step(
    model: ModelSpec | Mapping[str, Any],
    mesh: Mesh,
    global_batch: int,
    *,
    roles: Mapping[str, str] | None = None,
    optimizer: str = "adam",
    context: Mapping[str, Any] | None = None,
    shard_over_data: bool = False,
    pipeline: Mapping[str, Any] | None = None,
) -> AbstractStep:
    """The training step of ``model`` on ``mesh``, from shapes only.

    Args:
      model: a spec or a plan request's ``model`` object (dtype default bfloat16).
      mesh: the mesh; its axis names carry roles (:func:`cost.axis_roles`).
      global_batch: examples (MLP) or sequences (transformer) per step, split over the
        ``data`` and ``fsdp`` axes.
      roles: ``{axis: role}`` overriding the name-derived roles.
      optimizer: ``adam``, ``adamw`` or ``sgd``.
      context: a plan's ``context_parallel`` (``{"strategy", "load_balance"}``): the
        ``all_gather`` strategy by default, or ``ring``; load-balanced by default.
      shard_over_data: ZeRO-1: the optimizer state split over the data axes as well.
      pipeline: a plan's ``pipeline`` (``{"microbatches", "layers_per_stage",
        "schedule"}``) for the stage axes (:func:`stage_plan`).

    Returns:
      The step and its abstract arguments: parameters sharded as
      :func:`cost.param_specs` says (a transformer's per-layer groups stacked
      ``[layers, ...]``, unsplit on that dimension), optimizer state like its
      parameters, the batch split over ``data`` x ``fsdp`` on its first dimension.

    Raises:
      PlanError: ``invalid_model``, ``unknown_axis_role``, ``unknown_optimizer``,
        ``batch_not_divisible``.
    """
    spec = model_spec(model)
    roles = axis_roles(list(mesh.axis_names), roles)
    check_compiled(dict(mesh.shape), roles)  # the kinds the program builds
    context = dict(context or {})
    sizes = dict(mesh.shape)
    check_program_builds(
        stages=math.prod(sizes[a] for a in axes_where(sizes, _SPLITS_LAYERS, roles)),
        context=math.prod(sizes[a] for a in _sequence_axes(sizes, roles)),
        schedule=(pipeline or {}).get("schedule"),
        strategy=context.get("strategy"),
    )
    try:
        opt = make_optimizer(optimizer, _LEARNING_RATE)
    except ValueError as error:
        raise PlanError("unknown_optimizer", str(error)) from None
    params = _param_tree(spec, mesh, roles)
    data = replica_axes(dict(mesh.shape), roles) if shard_over_data else ()
    opt_state = _opt_state_tree(params, opt, mesh, data)
    batch = _batch_tree(spec, mesh, roles, global_batch)
    stages = stage_plan(spec, dict(mesh.shape), roles, global_batch, pipeline)
    balance = bool(context.get("load_balance", True))
    strategy = context.get("strategy") or "all_gather"
    loss_fn = step_loss(spec, mesh, roles, load_balance=balance, pipeline=stages, strategy=strategy)

    def step(params: Params, opt_state: Any, batch: Params) -> tuple[Params, Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def shardings(tree: Any) -> Any:
        return jax.tree.map(lambda leaf: leaf.sharding, tree)

    outs = (shardings(params), shardings(opt_state), NamedSharding(mesh, P()))
    return AbstractStep(step, (params, opt_state, batch), outs)


# --------------------------------------------------------------------------- compiling


def count_collectives(hlo_text: str) -> dict[str, int]:
    """``{kind: n}`` of the collective instructions in (compiled) HLO text.

    An async pair (``all-gather-start`` / ``-done``) counts once; kinds that do not occur
    are left out.
    """
    counts: dict[str, int] = {}
    for match in _HLO_OP.finditer(hlo_text):
        counts[match.group(1)] = counts.get(match.group(1), 0) + 1
    return counts


def _is_oom(text: str) -> bool:
    return "RESOURCE_EXHAUSTED" in text or "CompileTimeHbmOom" in text


def compile_train_step(
    model: ModelSpec | Mapping[str, Any],
    mesh: Mesh,
    global_batch: int,
    *,
    roles: Mapping[str, str] | None = None,
    optimizer: str = "adam",
    hbm_bytes: int | None = None,
    on_phase: Callable[[str], None] | None = None,
    context: Mapping[str, Any] | None = None,
    shard_over_data: bool = False,
    pipeline: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Lowers and compiles the step (:func:`abstract_train_step`) and reads XLA's figures.

    Args:
      model, mesh, global_batch, roles, optimizer, context, shard_over_data, pipeline:
        as :func:`abstract_train_step`.
      hbm_bytes: memory of one device, for ``fits`` where the compiler does not check
        it itself (CPU and GPU compiles); TPU compiles refuse what exceeds HBM.
      on_phase: called with ``"lowering"`` and then ``"compiling"``.

    Returns:
      ``{"fits", "memory": {"argument_bytes", "output_bytes", "temp_bytes",
      "alias_bytes", "peak_bytes", "hbm_peak_bytes", "generated_code_bytes",
      "hbm_bytes", "host_temp_bytes", ...}, "flops", "bytes_accessed", "collectives",
      "lower_s", "compile_s", "xla_error"}``: per-device figures from ``memory_analysis()`` and
      ``cost_analysis()``. ``peak_bytes`` is XLA's ``peak_memory_in_bytes`` where the
      backend reports it, else ``argument + output - alias + temp``; on TPU it also
      counts buffers that memory-space assignment puts in on-chip VMEM.
      ``hbm_peak_bytes`` is ``total_allocation_bytes`` (else ``peak_bytes``): the
      device memory the program allocates (on TPU, HBM only: the memory-usage report's
      default memory space), the figure XLA's compile-time OOM check compares with the
      available HBM (its ``CompileTimeHbmOom`` text quotes it); ``fits`` is
      ``hbm_peak_bytes <= hbm_bytes``, ``None`` (unknown) without ``hbm_bytes``, never
      true by default. When XLA refuses the program for memory,
      ``fits`` is false, ``xla_error`` its text and the figures ``None``.
      ``host_temp_bytes`` is ``host_temp_size_in_bytes``: host memory (``pinned_host``)
      the program's temporaries take, e.g. activations a remat policy offloads;
      ``host_argument_bytes``, ``host_output_bytes`` and ``host_alias_bytes`` are added
      where the backend reports them (0 when none).

    Raises:
      PlanError: the codes of :func:`abstract_train_step`; ``model_too_large`` when the
        program cannot be lowered or compiled for a reason other than memory (XLA's
        text in the detail).
    """
    step = abstract_train_step(
        model,
        mesh,
        global_batch,
        roles=roles,
        optimizer=optimizer,
        context=context,
        shard_over_data=shard_over_data,
        pipeline=pipeline,
    )
    if on_phase:
        on_phase("lowering")
    start = time.perf_counter()
    try:
        lowered = step.jitted().lower(*step.args)
    except Exception as error:  # XLA/JAX raise many types for shapes they cannot take
        raise PlanError(
            "model_too_large", f"the step cannot be lowered: {_first_lines(error)}"
        ) from None
    lower_s = time.perf_counter() - start
    if on_phase:
        on_phase("compiling")
    start = time.perf_counter()
    try:
        compiled = lowered.compile()
    except Exception as error:
        text = str(error)
        if not _is_oom(text):
            raise PlanError(
                "model_too_large", f"XLA cannot compile the step: {_first_lines(error)}"
            ) from None
        return {
            "fits": False,
            "memory": None,
            "flops": None,
            "bytes_accessed": None,
            "collectives": None,
            "lower_s": lower_s,
            "compile_s": time.perf_counter() - start,
            "xla_error": text.strip()[:4000],
        }
    compile_s = time.perf_counter() - start
    return {**compiled_figures(compiled, hbm_bytes), "lower_s": lower_s, "compile_s": compile_s}


def compiled_figures(compiled: Any, hbm_bytes: int | None = None) -> dict[str, Any]:
    """``fits``, ``memory``, ``flops``, ``bytes_accessed``, ``collectives`` and
    ``xla_error`` (``None``) of a ``jax.stages.Compiled`` (see :func:`compile_train_step`).
    """
    stats = compiled.memory_analysis()
    argument = int(stats.argument_size_in_bytes)
    output = int(stats.output_size_in_bytes)
    alias = int(stats.alias_size_in_bytes)
    temp = int(stats.temp_size_in_bytes)
    peak = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
    if peak <= 0:
        peak = argument + output - alias + temp
    # What the program allocates in device memory (TPU: HBM, the default memory space
    # only); XLA's compile-time OOM check compares this figure with the HBM available.
    hbm_peak = int(getattr(stats, "total_allocation_bytes", 0) or 0) or peak
    cost = compiled.cost_analysis()
    if isinstance(cost, list | tuple):  # older jax: one dict per program
        cost = cost[0] if cost else {}
    cost = cost or {}
    fits = None if hbm_bytes is None else hbm_peak <= hbm_bytes  # unknown without a bound
    return {
        "fits": fits,
        "memory": {
            "argument_bytes": argument,
            "output_bytes": output,
            "temp_bytes": temp,
            "alias_bytes": alias,
            "peak_bytes": peak,
            "hbm_peak_bytes": hbm_peak,
            "generated_code_bytes": int(stats.generated_code_size_in_bytes),
            "hbm_bytes": hbm_bytes,
            **_host_figures(stats),
        },
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "collectives": count_collectives(compiled.as_text()),
        "xla_error": None,
    }


def _host_figures(stats: Any) -> dict[str, int]:
    """Host-memory figures of ``memory_analysis()``: ``host_temp_bytes`` always (0 where
    the backend has no such field), the host argument/output/alias sizes where present."""
    out = {"host_temp_bytes": int(getattr(stats, "host_temp_size_in_bytes", 0) or 0)}
    for field, key in (
        ("host_argument_size_in_bytes", "host_argument_bytes"),
        ("host_output_size_in_bytes", "host_output_bytes"),
        ("host_alias_size_in_bytes", "host_alias_bytes"),
    ):
        if hasattr(stats, field):
            out[key] = int(getattr(stats, field) or 0)
    return out


def _first_lines(error: BaseException, limit: int = 600) -> str:
    text = str(error).strip() or type(error).__name__
    return text[:limit]
