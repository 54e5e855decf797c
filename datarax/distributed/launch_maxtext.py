"""From a hardware plan to MaxText's command line, and from MaxText's keys to a plan.

:func:`maxtext_args` turns a stored hardware plan (the JSON of ``POST /v1/meshes``) into
the ``key=value`` arguments of MaxText's trainer and the environment its published
scripts set; :func:`plan_request_from_maxtext` turns MaxText's own keys into a
``POST /v1/meshes`` body whose axes are MaxText's mesh axes in MaxText's order, so the
planner's device order is the one MaxText's ``create_device_mesh`` builds.

Facts come from MaxText (repository AI-Hypercomputer/maxtext) at commit
:data:`MAXTEXT_COMMIT`: the mesh axes and key names from ``src/maxtext/configs/base.yml``,
``create_device_mesh`` from ``src/maxtext/utils/maxtext_utils.py`` (``ici_map``:
axis ``stage`` reads ``ici_pipeline_parallelism``, every other axis
``ici_<axis>_parallelism``; one slice: ``mesh_utils.create_device_mesh``, several:
``create_hybrid_device_mesh``), the named models from ``src/maxtext/configs/models/``
and the flags from the scripts :data:`LIBTPU_INIT_ARGS` and :data:`XLA_FLAGS` name.

Choices:

- Our axes map onto MaxText's by name when the name is one of MaxText's mesh axes,
  else by role (:func:`datarax.distributed.cost.axis_roles`): data -> ``data``,
  fsdp -> ``fsdp``, tensor -> ``tensor``. Several of our axes landing on one MaxText axis
  are folded into it (sizes multiplied, per network); a size-1 axis without a role is
  dropped. A larger axis without a role is refused (``launch_target_unavailable``).
  Whenever the fold or MaxText's fixed axis order changes the mesh, ``notes`` says so,
  and whether MaxText's devices then sit where the plan put them (checked by planning
  MaxText's mesh with the same planner, which reproduces JAX's ``mesh_utils``).
- The reverse takes MaxText's defaults (base.yml) for keys not given, as MaxText does:
  ``ici_fsdp_parallelism=-1``, ``dcn_data_parallelism=-1``, the rest 1. Axes other than
  ``data``, ``fsdp``, ``fsdp_transpose`` and ``tensor`` must be 1 (no pipelines,
  experts, context or DiLoCo replicas here), and keys that change MaxText's device order
  in ways this planner does not follow (``mesh_axes``, ``custom_mesh``, ...) must keep
  their defaults; both are refused with ``invalid_maxtext_config``. A misspelt
  ``ici_*``/``dcn_*`` key is refused too. Any other key is ignored and, with ``notes``,
  listed there: it does not change the plan.

Example:
  >>> body = plan_request_from_maxtext(
  ...     {"ici_fsdp_parallelism": 4, "ici_tensor_parallelism": 4}, hardware="tpu-v5e",
  ...     topology="4x4")
  >>> {k: v for k, v in body["ici"].items() if v != 1}
  {'fsdp': 4, 'tensor': 4}
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from datarax.distributed.cost import axis_roles
from datarax.distributed.hardware import get_hardware
from datarax.distributed.model_specs import REMAT_POLICIES, REMAT_TENSORS, model_spec
from datarax.distributed.named_models import MODELS, named_model
from datarax.distributed.planning import PlanError
from datarax.distributed.topology import (
    HardwareLayout,
    parse_tpu_topology,
    plan_hardware_devices,
)

__all__ = [
    "LIBTPU_INIT_ARGS",
    "MAXTEXT_COMMIT",
    "MAXTEXT_MESH_AXES",
    "MAXTEXT_MODELS",
    "XLA_FLAGS",
    "maxtext_args",
    "parse_maxtext_args",
    "plan_request_from_maxtext",
]

MAXTEXT_COMMIT = "e591f30cbbf217ed67ef71263ec0538239f9c3b8"
"""The MaxText commit every fact of this module was read at (2026-08-22)."""

_BLOB = f"https://github.com/AI-Hypercomputer/maxtext/blob/{MAXTEXT_COMMIT}/"

MAXTEXT_MESH_AXES: tuple[str, ...] = (
    "diloco",
    "data",
    "stage",
    "fsdp",
    "fsdp_transpose",
    "context",
    "context_usp_ulysses",
    "context_autoregressive",
    "tensor",
    "tensor_sequence",
    "expert",
    "autoregressive",
)
"""base.yml's ``mesh_axes``, in MaxText's order (the order of its device mesh)."""

# create_device_mesh's ici_map/dcn_map: the key stem each mesh axis reads.
_STEM = {axis: "pipeline" if axis == "stage" else axis for axis in MAXTEXT_MESH_AXES}
# base.yml's defaults; every other ici_/dcn_ key defaults to 1.
_DEFAULT_ICI = {"fsdp": -1}
_DEFAULT_DCN = {"data": -1}
# ici_/dcn_ keys base.yml has that name no mesh axis (create_device_mesh never reads them
# with the default mesh_axes).
_STEMS_WITHOUT_AXIS = ("sequence",)
_PLANNED_AXES = ("data", "fsdp", "fsdp_transpose", "tensor")
_BY_ROLE = {"data": "data", "fsdp": "fsdp", "tensor": "tensor"}
_BATCH_AXES = ["data", "fsdp", "fsdp_transpose"]

# Keys that change MaxText's device order beyond ici/dcn: they must keep these defaults.
_ORDER_KEYS: dict[str, Any] = {
    "mesh_axes": list(MAXTEXT_MESH_AXES),
    "custom_mesh": "",
    "custom_mesh_and_rule": "",
    "optimize_mesh_for_tpu_v6e": False,
    "subslice_shape": "",
    "elastic_enabled": False,
    "inference_benchmark_test": False,
    "internal_compile": False,
}

# base.yml defaults of the model keys (MaxText trains its default model without them).
_MODEL_DEFAULTS: dict[str, Any] = {
    "base_emb_dim": 2048,
    "base_num_query_heads": 16,
    "base_num_kv_heads": 16,
    "base_mlp_dim": 7168,
    "base_num_decoder_layers": 16,
    "head_dim": 128,
    "vocab_size": 32000,
    "mlp_activations": ["silu", "linear"],
    "logits_via_embedding": False,
    "dtype": "bfloat16",
    "weight_dtype": "float32",
    "remat_policy": "full",
    "attention": "autoselected",
    "num_vocab_tiling": 1,
    "max_target_length": 2048,
}
_PER_DEVICE_BATCH_DEFAULT = 12.0
# Architecture keys a MaxText model config sets, and our field for each.
_ARCH_FIELDS = {
    "base_emb_dim": "d_model",
    "base_num_query_heads": "heads",
    "base_num_kv_heads": "kv_heads",
    "base_mlp_dim": "d_ff",
    "base_num_decoder_layers": "layers",
    "head_dim": "head_dim",
    "vocab_size": "vocab",
}
_OTHER_MODEL_KEYS = (
    "model_name",
    "override_model_config",
    "mlp_activations",
    "logits_via_embedding",
    "dtype",
    "weight_dtype",
    "remat_policy",
    "attention",
    "num_vocab_tiling",
    "max_target_length",
    "per_device_batch_size",
)
_ATTENTION_IN = {
    "flash": "flash",
    "autoselected": "flash",
    "cudnn_flash_te": "flash",
    "dot_product": "dot",
}
_DTYPES = ("float32", "bfloat16", "float16")


def _model(
    name: str,
    emb: int,
    q: int,
    kv: int,
    mlp: int,
    layers: int,
    head: int,
    vocab: int,
    acts: list[str],
    tied: bool,
) -> dict[str, Any]:
    return {
        "base_emb_dim": emb,
        "base_num_query_heads": q,
        "base_num_kv_heads": kv,
        "base_mlp_dim": mlp,
        "base_num_decoder_layers": layers,
        "head_dim": head,
        "mlp_activations": acts,
        "vocab_size": vocab,
        "logits_via_embedding": tied,
        "source": f"{_BLOB}src/maxtext/configs/models/{name}.yml",
    }


_SWIGLU = ["silu", "linear"]
MAXTEXT_MODELS: dict[str, dict[str, Any]] = {
    "llama2-7b": _model("llama2-7b", 4096, 32, 32, 11008, 32, 128, 32000, _SWIGLU, False),
    "llama2-13b": _model("llama2-13b", 5120, 40, 40, 13824, 40, 128, 32000, _SWIGLU, False),
    "llama2-70b": _model("llama2-70b", 8192, 64, 8, 28672, 80, 128, 32000, _SWIGLU, False),
    "llama3.1-8b": _model("llama3.1-8b", 4096, 32, 8, 14336, 32, 128, 128256, _SWIGLU, False),
    "llama3.1-70b": _model("llama3.1-70b", 8192, 64, 8, 28672, 80, 128, 128256, _SWIGLU, False),
    "llama3.1-405b": _model(
        "llama3.1-405b", 16384, 128, 8, 53248, 126, 128, 128256, _SWIGLU, False
    ),
    "mistral-7b": _model("mistral-7b", 4096, 32, 8, 14336, 32, 128, 32000, _SWIGLU, False),
    # Gemma 2: one MaxText decoder layer is a (local, global) attention pair.
    "gemma2-9b": {
        **_model("gemma2-9b", 3584, 16, 8, 14336, 21, 256, 256128, ["gelu", "linear"], True),
        "layers_per_decoder_layer": 2,
    },
    "gemma2-27b": {
        **_model("gemma2-27b", 4608, 32, 16, 36864, 23, 128, 256128, ["gelu", "linear"], True),
        "layers_per_decoder_layer": 2,
    },
    "gpt3-175b": _model("gpt3-175b", 12288, 96, 96, 49152, 96, 128, 50304, ["gelu"], True),
}
"""MaxText's ``configs/models/<name>.yml`` architecture keys for the named models of
:mod:`datarax.distributed.named_models` (all of them have one), with ``source``."""

_TPU_SCRIPTS = "src/maxtext/configs/tpu"
LIBTPU_INIT_ARGS: dict[str, dict[str, Any]] = {
    "tpu-v4": {
        "source": f"{_BLOB}{_TPU_SCRIPTS}/v4/22b.sh",
        "flags": ["--xla_enable_async_all_gather=true", "TPU_MEGACORE=MEGACORE_DENSE"],
    },
    "tpu-v5e": {
        "source": f"{_BLOB}{_TPU_SCRIPTS}/v5e/16b.sh",
        "flags": [
            "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
            "--xla_tpu_data_parallel_opt_different_sized_ops=true",
            "--xla_tpu_enable_async_collective_fusion=true",
            "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
            "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
            "--xla_tpu_overlap_compute_collective_tc=true",
            "--xla_enable_async_all_gather=true",
        ],
    },
    "tpu-v5p": {
        "source": f"{_BLOB}{_TPU_SCRIPTS}/v5p/128b.sh",
        "flags": [
            "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
            "--xla_tpu_megacore_fusion_allow_ags=false",
            "--xla_enable_async_collective_permute=true",
            "--xla_tpu_enable_ag_backward_pipelining=true",
            "--xla_tpu_enable_data_parallel_all_reduce_opt=true",
            "--xla_tpu_data_parallel_opt_different_sized_ops=true",
            "--xla_tpu_enable_async_collective_fusion=true",
            "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
            "--xla_tpu_overlap_compute_collective_tc=true",
            "--xla_enable_async_all_gather=true",
        ],
    },
    "tpu-v6e": {
        "source": f"{_BLOB}{_TPU_SCRIPTS}/v6e/llama2_7b_4096.sh",
        "flags": [
            "--xla_tpu_scoped_vmem_limit_kib=98304",
            "--xla_enable_async_all_gather=true",
            "--xla_tpu_overlap_compute_collective_tc=true",
            "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
            "--xla_tpu_enable_async_collective_fusion=true",
            "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true",
        ],
    },
}
"""Per TPU generation: the ``LIBTPU_INIT_ARGS`` one of MaxText's published training
scripts exports (``flags``, in the script's order) and that script (``source``)."""

# MaxText publishes GPU training scripts for A3 (H100) only; their XLA flags (less the
# script's own --xla_dump_to=<run dir>) serve the other GPUs too, and the source says so.
_A3_SCRIPT = f"{_BLOB}src/maxtext/configs/gpu/a3/llama_2_7b/4vm.sh"
_A3_FLAGS = [
    "--xla_gpu_enable_latency_hiding_scheduler=true",
    "--xla_gpu_enable_triton_gemm=false",
    "--xla_gpu_enable_command_buffer=''",
    "--xla_gpu_enable_highest_priority_async_stream=true",
    "--xla_gpu_all_reduce_combine_threshold_bytes=536870912",
    "--xla_gpu_all_gather_combine_threshold_bytes=134217728",
    "--xla_gpu_reduce_scatter_combine_threshold_bytes=67108864",
    "--xla_gpu_pipeline_all_gather=on",
    "--xla_gpu_pipeline_reduce_scatter=on",
    "--xla_gpu_pipeline_all_reduce=on",
    "--xla_gpu_enable_while_loop_double_buffering=true",
    "--xla_gpu_enable_all_gather_combine_by_dim=false",
    "--xla_gpu_enable_reduce_scatter_combine_by_dim=false",
    "--xla_disable_hlo_passes=rematerialization",
]
_NOT_A3 = " (MaxText publishes no {gpu} script at this commit; the A3 H100 flags)"
XLA_FLAGS: dict[str, dict[str, Any]] = {
    "h100-sxm": {"source": _A3_SCRIPT, "flags": _A3_FLAGS},
    **{
        gpu: {"source": _A3_SCRIPT + _NOT_A3.format(gpu=gpu), "flags": _A3_FLAGS}
        for gpu in ("h200-sxm", "b200", "gb200-nvl72")
    },
}
"""Per GPU of the catalog: the ``XLA_FLAGS`` of MaxText's A3 multi-node script."""


# ------------------------------------------------------------------------------ values


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_format(v) for v in value) + "]"
    return str(value)


