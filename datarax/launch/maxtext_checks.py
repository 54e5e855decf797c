"""What MaxText's own configuration checks refuse, among the keys a launch writes
(DESIGN v1.4, "Every input is used or refused": a ``maxtext`` launch MaxText would refuse
is 422 ``not_launchable`` with MaxText's reason and what would be accepted).

MaxText checks its configuration when its trainer starts: ``pyconfig.initialize`` builds
the pydantic ``MaxTextConfig`` (``configs/types.py``, ``set_derived_and_validate_values``)
over ``base.yml``, the named model's ``configs/models/<name>.yml`` and the command line,
then ``train_utils.validate_train_config``. :func:`check_maxtext_launch` runs, on a
launch's final arguments (``extra_args`` included), the checks of MaxText
:data:`MAXTEXT_VERSION` (the package compile checks run) that a launch of a plan can
meet, with MaxText's own words:

- pipeline (``ici_pipeline_parallelism x dcn_pipeline_parallelism`` stages over 1):
  ``stages x repeats x num_layers_per_pipeline_stage == pipeline_parallel_layers``
  (default: the decoder layers, but the MoE layers, ``num_decoder_layers -
  first_num_dense_layers``, for the ``deepseek`` decoder block, whose leading dense layers
  run before the pipeline on every stage); ``num_pipeline_microbatches`` (default: the
  stages, twice them with ``pipeline_delay_activation_forwarding``) a multiple of the
  stages, dividing the batch of one forward pass (``int(devices x
  per_device_batch_size)``), and at least twice the stages with delayed forwarding;
- ZeRO-1 (``shard_optimizer_over_data``) beside an fsdp or fsdp_transpose axis over 1;
- ``num_vocab_tiling`` dividing ``per_device_batch_size x max_target_length``;
- context parallelism: its strategy; on TPU, ring attention needs ``attention=flash``,
  ``use_tokamax_splash=true``, ``use_jax_splash=false``, ``max_target_length`` divisible
  by the context size squared, an even context size with ``context_parallel_load_balance``,
  global or MLA attention, and no packing with MLA;
- dcn parallelism over 1 with one slice;
- TransformerEngine attention (``cudnn_flash_te``) with packing on GPU needs
  ``max_segments_per_seq``;
- mixture of experts: ``base_moe_mlp_dim`` above 0; a fully MoE model's
  ``base_mlp_dim == base_moe_mlp_dim`` (but Qwen3-MoE's, which MaxText sets so);
  GPT-OSS's dense kernel only dropless; Llama 4's router top-1, dropless, and its layers a
  multiple of ``interleave_moe_layer_step``;
- a named model's key given with another value than its ``<name>.yml`` without
  ``override_model_config=true``.

MaxText 0.2.5 does not refuse ``sparse_matmul=true`` with both stage and expert axes
(MaxText's deprecated ``pyconfig_deprecated.validate_sparse_matmul_parallelism`` did; the
pydantic config it runs now has no such check), so neither does this module.

Keys not given take base.yml's defaults (:data:`MAXTEXT_DEFAULTS`), a named model's keys
its config's (:data:`~datarax.launch.maxtext_config.MAXTEXT_MODELS`). The test suite runs
MaxText's own checks on every launch config it produces and holds this module to them
both ways (``tests/datarax/launch/test_maxtext_accepts.py``).

Example:
  >>> args = ["ici_pipeline_parallelism=9", "ici_fsdp_parallelism=8",
  ...         "base_num_decoder_layers=126", "num_pipeline_microbatches=12",
  ...         "per_device_batch_size=1.5"]
  >>> print(maxtext_refusal(args, devices=72))  # doctest: +ELLIPSIS
  "The number of microbatches (12) must be divisible by the number of stages (9)"; ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from datarax.errors import PlanError
from datarax.launch.maxtext_config import (
    DEFAULT_DCN,
    DEFAULT_ICI,
    MAXTEXT_MESH_AXES,
    MAXTEXT_MODELS,
    MESH_AXIS_STEM,
    MODEL_DEFAULTS,
    PER_DEVICE_BATCH_DEFAULT,
    parse_maxtext_args,
)

__all__ = [
    "MAXTEXT_DEFAULTS",
    "MAXTEXT_VERSION",
    "check_maxtext_launch",
    "maxtext_refusal",
    "per_device_batch_size",
]

MAXTEXT_VERSION = "0.2.5"
"""The ``maxtext`` package whose checks these are (``requirements-maxtext.txt``)."""

MAXTEXT_DEFAULTS: dict[str, Any] = {
    **MODEL_DEFAULTS,
    **{
        f"{net}_{MESH_AXIS_STEM[axis]}_parallelism": defaults.get(axis, 1)
        for net, defaults in (("ici", DEFAULT_ICI), ("dcn", DEFAULT_DCN))
        for axis in MAXTEXT_MESH_AXES
    },
    "model_name": "default",
    "override_model_config": False,
    "decoder_block": "llama2",
    "hardware": "tpu",
    "num_slices": -1,
    "per_device_batch_size": PER_DEVICE_BATCH_DEFAULT,
    "pipeline_parallel_layers": -1,
    "num_pipeline_repeats": -1,
    "pipeline_delay_activation_forwarding": False,
    "packing": True,
    "max_segments_per_seq": -1,
    "use_tokamax_splash": False,
    "use_jax_splash": False,
    "context_sharding": "context",
    "dq_reduction_steps": 0,
    "mtp_num_layers": 0,
    "inhomogeneous_layer_cycle_interval": 1,
}
"""base.yml's values (MaxText :data:`MAXTEXT_VERSION`) of every key the checks read."""

