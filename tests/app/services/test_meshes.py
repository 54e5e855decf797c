"""Mesh plans as a service: made, stored durably, listed, read, pictured and forgotten,
against a real SQLite store (no HTTP)."""

from __future__ import annotations

import anyio
import orjson
import pytest

from app.core.errors import AnswerTooLarge, MeshNotFound, ServiceError, WorkerLost
from app.schemas.meshes import MeshPlanRequest
from app.services import meshes
from app.storage.db import Store
from app.workers.runtime_client import RuntimeClient
from tests.helpers import make_settings


@pytest.fixture
def store(tmp_path):
    store = Store(tmp_path / "plans.sqlite")
    store.open()
    yield store
    store.close()


@pytest.fixture
def runtime(tmp_path):
    return RuntimeClient(make_settings(tmp_path))  # never started: not ready


def _create(store: Store, runtime: RuntimeClient, body: dict) -> meshes.CreatedPlan:
    request = MeshPlanRequest.model_validate(body)
    return anyio.run(lambda: meshes.create_plan(request, store, runtime))


def test_an_abstract_plan_is_stored_as_answered(store, runtime):
    created = _create(store, runtime, {"axes": {"data": -1, "model": 2}, "num_devices": 8})
    assert created.id.startswith("m_") and not created.live
    plan = orjson.loads(created.body)
    assert plan["axes"] == {"data": 4, "model": 2} and plan["total_devices"] == 8
    assert anyio.run(meshes.get_plan, store, created.id) == created.body
    summary = orjson.loads(anyio.run(meshes.get_plan_summary, store, created.id))
    assert "shards" not in summary and summary["id"] == created.id


def test_plans_are_listed_newest_first_and_the_page_is_bounded(store, runtime):
    ids = [_create(store, runtime, {"axes": {"data": n}, "num_devices": n}).id for n in (1, 2, 4)]
    page = orjson.loads(
        anyio.run(lambda: meshes.list_plans(store, 2, 0, summary=True, max_bytes=10**6))
    )
    assert page["total"] == 3 and [p["id"] for p in page["items"]] == ids[::-1][:2]
    with pytest.raises(AnswerTooLarge):
        anyio.run(lambda: meshes.list_plans(store, 3, 0, summary=False, max_bytes=100))


def test_a_live_plan_needs_a_ready_runtime(store, runtime):
    with pytest.raises(WorkerLost):
        _create(store, runtime, {"axes": {"data": 2}})


def test_too_many_axes_is_refused_before_planning(store, runtime):
    axes = {f"a{i}": 1 for i in range(meshes.MAX_MESH_AXES + 1)}
    with pytest.raises(ServiceError) as err:
        _create(store, runtime, {"axes": axes, "num_devices": 1})
    assert err.value.code == "too_many_axes"


def test_the_picture_is_drawn_once_and_forgotten_with_its_plan(store, runtime):
    created = _create(store, runtime, {"axes": {"data": 4}, "num_devices": 4})
    svg = anyio.run(meshes.layout_svg, store, created.id, None)
    assert svg.startswith("<?xml") and anyio.run(meshes.layout_svg, store, created.id) is svg
    anyio.run(meshes.delete_plan, store, created.id)
    for read in (meshes.get_plan, meshes.layout_svg, meshes.delete_plan):
        with pytest.raises(MeshNotFound):
            anyio.run(read, store, created.id)
