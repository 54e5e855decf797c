"""The planner without HTTP: requests in, plan JSON out, exactly as JAX lays arrays out."""

from __future__ import annotations

import json

import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from app.schemas.meshes import MeshPlanRequest
from app.services.meshes import plan_request
from app.services.plans import abstract_devices, render_plan
from datarax.errors import PlanError
from tests.conftest import require_devices


def _render(body: dict, n: int) -> dict:
    from datarax.plan.layout import resolve_axes

    request = plan_request(MeshPlanRequest.model_validate({**body, "num_devices": n}))
    axes = resolve_axes(request.axes, n, exact=True)
    rendered = render_plan(request, axes, abstract_devices(axes), plan_id="m_x", created_at="t")
    return json.loads(rendered.body)


def test_abstract_plan_shards_equal_jax_on_eight_devices():
    require_devices(8)
    import jax

    plan = _render({"axes": {"data": 2, "model": 4}, "batch_shape": [16, 6]}, 8)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    expected = NamedSharding(mesh, P("data")).devices_indices_map((16, 6))
    for shard, device in zip(plan["shards"], mesh.devices.flat, strict=True):
        got = [tuple(r) for r in shard["index"]]
        want = [
            (s.start or 0, s.stop if s.stop is not None else dim)
            for s, dim in zip(expected[device], (16, 6), strict=True)
        ]
        assert got == want


def test_model_layouts_and_memory():
    plan = _render(
        {
            "axes": {"data": 2, "model": 4},
            "batch_shape": [8, 16],
            "model": {"kind": "mlp", "features": [16, 64, 4]},
            "param_sharding": "model",
        },
        8,
    )
    kernel = plan["params"][0]
    assert kernel["spec"] == [None, "model"] and kernel["shard_shape"] == [16, 16]
    memory = plan["memory_per_device"]
    assert memory["total"] == memory["params"] + memory["optimizer"] + memory["batch"]
    assert memory["optimizer"] == 2 * memory["params"]  # adam: two moments


def test_indivisible_batch_names_nearest_sizes():
    with pytest.raises(PlanError) as info:
        _render({"axes": {"data": 4}, "batch_shape": [10]}, 4)
    assert info.value.code == "batch_not_divisible" and "8" in info.value.message
