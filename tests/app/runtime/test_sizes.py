"""Sizes checked before lowering (issue 58, classes 2 and 3; app/runtime/sizes.py and
``check_before_lowering`` in app/runtime/steps.py).

- The element table is an upper bound of what XLA makes: for every kind of step (dense,
  ``dot`` and ``flash`` attention, remat, mixtures of experts dropless over an expert
  axis and on one device, capacity kernels, shared experts, an MLP), its largest array
  is at least the largest array of XLA's compiled step, and not far above it.
- In a real runtime: a mixture-of-experts step whose dispatched rows times ``moe_d_ff``
  pass 2**31 - 1 elements (the issue's SIGFPE) is 422 ``model_too_large`` before anything
  is lowered, under a budget that would admit it, and the runtime and its other session
  live on; so is a session whose parameter array passes the bound, before anything is
  initialised; a ``dot`` step of a long sequence is refused by the estimate before
  lowering, with no large allocation in the runtime (its peak RSS stays low).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

from app.core.errors import ServiceError
from app.runtime import sessions, steps
from app.runtime.sizes import MAX_ELEMENTS, check_elements, transformer_step_elements
from datarax.specs.model_specs import model_spec
from tests.conftest import require_devices

HUGE_BUDGET = {"host": 2**50, "device": 2**50}  # admits anything: only sizes refuse
TINY = {"kind": "transformer", "layers": 2, "d_model": 32, "d_ff": 64, "heads": 4,
        "kv_heads": 2, "vocab": 50, "seq_len": 64}  # fmt: skip
MOE = {**TINY, "num_experts": 4, "experts_per_token": 2, "moe_d_ff": 256}
# The issue's session: d_model 32, 8 experts, 8 per token, moe_d_ff 65,536, 4,096 tokens.
ISSUE_MOE = {"kind": "transformer", "layers": 1, "d_model": 32, "d_ff": 64, "heads": 4,
             "kv_heads": 4, "vocab": 64, "seq_len": 4096, "num_experts": 8,
             "experts_per_token": 8, "moe_d_ff": 65536}  # fmt: skip
# Its smallest variant to create here: 2 experts, both per token, 8,192 tokens over an
# expert axis of 2: each device receives 2 x 8,192 x 2 = 32,768 rows of 65,536.
SMALL_OVERSIZED_MOE = {"kind": "transformer", "layers": 1, "d_model": 8, "d_ff": 16,
                       "heads": 2, "kv_heads": 2, "vocab": 16, "seq_len": 8192,
                       "num_experts": 2, "experts_per_token": 2, "moe_d_ff": 65536}  # fmt: skip
_SHAPE = re.compile(r"\b(?:f32|bf16|f16|f64|s8|u8|s32|u32|s64|pred)\[([\d,]*)\]")


def _payload(sid: str, axes: dict, model: dict, batch_axes=None, budget=None) -> dict:
    n = math.prod(axes.values())
    payload = {
        "id": sid,
        "mesh": {
            "axes": axes,
            "device_grid": np.arange(n).reshape(tuple(axes.values())).tolist(),
            "batch_axes": batch_axes,
        },
        "model": model,
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "seed": 0,
    }
    if budget is not None:
        payload["memory_budget"] = budget
    return payload


def _largest_xla_array(text: str) -> int:
    """Elements of the largest array of a compiled HLO module's text."""
    return max(math.prod(int(d) for d in m.group(1).split(",") if d) for m in _SHAPE.finditer(text))