_STRATEGIES = ("all_gather", "ring", "ulysses", "usp")


def _config(values: Mapping[str, Any]) -> Mapping[str, Any]:
    """MaxText's merged configuration, as far as the checks read it: base.yml, then the
    named model's config, then the arguments."""
    name = values.get("model_name", "default")
    table = {k: v for k, v in MAXTEXT_MODELS.get(name, {}).items() if k != "source"}
    return {**MAXTEXT_DEFAULTS, **table, **values}


def _size(cfg: Mapping[str, Any], stem: str) -> int:
    return int(cfg[f"ici_{stem}_parallelism"]) * int(cfg[f"dcn_{stem}_parallelism"])


def _multiples(step: int, of: int, most: int = 6) -> str:
    """``step``'s multiples up to ``of`` that divide ``of`` (at most ``most``)."""
    found = [n for n in range(step, of + 1, step) if of % n == 0][:most]
    return ", ".join(map(str, found))


def _divisors(n: int, most: int = 8) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:most]


def _pipelined_layers(cfg: Mapping[str, Any]) -> int:
    given = int(cfg["pipeline_parallel_layers"])
    if given != -1:
        return given
    layers = int(cfg["base_num_decoder_layers"])
    if cfg["decoder_block"] == "deepseek":
        return layers - int(cfg["first_num_dense_layers"])
    return layers


def _pipelined_what(cfg: Mapping[str, Any], layers: int) -> str:
    """Which layers MaxText pipelines, in words."""
    decoder = int(cfg["base_num_decoder_layers"])
    leading = int(cfg["first_num_dense_layers"])
    pairs = int(MAXTEXT_MODELS.get(cfg["model_name"], {}).get("layers_per_decoder_layer", 1))
    if cfg["decoder_block"] == "deepseek" and layers == decoder - leading:
        return (
            f"pipeline_parallel_layers={layers}: the model's {decoder} decoder layers less its "
            f"{leading} leading dense ones, which run before the pipeline on every stage"
        )
    if layers == decoder:
        return f"pipeline_parallel_layers={layers}: the model's decoder layers" + (
            f", each a pair of the plan's {decoder * pairs} layers" if pairs > 1 else ""
        )
    return f"pipeline_parallel_layers={layers} of the model's {decoder} decoder layers"


