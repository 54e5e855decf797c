"""What MaxText says, at the commit :data:`MAXTEXT_COMMIT`: its mesh axes and the keys that
size them, its defaults, its named models, the flags of its published scripts, and how its
command line reads ``key=value`` arguments.

Facts come from MaxText (repository AI-Hypercomputer/maxtext) at commit
:data:`MAXTEXT_COMMIT`: the mesh axes and key names from ``src/maxtext/configs/base.yml``,
``create_device_mesh`` from ``src/maxtext/utils/maxtext_utils.py`` (``ici_map``: axis
``stage`` reads ``ici_pipeline_parallelism``, every other axis ``ici_<axis>_parallelism``),
the named models from ``src/maxtext/configs/models/`` and the flags from the scripts
:data:`LIBTPU_INIT_ARGS` and :data:`XLA_FLAGS` name. :mod:`datarax.launch.maxtext`
(plan -> arguments) and :mod:`datarax.launch.maxtext_plan_request` (keys -> plan) read
them.

Example:
  >>> parse_maxtext_args(["ici_fsdp_parallelism=-1", "mlp_activations=[silu,linear]"])
  {'ici_fsdp_parallelism': -1, 'mlp_activations': ['silu', 'linear']}
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from datarax.errors import PlanError
from datarax.json_types import JSONObject
from datarax.parallel.kinds import KINDS

__all__ = [
    "ARCH_FIELDS",
    "ATTENTION_IN",
    "ATTENTION_TYPE_IN",
    "AXIS_BY_ROLE",
    "BATCH_AXES",
    "DEFAULT_DCN",
    "DEFAULT_ICI",
    "DTYPES",
    "LIBTPU_INIT_ARGS",
    "MAXTEXT_COMMIT",
    "MAXTEXT_MESH_AXES",
    "MAXTEXT_MODELS",
    "MESH_AXIS_STEM",
    "MLA_KEYS",
    "MODEL_DEFAULTS",
    "MOE_ARCH_KEYS",
    "MOE_KEYS",
    "ORDER_KEYS",
    "PARALLEL_KEYS",
    "OTHER_MODEL_KEYS",
    "PER_DEVICE_BATCH_DEFAULT",
    "PLANNED_AXES",
    "STEMS_WITHOUT_AXIS",
    "SWIGLU",
    "TE_MAX_SEGMENTS",
    "XLA_FLAGS",
    "format_value",
    "parse_maxtext_args",
    "parse_value",
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
MESH_AXIS_STEM = {axis: "pipeline" if axis == "stage" else axis for axis in MAXTEXT_MESH_AXES}
# base.yml's defaults; every other ici_/dcn_ key defaults to 1.
DEFAULT_ICI = {"fsdp": -1}
DEFAULT_DCN = {"data": -1}
# ici_/dcn_ keys base.yml has that name no mesh axis (create_device_mesh never reads them
# with the default mesh_axes).
STEMS_WITHOUT_AXIS = ("sequence",)
# From the registry of parallelism kinds: MaxText's axes of the kinds plans price, each
# kind's own MaxText axis, and the axes of the priced kinds that split the batch.
PLANNED_AXES = tuple(axis for kind in KINDS.values() if kind.priced for axis in kind.maxtext_axes)
AXIS_BY_ROLE = {kind.name: kind.maxtext_axes[0] for kind in KINDS.values()}
BATCH_AXES = [
    axis
    for kind in KINDS.values()
    if kind.priced and kind.splits_batch
    for axis in kind.maxtext_axes
]

# Keys that change MaxText's device order beyond ici/dcn: they must keep these defaults.
ORDER_KEYS: dict[str, Any] = {
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
MODEL_DEFAULTS: dict[str, Any] = {
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
    # mixture of experts and MLA (base.yml's "mixture of experts (moe)", "deepseek moe"
    # and "MLA parameters" sections; interleave_moe_layer_step sits with the llama4 keys)
    "num_experts": 1,
    "num_experts_per_tok": 1,
    "shared_experts": 0,
    "base_moe_mlp_dim": -1,
    "first_num_dense_layers": 0,
    "interleave_moe_layer_step": 1,
    "capacity_factor": -1.0,
    "sparse_matmul": True,
    "attention_type": "global",
    "q_lora_rank": 0,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    # pipeline, context parallelism and ZeRO-1 (base.yml)
    "num_pipeline_microbatches": -1,
    "num_layers_per_pipeline_stage": 1,
    "context_parallel_strategy": "all_gather",
    "context_parallel_load_balance": True,
    "shard_optimizer_over_data": False,
}
# MaxText's keys of the pipeline's schedule, context parallelism's strategy and ZeRO-1.
PARALLEL_KEYS = (
    "num_pipeline_microbatches",
    "num_layers_per_pipeline_stage",
    "context_parallel_strategy",
    "context_parallel_load_balance",
    "shard_optimizer_over_data",
)
PER_DEVICE_BATCH_DEFAULT = 12.0
TE_MAX_SEGMENTS = 32
"""``max_segments_per_seq`` of MaxText's GPU model configs (``configs/gpu/models/*.yml``):
TransformerEngine's attention (``cudnn_flash_te``) with packing needs it set."""
# Architecture keys a MaxText model config sets, and our field for each.
ARCH_FIELDS = {
    "base_emb_dim": "d_model",
    "base_num_query_heads": "heads",
    "base_num_kv_heads": "kv_heads",
    "base_mlp_dim": "d_ff",
    "base_num_decoder_layers": "layers",
    "head_dim": "head_dim",
    "vocab_size": "vocab",
}
# MaxText's mixture-of-experts keys and our field for each (``sparse_matmul`` is
# ``moe_kernel``: true is ``sparse``, MaxText's dropless grouped-matmul path; false is
# ``dense``, its capacity-padded einsums). ``base_moe_mlp_dim=-1`` and
# ``capacity_factor=-1`` are base.yml's "not set": the MLP width, and dropless.
MOE_KEYS = {
    "num_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
    "shared_experts": "shared_experts",
    "base_moe_mlp_dim": "moe_d_ff",
    "first_num_dense_layers": "first_dense_layers",
    "interleave_moe_layer_step": "moe_every",
    "capacity_factor": "capacity_factor",
    "sparse_matmul": "moe_kernel",
}
# The MoE keys that are the architecture's (a named model's config sets them or keeps
# base.yml's default); capacity_factor and sparse_matmul are run choices.
MOE_ARCH_KEYS = tuple(k for k in MOE_KEYS if k not in ("capacity_factor", "sparse_matmul"))
# MLA's ranks and head widths: the same names in MaxText and here. They are read only
# with attention_type=mla.
MLA_KEYS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# MaxText's attention_type values this planner prices, and our field's value for each:
# global (full causal attention) and mla. Sliding-window, chunked and the other variants
# would be priced as something else, so they are refused.
ATTENTION_TYPE_IN = {"global": "mha", "full": "mha", "mla": "mla"}
OTHER_MODEL_KEYS = (
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
    "attention_type",
    *MOE_KEYS,
    *MLA_KEYS,
)
ATTENTION_IN = {
    "flash": "flash",
    "autoselected": "flash",
    "cudnn_flash_te": "flash",
    "dot_product": "dot",
}
DTYPES = ("float32", "bfloat16", "float16")


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
    block: str,
    **extra: Any,
) -> JSONObject:
    return {
        "base_emb_dim": emb,
        "base_num_query_heads": q,
        "base_num_kv_heads": kv,
        "base_mlp_dim": mlp,
        "base_num_decoder_layers": layers,
        **({"head_dim": head} if head else {}),
        "mlp_activations": acts,
        "vocab_size": vocab,
        "logits_via_embedding": tied,
        "decoder_block": block,
        **extra,
        "source": f"{_BLOB}src/maxtext/configs/models/{name}.yml",
    }