STEPS = [
    ("dense-dot", {"data": 8}, {**TINY, "attention": "dot"}, 16, None),
    ("flash-key-blocks", {"data": 8}, {**TINY, "seq_len": 1024, "heads": 8, "kv_heads": 8}, 8,
     None),
    ("dot-remat-full", {"data": 8}, {**TINY, "seq_len": 256, "attention": "dot",
                                      "remat": "full"}, 8, None),
    ("logits", {"data": 4}, {**TINY, "vocab": 4000, "seq_len": 128}, 8, None),
    ("moe-expert-axis", {"data": 2, "expert": 4}, MOE, 16, ["data", "expert"]),
    ("moe-all-experts", {"expert": 8}, {**MOE, "num_experts": 8, "experts_per_token": 8,
                                         "moe_d_ff": 512, "layers": 1}, 8, ["expert"]),
    ("moe-one-device", {"data": 1}, {**MOE, "num_experts": 8, "experts_per_token": 8,
                                      "moe_d_ff": 512, "layers": 1}, 1, None),
    ("moe-capacity", {"data": 2, "expert": 4}, {**MOE, "moe_kernel": "dense",
                                                 "capacity_factor": 1.5}, 16, ["data", "expert"]),
    ("moe-shared-plain", {"data": 4}, {**MOE, "moe_d_ff": 512, "shared_experts": 1,
                                        "first_dense_layers": 1, "layers": 3, "mlp": "plain"}, 8,
     None),
    ("mlp", {"data": 8}, {"kind": "mlp", "features": [16, 300, 8]}, 64, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("axes", "model", "rows", "batch_axes"),
    [case[1:] for case in STEPS],
    ids=[case[0] for case in STEPS],
)
def test_the_table_bounds_the_largest_array_of_the_compiled_step(axes, model, rows, batch_axes):
    require_devices(8)
    sid = f"sizes-{len(sessions.SESSIONS)}"
    payload = _payload(sid, axes, model, batch_axes, budget=HUGE_BUDGET)
    if model["kind"] == "mlp":
        payload["loss"] = "mse"
    sessions.session_create(payload, {})
    try:
        s = sessions.SESSIONS[sid]
        executable = steps._compile(s, steps._abstract_batch(s, rows))
        xla = _largest_xla_array(executable.as_text())
        table = max(steps.step_elements(s, rows).values())
        assert xla <= table <= 4 * xla, (xla, steps.step_elements(s, rows))
    finally:
        sessions.session_delete({"id": sid}, {})


def test_the_issues_mixture_of_experts_step_passes_the_bound():
    # 4,096 tokens x 8 experts a token x 8 expert shards = 262,144 rows received per
    # device, x 65,536 = 2**34 elements of hidden activations (and 8x that off TPU)
    arrays = transformer_step_elements(model_spec(ISSUE_MOE), 8, 1, 8, 8, "cpu")
    assert arrays["expert hidden"] == 2**34 and arrays["grouped matmul"] == 2**34
    assert arrays["dispatch buffer"] == 262_144 * 32
    one_device = transformer_step_elements(model_spec(ISSUE_MOE), 1, 1, 1, 1, "tpu")
    assert one_device["expert hidden"] == 2**31 > MAX_ELEMENTS
    assert "grouped matmul" not in one_device  # TPU's grouped matmul is its own kernel
    with pytest.raises(ServiceError) as err:
        check_elements("a step", one_device)
    assert (err.value.status, err.value.code) == (422, "model_too_large")
    assert "expert hidden would hold 2,147,483,648 elements" in str(err.value)
    check_elements("a step", {"at the bound": MAX_ELEMENTS})  # the bound itself passes


def test_an_oversized_step_is_refused_before_lowering_and_the_runtime_lives_on(shared_runtime):
    require_devices(8)
    runtime = shared_runtime
    pid = runtime.client.pid
    other = _payload("bystander", {"data": 8}, {**TINY}, batch_axes=["data"])
    runtime.call("session_create", other)
    step = {"id": "bystander", "steps": 1, "synthetic": {"seed": 0, "batch_size": 8}}
    assert runtime.call("session_step", step)[0]["step"] == 1
    big = _payload("oversized", {"expert": 2}, SMALL_OVERSIZED_MOE, ["expert"], HUGE_BUDGET)
    runtime.call("session_create", big)
    refused = {"id": "oversized", "steps": 1, "memory_budget": HUGE_BUDGET,
               "synthetic": {"seed": 0, "batch_size": 2}}  # fmt: skip
    with pytest.raises(ServiceError) as err:
        runtime.call("session_step", refused)
    assert (err.value.status, err.value.code) == (422, "model_too_large"), str(err.value)
    assert "expert hidden would hold 2,147,483,648 elements" in str(err.value)
    assert "nothing was lowered" in str(err.value)
    assert runtime.call("session_info", {"id": "oversized"})[0]["step"] == 0
    # the same runtime, and the other session trains on
    assert runtime.client.pid == pid
    assert runtime.call("session_step", step)[0]["step"] == 2
    for sid in ("oversized", "bystander"):
        runtime.call("session_delete", {"id": sid})


def test_a_session_with_a_parameter_past_the_bound_is_refused_before_it_is_made(shared_runtime):
    require_devices(8)
    # [65,536, 32,769]: 2,147,549,184 elements (8 GiB in float32), admitted by the budget
    mlp = {"kind": "mlp", "features": [65536, 32769]}
    payload = {**_payload("wide", {"data": 8}, mlp, budget=HUGE_BUDGET), "loss": "mse"}
    payload["optimizer"] = {"name": "sgd", "learning_rate": 0.01}
    with pytest.raises(ServiceError) as err:
        shared_runtime.call("session_create", payload)
    assert (err.value.status, err.value.code) == (422, "model_too_large"), str(err.value)
    assert "layers/0/kernel would hold 2,147,549,184 elements" in str(err.value)
    with pytest.raises(ServiceError) as lost:
        shared_runtime.call("session_info", {"id": "wide"})
    assert lost.value.code == "session_lost"  # nothing was kept


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_a_long_dot_attention_step_is_refused_before_any_large_allocation(start_runtime):
    require_devices(8)
    if not Path("/proc/self/status").exists():
        pytest.skip("LOUD SKIP: peak RSS is read from /proc (Linux)")
    runtime = start_runtime()
    # 32,768 tokens of dot attention, one sequence: its [S, S] mask alone is a 1 GiB
    # constant of the lowered program, and XLA's compile peaked at 4.5 GiB before its
    # figure (48 GiB) refused the step. The estimate (43 GiB) refuses it before lowering.
    model = {**TINY, "layers": 1, "seq_len": 32768, "attention": "dot"}
    budget = {"host": 8 * 2**30, "device": None}
    runtime.call("session_create", _payload("dot", {"data": 1}, model, budget=budget))
    before = _peak_rss_bytes(runtime.client.pid)
    step = {"id": "dot", "steps": 1, "memory_budget": budget,
            "synthetic": {"seed": 0, "batch_size": 1}}  # fmt: skip
    with pytest.raises(ServiceError) as err:
        runtime.call("session_step", step)
    assert (err.value.status, err.value.code) == (422, "insufficient_memory"), str(err.value)
    assert "(the estimate, before lowering)" in str(err.value)
    assert "XLA's compiled step" not in str(err.value)
    grown = _peak_rss_bytes(runtime.client.pid) - before
    assert grown < 256 * 2**20, f"the runtime's peak grew by {grown / 2**20:.0f} MiB"
    # the runtime serves on
    assert runtime.call("session_info", {"id": "dot"})[0]["step"] == 0
