"""What a compile check compiles for a serving plan (DESIGN v1.4, "Serving plans"): one
KV-cached decode step of the plan's model (:mod:`datarax.spmd.compile_decode`) for the
plan's TPU topology, in the plan's device order, holding the batch its
``serving_estimate`` prices (``batch`` sequences a replica of ``input_tokens +
output_tokens`` positions), judged against its serving ``memory_per_device``.

Compiled: TPU hardware plans (through libtpu) with ``data`` and ``tensor`` axes, bfloat16
weights and a bfloat16 cache. Not compiled (422 ``compile_target_unavailable``, with the
reason and the plan's serving memory): GPU hardware (no chips here), quantized weights
(``float8``, ``int8``, ``int4``: the library's transformer has no quantized matmul),
``float8``/``int8`` caches, and ``expert`` or ``stage`` axes (the decode step splits the
batch over replicas and the heads over tensor only).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from app.core.errors import CompileTargetUnavailable, ServiceError, from_library
from app.schemas.compile_checks import CompileCheckRequest
from datarax.errors import PlanError
from datarax.hardware.chips import get_hardware
from datarax.parallel.axis_roles import axis_roles
from datarax.specs.model_specs import TransformerSpec, model_spec

__all__ = ["SERVING_OPTIMIZER", "is_serving_plan", "serving_target"]

SERVING_OPTIMIZER = "none (serving decode step)"
"""The ``optimizer`` a serving check's work names (a decode step has none)."""


def is_serving_plan(plan: dict[str, Any]) -> bool:
    """The stored plan is a serving plan (it carries ``serving`` options)."""
    return bool(plan.get("serving")) and bool(plan.get("serving_estimate"))


def _unavailable(detail: str, memory: dict[str, Any]) -> CompileTargetUnavailable:
    return CompileTargetUnavailable(detail, extra={"serving_memory": memory})


def _libtpu() -> bool:
    try:
        importlib.metadata.version("libtpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def serving_target(plan: dict[str, Any], request: CompileCheckRequest) -> dict[str, Any]:
    """The worker's request for a serving plan's decode step: ``{"target", "axes",
    "roles", "device_ids", "model", "optimizer", "global_batch", "hbm_bytes", "serving":
    {"batch", "max_len", "weight_dtype"}, "serving_memory"}``.

    Raises:
      CompileTargetUnavailable: what is not compiled (module docstring).
      ServiceError: the library's codes for a model it refuses.
    """
    memory = dict(plan["memory_per_device"])
    options, estimate = plan["serving"], plan["serving_estimate"]
    try:
        spec = model_spec(request.model.model_dump(exclude_none=True))
    except PlanError as error:
        raise from_library(error) from None
    if not isinstance(spec, TransformerSpec):
        raise ServiceError(
            "a serving plan's compile check compiles a transformer's decode step: send the "
            "plan's transformer as model",
            code="invalid_model",
        )
    hardware = get_hardware(plan["hardware"])
    if hardware.kind != "tpu":
        raise _unavailable(
            f"{hardware.name} serving plans cannot be compiled here: only TPU topologies "
            "compile without the chips (libtpu); the serving memory is in 'serving_memory'",
            memory,
        )
    if not _libtpu():
        raise _unavailable(
            "TPU plans compile through libtpu, which is not installed here; install the "
            "extra: pip install -c constraints.txt 'jax[tpu]==0.12.0.1'",
            memory,
        )
    if options.get("weight_dtype", "bfloat16") != "bfloat16":
        raise _unavailable(
            f"the library's decode step holds bfloat16 weights; {options['weight_dtype']} "
            "weights need a quantized matmul it does not have",
            memory,
        )
    if options.get("kv_dtype", "bfloat16") != "bfloat16":
        raise _unavailable(
            f"the library's decode step caches bfloat16 keys and values, not {options['kv_dtype']}",
            memory,
        )
    axes = {name: int(size) for name, size in plan["axes"].items()}
    roles = axis_roles(list(axes), plan.get("roles"))
    other = sorted(a for a, n in axes.items() if n > 1 and roles[a] not in ("data", "tensor"))
    if other:
        raise _unavailable(
            f"axes {other} ({sorted({roles[a] for a in other})}): the library's decode step "
            "splits the batch over data axes and the heads over tensor axes only",
            memory,
        )
    replicas = int(estimate.get("replicas") or 1)
    batch = int(estimate["batch"])
    ids = [int(i) for i in _flatten(plan["device_grid"])]
    return {
        "target": {
            "kind": "tpu",
            "hardware": hardware.name,
            "topology": plan["topology"],
            "slices": int(plan.get("slices") or 1),
            "hbm_source": f"catalog:{hardware.name}",
        },
        "axes": axes,
        "roles": roles,
        "device_ids": ids,
        "model": spec.to_json(),
        "optimizer": SERVING_OPTIMIZER,
        "global_batch": batch * replicas,
        "hbm_bytes": hardware.hbm_bytes,
        "serving": {
            "batch": batch,
            "max_len": int(options["input_tokens"]) + int(options["output_tokens"]),
            "weight_dtype": "bfloat16",
        },
        "serving_memory": memory,
    }


def _flatten(grid: Any) -> list[Any]:
    if isinstance(grid, list):
        return [x for row in grid for x in _flatten(row)]
    return [grid]