def _parse_value(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_parse_value(part) for part in inner.split(",")] if inner else []
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if re.fullmatch(r"[-+]?\d[\d_]*", text):
        return int(text.replace("_", ""))
    if re.fullmatch(r"[-+]?(\d[\d_]*)?\.?\d*([eE][-+]?\d+)?", text) and any(
        c.isdigit() for c in text
    ):
        return float(text.replace("_", ""))
    return text


def parse_maxtext_args(args: Sequence[str]) -> dict[str, Any]:
    """``["key=value", ...]`` as MaxText's command line reads them (YAML scalars, lists).

    Raises:
      PlanError: ``invalid_maxtext_config`` for an argument without ``=``.

    Example:
      >>> parse_maxtext_args(["ici_fsdp_parallelism=-1", "mlp_activations=[silu,linear]"])
      {'ici_fsdp_parallelism': -1, 'mlp_activations': ['silu', 'linear']}
    """
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, value = str(arg).partition("=")
        if not sep or not key:
            raise PlanError(
                "invalid_maxtext_config",
                f"argument {arg!r} is not key=value; write MaxText keys as e.g. "
                f"ici_fsdp_parallelism=8",
            )
        out[key.strip()] = _parse_value(value)
    return out


# ------------------------------------------------------------------------ plan -> args


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
    """``{maxtext_axis: [our axes, mesh order]}``; size-1 axes without a role dropped."""
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
        targets[_BY_ROLE[role]].append(name)
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


