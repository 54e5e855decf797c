"""From a hardware plan to MaxText's command line.

:func:`maxtext_args` turns a stored hardware plan (the JSON of ``POST /v1/meshes``) into
the ``key=value`` arguments of MaxText's trainer and the environment its published
scripts set. The reverse, :func:`plan_request_from_maxtext` (MaxText's own keys to a
``POST /v1/meshes`` body in MaxText's device order), lives in
:mod:`datarax.launch.maxtext_plan_request`, and MaxText's facts at
:data:`MAXTEXT_COMMIT` (mesh axes, defaults, named models, script flags,
:func:`parse_maxtext_args`) in :mod:`datarax.launch.maxtext_config`; both are
re-exported here.

Choices:

- Our axes map onto MaxText's by name when the name is one of MaxText's mesh axes,
  else by role (:func:`datarax.estimate.cost.axis_roles`): data -> ``data``,
  fsdp -> ``fsdp``, tensor -> ``tensor``. Several of our axes landing on one MaxText axis
  are folded into it (sizes multiplied, per network); a size-1 axis without a role is
  dropped. A larger axis without a role is refused (``launch_target_unavailable``).
  Whenever the fold or MaxText's fixed axis order changes the mesh, ``notes`` says so,
  and whether MaxText's devices then sit where the plan put them (checked by planning
  MaxText's mesh with the same planner, which reproduces JAX's ``mesh_utils``: one
  slice ``create_device_mesh``, several ``create_hybrid_device_mesh``).

Example:
  >>> out = maxtext_args({"hardware": "tpu-v5e", "topology": "v5e:2x2", "slices": 1,
  ...     "hosts": 1, "ici": {"fsdp": 4}, "dcn": {"fsdp": 1}, "axes": {"fsdp": 4}})
  >>> [a for a in out["args"] if a.startswith("ici_fsdp")]
  ['ici_fsdp_parallelism=4', 'ici_fsdp_transpose_parallelism=1']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import numpy as np

from datarax.errors import PlanError
from datarax.hardware.chips import get_hardware
from datarax.hardware.topology import HardwareLayout, plan_hardware_devices
from datarax.json_types import JSONObject
from datarax.launch.maxtext_checks import MAXTEXT_VERSION, per_device_batch_size
from datarax.launch.maxtext_config import (
    AXIS_BY_ROLE,
    LIBTPU_INIT_ARGS,
    MAXTEXT_COMMIT,
    MAXTEXT_MESH_AXES,
    MAXTEXT_MODELS,
    MESH_AXIS_STEM,
    MLA_KEYS,
    MODEL_DEFAULTS,
    MOE_ARCH_KEYS,
    MOE_KEYS,
    SWIGLU,
    TE_MAX_SEGMENTS,
    XLA_FLAGS,
    format_value,
    parse_maxtext_args,
)
from datarax.launch.maxtext_plan_request import plan_request_from_maxtext
from datarax.parallel.axis_roles import axis_roles, check_named_kinds
from datarax.parallel.options import pipelined_layers
from datarax.specs.model_specs import MLA_FIELDS, MOE_FIELDS, TransformerSpec, model_spec
from datarax.specs.named_models import named_model

__all__ = [
    "LIBTPU_INIT_ARGS",
    "MAXTEXT_COMMIT",
    "MAXTEXT_MESH_AXES",
    "MAXTEXT_MODELS",
    "MaxTextArgs",
    "XLA_FLAGS",
    "maxtext_args",
    "parse_maxtext_args",
    "plan_request_from_maxtext",
]


# ------------------------------------------------------------------------ plan -> args


class MaxTextArgs(TypedDict):
    """:func:`maxtext_args`' answer: MaxText's ``key=value`` arguments, the environment
    its chips need, where each variable comes from, and notes on what was left out."""

    args: list[str]
    env: dict[str, str]
    env_sources: dict[str, str]
    notes: list[str]
    refusal: str | None
    """why MaxText would not train the plan's model as planned (a mixture of experts it
    has no decoder block for), else ``None``: whatever runs MaxText with these arguments
    refuses with 422 ``not_launchable``"""


# opt_type -> our optimizer name
_OPT_TYPE = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd"}


def _unavailable(message: str) -> PlanError:
    return PlanError("launch_target_unavailable", message)


def _plan_layout(
    plan: Mapping[str, Any], ici: Mapping[str, int], dcn: Mapping[str, int], split: bool | None
) -> HardwareLayout:
    """Plans ``ici``/``dcn`` on the plan's cluster; ``split=None`` splits only if needed."""
    kwargs: dict[str, Any] = {"ici": dict(ici), "dcn": dict(dcn)}
    if get_hardware(plan["hardware"]).kind == "tpu":
        kwargs.update(topology=plan["topology"], slices=int(plan.get("slices") or 1))
    else:
        kwargs["hosts"] = int(plan["hosts"])
    if split is not None:
        return plan_hardware_devices(plan["hardware"], allow_split_physical_axes=split, **kwargs)
    try:
        return plan_hardware_devices(plan["hardware"], **kwargs)
    except PlanError as error:
        if error.code != "physical_axes_split_required":
            raise
        return plan_hardware_devices(plan["hardware"], allow_split_physical_axes=True, **kwargs)


