"""Launch configs of stored plans (no HTTP): the library's config of the plan's summary,
its refusals as service problems."""

from __future__ import annotations

import anyio
import pytest

from app.core.errors import MeshNotFound, ServiceError
from app.schemas.launch import LaunchRequest
from app.schemas.meshes import MeshPlanRequest
from app.services import meshes
from app.services.launch import launch
from app.storage.db import Store
from app.workers.runtime_client import RuntimeClient
from tests.helpers import make_settings


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "plans.sqlite")
    store.open()
    yield store
    store.close()


TPU_PLAN = {"hardware": "tpu-v5e", "topology": "4x4", "ici": {"data": -1}}
DEEPSEEK_2_STAGES = {"hardware": "tpu-v5p", "topology": "4x4x8",
                     "ici": {"stage": 2, "fsdp": 8, "expert": 8}, "allow_split_physical_axes": True,
                     "batch_shape": [256, 4096], "model": {"name": "deepseek3-671b"}}  # fmt: skip
PLANS = {"tpu-v5e-4x4-data": TPU_PLAN, "deepseek-v3-2-stages": DEEPSEEK_2_STAGES}
"""The hardware plans these tests launch (MaxText's checks judge each:
tests/datarax/launch/test_maxtext_accepts.py)."""


def _plan(store: Store, tmp_path, body: dict) -> str:
    runtime = RuntimeClient(make_settings(tmp_path))  # abstract plans never ask it
    request = MeshPlanRequest.model_validate(body)
    return anyio.run(lambda: meshes.create_plan(request, store, runtime)).id


def test_a_tpu_plan_launches_as_a_jobset_and_as_env(store, tmp_path):
    mesh_id = _plan(store, tmp_path, TPU_PLAN)
    jobset = anyio.run(launch, store, mesh_id, LaunchRequest(target="jobset", image="img:1"))
    assert jobset["target"] == "jobset" and jobset["manifest"]["kind"] == "JobSet"
    assert "img:1" in str(jobset["manifest"])
    env = anyio.run(launch, store, mesh_id, LaunchRequest(target="env"))
    assert env["target"] == "env"


def test_a_plan_without_hardware_is_launch_target_unavailable(store, tmp_path):
    mesh_id = _plan(store, tmp_path, {"axes": {"data": 2}, "num_devices": 2})
    with pytest.raises(ServiceError) as err:
        anyio.run(launch, store, mesh_id, LaunchRequest(target="jobset"))
    assert err.value.code == "launch_target_unavailable" and err.value.status == 422


def test_an_unknown_plan_is_mesh_not_found(store):
    with pytest.raises(MeshNotFound):
        anyio.run(launch, store, "m_missing", LaunchRequest(target="env"))


def test_a_launch_maxtext_would_refuse_is_not_launchable(store, tmp_path):
    # issue 56: DeepSeek-V3 pipelines over 2 stages (its 58 MoE layers), but ZeRO-1 beside
    # an fsdp axis is what MaxText 0.2.5 refuses
    body = {**DEEPSEEK_2_STAGES, "optimizer": {"name": "adamw", "shard_over_data": True}}
    mesh_id = _plan(store, tmp_path, body)
    with pytest.raises(ServiceError) as err:
        anyio.run(launch, store, mesh_id, LaunchRequest(target="maxtext"))
    assert err.value.code == "not_launchable" and err.value.status == 422
    assert "cannot be combined with FSDP" in str(err.value)
    mesh_id = _plan(store, tmp_path, DEEPSEEK_2_STAGES)
    config = anyio.run(launch, store, mesh_id, LaunchRequest(target="maxtext"))
    assert "pipeline_parallel_layers=58" in config["args"]