def _batch_args(plan: Mapping[str, Any], devices: int) -> dict[str, Any]:
    batch = plan.get("batch")
    if not batch or not batch.get("shape"):
        return {}
    global_batch = int(batch["shape"][0])
    per_device = global_batch / devices
    return {"per_device_batch_size": per_device}


def _model_args(plan: Mapping[str, Any], gpu: bool, notes: list[str]) -> dict[str, Any]:
    model = plan.get("model")
    if not model:
        return {}
    spec = model_spec(model)
    if spec.kind != "transformer":
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
        "mlp_activations": _SWIGLU if spec.mlp == "gated" else ["gelu"],
        "logits_via_embedding": spec.tied_embeddings,
    }
    if table is not None:
        out["model_name"] = name
        pairs = table.get("layers_per_decoder_layer", 1)
        fields = {k: v for k, v in named_model(name).items() if k in _NAMED_ARCH}
        if all(model.get(k, v) == v for k, v in fields.items()):
            # the named model as MaxText has it: its own values, so no key is overridden
            arch = {k: v for k, v in table.items() if k in arch}
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
    out.update(arch)
    out["dtype"] = spec.dtype
    out["weight_dtype"] = spec.param_dtype
    out["remat_policy"] = spec.remat
    if spec.remat == "custom":
        out.update(spec.remat_places())
    out["attention"] = (
        ("cudnn_flash_te" if gpu else "flash") if spec.attention == "flash" else ("dot_product")
    )
    out["num_vocab_tiling"] = spec.vocab_tiling
    out["max_target_length"] = spec.seq_len
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
)