def _map_axes(
    names: Sequence[str], ici: Mapping[str, int], dcn: Mapping[str, int], notes: list[str]
) -> dict[str, list[str]]:
    """``{maxtext_axis: [our axes, mesh order]}``; size-1 axes without a role dropped.

    Raises:
      PlanError: ``invalid_parallelism`` for an axis over 1 of a kind not priced.
    """
    check_named_kinds({name: ici[name] * dcn[name] for name in names})
    targets: dict[str, list[str]] = {axis: [] for axis in MAXTEXT_MESH_AXES}
    for name in names:
        if name in targets:
            targets[name].append(name)
            continue
        try:
            role = axis_roles([name])[name]
        except PlanError:
            if ici[name] * dcn[name] == 1:
                notes.append(f"axis {name!r} (size 1) has no MaxText name; left out")
                continue
            raise _unavailable(
                f"axis {name!r} (size {ici[name] * dcn[name]}) has no role MaxText knows: "
                f"name it data, fsdp or tensor (or one of MaxText's mesh axes "
                f"{list(MAXTEXT_MESH_AXES)}) and plan again"
            ) from None
        targets[AXIS_BY_ROLE[role]].append(name)
    for axis, ours in targets.items():
        if len(ours) > 1:
            notes.append(
                f"axes {ours} all map to MaxText's {axis!r} and are folded into it "
                f"(ici and dcn sizes multiplied)"
            )
    return targets


def _order_notes(
    plan: Mapping[str, Any],
    names: list[str],
    targets: dict[str, list[str]],
    ours: np.ndarray,
    theirs: HardwareLayout,
) -> list[str]:
    """What MaxText's fixed order and the folds change, and whether the devices move."""
    sizes = plan["axes"]
    mine = [n for n in names if sizes[n] > 1]
    order = [n for axis in MAXTEXT_MESH_AXES for n in targets[axis]]
    in_theirs = [n for n in order if sizes[n] > 1]
    folded = any(len(v) > 1 for v in targets.values())
    if mine == in_theirs and not folded:
        return []
    kept = [n for n in names if n in order]
    grid = ours.reshape([sizes[n] for n in names])
    drop = tuple(i for i, n in enumerate(names) if n not in order)
    grid = grid.reshape([s for i, s in enumerate(grid.shape) if i not in drop])
    grid = grid.transpose([kept.index(n) for n in order])
    same = np.array_equal(grid.reshape(theirs.device_grid.shape), theirs.device_grid)
    mt = [f"{axis}" for axis in MAXTEXT_MESH_AXES if theirs.axes[axis] > 1]
    what = (
        "every device sits where the plan put it (same groups per axis)"
        if same
        else "MaxText's create_device_mesh then places devices differently from this plan "
        "(other chips form each axis' groups); plan with ici/dcn in MaxText's order "
        "(plan_request_from_maxtext) to get its exact order"
    )
    return [
        f"MaxText's mesh axes are in its fixed order {mt} where the plan has {mine}: the "
        f"mesh is transposed to that order (shardings name the same axes); {what}"
    ]


