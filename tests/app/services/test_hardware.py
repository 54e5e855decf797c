"""Hardware plans and recommendations as plain functions (no HTTP)."""

from __future__ import annotations

import json

import pytest

from app.core.errors import ServiceError
from app.schemas.hardware import HardwarePlanRequest, RecommendationRequest
from app.schemas.meshes import HardwarePlanBody, MaxTextPlanBody, MeshPlanRequest
from app.services import hardware as hardware_service
from app.services.hardware import (
    HardwarePlan,
    check_hardware_plan,
    hardware_entry,
    hardware_plan,
    hardware_plan_request,
    list_hardware,
    maxtext_plan_request,
    recommend,
    render_hardware_plan,
)
from datarax.errors import PlanError
from datarax.hardware.chips import HARDWARE
from datarax.hardware.topology import plan_hardware_devices


def test_catalog_functions():
    names = [item["name"] for item in list_hardware()["items"]]
    assert len(names) == len(HARDWARE) == 13 and {"gb200-nvl72", "tpu7x"} <= set(names)
    assert hardware_entry("cpu")["kind"] == "cpu"
    with pytest.raises(ServiceError, match="no hardware named") as info:
        hardware_entry("nope")
    assert info.value.status == 404


def test_mesh_body_converts_and_renders_with_hosts_and_slices():
    body = HardwarePlanBody(
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
    plan = json.loads(
        render_hardware_plan(check_hardware_plan(request), plan_id="m_1", created_at="t").body
    )
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


def test_a_hardware_body_is_its_own_request_and_its_cluster_is_sized_once(monkeypatch):
    """The hardware path takes the body as it was parsed (nothing copied), sizes its
    cluster once and passes the plan on to the render (which does not redo it); the batch
    splits over the axes whose role splits it (tests/app/services/test_plan_path.py
    counts the rest of the path)."""
    calls = {"cluster": 0}
    cluster = hardware_service.cluster_devices

    def counted_cluster(*args, **kwargs):
        calls["cluster"] += 1
        return cluster(*args, **kwargs)

    monkeypatch.setattr(hardware_service, "cluster_devices", counted_cluster)
    body = MeshPlanRequest.model_validate(
        {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": 4, "fsdp": -1},
         "batch_shape": [32, 128], "model": {"name": "llama2-7b"}}
    ).root  # fmt: skip
    assert isinstance(body, HardwarePlanBody) and isinstance(body, HardwarePlanRequest)
    assert hardware_plan_request(body) is body
    plan = hardware_plan(body)
    assert isinstance(plan, HardwarePlan) and plan.devices == 16 and plan.request is body
    rendered = json.loads(render_hardware_plan(plan, plan_id="m_1", created_at="t").body)
    assert rendered["step_estimate"]["step_s"] > 0
    assert rendered["batch"]["spec"] == [["data", "fsdp"], None]  # from the roles
    assert body.batch_axes is None  # the request stays as sent
    assert calls == {"cluster": 1}


def test_a_maxtext_body_becomes_a_typed_hardware_request_once():
    body = MaxTextPlanBody(
        hardware="tpu-v5e",
        topology="4x4",
        maxtext={"ici_fsdp_parallelism": -1, "model_name": "llama2-7b",
                 "per_device_batch_size": 1, "max_target_length": 256},
        name="mt",
        optimizer="sgd",
    )  # fmt: skip
    request = maxtext_plan_request(body)
    assert isinstance(request, HardwarePlanRequest)
    assert request.name == "mt" and request.optimizer == "sgd"
    assert request.batch_shape == [16, 256] and request.ici["fsdp"] == -1
    plan = hardware_plan(body)
    assert plan.request == request and plan.devices == 16
    with pytest.raises(ServiceError) as info:
        maxtext_plan_request(body.model_copy(update={"maxtext": {"ici_fdsp_parallelism": 4}}))
    assert info.value.code == "invalid_maxtext_config"


def test_a_request_checks_its_cluster_size_before_it_is_laid_out():
    request = HardwarePlanRequest(
        hardware="tpu-v5p", topology="16x16x24", slices=64, ici={"data": -1}
    )
    with pytest.raises(ServiceError) as info:
        check_hardware_plan(request)
    assert info.value.code == "too_many_devices"
    with pytest.raises(ServiceError) as info:
        render_hardware_plan(check_hardware_plan(request), plan_id="m_1", created_at="t")
    assert info.value.code == "too_many_devices"


def test_only_a_hardware_body_converts_to_a_hardware_request():
    live = MeshPlanRequest.model_validate({"axes": {"data": 2}})
    with pytest.raises(ServiceError):
        hardware_plan_request(live)