def _env(hardware: str) -> tuple[dict[str, str], dict[str, str]]:
    if hardware in LIBTPU_INIT_ARGS:
        entry, var = LIBTPU_INIT_ARGS[hardware], "LIBTPU_INIT_ARGS"
    elif hardware in XLA_FLAGS:
        entry, var = XLA_FLAGS[hardware], "XLA_FLAGS"
    else:
        return {}, {}
    return {var: " ".join(entry["flags"])}, {var: entry["source"]}


def maxtext_args(plan: Mapping[str, Any]) -> dict[str, Any]:
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
      ``model_name`` for a named model, whose own values are then used). ``env``:
      ``LIBTPU_INIT_ARGS`` (TPU) or ``XLA_FLAGS`` (GPU), empty on CPU.

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
        values[f"ici_{_STEM[axis]}_parallelism"] = mt_ici[axis]
    for axis in MAXTEXT_MESH_AXES:
        values[f"dcn_{_STEM[axis]}_parallelism"] = mt_dcn[axis]
    values["num_slices"] = theirs.slices
    values["allow_split_physical_axes"] = theirs.split_physical_axes
    values["hardware"] = entry.kind
    values.update(_batch_args(plan, theirs.num_devices))
    values.update(_model_args(plan, entry.kind == "gpu", notes))
    optimizer = plan.get("optimizer")
    optimizer = optimizer.get("name") if isinstance(optimizer, Mapping) else optimizer
    if optimizer in _OPT_TYPE:
        values["opt_type"] = _OPT_TYPE[optimizer]
    env, sources = _env(entry.name)
    return {
        "args": [f"{k}={_format(v)}" for k, v in values.items()],
        "env": env,
        "env_sources": sources,
        "notes": notes,
    }