SWIGLU = ["silu", "linear"]
MAXTEXT_MODELS: dict[str, dict[str, Any]] = {
    "llama2-7b": _model("llama2-7b", 4096, 32, 32, 11008, 32, 128, 32000, SWIGLU, False, "llama2"),
    "llama2-13b": _model("llama2-13b", 5120, 40, 40, 13824, 40, 128, 32000, SWIGLU,
                         False, "llama2"),
    "llama2-70b": _model("llama2-70b", 8192, 64, 8, 28672, 80, 128, 32000, SWIGLU, False, "llama2"),
    "llama3.1-8b": _model("llama3.1-8b", 4096, 32, 8, 14336, 32, 128, 128256, SWIGLU,
                          False, "llama2"),
    "llama3.1-70b": _model("llama3.1-70b", 8192, 64, 8, 28672, 80, 128, 128256, SWIGLU,
                           False, "llama2"),
    "llama3.1-405b": _model("llama3.1-405b", 16384, 128, 8, 53248, 126, 128, 128256, SWIGLU,
                            False, "llama2"),
    "mistral-7b": _model("mistral-7b", 4096, 32, 8, 14336, 32, 128, 32000, SWIGLU,
                         False, "mistral"),
    # Gemma 2: one MaxText decoder layer is a (local, global) attention pair.
    "gemma2-9b": {
        **_model("gemma2-9b", 3584, 16, 8, 14336, 21, 256, 256128, ["gelu", "linear"],
                 True, "gemma2"),
        "layers_per_decoder_layer": 2,
    },
    "gemma2-27b": {
        **_model("gemma2-27b", 4608, 32, 16, 36864, 23, 128, 256128, ["gelu", "linear"],
                 True, "gemma2"),
        "layers_per_decoder_layer": 2,
    },
    "gpt3-175b": _model("gpt3-175b", 12288, 96, 96, 49152, 96, 128, 50304, ["gelu"], True, "gpt3"),
    # mixture of experts: MaxText's MoE keys as its configs set them (head 0: the config
    # sets no head_dim, as DeepSeek-V3's MLA reads its own head widths)
    "mixtral-8x7b": _model(
        "mixtral-8x7b", 4096, 32, 8, 14336, 32, 128, 32000, SWIGLU, False, "mixtral",
        num_experts=8, num_experts_per_tok=2, base_moe_mlp_dim=14336,
    ),
    "mixtral-8x22b": _model(
        "mixtral-8x22b", 6144, 48, 8, 16384, 56, 128, 32768, SWIGLU, False, "mixtral",
        num_experts=8, num_experts_per_tok=2, base_moe_mlp_dim=16384,
    ),
    "deepseek3-671b": _model(
        "deepseek3-671b", 7168, 128, 128, 18432, 61, 0, 129280, SWIGLU, False, "deepseek",
        num_experts=256, num_experts_per_tok=8, shared_experts=1, base_moe_mlp_dim=2048,
        first_num_dense_layers=3, attention_type="mla", q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    ),
    "qwen3-30b-a3b": _model(
        "qwen3-30b-a3b", 2048, 32, 4, 768, 48, 128, 151936, SWIGLU, False, "qwen3_moe",
        num_experts=128, num_experts_per_tok=8, base_moe_mlp_dim=768,
    ),
    "qwen3-235b-a22b": _model(
        "qwen3-235b-a22b", 4096, 64, 4, 1536, 94, 128, 151936, SWIGLU, False, "qwen3_moe",
        num_experts=128, num_experts_per_tok=8, base_moe_mlp_dim=1536,
    ),
    "llama4-17b-16e": _model(
        "llama4-17b-16e", 5120, 40, 8, 8192, 48, 128, 202048, SWIGLU, False, "llama4",
        num_experts=16, num_experts_per_tok=1, shared_experts=1, base_moe_mlp_dim=8192,
        interleave_moe_layer_step=1, inhomogeneous_layer_cycle_interval=4,
    ),
    "llama4-17b-128e": _model(
        "llama4-17b-128e", 5120, 40, 8, 16384, 48, 128, 202048, SWIGLU, False, "llama4",
        num_experts=128, num_experts_per_tok=1, shared_experts=1, base_moe_mlp_dim=8192,
        interleave_moe_layer_step=2, inhomogeneous_layer_cycle_interval=4,
    ),
    "gpt-oss-120b": _model(
        "gpt-oss-120b", 2880, 64, 8, 2880, 36, 64, 201088, ["sigmoid", "linear"], False, "gpt_oss",
        num_experts=128, num_experts_per_tok=4, base_moe_mlp_dim=2880,
        inhomogeneous_layer_cycle_interval=2,
    ),
}  # fmt: skip
"""MaxText's ``configs/models/<name>.yml`` architecture keys for the named models of
:mod:`datarax.specs.named_models` (all of them have one), with ``source``."""

