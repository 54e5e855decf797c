"""Step admission by XLA's figures: a real runtime compiles the step from shapes, reads its
``memory_analysis()`` and admits (or refuses) before anything runs.

The session is replicated on 8 CPU devices with adam and no donation (CPU). Its
reservation is :func:`session_need` (7 copies of the model per device and one whole
model), held by the session itself; a step needs by XLA's figure what its 8 devices' peak
exceeds that reservation by, plus the host copy of the batch.
"""

from __future__ import annotations

import re

import jax
import pytest

from app.core.errors import ServiceError
from app.runtime.admission import session_need, step_need
from tests.app.runtime.test_admission import _payload
from tests.conftest import require_devices

_XLA = re.compile(
    r"XLA's compiled step: ([\d,]+) bytes per device; arguments ([\d,]+) \+ outputs ([\d,]+) "
    r"- aliased ([\d,]+) \+ temporaries ([\d,]+), XLA's peak ([\d,]+)"
)


def _refusal(runtime, payload) -> str:
    with pytest.raises(ServiceError) as err:
        runtime.call("session_step", payload)
    assert (err.value.status, err.value.code) == (422, "insufficient_memory")
    return str(err.value)


def _setup(runtime, sid: str, features: list[int], rows: int):
    """Creates the session; returns (reserved bytes, estimated step bytes, XLA's figures
    read from a refusal under a 1-byte budget)."""
    require_devices(8)
    mesh = jax.make_mesh((8,), ("data",))
    runtime.call("session_create", _payload({"data": 8}, sid, features=features))
    reserved = session_need(mesh, features, "replicate", "adam", donate=False)[("host", 0)]
    estimate = step_need(mesh, 8, features, rows)[("host", 0)]
    tiny = {"host": 1, "device": None}
    step = {"id": sid, "steps": 1, "synthetic": {"seed": 0, "batch_size": rows}}
    text = _refusal(runtime, {**step, "memory_budget": tiny})
    match = _XLA.search(text)
    assert match, text
    total, argument, output, alias, temp, xla_peak = (
        int(g.replace(",", "")) for g in match.groups()
    )
    assert total == max(argument + output - alias + temp, xla_peak)
    return reserved, estimate, {"total": total, "argument": argument, "temp": temp}, step


def test_xla_refuses_a_step_the_estimate_admits(start_runtime):
    # MLP [16, 4096, 16], 1,024 rows a device: XLA keeps more of the 4,096-wide hidden
    # layer alive at once than the estimate's 2 x width per row.
    runtime = start_runtime()
    features, rows = [16, 4096, 16], 8192
    reserved, estimate, xla, step = _setup(runtime, "wide", features, rows)
    model_bytes = (16 * 4096 + 4096 + 4096 * 16 + 16) * 4
    batch_shard = rows // 8 * (16 + 16) * 4
    # The quoted arguments are this device's state (params and 2 adam moments, plus a
    # few counter bytes) and its batch rows: XLA's figure, not ours.
    assert 0 <= xla["argument"] - (3 * model_bytes + batch_shard) < 64
    xla_need = 8 * xla["total"] - reserved + rows * (16 + 16) * 4
    assert estimate < xla_need
    budget = reserved + (estimate + xla_need) // 2  # the estimate fits; XLA's figure not
    text = _refusal(runtime, {**step, "memory_budget": {"host": budget, "device": None}})
    assert "a step of batch size 8192 (XLA's compiled step" in text
    info, _ = runtime.call("session_info", {"id": "wide"})
    assert info["step"] == 0  # refused before it ran
    runtime.call("session_step", step)  # the host's own budget admits it
    assert runtime.call("session_info", {"id": "wide"})[0]["step"] == 1


def test_xla_admits_a_step_the_estimate_refuses(start_runtime):
    # MLP [256, 1024, 256], 8 rows a device: XLA's step fits inside the session's own
    # reservation (state in, state out, small temporaries); the estimate adds its
    # activations on top.
    runtime = start_runtime()
    features, rows = [256, 1024, 256], 64
    reserved, estimate, xla, step = _setup(runtime, "narrow", features, rows)
    host_batch = rows * (256 + 256) * 4
    xla_need = max(0, 8 * xla["total"] - reserved) + host_batch
    assert xla_need < estimate
    budget = reserved + (estimate + xla_need) // 2  # XLA's figure fits; the estimate not
    answer, _ = runtime.call("session_step", {**step, "memory_budget": {"host": budget}})
    assert answer["step"] == 1 and answer["timing"]["cache_hit"] is True  # compiled once