# ------------------------------------------------------------------------ keys -> plan


def _invalid(message: str) -> PlanError:
    return PlanError("invalid_maxtext_config", message)


_MESH_KEY = re.compile(r"^(ici|dcn)_(\w+)_parallelism$")
_KNOWN_STEMS = {*_STEM.values(), *_STEMS_WITHOUT_AXIS}


def _int_key(maxtext: Mapping[str, Any], key: str, default: int) -> int:
    value = maxtext.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise _invalid(f"{key} is {value!r}; give an integer >= 1, or -1 (one per network)")
    return value


def _networks(maxtext: Mapping[str, Any], notes: list[str]) -> tuple[dict, dict]:
    for key in maxtext:
        match = _MESH_KEY.match(str(key))
        if match and match.group(2) not in _KNOWN_STEMS:
            raise _invalid(
                f"{key} names no parallelism of MaxText's base.yml; the mesh keys are "
                f"ici_/dcn_ + one of {sorted(_KNOWN_STEMS)} + _parallelism"
            )
    ici, dcn = {}, {}
    for axis in MAXTEXT_MESH_AXES:
        stem = _STEM[axis]
        ici[axis] = _int_key(maxtext, f"ici_{stem}_parallelism", _DEFAULT_ICI.get(axis, 1))
        dcn[axis] = _int_key(maxtext, f"dcn_{stem}_parallelism", _DEFAULT_DCN.get(axis, 1))
        if axis in _PLANNED_AXES:
            continue
        for net, size in (("ici", ici[axis]), ("dcn", dcn[axis])):
            if size != 1:
                raise _invalid(
                    f"{net}_{stem}_parallelism={size}: datarax plans data, fsdp, "
                    f"fsdp_transpose and tensor parallelism only ({axis!r} would need "
                    f"{'pipeline stages' if axis == 'stage' else 'its own sharding'}); set "
                    f"it to 1 and give its devices to ici_fsdp_parallelism or "
                    f"ici_tensor_parallelism"
                )
    for stem in _STEMS_WITHOUT_AXIS:
        for net in ("ici", "dcn"):
            key = f"{net}_{stem}_parallelism"
            if maxtext.get(key, 1) != 1:
                notes.append(f"{key}={maxtext[key]!r} ignored: no mesh axis reads it")
    return ici, dcn