def _stage_fits(layers: int, stages: int, pairs: int) -> str:
    """What pipelines ``layers`` over the stages: layers per stage and pass, or stages."""
    if layers % stages:
        return f"a stage count dividing {layers}: among {_divisors(layers)[1:]}"
    fits = [n * pairs for n in _divisors(layers // stages)]
    return f"pipeline.layers_per_stage among {fits}" + (
        f" (whole pairs of layers: MaxText's decoder layer is {pairs} of the plan's)"
        if pairs > 1
        else ""
    )


def _pipeline(cfg: Mapping[str, Any], devices: int) -> str | None:
    stages = _size(cfg, "pipeline")
    if stages <= 1:
        return None
    layers = _pipelined_layers(cfg)
    per = int(cfg["num_layers_per_pipeline_stage"])
    repeats = int(cfg["num_pipeline_repeats"])
    what = _pipelined_what(cfg, layers)
    pairs = int(MAXTEXT_MODELS.get(cfg["model_name"], {}).get("layers_per_decoder_layer", 1))
    if repeats == -1:
        if per < 1 or layers % (stages * per):
            return (
                f'"The number of layers per stage ({per}) times the number of stages ({stages}) '
                f'must divide the number of pipeline_parallel_layers" ({what}); accepted: '
                f"{_stage_fits(layers, stages, pairs)}"
            )
        repeats = layers // (stages * per)
    if stages * repeats * per != layers:
        return (
            f'"The product of pipeline stages ({stages}), repeats ({repeats}), and layers per '
            f'stage ({per}) must be equal to pipeline_parallel_layers" ({what}); accepted: '
            f"{_stage_fits(layers, stages, pairs)}"
        )
    delay = bool(cfg["pipeline_delay_activation_forwarding"])
    micro = int(cfg["num_pipeline_microbatches"])
    if micro == -1:
        micro = 2 * stages if delay else stages
    batch = int(devices * float(cfg["per_device_batch_size"]))
    if micro <= 0 or micro % stages:
        return (
            f'"The number of microbatches ({micro}) must be divisible by the number of stages '
            f'({stages})"; accepted: pipeline.microbatches a multiple of the {stages} stages '
            + (
                f"that divides the {batch} sequences of a forward pass: {_multiples(stages, batch)}"
                if batch % stages == 0
                else f"({stages}, {2 * stages}, {3 * stages} ...), with a global batch they "
                f"divide (the {batch} sequences now are no multiple of {stages})"
            )
        )
    if batch > 0 and batch % micro:
        return (
            f'"The batch size for a single forward pass ({batch}) must be divisible by the '
            f'number of microbatches ({micro})"; accepted: pipeline.microbatches among '
            f"{_multiples(stages, batch) or 'none: no multiple of the stages divides it'}, or a "
            f"global batch that {micro} divides"
        )
    if delay and micro < 2 * stages:
        return (
            f'"Delayed activation forwarding requires at least 2 * num_stages microbatches, but '
            f'{stages} stages are used with {micro} microbatches"; accepted: '
            f"num_pipeline_microbatches of at least {2 * stages} (a multiple of {stages}), or "
            "pipeline_delay_activation_forwarding=false"
        )
    return None


def _resolved_fsdp(cfg: Mapping[str, Any], devices: int) -> int:
    """The fsdp and fsdp_transpose axes' combined size, a -1 resolved as MaxText does
    (``types._resolved_fsdp_size``)."""
    slices = max(int(cfg["num_slices"]), 1)
    total = 1
    for net, count in (("ici", devices // slices), ("dcn", slices)):
        sizes = {a: int(cfg[f"{net}_{MESH_AXIS_STEM[a]}_parallelism"]) for a in MAXTEXT_MESH_AXES}
        known = math.prod(v for v in sizes.values() if v != -1)
        left = count // known if known > 0 and count > 0 and count % known == 0 else 1
        sizes = {a: left if v == -1 else v for a, v in sizes.items()}
        total *= max(sizes["fsdp"], 1) * max(sizes["fsdp_transpose"], 1)
    return total


def _zero1(cfg: Mapping[str, Any], devices: int) -> str | None:
    if not cfg["shard_optimizer_over_data"]:
        return None
    fsdp = _resolved_fsdp(cfg, devices)
    if fsdp <= 1:
        return None
    return (
        f'"`shard_optimizer_over_data` (Zero-1) cannot be combined with FSDP: the resolved '
        f'fsdp/fsdp_transpose mesh axes have a combined size of {fsdp}"; accepted: ZeRO-1 '
        "(optimizer.shard_over_data) without an fsdp axis (put those devices on data), or "
        "fsdp without optimizer.shard_over_data"
    )


def per_device_batch_size(global_batch: int, devices: int, seq: int, tiles: int) -> float:
    """The ``per_device_batch_size`` to write for ``global_batch`` sequences of ``seq``
    tokens over ``devices``: the float nearest ``global_batch / devices`` (a few ulps
    either way) whose product with the devices MaxText truncates back to the global batch
    (``int(devices * per_device_batch_size)``: ``120 / 88`` would train 119) and whose
    tokens per device its vocab-tiling check takes (``(per_device_batch_size * seq) %
    tiles == 0`` in floats); the first of those that holds when both cannot.

    Example:
      >>> int(88 * (120 / 88)), int(88 * per_device_batch_size(120, 88, 2048, 1))
      (119, 120)
    """
    exact = global_batch / devices
    candidates, up, down = [exact], exact, exact
    for _ in range(4):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        candidates += [up, down]
    whole = [x for x in candidates if int(devices * x) == global_batch] or [exact]
    return next((x for x in whole if (x * seq) % tiles == 0), whole[0])


def _exact_batches(devices: int, seq: int, tiles: int, near: int, most: int = 4) -> list[int]:
    """Global batches near ``near`` whose share per device passes both float checks."""
    found = []
    for step in range(1, 4 * devices + 1):
        for batch in (near - step, near + step):
            x = per_device_batch_size(batch, devices, seq, tiles) if batch > 0 else 0.0
            if batch > 0 and int(devices * x) == batch and (x * seq) % tiles == 0:
                found.append(batch)
        if len(found) >= most:
            break
    return sorted(found)[:most]


def _vocab_tiling(cfg: Mapping[str, Any], devices: int) -> str | None:
    per_device, seq = float(cfg["per_device_batch_size"]), int(cfg["max_target_length"])
    tiles = int(cfg["num_vocab_tiling"])
    if not (per_device > 0 and (per_device * seq) % tiles != 0):
        return None
    tokens = per_device * seq
    if float(tokens).is_integer():
        accepted = f"model.vocab_tiling dividing the {tokens:g} tokens a device holds"
    else:
        batches = _exact_batches(devices, seq, tiles, int(devices * per_device))
        accepted = (
            f"a global batch whose share of the {devices} devices MaxText's floats hold "
            f"exactly, e.g. {', '.join(map(str, batches))}"
        )
    return (
        '"Per device batch size times sequence length should be divisible by the number '
        f'of vocab tiles" ({per_device!r} x {seq} tokens, {tiles} tiles); accepted: {accepted}'
    )


def _ring_on_tpu(cfg: Mapping[str, Any], cp: int) -> str | None:
    """MaxText's TPU ring attention (Tokamax's splash kernel) and what it needs."""
    seq = int(cfg["max_target_length"])
    needs = [
        (cp <= 1, "TPU Tokamax ring attention requires context_parallel_size > 1.",
         "a context axis over 1"),
        (seq % (cp * cp) != 0,
         "TPU Tokamax ring attention requires max_target_length to be divisible by "
         "context_parallel_size squared.",
         f"a sequence length that {cp * cp} ({cp} squared) divides, or the all_gather strategy"),
        (cfg["attention"] != "flash", "TPU ring context parallelism requires attention=flash.",
         "model.attention flash"),
        (not cfg["use_tokamax_splash"],
         "TPU ring context parallelism requires use_tokamax_splash=True.",
         "use_tokamax_splash=true (launch writes it for ring plans)"),
        (bool(cfg["use_jax_splash"]), "TPU ring context parallelism requires use_jax_splash=False.",
         "use_jax_splash=false"),
        (cfg["attention_type"] not in ("global", "mla"),
         "TPU Tokamax ring attention supports only attention_type='global' or 'mla'.",
         "global or MLA attention"),
        (cfg["attention_type"] == "mla" and bool(cfg["packing"]),
         "TPU Tokamax ring attention with MLA does not support packing yet.",
         "packing=false in extra_args (sequences unpacked), or context_parallel.strategy "
         "all_gather"),
        (bool(cfg["context_parallel_load_balance"]) and cp % 2 != 0,
         "TPU Tokamax ring load balancing requires an even context_parallel_size.",
         "an even context size, or context_parallel.load_balance false"),
        (bool(cfg["context_parallel_load_balance"]) and int(cfg["mtp_num_layers"]) > 0,
         "TPU Tokamax ring attention with context_parallel_load_balance=True does not "
         "support MTP.", "context_parallel.load_balance false"),
        (int(cfg["dq_reduction_steps"]) not in (0, 3),
         "TPU Tokamax ring attention requires dq_reduction_steps to be 0 or 3.",
         "dq_reduction_steps 0 or 3"),
    ]  # fmt: skip
    for refused, words, accepted in needs:
        if refused:
            return f'"{words}" (context size {cp}); accepted: {accepted}'
    return None


def _context(cfg: Mapping[str, Any], _devices: int) -> str | None:
    strategy = str(cfg["context_parallel_strategy"]).lower()
    if strategy not in _STRATEGIES:
        return (
            "\"context_parallel_strategy must be one of 'all_gather', 'ring', 'ulysses', or "
            f"'usp'.\" (given {strategy!r}); accepted: one of those"
        )
    if strategy != "ring":
        return None
    cp = _size(cfg, str(cfg["context_sharding"]))
    hardware = str(cfg["hardware"])
    if "gpu" not in hardware and "tpu" not in hardware and cp > 1:
        return (
            "\"Ring context parallelism strategy (context_parallel_strategy='ring') is only "
            'supported on GPUs or TPU with attention=flash and use_tokamax_splash=True." '
            f"(hardware={hardware}); accepted: the all_gather strategy"
        )
    if "gpu" not in hardware and "tpu" in hardware:
        return _ring_on_tpu(cfg, cp)
    return None


def _slices(cfg: Mapping[str, Any], _devices: int) -> str | None:
    dcn = math.prod(int(cfg[f"dcn_{MESH_AXIS_STEM[a]}_parallelism"]) for a in MAXTEXT_MESH_AXES)
    if abs(dcn) > 1 and not int(cfg["num_slices"]) > 1:
        return (
            '"DCN parallelism requested but only one slice available." (dcn sizes multiply to '
            f"{abs(dcn)}, num_slices={cfg['num_slices']}); accepted: dcn sizes of 1 on one slice"
        )
    return None


def _te_attention(cfg: Mapping[str, Any], _devices: int) -> str | None:
    if (
        cfg["hardware"] == "gpu"
        and cfg["packing"]
        and cfg["attention"] == "cudnn_flash_te"
        and int(cfg["max_segments_per_seq"]) <= 0
    ):
        return (
            '"max_segments_per_seq must be set when using TransformerEngine attention and '
            "packing\"; accepted: max_segments_per_seq=32 (MaxText's GPU model configs; "
            "launch writes it), or packing=false"
        )
    return None


def _moe(cfg: Mapping[str, Any], _devices: int) -> str | None:
    block = cfg["decoder_block"]
    if block == "llama4":
        if float(cfg["capacity_factor"]) >= 0:
            return (
                '"Llama4 decoder has not been tested with capacity_factor >= 0 -- please set '
                f'that value to -1 for now!" (capacity_factor={cfg["capacity_factor"]}); '
                "accepted: a dropless model (no model.capacity_factor)"
            )
        if int(cfg["num_experts_per_tok"]) > 1:
            return (
                '"Only top-1 routing is supported for Llama4 for now!" (num_experts_per_tok='
                f"{cfg['num_experts_per_tok']}); accepted: model.experts_per_token 1"
            )
        layers, step = int(cfg["base_num_decoder_layers"]), int(cfg["interleave_moe_layer_step"])
        if layers % step:
            return (
                f'"The number of decoder layers ({layers}) must be divisible by interleave moe '
                f'layer step ({step})"; accepted: layers a multiple of model.moe_every'
            )
    if int(cfg["num_experts"]) <= 1:
        return None
    if int(cfg["base_moe_mlp_dim"]) <= 0:
        return (
            '"moe_mlp_dim must be positive for MoE models (num_experts > 1)"; accepted: '
            "model.moe_d_ff above 0"
        )
    fully = (
        int(cfg["interleave_moe_layer_step"]) == 1
        and int(cfg["first_num_dense_layers"]) == 0
        and int(cfg["inhomogeneous_layer_cycle_interval"]) == 1
    )
    mlp, moe = int(cfg["base_mlp_dim"]), int(cfg["base_moe_mlp_dim"])
    if fully and mlp != moe and block not in ("qwen3_moe", "gemma4"):
        return (
            '"For a fully MoE model, base_mlp_dim must equal base_moe_mlp_dim. Got '
            f'base_mlp_dim={mlp}, base_moe_mlp_dim={moe}."; accepted: model.d_ff equal to '
            f"model.moe_d_ff ({moe}): every layer is a mixture of experts, so d_ff sizes none"
        )
    if block == "gpt_oss" and not cfg["sparse_matmul"] and float(cfg["capacity_factor"]) != -1:
        return (
            '"GPT-OSS MoE only supports dropless (capacity_factor=-1) with dense matmul."; '
            "accepted: model.moe_kernel sparse, or a dropless model"
        )
    return None


def _named_model(cfg: Mapping[str, Any], _devices: int) -> str | None:
    name = cfg["model_name"]
    if name not in MAXTEXT_MODELS or cfg["override_model_config"]:
        return None
    table = MAXTEXT_MODELS[name]
    for key, value in table.items():
        if key in ("source", "layers_per_decoder_layer") or cfg.get(key, value) == value:
            continue
        return (
            f"\"Keys ['{key}'] are overridden by both model config and CLI/kwargs with "
            f'different values" ({key}={cfg[key]!r}, '
            f"{name}.yml has {value!r}); accepted: override_model_config=true, or "
            f"{name}'s own value"
        )
    return None


_CHECKS: tuple[Callable[[Mapping[str, Any], int], str | None], ...] = (
    _named_model,
    _pipeline,
    _zero1,
    _vocab_tiling,
    _context,
    _slices,
    _te_attention,
    _moe,
)


def maxtext_refusal(args: Sequence[str], *, devices: int) -> str | None:
    """MaxText's reason to refuse ``args`` on ``devices`` devices (with what it would
    accept), or ``None`` where its checks pass."""
    cfg = _config(parse_maxtext_args(args))
    for check in _CHECKS:
        reason = check(cfg, int(devices))
        if reason is not None:
            return reason
    return None


def check_maxtext_launch(args: Sequence[str], *, devices: int) -> None:
    """Refuse a launch MaxText's configuration checks would refuse.

    Args:
      args: MaxText's ``key=value`` arguments as the launch writes them.
      devices: the plan's devices (all slices).

    Raises:
      PlanError: ``not_launchable`` quoting MaxText's reason and what it would accept.
    """
    reason = maxtext_refusal(args, devices=devices)
    if reason is not None:
        raise PlanError(
            "not_launchable",
            f"MaxText {MAXTEXT_VERSION} would refuse this launch: {reason}. Plan again with "
            "an accepted value (or pass it in extra_args), then launch",
        )
