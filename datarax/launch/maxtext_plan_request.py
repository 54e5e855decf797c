"""From MaxText's own keys to a ``POST /v1/meshes`` hardware-plan body.

:func:`plan_request_from_maxtext` turns MaxText's keys into a plan request whose axes are
MaxText's mesh axes in MaxText's order, so the planner's device order is the one
MaxText's ``create_device_mesh`` builds. It takes MaxText's defaults (base.yml) for keys
not given, as MaxText does: ``ici_fsdp_parallelism=-1``, ``dcn_data_parallelism=-1``, the
rest 1. Axes other than ``data``, ``fsdp``, ``fsdp_transpose`` and ``tensor`` must be 1
(no pipelines, experts, context or DiLoCo replicas here), and keys that change MaxText's
device order in ways this planner does not follow (``mesh_axes``, ``custom_mesh``, ...)
must keep their defaults; both are refused with ``invalid_maxtext_config``. A misspelt
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

from datarax.errors import PlanError
from datarax.hardware.chips import get_hardware
from datarax.hardware.entry import Hardware
from datarax.hardware.tpu_slices import parse_tpu_topology
from datarax.json_types import JSONObject
from datarax.launch.maxtext_config import (
    ARCH_FIELDS,
    ATTENTION_IN,
    ATTENTION_TYPE_IN,
    BATCH_AXES,
    DEFAULT_DCN,
    DEFAULT_ICI,
    DTYPES,
    MAXTEXT_MESH_AXES,
    MAXTEXT_MODELS,
    MESH_AXIS_STEM,
    MLA_KEYS,
    MODEL_DEFAULTS,
    MOE_ARCH_KEYS,
    MOE_KEYS,
    ORDER_KEYS,
    OTHER_MODEL_KEYS,
    PARALLEL_KEYS,
    PER_DEVICE_BATCH_DEFAULT,
    PLANNED_AXES,
    STEMS_WITHOUT_AXIS,
    parse_value,
)
from datarax.parallel.kinds import kind_of_axis
from datarax.parallel.options import pipelined_layers
from datarax.specs.model_specs import REMAT_POLICIES, REMAT_TENSORS, TransformerSpec, model_spec
from datarax.specs.named_models import MODELS

__all__ = ["plan_request_from_maxtext"]


# ------------------------------------------------------------------------ keys -> plan


def _invalid(message: str) -> PlanError:
    return PlanError("invalid_maxtext_config", message)


_PIPELINE_KEYS = ("num_pipeline_microbatches", "num_layers_per_pipeline_stage")
_PIPELINE_EXTENT_KEYS = ("pipeline_parallel_layers", "num_pipeline_repeats")
_MESH_KEY = re.compile(r"^(ici|dcn)_(\w+)_parallelism$")
_KNOWN_STEMS = {*MESH_AXIS_STEM.values(), *STEMS_WITHOUT_AXIS}


def _int_key(maxtext: Mapping[str, Any], key: str, default: int) -> int:
    value = maxtext.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
        raise _invalid(f"{key} is {value!r}; give an integer >= 1, or -1 (one per network)")
    return value


def _networks(
    maxtext: Mapping[str, Any], notes: list[str]
) -> tuple[dict[str, int], dict[str, int]]:
    for key in maxtext:
        match = _MESH_KEY.match(str(key))
        if match and match.group(2) not in _KNOWN_STEMS:
            raise _invalid(
                f"{key} names no parallelism of MaxText's base.yml; the mesh keys are "
                f"ici_/dcn_ + one of {sorted(_KNOWN_STEMS)} + _parallelism"
            )
    ici, dcn = {}, {}
    for axis in MAXTEXT_MESH_AXES:
        stem = MESH_AXIS_STEM[axis]
        ici[axis] = _int_key(maxtext, f"ici_{stem}_parallelism", DEFAULT_ICI.get(axis, 1))
        dcn[axis] = _int_key(maxtext, f"dcn_{stem}_parallelism", DEFAULT_DCN.get(axis, 1))
        if axis in PLANNED_AXES:
            continue
        for net, size in (("ici", ici[axis]), ("dcn", dcn[axis])):
            if size != 1:
                kind = kind_of_axis(axis)  # the registry's kind of MaxText's axis
                raise PlanError(
                    "invalid_parallelism",
                    f"{net}_{stem}_parallelism={size} is {kind.name} parallelism "
                    f"({kind.summary}), which plans do not price yet: datarax plans "
                    f"{', '.join(PLANNED_AXES)} only; set it to 1 and give its devices to "
                    f"ici_fsdp_parallelism or ici_tensor_parallelism",
                )
    for stem in STEMS_WITHOUT_AXIS:
        for net in ("ici", "dcn"):
            key = f"{net}_{stem}_parallelism"
            if maxtext.get(key, 1) != 1:
                notes.append(f"{key}={maxtext[key]!r} ignored: no mesh axis reads it")
    return ici, dcn


def _check_order_keys(maxtext: Mapping[str, Any]) -> None:
    for key, default in ORDER_KEYS.items():
        if key in maxtext and maxtext[key] not in (default, None):
            raise _invalid(
                f"{key}={maxtext[key]!r} changes MaxText's device mesh in a way this planner "
                f"does not follow; drop it (default {default!r})"
            )


def _activations_mlp(value: Any) -> str:
    acts = value if isinstance(value, list) else parse_value(str(value))
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
    value = maxtext.get(key, MODEL_DEFAULTS[key])
    if value not in allowed:
        raise _invalid(f"{key}={value!r} is not one of {list(allowed)}")
    return str(value)


def _model_request(maxtext: Mapping[str, Any], notes: list[str]) -> dict[str, Any] | None:
    name = maxtext.get("model_name", "default")
    if name == "default" and not any(k in maxtext for k in ARCH_FIELDS):
        loose = [k for k in (*OTHER_MODEL_KEYS, *REMAT_TENSORS) if k in maxtext]
        loose = [k for k in loose if k not in ("per_device_batch_size", "max_target_length")]
        if loose:
            notes.append(f"no model_name nor base_* keys: no model; {loose} ignored")
        return None
    override = bool(maxtext.get("override_model_config", False))
    fields: dict[str, Any] = {}
    table = MAXTEXT_MODELS.get(name) if name != "default" else None
    if name != "default" and table is None:
        missing = [k for k in ARCH_FIELDS if k not in maxtext]
        if missing:
            raise _invalid(
                f"model_name={name!r} has no entry here (named models: {sorted(MODELS)}); "
                f"use one of those or give {missing} too"
            )
        notes.append(f"model_name={name!r} is not a named model here: its keys as given")
    pairs = table.get("layers_per_decoder_layer", 1) if table else 1
    for key, field in ARCH_FIELDS.items():
        if key not in maxtext:
            if table is None:
                fields[field] = MODEL_DEFAULTS[key]
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
        value = maxtext.get(key, MODEL_DEFAULTS[key])
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
    fields.update(_moe_mla_request(maxtext, table, name, override, notes))
    if fields.get("attention_type") == "mla" or (table or {}).get("attention_type") == "mla":
        if fields.pop("head_dim", None) is not None:
            notes.append(
                "attention_type=mla: head_dim ignored (MLA's heads are qk_nope_head_dim "
                "+ qk_rope_head_dim wide)"
            )
    fields["dtype"] = _choice_key(maxtext, "dtype", DTYPES)
    fields["param_dtype"] = _choice_key(maxtext, "weight_dtype", DTYPES)
    fields["remat"] = _choice_key(maxtext, "remat_policy", REMAT_POLICIES)
    if fields["remat"] == "custom":
        custom = {t: maxtext[t] for t in REMAT_TENSORS if t in maxtext}
        bad = {t: p for t, p in custom.items() if p not in ("device", "offload", "remat")}
        if bad:
            raise _invalid(f"remat_policy=custom places {bad}; use device, offload or remat")
        fields["remat_custom"] = custom
    attention = maxtext.get("attention", MODEL_DEFAULTS["attention"])
    if attention not in ATTENTION_IN:
        raise _invalid(f"attention={attention!r} is not one of {sorted(ATTENTION_IN)}")
    fields["attention"] = ATTENTION_IN[attention]
    fields["vocab_tiling"] = _int_key(maxtext, "num_vocab_tiling", 1)
    fields["seq_len"] = _int_key(maxtext, "max_target_length", MODEL_DEFAULTS["max_target_length"])
    if table is not None:
        return {"name": name, **fields}
    return {"kind": "transformer", **fields}


def _moe_value(key: str, value: Any) -> Any:
    if key == "sparse_matmul":
        if not isinstance(value, bool):
            raise _invalid(f"sparse_matmul={value!r}: give true or false")
        return "sparse" if value else "dense"
    if key == "capacity_factor":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise _invalid(f"capacity_factor={value!r}: give a number (-1: dropless)")
        return float(value)
    if key == "attention_type":
        if value not in ATTENTION_TYPE_IN:
            raise _invalid(
                f"attention_type={value!r} is not priced here: datarax prices "
                f"{sorted(ATTENTION_TYPE_IN)} (sliding-window and chunked attention would "
                f"be priced as full causal attention); use one of those"
            )
        return ATTENTION_TYPE_IN[value]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    low = 1 if key in ("num_experts", "num_experts_per_tok", "interleave_moe_layer_step") else 0
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        if not (key == "base_moe_mlp_dim" and value == -1):
            raise _invalid(f"{key}={value!r}: give an integer >= {low}")
    return value


def _moe_mla_request(
    maxtext: Mapping[str, Any],
    table: Mapping[str, Any] | None,
    name: str,
    override: bool,
    notes: list[str],
) -> JSONObject:
    """The model's mixture-of-experts and MLA fields from MaxText's keys: architecture
    keys are held to a named model's config as the dense ones are; a dense model
    (``num_experts=1``) drops the MoE keys, and MLA's keys count only with
    ``attention_type=mla``, each dropped key noted."""
    out: JSONObject = {}
    for key in (*MOE_KEYS, "attention_type", *MLA_KEYS):
        if key not in maxtext:
            continue
        value = _moe_value(key, maxtext[key])
        if table is not None and key in (*MOE_ARCH_KEYS, "attention_type", *MLA_KEYS):
            theirs = _moe_value(key, table.get(key, MODEL_DEFAULTS[key]))
            if value != theirs and not override:
                raise _invalid(
                    f"{key}={maxtext[key]!r} differs from MaxText's {name}.yml "
                    f"({table.get(key, MODEL_DEFAULTS[key])!r}); MaxText refuses that too: "
                    f"drop it or set override_model_config=true"
                )
        field = MOE_KEYS.get(key, key)
        if not (key == "base_moe_mlp_dim" and value == -1):
            out[field] = value
    experts = out.get("num_experts", (table or {}).get("num_experts", 1))
    if experts <= 1:
        dropped = [k for k, f in MOE_KEYS.items() if f in out and k != "num_experts"]
        dropped = [k for k in dropped if maxtext[k] != MODEL_DEFAULTS[k]]
        if dropped:
            notes.append(f"num_experts={experts}: a dense model; {dropped} ignored")
        for field in MOE_KEYS.values():
            out.pop(field, None)
    factor = out.get("capacity_factor")
    if isinstance(factor, float) and factor <= 0:
        out.pop("capacity_factor")  # base.yml's -1: dropless, our default
    mla = out.get("attention_type", (table or {}).get("attention_type", "global"))
    if mla != "mla":
        out.pop("attention_type", None)
        given = [k for k in MLA_KEYS if k in out]
        if given:
            notes.append(f"attention_type is not mla: {given} ignored")
        for key in MLA_KEYS:
            out.pop(key, None)
    elif table is None:
        out.update({key: out.get(key, MODEL_DEFAULTS[key]) for key in MLA_KEYS})
    return out


_PLAN_KEYS = {
    *(f"{n}_{s}_parallelism" for n in ("ici", "dcn") for s in _KNOWN_STEMS),
    *ARCH_FIELDS,
    *OTHER_MODEL_KEYS,
    *REMAT_TENSORS,
    *ORDER_KEYS,
    "num_slices",
    "allow_split_physical_axes",
    "hardware",
    "opt_type",
    *PARALLEL_KEYS,
    *_PIPELINE_EXTENT_KEYS,
}
_OPTIMIZERS = {"adamw": "adamw", "adam_pax": "adamw", "sgd": "sgd"}


def _bool_key(maxtext: Mapping[str, Any], key: str) -> bool:
    value = maxtext.get(key, MODEL_DEFAULTS[key])
    if not isinstance(value, bool):
        raise _invalid(f"{key}={value!r}: give true or false")
    return value


def _parallel_options(
    maxtext: Mapping[str, Any],
    ici: Mapping[str, int],
    dcn: Mapping[str, int],
    notes: list[str],
    optimizer: Any,
) -> JSONObject:
    """The body's ``pipeline``, ``context_parallel`` and ZeRO-1 optimizer from MaxText's
    keys. MaxText's pipeline is circular: ``num_layers_per_pipeline_stage`` (default 1)
    layers a pass, as many repeats as that leaves, ``num_pipeline_microbatches``
    (default: the stages). Keys of a kind the mesh does not use are noted and left."""
    out: JSONObject = {}
    stages = ici.get("stage", 1) * dcn.get("stage", 1)
    pipe_keys = [k for k in (*_PIPELINE_KEYS, *_PIPELINE_EXTENT_KEYS) if k in maxtext]
    if stages != 1:
        micro = _int_key(maxtext, "num_pipeline_microbatches", -1)
        out["pipeline"] = {
            "schedule": "circular",
            "layers_per_stage": _int_key(maxtext, "num_layers_per_pipeline_stage", 1),
            **({"microbatches": micro} if micro != -1 else {}),
        }
    elif pipe_keys:
        notes.append(f"no pipeline stages: {pipe_keys} ignored")
    context = ici.get("context", 1) * dcn.get("context", 1)
    ctx_keys = [k for k in ("context_parallel_strategy", "context_parallel_load_balance")
                if k in maxtext]  # fmt: skip
    if context != 1:
        strategy = maxtext.get(
            "context_parallel_strategy", MODEL_DEFAULTS["context_parallel_strategy"]
        )
        if strategy not in ("all_gather", "ring"):
            raise PlanError(
                "invalid_parallelism",
                f"context_parallel_strategy={strategy!r} is not priced: datarax prices "
                "all_gather and ring; use one of those",
            )
        out["context_parallel"] = {
            "strategy": strategy,
            "load_balance": _bool_key(maxtext, "context_parallel_load_balance"),
        }
    elif ctx_keys:
        notes.append(f"no context axis: {ctx_keys} ignored")
    if _bool_key(maxtext, "shard_optimizer_over_data"):
        out["optimizer"] = {"name": optimizer or "adam", "shard_over_data": True}
    return out


def _check_pipeline_extent(
    maxtext: Mapping[str, Any], model: Mapping[str, Any] | None, pipeline: Mapping[str, Any]
) -> None:
    """``pipeline_parallel_layers`` and ``num_pipeline_repeats``, when given, must be what
    the plan prices: MaxText's default extent (every decoder layer; a DeepSeek-style
    model's MoE layers) and the repeats it leaves.

    Raises:
      PlanError: ``invalid_maxtext_config`` naming the key and the value plans take.
    """
    given = {k: _int_key(maxtext, k, -1) for k in _PIPELINE_EXTENT_KEYS if k in maxtext}
    given = {k: v for k, v in given.items() if v != -1}
    if not given:
        return
    spec = model_spec(model) if model else None
    if not isinstance(spec, TransformerSpec):
        raise _invalid(f"{sorted(given)} need a model: give model_name or the base_* keys")
    table = MAXTEXT_MODELS.get(str(model.get("name"))) if model else None
    pairs = int((table or {}).get("layers_per_decoder_layer", 1))
    layers = pipelined_layers(spec) // pairs
    stages = int(pipeline["stages"])
    expected = {
        "pipeline_parallel_layers": layers,
        "num_pipeline_repeats": layers // max(stages * int(pipeline["layers_per_stage"]), 1),
    }
    for key, value in given.items():
        if stages < 1 and key == "num_pipeline_repeats":
            continue  # a stage size of -1: the planner's to resolve
        if value != expected[key]:
            raise _invalid(
                f"{key}={value}: plans pipeline what MaxText pipelines by default "
                f"({layers} layers here, every decoder layer but a DeepSeek-style model's "
                f"leading dense ones), so {key} is {expected[key]}; drop it or give that"
            )


def _cluster(
    entry: Hardware,
    num_slices: int,
    dcn: Mapping[str, int],
    topology: str | None,
    slices: int | None,
    hosts: int | None,
) -> tuple[dict[str, Any], int, int]:
    """``(members, devices, domains)``: the body's ``topology`` and ``slices`` (TPU) or
    ``hosts``, the cluster's devices, and its slices or NVLink domains."""
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
        devices = math.prod(parse_tpu_topology(topology, entry)[1]) * int(slices)
        return {"topology": topology, "slices": slices}, devices, slices
    if isinstance(hosts, bool) or not isinstance(hosts, int) or hosts < 1:
        raise PlanError(
            "invalid_host_count",
            f"hosts is {hosts!r}; {entry.name} needs hosts=<n> (an integer >= 1)",
        )
    per_host = int(entry.devices_per_host)
    devices = per_host * hosts
    domains = max(devices // int(entry.fast_domain_devices or per_host), 1)
    if num_slices not in (-1, domains):
        raise _invalid(
            f"num_slices={num_slices} but {hosts} hosts of {entry.name} form {domains} "
            f"NVLink domains; drop num_slices or give hosts for {num_slices} domains"
        )
    return {"hosts": hosts}, devices, domains


def _batch(
    maxtext: Mapping[str, Any], model: Mapping[str, Any] | None, devices: int, notes: list[str]
) -> dict[str, Any]:
    """``batch_shape`` (``per_device_batch_size`` times the devices, by the sequence
    length) and ``batch_axes`` (MaxText's batch axes)."""
    per_device = maxtext.get("per_device_batch_size", PER_DEVICE_BATCH_DEFAULT)
    if isinstance(per_device, bool) or not isinstance(per_device, int | float) or per_device <= 0:
        raise _invalid(f"per_device_batch_size={per_device!r}: give a number > 0")
    global_batch = devices * per_device
    if global_batch < 1 or not float(global_batch).is_integer():
        raise _invalid(
            f"per_device_batch_size={per_device} over {devices} devices is a global "
            f"batch of {global_batch}; choose one that makes a whole batch"
        )
    seq = model["seq_len"] if model else _int_key(maxtext, "max_target_length", 2048)
    if "per_device_batch_size" not in maxtext:
        notes.append(f"per_device_batch_size not given: MaxText's {PER_DEVICE_BATCH_DEFAULT}")
    return {"batch_shape": [int(global_batch), seq], "batch_axes": list(BATCH_AXES)}


def plan_request_from_maxtext(
    maxtext: Mapping[str, Any],
    *,
    hardware: str,
    topology: str | None = None,
    slices: int | None = None,
    hosts: int | None = None,
    notes: list[str] | None = None,
) -> JSONObject:
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
    cluster, devices, domains = _cluster(entry, num_slices, dcn, topology, slices, hosts)
    body: dict[str, Any] = {"hardware": entry.name, **cluster}
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
        body.update(_batch(maxtext, model, devices, notes))
    if model is not None:
        body["model"] = model
    if "opt_type" in maxtext:
        if maxtext["opt_type"] not in _OPTIMIZERS:
            raise _invalid(f"opt_type={maxtext['opt_type']!r} is not one of {list(_OPTIMIZERS)}")
        body["optimizer"] = _OPTIMIZERS[maxtext["opt_type"]]
    body.update(_parallel_options(maxtext, ici, dcn, notes, body.get("optimizer")))
    if "pipeline" in body:
        stages = ici["stage"] * dcn["stage"]
        per_stage = body["pipeline"]["layers_per_stage"]
        _check_pipeline_extent(maxtext, model, {"stages": stages, "layers_per_stage": per_stage})
    ignored = sorted(k for k in maxtext if k not in _PLAN_KEYS)
    if ignored:
        notes.append(f"MaxText keys that do not change the plan, ignored: {ignored}")
    return body