def _check_order_keys(maxtext: Mapping[str, Any]) -> None:
    for key, default in _ORDER_KEYS.items():
        if key in maxtext and maxtext[key] not in (default, None):
            raise _invalid(
                f"{key}={maxtext[key]!r} changes MaxText's device mesh in a way this planner "
                f"does not follow; drop it (default {default!r})"
            )


def _activations_mlp(value: Any) -> str:
    acts = value if isinstance(value, list) else _parse_value(str(value))
    acts = acts if isinstance(acts, list) else [acts]
    if len(acts) == 2 and acts[1] == "linear":
        return "gated"
    if len(acts) == 1 and acts[0] != "linear":
        return "plain"
    raise _invalid(
        f"mlp_activations={value!r}: datarax prices a gated MLP ([silu,linear], "
        f"[gelu,linear]) or a plain one ([gelu]); use one of those"
    )


def _choice_key(maxtext: Mapping[str, Any], key: str, allowed: Sequence[str]) -> str:
    value = maxtext.get(key, _MODEL_DEFAULTS[key])
    if value not in allowed:
        raise _invalid(f"{key}={value!r} is not one of {list(allowed)}")
    return str(value)


def _model_request(maxtext: Mapping[str, Any], notes: list[str]) -> dict[str, Any] | None:
    name = maxtext.get("model_name", "default")
    if name == "default" and not any(k in maxtext for k in _ARCH_FIELDS):
        loose = [k for k in (*_OTHER_MODEL_KEYS, *REMAT_TENSORS) if k in maxtext]
        loose = [k for k in loose if k not in ("per_device_batch_size", "max_target_length")]
        if loose:
            notes.append(f"no model_name nor base_* keys: no model; {loose} ignored")
        return None
    override = bool(maxtext.get("override_model_config", False))
    fields: dict[str, Any] = {}
    table = MAXTEXT_MODELS.get(name) if name != "default" else None
    if name != "default" and table is None:
        missing = [k for k in _ARCH_FIELDS if k not in maxtext]
        if missing:
            raise _invalid(
                f"model_name={name!r} has no entry here (named models: {sorted(MODELS)}); "
                f"use one of those or give {missing} too"
            )
        notes.append(f"model_name={name!r} is not a named model here: its keys as given")
    pairs = table.get("layers_per_decoder_layer", 1) if table else 1
    for key, field in _ARCH_FIELDS.items():
        if key not in maxtext:
            if table is None:
                fields[field] = _MODEL_DEFAULTS[key]
            continue
        value = _int_key(maxtext, key, 1)
        if value == -1:
            raise _invalid(f"{key}=-1: give the model's size")
        if table is not None and value != table[key] and not override:
            raise _invalid(
                f"{key}={value} differs from MaxText's {name}.yml ({table[key]}); MaxText "
                f"refuses that too: drop it or set override_model_config=true"
            )
        fields[field] = value * pairs if field == "layers" else value
    for key, field in (("mlp_activations", "mlp"), ("logits_via_embedding", "tied_embeddings")):
        if key not in maxtext and table is not None:
            continue
        value = maxtext.get(key, _MODEL_DEFAULTS[key])
        if table is not None and value != table[key] and not override:
            raise _invalid(
                f"{key}={value!r} differs from MaxText's {name}.yml ({table[key]!r}); drop "
                f"it or set override_model_config=true"
            )
        if field == "mlp":
            fields["mlp"] = _activations_mlp(value)
        elif not isinstance(value, bool):
            raise _invalid(f"logits_via_embedding={value!r}: give true or false")
        else:
            fields["tied_embeddings"] = value
    fields["dtype"] = _choice_key(maxtext, "dtype", _DTYPES)
    fields["param_dtype"] = _choice_key(maxtext, "weight_dtype", _DTYPES)
    fields["remat"] = _choice_key(maxtext, "remat_policy", REMAT_POLICIES)
    if fields["remat"] == "custom":
        custom = {t: maxtext[t] for t in REMAT_TENSORS if t in maxtext}
        bad = {t: p for t, p in custom.items() if p not in ("device", "offload", "remat")}
        if bad:
            raise _invalid(f"remat_policy=custom places {bad}; use device, offload or remat")
        fields["remat_custom"] = custom
    attention = maxtext.get("attention", _MODEL_DEFAULTS["attention"])
    if attention not in _ATTENTION_IN:
        raise _invalid(f"attention={attention!r} is not one of {sorted(_ATTENTION_IN)}")
    fields["attention"] = _ATTENTION_IN[attention]
    fields["vocab_tiling"] = _int_key(maxtext, "num_vocab_tiling", 1)
    fields["seq_len"] = _int_key(maxtext, "max_target_length", _MODEL_DEFAULTS["max_target_length"])
    if table is not None:
        return {"name": name, **fields}
    return {"kind": "transformer", **fields}