def _batch_args(plan: Mapping[str, Any], devices: int) -> JSONObject:
    """``per_device_batch_size``: the global batch over the devices, as the float MaxText
    reads back as it (:func:`~datarax.launch.maxtext_checks.per_device_batch_size`)."""
    batch = plan.get("batch")
    if not batch or not batch.get("shape"):
        return {}
    spec = model_spec(plan["model"]) if plan.get("model") else None
    if isinstance(spec, TransformerSpec):
        seq, tiles = spec.seq_len, spec.vocab_tiling
    else:
        seq, tiles = MODEL_DEFAULTS["max_target_length"], 1
    per_device = per_device_batch_size(int(batch["shape"][0]), devices, seq, tiles)
    return {"per_device_batch_size": per_device}


def _model_args(
    plan: Mapping[str, Any], gpu: bool, notes: list[str], refusals: list[str]
) -> JSONObject:
    model = plan.get("model")
    if not model:
        return {}
    spec = model_spec(model)
    if not isinstance(spec, TransformerSpec):
        notes.append("the plan's model is an MLP: MaxText trains transformers; no model keys")
        return {}
    out: dict[str, Any] = {}
    name = getattr(spec, "name", None)
    table = MAXTEXT_MODELS.get(name) if name else None
    arch: dict[str, Any] = {
        "base_emb_dim": spec.d_model,
        "base_num_query_heads": spec.heads,
        "base_num_kv_heads": spec.kv_heads,
        "base_mlp_dim": spec.d_ff,
        "base_num_decoder_layers": spec.layers,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab,
        "mlp_activations": SWIGLU if spec.mlp == "gated" else ["gelu"],
        "logits_via_embedding": spec.tied_embeddings,
        **_moe_mla_args(spec),
    }
    if table is not None:
        out["model_name"] = name
        pairs = table.get("layers_per_decoder_layer", 1)
        fields = {k: v for k, v in named_model(name).items() if k in _NAMED_ARCH}
        if all(model.get(k, v) == v for k, v in fields.items()):
            # the named model as MaxText has it: its own values, so no key is overridden
            arch = {
                **{k: v for k, v in table.items() if k in arch},
                **{k: v for k, v in arch.items() if k in _MOE_ARCH and k not in table},
            }
            if pairs > 1:
                notes.append(
                    f"{name}: MaxText counts {pairs} layers per decoder layer "
                    f"(base_num_decoder_layers={table['base_num_decoder_layers']} for "
                    f"{spec.layers} layers)"
                )
        else:
            if spec.layers % pairs:
                raise _unavailable(
                    f"{name} has {spec.layers} layers; MaxText builds it from pairs of "
                    f"layers: use an even layer count"
                )
            arch["base_num_decoder_layers"] = spec.layers // pairs
            if spec.mlp == named_model(name)["mlp"]:
                arch["mlp_activations"] = table["mlp_activations"]
            out["override_model_config"] = True
            notes.append(
                f"the plan changes {name}'s architecture: override_model_config=true lets "
                f"the keys below override MaxText's {name}.yml"
            )
    if table is None and spec.is_moe:
        block, refusal = _moe_block(spec)
        if refusal is not None:
            notes.append(refusal)
            refusals.append(refusal)
        else:
            out["decoder_block"] = block
        if block == "mixtral":
            # the mixtral block sizes its experts by mlp_dim (every layer is MoE, so the
            # dense width is read nowhere else)
            arch["base_mlp_dim"] = spec.moe_d_ff or spec.d_ff
    if spec.attention_type == "mla":
        arch.pop("head_dim", None)  # MLA's head widths are its own keys
    out.update(arch)
    out["dtype"] = spec.dtype
    out["weight_dtype"] = spec.param_dtype
    out["remat_policy"] = spec.remat
    places = spec.remat_places()
    if spec.remat == "custom" and places is not None:
        out.update(places)
    out["attention"] = (
        ("cudnn_flash_te" if gpu else "flash") if spec.attention == "flash" else ("dot_product")
    )
    if out["attention"] == "cudnn_flash_te":
        # TransformerEngine's attention with packed sequences needs a bound on them
        # (MaxText refuses it without); 32 is what MaxText's GPU model configs set
        out["max_segments_per_seq"] = TE_MAX_SEGMENTS
    out["num_vocab_tiling"] = spec.vocab_tiling
    out["max_target_length"] = spec.seq_len
    if spec.is_moe:
        out["capacity_factor"] = spec.capacity_factor if not spec.dropless else -1
        out["sparse_matmul"] = spec.moe_kernel == "sparse"
    return out