_TPU_SCRIPTS = "src/maxtext/configs/tpu"
_REFUSED = {
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather=true": (
        "the script's flag, left out: libtpu 0.0.50.1 (the one jax[tpu]==0.12.0.1 pins) "
        "refuses it when it compiles MaxText 0.2.5's step for this generation "
        '("Continuation fusion for AllGather ... not supported on platforms other than '
        'TPU v5e"), so a launch with it would not start'
    )
}
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
        "refused": _REFUSED,
        "flags": [
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
        "refused": _REFUSED,
        "flags": [
            "--xla_tpu_scoped_vmem_limit_kib=98304",
            "--xla_enable_async_all_gather=true",
            "--xla_tpu_overlap_compute_collective_tc=true",
            "--xla_tpu_enable_async_collective_fusion_multiple_steps=true",
            "--xla_tpu_enable_async_collective_fusion=true",
        ],
    },
}
"""Per TPU generation: the ``LIBTPU_INIT_ARGS`` one of MaxText's published training
scripts exports (``flags``, in the script's order), that script (``source``), and the
script's flags the launch leaves out because libtpu refuses them (``refused``: flag ->
why). No MaxText script at this commit names Ironwood (tpu7x): its launch exports none."""

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
    "h100-a3-high": {"source": _A3_SCRIPT, "flags": _A3_FLAGS},
    **{
        gpu: {"source": _A3_SCRIPT + _NOT_A3.format(gpu=gpu), "flags": _A3_FLAGS}
        for gpu in ("h200-sxm", "b200", "gb200-nvl72")
    },
}
"""Per GPU of the catalog: the ``XLA_FLAGS`` of MaxText's A3 multi-node script."""


# ------------------------------------------------------------------------------ values


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(format_value(v) for v in value) + "]"
    return str(value)


def parse_value(text: str) -> Any:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [parse_value(part) for part in inner.split(",")] if inner else []
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if re.fullmatch(r"[-+]?\d[\d_]*", text):
        return int(text.replace("_", ""))
    if re.fullmatch(r"[-+]?(\d[\d_]*)?\.?\d*([eE][-+]?\d+)?", text) and any(
        c.isdigit() for c in text
    ):
        return float(text.replace("_", ""))
    return text


def parse_maxtext_args(args: Sequence[str]) -> JSONObject:
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
        out[key.strip()] = parse_value(value)
    return out