_PLAN_KEYS = {
    *(f"{n}_{s}_parallelism" for n in ("ici", "dcn") for s in _KNOWN_STEMS),
    *_ARCH_FIELDS,
    *_OTHER_MODEL_KEYS,
    *REMAT_TENSORS,
    *_ORDER_KEYS,
    "num_slices",
    "allow_split_physical_axes",
    "hardware",
    "opt_type",
}
_OPTIMIZERS = {"adamw": "adamw", "adam_pax": "adamw", "sgd": "sgd"}
_OPT_TYPE = {"adam": "adamw", "adamw": "adamw", "sgd": "sgd"}


def plan_request_from_maxtext(
    maxtext: Mapping[str, Any],
    *,
    hardware: str,
    topology: str | None = None,
    slices: int | None = None,
    hosts: int | None = None,
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """A ``POST /v1/meshes`` hardware-plan body from MaxText's own keys.

    Args:
      maxtext: MaxText keys (``ici_*_parallelism``, ``dcn_*_parallelism``,
        ``num_slices``, ``allow_split_physical_axes``, ``per_device_batch_size``,
        ``max_target_length``, ``model_name`` or the model keys, ``remat_policy`` and
        the custom per-tensor keys, ``weight_dtype``, ``dtype``, ``attention``,
        ``num_vocab_tiling``, ``opt_type``), values as parsed (see
        :func:`parse_maxtext_args`). Missing keys take base.yml's defaults.
      hardware: catalog name.
      topology: TPU slice shape (required on TPU).
      slices: TPU slices; default ``num_slices`` when positive, else the product of the
        dcn sizes, else 1.
      hosts: GPU/CPU hosts (required there).
      notes: when given, receives one line per key ignored or default assumed.

    Returns:
      ``{"hardware", "topology"|"hosts", "slices" (TPU), "ici", "dcn",
      "allow_split_physical_axes", "batch_shape", "batch_axes", "model", "optimizer"}``;
      ``ici``/``dcn`` hold all of MaxText's mesh axes in its order (size 1 included,
      ``-1`` kept), so the planner's device order is ``create_device_mesh``'s. ``model``,
      ``batch_shape`` (``[per_device_batch_size * devices, max_target_length]``) and
      ``batch_axes`` come only with model keys or ``per_device_batch_size``;
      ``optimizer`` only with ``opt_type``.

    Raises:
      PlanError: ``invalid_maxtext_config`` naming the key: a parallelism > 1 on an axis
        other than data, fsdp, fsdp_transpose, tensor; a misspelt ``ici_``/``dcn_`` key;
        a device-order key off its default; ``num_slices`` disagreeing with ``slices``;
        a model key this API cannot take; ``unknown_hardware``.
    """
    if not isinstance(maxtext, Mapping):
        raise _invalid(f"maxtext must be an object of MaxText keys, got {maxtext!r}")
    notes = [] if notes is None else notes
    entry = get_hardware(hardware)
    _check_order_keys(maxtext)
    ici, dcn = _networks(maxtext, notes)
    num_slices = _int_key(maxtext, "num_slices", -1)
    body: dict[str, Any] = {"hardware": entry.name}
    if entry.kind == "tpu":
        if slices is not None and num_slices != -1 and slices != num_slices:
            raise _invalid(f"num_slices={num_slices} but slices={slices}; give one of them")
        if slices is None:
            fixed = math.prod(dcn.values())
            slices = num_slices if num_slices != -1 else (fixed if fixed > 0 else 1)
        if topology is None:
            raise PlanError(
                "missing_topology",
                f"{entry.name} is a TPU: give topology, one of {', '.join(entry.topologies)}",
            )
        body.update(topology=topology, slices=slices)
        devices = math.prod(parse_tpu_topology(topology, entry)[1]) * int(slices)
        domains = slices
    else:
        if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
            raise PlanError(
                "invalid_host_count",
                f"hosts is {hosts!r}; {entry.name} needs hosts=<n> (an integer >= 1)",
            )
        body["hosts"] = hosts
        per_host = int(entry.devices_per_host)
        devices = per_host * hosts
        domains = max(devices // int(entry.fast_domain_devices or per_host), 1)
        if num_slices not in (-1, domains):
            raise _invalid(
                f"num_slices={num_slices} but {hosts} hosts of {entry.name} form {domains} "
                f"NVLink domains; drop num_slices or give hosts for {num_slices} domains"
            )
    if domains == 1:
        # MaxText reads no dcn key with one slice.
        given = {a: v for a, v in dcn.items() if v not in (1, -1)}
        if given:
            notes.append(f"one slice: dcn sizes {given} ignored, as MaxText does")
        dcn = dict.fromkeys(MAXTEXT_MESH_AXES, 1)
    split = maxtext.get("allow_split_physical_axes", False)
    if not isinstance(split, bool):
        raise _invalid(f"allow_split_physical_axes={split!r}: give true or false")
    body.update(ici=ici, dcn=dcn, allow_split_physical_axes=split)
    model = _model_request(maxtext, notes)
    if model is not None or "per_device_batch_size" in maxtext:
        per_device = maxtext.get("per_device_batch_size", _PER_DEVICE_BATCH_DEFAULT)
        if (
            isinstance(per_device, bool)
            or not isinstance(per_device, int | float)
            or (per_device <= 0)
        ):
            raise _invalid(f"per_device_batch_size={per_device!r}: give a number > 0")
        global_batch = devices * per_device
        if global_batch < 1 or not float(global_batch).is_integer():
            raise _invalid(
                f"per_device_batch_size={per_device} over {devices} devices is a global "
                f"batch of {global_batch}; choose one that makes a whole batch"
            )
        seq = model["seq_len"] if model else _int_key(maxtext, "max_target_length", 2048)
        body["batch_shape"] = [int(global_batch), seq]
        body["batch_axes"] = list(_BATCH_AXES)
        if "per_device_batch_size" not in maxtext:
            notes.append(f"per_device_batch_size not given: MaxText's {_PER_DEVICE_BATCH_DEFAULT}")
    if model is not None:
        body["model"] = model
    if "opt_type" in maxtext:
        if maxtext["opt_type"] not in _OPTIMIZERS:
            raise _invalid(f"opt_type={maxtext['opt_type']!r} is not one of {list(_OPTIMIZERS)}")
        body["optimizer"] = _OPTIMIZERS[maxtext["opt_type"]]
    ignored = sorted(k for k in maxtext if k not in _PLAN_KEYS)
    if ignored:
        notes.append(f"MaxText keys that do not change the plan, ignored: {ignored}")
    return body
