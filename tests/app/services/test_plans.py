"""The planner without HTTP: requests in, plan JSON out, exactly as JAX lays arrays out."""

from __future__ import annotations

import json

import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from app.schemas.meshes import MeshPlanRequest
from app.services.hardware import render_hardware_plan
from app.services.meshes import plan_request
from app.services.plans import (
    ShardColumns,
    abstract_devices,
    plan_answer,
    render,
    render_plan,
    shard_template,
)
from datarax.answers.estimates import AxisDetail
from datarax.answers.plans import BatchLayout, MeshPlan, MeshPlanSummary, Shard
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


def _plan(body: dict, n: int):
    from datarax.plan.layout import resolve_axes

    request = plan_request(MeshPlanRequest.model_validate({**body, "num_devices": n}))
    axes = resolve_axes(request.axes, n, exact=True)
    return plan_answer(request, axes, abstract_devices(axes), plan_id="m_x", created_at="t")


def test_the_plan_is_its_answer_class_and_its_text_is_that_answers_json():
    plan = _plan({"axes": {"data": 2, "model": 2}, "batch_shape": [8, 4], "name": "p"}, 4)
    assert isinstance(plan, MeshPlan) and isinstance(plan.shards, ShardColumns)
    rendered = render(plan)
    body, summary = json.loads(rendered.body), json.loads(rendered.summary)
    # the columnar shards read as the Shard answers their JSON holds
    assert [shard.to_json() for shard in plan.shards] == body["shards"]
    assert all(isinstance(shard, Shard) for shard in plan.shards)
    assert plan.shards[1] == body["shards"][1] and plan.shards[1:3] == body["shards"][1:3]
    assert list(plan.device_grid) == body["device_grid"] == [[0, 1], [2, 3]]
    assert plan.device_grid[1] == [2, 3]
    parsed = MeshPlan.from_json(body)
    assert parsed.to_json() == body and parsed.memory_per_device == plan.memory_per_device
    assert isinstance(parsed.batch, BatchLayout) and parsed.batch.shard_shape == [4, 4]
    # the summary is the plan without its per-device members
    assert summary == {k: v for k, v in body.items() if k not in ("device_grid", "shards")}
    assert MeshPlanSummary.from_json(summary).to_json() == summary == plan.summary().to_json()


def test_a_plain_plans_shards_have_no_hardware_members():
    plan = _plan({"axes": {"data": 4}}, 4)
    shard = json.loads(render(plan).body)["shards"][0]
    assert shard == {"device": 0, "process_index": 0, "coords": {"data": 0}, "index": [],
                     "replica": 0}  # fmt: skip
    assert "hardware" not in plan and "step_estimate" not in plan.to_json()


def test_the_shard_format_is_the_shard_classs():
    # every member of Shard in its order, the omitted ones only where they have columns
    assert shard_template(["a", "b"], {"device": 1, "process_index": 1, "coords": 2,
                                       "index": 4, "replica": 1}) == (
        '{"device":%d,"process_index":%d,"coords":{"a":%d,"b":%d},'
        '"index":[[%d,%d],[%d,%d]],"replica":%d}'
    )  # fmt: skip
    hardware = {"device": 1, "process_index": 1, "coords": 1, "index": 0, "replica": 1,
                "slice": 1, "host": 1, "physical": 3, "core": 1}  # fmt: skip
    assert shard_template(["a"], hardware).endswith(
        '"replica":%d,"slice":%d,"host":%d,"physical":[%d,%d,%d],"core":%d}'
    )
    with pytest.raises(ValueError, match="'replica'"):
        shard_template(["a"], {"device": 1, "process_index": 1, "coords": 1, "index": 0})
    with pytest.raises(ValueError, match="no member"):
        shard_template(["a"], {**hardware, "rack": 1})


def test_a_hardware_plans_shards_and_members_come_from_the_answer_class():
    from app.services.hardware import hardware_plan

    body = MeshPlanRequest.model_validate(
        {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"data": 4}, "batch_shape": [8]}
    ).root
    rendered = render_hardware_plan(hardware_plan(body), plan_id="m_x", created_at="t")
    plan = json.loads(rendered.body)
    shard = plan["shards"][0]
    assert {"slice", "host", "physical"} <= set(shard) and len(shard["physical"]) == 3
    parsed = MeshPlan.from_json(plan)
    assert parsed.hardware == "tpu-v5e" and parsed.topology == "v5e:2x2"
    assert parsed.to_json() == plan
    assert all(isinstance(axis, AxisDetail) for axis in parsed.axes_detail or ())
    # a plan without a model has no step estimate, model or options
    assert not {"step_estimate", "model", "pipeline", "shard_over_data"} & set(plan)
    assert json.loads(rendered.summary) == parsed.summary().to_json()
