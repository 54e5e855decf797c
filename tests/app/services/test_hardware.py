"""Hardware plans and recommendations as plain functions (no HTTP)."""

from __future__ import annotations

import json

import pytest

from app.core.errors import ServiceError
from app.schemas.hardware import HardwarePlanRequest, RecommendationRequest
from app.schemas.meshes import MeshPlanRequest
from app.services.hardware import (
    hardware_entry,
    hardware_plan_request,
    list_hardware,
    recommend,
    render_hardware_plan,
)
from datarax.hardware.topology import plan_hardware_devices
from datarax.plan.layout import PlanError


def test_catalog_functions():
    names = [item["name"] for item in list_hardware()["items"]]
    assert len(names) == 11 and "gb200-nvl72" in names
    assert hardware_entry("cpu")["kind"] == "cpu"
    with pytest.raises(ServiceError, match="no hardware named") as info:
        hardware_entry("nope")
    assert info.value.status == 404


def test_mesh_body_converts_and_renders_with_hosts_and_slices():
    body = MeshPlanRequest(
        hardware="tpu-v5p",
        topology="4x4x4",
        slices=2,
        ici={"fsdp": -1},
        dcn={"fsdp": 2},
        batch_shape=[256, 8],
        batch_axes=["fsdp"],
        model={"kind": "mlp", "features": [8, 64, 8], "remat": "full"},
    )
    request = hardware_plan_request(body)
    assert isinstance(request, HardwarePlanRequest) and request.model.remat == "full"
    plan = json.loads(render_hardware_plan(request, plan_id="m_1", created_at="t").body)
    layout = plan_hardware_devices(
        "tpu-v5p", topology="4x4x4", slices=2, ici={"fsdp": -1}, dcn={"fsdp": 2}
    )
    assert plan["device_grid"] == layout.device_grid.tolist()
    assert [s["process_index"] for s in plan["shards"]] == layout.host_index.tolist()
    assert plan["axes_detail"][0]["link"] == "dcn" and plan["topology"] == "v5p:4x4x4"
    assert plan["memory_per_device"]["fits"] is True
    assert plan["step_estimate"]["bottleneck"] in ("compute", "communication")


def test_recommend_raises_no_plan_fits_with_hints():
    model = {"kind": "mlp", "features": [65536, 65536, 65536, 65536]}
    request = RecommendationRequest(
        hardware="tpu-v5e", topology="2x2", model=model, global_batch=4, axes=["data"]
    )
    with pytest.raises(PlanError) as info:
        recommend(request)
    assert info.value.code == "no_plan_fits" and "GiB" in info.value.message