def _moe_block(spec: TransformerSpec) -> tuple[str | None, str | None]:
    """``(decoder_block, refusal)``: MaxText's ``decoder_block`` for a mixture of experts
    without a ``model_name`` (base.yml's ``llama2`` block would build it dense, ignoring
    ``num_experts``), or why there is none.

    ``mixtral`` (attention and routed experts in every layer) for grouped-query attention
    without shared experts or leading dense layers; ``deepseek`` (MLA, routed and shared
    experts, ``first_num_dense_layers``) for MLA with shared experts. MaxText 0.2.5 has no
    block for the other mixtures but its named models' own (``qwen3_moe``, ``llama4``,
    ``gpt_oss``): a launch that runs MaxText on them is 422 ``not_launchable``."""
    every = spec.moe_every or 1
    if spec.attention_type == "mla":
        if spec.shared_experts and every == 1:
            return "deepseek", None
        reason = "MLA with routed experts alone or interleaved with dense layers"
    elif not spec.shared_experts and not spec.first_dense_layers and every == 1:
        return "mixtral", None
    else:
        reason = (
            "grouped-query attention with shared experts, leading dense layers or experts "
            "every few layers"
        )
    return None, (
        f"MaxText {MAXTEXT_VERSION} has no decoder block for this mixture of experts "
        f"({reason}) but a named model's: without one it would build the model dense. "
        "Accepted: a named model (model.name, e.g. llama4-17b-16e for experts every few "
        "layers), or experts in every layer with grouped-query attention and neither shared "
        "experts nor leading dense layers (MaxText's mixtral block), or MLA with shared "
        "experts (its deepseek block)"
    )


# MaxText keys of the MoE and MLA fields a named model's config sets (or base.yml's
# default it keeps): written from the spec even when the model is named.
_MOE_ARCH = (*MOE_ARCH_KEYS, "attention_type", *MLA_KEYS)


def _moe_mla_args(spec: TransformerSpec) -> JSONObject:
    """MaxText's mixture-of-experts and MLA keys of a spec (none for a dense ``mha``
    model, which base.yml's defaults describe)."""
    out: JSONObject = {}
    if spec.is_moe:
        out.update({key: getattr(spec, MOE_KEYS[key]) for key in MOE_ARCH_KEYS})
    if spec.attention_type == "mla":
        out["attention_type"] = "mla"
        out.update({key: getattr(spec, key) for key in MLA_KEYS})
    return out


_NAMED_ARCH = (
    "layers",
    "d_model",
    "d_ff",
    "heads",
    "kv_heads",
    "head_dim",
    "vocab",
    "mlp",
    "tied_embeddings",
    *(field for field in MOE_FIELDS if field not in ("capacity_factor", "moe_kernel")),
    *MLA_FIELDS,
)


def _pipelined(plan: Mapping[str, Any]) -> tuple[int | None, int]:
    """``(pipelined layers, our layers per MaxText decoder layer)`` of the plan's model:
    the layers the stages split (:func:`~datarax.parallel.options.pipelined_layers`;
    ``None`` without a transformer) and 2 for a model MaxText builds of layer pairs."""
    model = plan.get("model")
    spec = model_spec(model) if model else None
    if not isinstance(spec, TransformerSpec):
        return None, 1
    name = getattr(spec, "name", None)
    pairs = int(MAXTEXT_MODELS[name].get("layers_per_decoder_layer", 1)) if name else 1
    return pipelined_layers(spec), pairs


