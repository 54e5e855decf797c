"""Arrays too large for the kernels: a session or a step is refused (422
``model_too_large``) before anything is initialised or lowered when one of its arrays
would hold more than :data:`MAX_ELEMENTS` elements.

XLA's kernels index an array's elements with 32-bit integers in places: a mixture-of-experts
step whose dispatched rows times the experts' hidden width passed about 2**31 elements
killed the whole runtime (SIGFPE), and every other session with it (issue 58). Memory
admission (:mod:`app.runtime.admission`) does not catch it where the host is large enough
to admit such a step. So the arrays a session's kernels index are counted from its model,
mesh and batch, before lowering: plain arithmetic, no JAX.

What is counted, per device (the program each device runs), the largest one deciding:

- parameters: each whole array (``spec.params()``, a scanned transformer's layers stacked
  in one array), as every process initialises the whole model before placing it;
- the batch as the host holds it (every row);
- a transformer's layer inputs (stacked by the scan for its backward pass), its logits (one
  ``vocab_tiling`` tile), its queries, the attention scores (``dot``: ``[b, heads, S, S]``,
  stacked over the layers unless ``remat: full``, and the causal mask the lowering
  captures as an ``[S, S]`` constant; ``flash``: on TPU one key block of at most 512, else
  the blockwise kernel's masks, which its backward keeps for every key block, ``[b, heads,
  S, S]`` booleans), the dense
  layers' hidden activations, and a mixture-of-experts layer's dispatched rows, the
  experts' hidden activations over them and, off TPU, XLA's dense form of the grouped
  matmul (every local expert's copy of the rows: ``[experts, rows, moe_d_ff]``);
- an MLP's widest activation over its rows.

Each figure is an upper bound of the array XLA makes (it may fuse some away); a model
refused here may compile, but one admitted here has no array past the bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from app.core.errors import ServiceError
from datarax.specs.model_specs import ModelSpec, TransformerSpec

MAX_ELEMENTS = 2**31 - 1
"""Elements of one array at most: the largest count a signed 32-bit index reaches."""

_ATTENTION_BLOCK = 512
"""Keys a ``flash`` step on TPU (splash attention) scores at once, at most."""
_SPLASH_BLOCK = 128
"""Sequences splash attention takes: multiples of this; others take the blockwise kernel."""


def parameter_elements(spec: ModelSpec) -> dict[str, int]:
    """Elements of each parameter array, whole (a stacked group is one array)."""
    return {g.path: int(g.repeat) * math.prod(g.shape) for g in spec.params()}


def mlp_step_elements(features: Sequence[int], rows: int, rows_per_device: int) -> dict[str, int]:
    """The arrays of one MLP step: the host batch and the widest activation of a device."""
    return {
        "batch": rows * max(features[0], features[-1]),
        "activations": rows_per_device * max(features),
    }


def transformer_step_elements(
    spec: TransformerSpec,
    rows: int,
    rows_per_device: int,
    expert_shards: int,
    devices: int,
    platform: str,
) -> dict[str, int]:
    """The arrays of one transformer step (module docstring).

    Args:
      spec: the model.
      rows: the batch's sequences.
      rows_per_device: the sequences one device holds.
      expert_shards: the product of the mesh's expert axes (1 without one).
      devices: the mesh's devices (the expert-parallel kernel runs on more than one).
      platform: the devices' platform (``tpu`` has a grouped matmul of its own).

    Returns:
      Array name -> elements.
    """
    b, s = rows_per_device, spec.seq_len
    saved = 1 if spec.remat == "full" else spec.layers  # the scan stacks what it saves
    out = {
        "batch (token ids)": rows * s,
        "layer inputs": spec.layers * b * s * spec.d_model,
        "logits": b * math.ceil(s / max(1, spec.vocab_tiling)) * spec.vocab,
        "queries": saved * b * s * spec.heads * spec.qk_head_dim,
    }
    if spec.attention == "dot":
        out["attention scores"] = saved * b * spec.heads * s * s
        out["causal mask"] = s * s
    elif platform == "tpu" and s % _SPLASH_BLOCK == 0:  # splash: one block of keys at a time
        out["attention scores"] = b * spec.heads * s * min(s, _ATTENTION_BLOCK)
    else:  # the blockwise kernel's backward keeps every key block's mask: [S, S] a head
        out["attention masks"] = b * spec.heads * s * s
    if spec.dense_layers:
        dense_saved = 1 if spec.remat == "full" else spec.dense_layers
        out["feed-forward hidden"] = dense_saved * b * s * spec.d_ff
    if spec.is_moe:
        out.update(_moe_elements(spec, b, expert_shards, devices, platform))
    return out


def _moe_elements(
    spec: TransformerSpec, b: int, e: int, devices: int, platform: str
) -> dict[str, int]:
    """A mixture-of-experts layer's arrays (:mod:`datarax.models.moe`)."""
    s, k, experts, f = spec.seq_len, spec.experts_per_token, spec.num_experts, spec.moe_d_ff
    saved = 1 if spec.remat == "full" else spec.moe_layers
    out: dict[str, int] = {}
    if spec.moe_kernel == "sparse":
        routed = b * s * k
        if devices > 1 and experts % e == 0:
            # the expert-parallel kernel: a receive buffer for every routed copy of the
            # expert group (the worst case, all to one device), per device
            received, local = max(1, e) * routed, experts // max(1, e)
            out["dispatch buffer"] = received * spec.d_model
        else:
            received, local = routed, experts
        out["expert hidden"] = saved * received * f
        if platform != "tpu":  # XLA's dense ragged dot: every group's copy of the rows
            out["grouped matmul"] = local * received * f
    else:
        capacity = max(1, int(math.ceil(s * k / experts) * spec.capacity_factor))
        # the experts' arrays are split over the expert axes, and not their batch
        rows = b * max(1, e)
        out["dispatch mask"] = b * s * experts * capacity
        out["expert hidden"] = saved * math.ceil(experts / max(1, e)) * rows * capacity * f
    if spec.shared_experts:
        out["shared expert hidden"] = saved * b * s * spec.shared_experts * f
    return out


def check_elements(what: str, arrays: Mapping[str, int]) -> None:
    """Refuses ``arrays`` (name -> elements) when one passes :data:`MAX_ELEMENTS`.

    Raises:
      ServiceError: 422 ``model_too_large``, naming the largest array, its elements and
        the bound.
    """
    if not arrays:
        return
    name, largest = max(arrays.items(), key=lambda item: item[1])
    if largest > MAX_ELEMENTS:
        raise ServiceError(
            f"{what}: its {name} would hold {largest:,} elements, beyond the "
            f"{MAX_ELEMENTS:,} (2**31 - 1) that XLA's kernels index in one array; nothing "
            "was lowered. Use a smaller batch, sequence or model (for a mixture of experts, "
            "fewer experts per token or a smaller moe_d_ff)",
            code="model_too_large",
        )