def _parallel_args(plan: Mapping[str, Any], tpu: bool, notes: list[str]) -> JSONObject:
    """MaxText's keys of the plan's pipeline (``step_estimate.pipeline``), context
    strategy (``context_parallel``) and ZeRO-1 (``shard_over_data``). MaxText runs one
    schedule, circular GPipe; a 1f1b plan is noted, its bubble and memory being
    another schedule's. The pipeline's extent is written as MaxText counts it
    (``pipeline_parallel_layers``: a DeepSeek-style model's MoE layers, its leading dense
    ones running before the pipeline; MaxText's decoder layers, which are pairs of ours
    for Gemma 2), and its repeats too, so MaxText runs the circular shape the plan
    priced or refuses. TPU ring attention is Tokamax's splash kernel
    (``use_tokamax_splash=true``, which MaxText's ring needs there)."""
    out: JSONObject = {}
    pipeline = (plan.get("step_estimate") or {}).get("pipeline")
    if pipeline:
        layers, pairs = _pipelined(plan)
        per_stage = int(pipeline["layers_per_stage"])
        out["num_pipeline_microbatches"] = pipeline["microbatches"]
        out["num_layers_per_pipeline_stage"] = (
            per_stage // pairs if per_stage % pairs == 0 else per_stage
        )
        if layers is not None:
            out["pipeline_parallel_layers"] = layers // pairs
        out["num_pipeline_repeats"] = pipeline["repeats"]
        if pipeline["schedule"] in ("1f1b", "interleaved_1f1b"):
            notes.append(
                f"the plan prices a {pipeline['schedule']} schedule; MaxText runs its circular "
                "(GPipe-like) one, which keeps every microbatch's activations"
            )
    context = plan.get("context_parallel")
    if context:
        out["context_parallel_strategy"] = context["strategy"]
        out["context_parallel_load_balance"] = context["load_balance"]
        if context["strategy"] == "ring" and tpu:
            out["use_tokamax_splash"] = True
    if plan.get("shard_over_data"):
        out["shard_optimizer_over_data"] = True
    return out


def _env(hardware: str) -> tuple[dict[str, str], dict[str, str]]:
    if hardware in LIBTPU_INIT_ARGS:
        entry, var = LIBTPU_INIT_ARGS[hardware], "LIBTPU_INIT_ARGS"
    elif hardware in XLA_FLAGS:
        entry, var = XLA_FLAGS[hardware], "XLA_FLAGS"
    else:
        return {}, {}
    return {var: " ".join(entry["flags"])}, {var: entry["source"]}


def maxtext_args(plan: Mapping[str, Any]) -> MaxTextArgs:
    """MaxText's command line and environment for a stored hardware plan.

    Args:
      plan: a hardware plan as ``POST /v1/meshes`` answers it: ``hardware``,
        ``topology`` (TPU), ``slices``, ``hosts``, ``ici``/``dcn`` (ordered
        ``{axis: size}`` over the mesh axes), ``axes``, ``batch`` (``{"shape":
        [global_batch, ...]}`` or null), ``model`` (a resolved transformer spec) and
        ``device_grid`` (optional: replanned from ``ici``/``dcn`` when absent).

    Returns:
      ``{"args": ["key=value", ...], "env": {var: flags}, "env_sources": {var: script
      URL}, "notes": [...]}``. ``args``: ``ici_<stem>_parallelism`` and
      ``dcn_<stem>_parallelism`` for every one of MaxText's mesh axes (stem
      ``pipeline`` for ``stage``; 1 where unused), ``num_slices``,
      ``allow_split_physical_axes``, ``hardware`` (``tpu``/``gpu``),
      ``per_device_batch_size`` (global batch / all devices) with a batch, and with a
      transformer its MaxText keys (``base_emb_dim`` ... ``max_target_length``;
      ``model_name`` for a named model, whose own values are then used;
      ``max_segments_per_seq`` with TransformerEngine's attention), with a pipeline its
      ``num_pipeline_microbatches``, ``num_layers_per_pipeline_stage``,
      ``pipeline_parallel_layers`` and ``num_pipeline_repeats``, with a context axis its
      strategy (and ``use_tokamax_splash`` for ring on TPU). ``env``:
      ``LIBTPU_INIT_ARGS`` (TPU) or ``XLA_FLAGS`` (GPU), empty on CPU. Whether MaxText
      accepts them is :func:`~datarax.launch.maxtext_checks.check_maxtext_launch`'s (the
      launch config runs it).

    Raises:
      PlanError: ``launch_target_unavailable`` for a plan without hardware, or an axis
        of size > 1 MaxText has no name or role for; the planner's codes for a plan
        whose ``ici``/``dcn`` no longer plan.

    Example:
      >>> out = maxtext_args({"hardware": "tpu-v5e", "topology": "v5e:2x2", "slices": 1,
      ...     "hosts": 1, "ici": {"data": 4}, "dcn": {"data": 1}, "axes": {"data": 4}})
      >>> "ici_data_parallelism=4" in out["args"], out["env_sources"]["LIBTPU_INIT_ARGS"][-10:]
      (True, 'v5e/16b.sh')
    """
    if not isinstance(plan, Mapping) or not plan.get("hardware") or not plan.get("ici"):
        raise _unavailable(
            "MaxText needs a hardware plan (hardware, ici, dcn); plan with hardware and ici"
        )
    entry = get_hardware(plan["hardware"])
    ici = {str(k): int(v) for k, v in plan["ici"].items()}
    dcn = {k: int((plan.get("dcn") or {}).get(k, 1)) for k in ici}
    names = list(ici)
    notes: list[str] = []
    targets = _map_axes(names, ici, dcn, notes)
    mt_ici = {a: math.prod(ici[n] for n in targets[a]) for a in MAXTEXT_MESH_AXES}
    mt_dcn = {a: math.prod(dcn[n] for n in targets[a]) for a in MAXTEXT_MESH_AXES}
    theirs = _plan_layout(plan, mt_ici, mt_dcn, None)
    if plan.get("device_grid") is not None:
        ours = np.asarray(plan["device_grid"], dtype=np.int64).ravel()
    else:
        ours = _plan_layout(plan, ici, dcn, None).device_ids
    axes = {n: ici[n] * dcn[n] for n in names}
    notes.extend(_order_notes({**plan, "axes": axes}, names, targets, ours, theirs))
    if theirs.split_physical_axes:
        notes.append("MaxText's mesh splits physical axes: allow_split_physical_axes=true")
    values: dict[str, Any] = {}
    for axis in MAXTEXT_MESH_AXES:
        values[f"ici_{MESH_AXIS_STEM[axis]}_parallelism"] = mt_ici[axis]
    for axis in MAXTEXT_MESH_AXES:
        values[f"dcn_{MESH_AXIS_STEM[axis]}_parallelism"] = mt_dcn[axis]
    values["num_slices"] = theirs.slices
    values["allow_split_physical_axes"] = theirs.split_physical_axes
    values["hardware"] = entry.kind
    values.update(_batch_args(plan, theirs.num_devices))
    refusals: list[str] = []
    values.update(_model_args(plan, entry.kind == "gpu", notes, refusals))
    values.update(_parallel_args(plan, entry.kind == "tpu", notes))
    optimizer = plan.get("optimizer")
    optimizer = optimizer.get("name") if isinstance(optimizer, Mapping) else optimizer
    if optimizer in _OPT_TYPE:
        values["opt_type"] = _OPT_TYPE[optimizer]
    env, sources = _env(entry.name)
    refused = LIBTPU_INIT_ARGS.get(entry.name, {}).get("refused", {})
    notes.extend(f"LIBTPU_INIT_ARGS leaves out {flag}: {why}" for flag, why in refused.items())
    return {
        "args": [f"{k}={format_value(v)}" for k, v in values.items()],
        "env": env,
        "env_sources": sources,
        "notes": notes,
        "refusal": refusals[0] if refusals else None,
    }
