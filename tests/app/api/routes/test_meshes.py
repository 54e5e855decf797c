"""Mesh plans over HTTP: live plans agree with JAX, abstract plans scale, CRUD, SVG."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from app.main import create_app
from app.storage.postgres import PostgresStore
from datarax.distributed.device_mesh import DeviceMeshManager
from datarax.distributed.sharding import param_partition_spec
from datarax.plan.memory import mlp_param_shapes
from tests.conftest import require_devices
from tests.helpers import StubRuntime, TestClient, assert_problem, make_settings, strict_json
from tests.postgres_fixtures import store_url

# (id, axes, batch_axes or None for the default, batch_shape)
LIVE_CASES = [
    ("data8", {"data": 8}, None, [16, 4]),
    ("model8-replicated", {"model": 8}, None, [16, 4]),
    ("data2-model4", {"data": 2, "model": 4}, None, [8, 4]),
    ("auto-data-model2", {"data": -1, "model": 2}, ["data"], [8, 6]),
    ("model4-of-8", {"model": 4}, None, [4, 2]),
    ("data-fsdp", {"data": 2, "fsdp": 4}, ["data", "fsdp"], [16, 3]),
    ("fsdp-major-data", {"fsdp": 2, "data": 4}, ["data", "fsdp"], [8]),
    ("data-fsdp-model", {"data": 2, "fsdp": 2, "model": 2}, ["data", "fsdp"], [8, 2, 2]),
    ("split-over-model", {"data": 2, "fsdp": 2, "model": 2}, ["model"], [4, 4]),
    ("explicit-replicated", {"data": 4, "model": 2}, [], [4]),
    ("three-axes-c-a", {"a": 2, "b": 2, "c": 2}, ["c", "a"], [12, 1]),
    ("data1-model8", {"data": 1, "model": 8}, None, [5, 3]),
    ("empty-dim", {"data": 2}, None, [0, 3]),
]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def plans_api(request, tmp_path_factory):
    """The service on each store in turn (the SQLite file, or a fresh database of the
    session's PostgreSQL, dropped after), for the tests of stored plans: abstract plans
    need no devices, so its runtime is a stand-in."""
    folder = tmp_path_factory.mktemp("plans")
    with store_url(request) as url:
        settings = make_settings(folder, database_url=url)
        app = create_app(settings, runtime=StubRuntime(ready=True))
        with strict_json(TestClient(app)) as client:
            assert isinstance(client.app.state.store, PostgresStore) is (url is not None)
            yield client


def _expected(axes_resolved: dict, grid: list, spec: tuple, shape: list[int]):
    """JAX's own answer for the plan's device grid: index map and replica ids by device."""
    by_id = {d.id: d for d in jax.devices()}
    devices = np.vectorize(lambda i: by_id[int(i)], otypes=[object])(np.asarray(grid))
    mesh = Mesh(devices.reshape(tuple(axes_resolved.values())), tuple(axes_resolved))
    sharding = NamedSharding(mesh, P(*spec))
    index_map = sharding.devices_indices_map(tuple(shape))
    ranges = {
        d.id: [
            [0 if s.start is None else s.start, dim if s.stop is None else s.stop]
            for s, dim in zip(index, shape, strict=True)
        ]
        for d, index in index_map.items()
    }
    placed = jax.device_put(np.zeros(shape, np.float32), sharding)
    replicas = {shard.device.id: shard.replica_id for shard in placed.addressable_shards}
    return mesh, ranges, replicas


@pytest.mark.parametrize(
    ("axes", "batch_axes", "shape"),
    [case[1:] for case in LIVE_CASES],
    ids=[case[0] for case in LIVE_CASES],
)
def test_live_plan_matches_jax(api, axes, batch_axes, shape):
    require_devices(8)
    body = {"axes": axes, "batch_shape": shape}
    if batch_axes is not None:
        body["batch_axes"] = batch_axes
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert response.headers["location"] == f"/v1/meshes/{plan['id']}"
    assert plan["live"] is True and plan["platform"] == "cpu"
    resolved = plan["axes"]
    assert list(resolved) == list(axes)
    n = math.prod(resolved.values())
    assert plan["total_devices"] == n == len(plan["shards"])

    # The device grid is JAX's own mesh order for these axes, on the first n devices.
    reference = DeviceMeshManager.create_device_mesh(resolved)
    assert np.vectorize(lambda d: d.id)(reference.devices).tolist() == plan["device_grid"]

    spec = tuple(tuple(e) if isinstance(e, list) else e for e in plan["batch"]["spec"])
    mesh, ranges, replicas = _expected(resolved, plan["device_grid"], spec, shape)
    flat_ids = np.asarray(plan["device_grid"]).reshape(-1).tolist()
    assert [shard["device"] for shard in plan["shards"]] == flat_ids
    for position, shard in enumerate(plan["shards"]):
        coords = np.unravel_index(position, tuple(resolved.values()))
        assert shard["coords"] == {a: int(c) for a, c in zip(resolved, coords, strict=True)}
        assert shard["index"] == ranges[shard["device"]], shard
        assert shard["replica"] == replicas[shard["device"]], shard
        assert shard["process_index"] == 0
    block = list(NamedSharding(mesh, P(*spec)).shard_shape(tuple(shape)))
    assert plan["batch"]["shard_shape"] == block
    assert plan["batch"]["shape"] == shape


def test_live_plan_without_batch_has_empty_indices(api):
    plan = api.post("/v1/meshes", json={"axes": {"data": 2, "model": 2}}).json()
    assert plan["batch"] is None
    assert [s["index"] for s in plan["shards"]] == [[]] * 4
    assert [s["replica"] for s in plan["shards"]] == [0, 1, 2, 3]
    assert any("first 4 of 8" in w for w in plan["warnings"])
    assert plan["params"] == []
    assert plan["memory_per_device"] == {
        "params": 0, "optimizer": 0, "batch": 0, "total": 0, "program": "datarax"
    }  # fmt: skip


def test_abstract_plan_equals_live_plan_on_the_same_devices(api):
    request = {"axes": {"data": 2, "fsdp": 2, "model": 2}, "batch_shape": [8, 4]}
    request["batch_axes"] = ["data", "fsdp"]
    live = api.post("/v1/meshes", json=request).json()
    abstract = api.post("/v1/meshes", json={**request, "num_devices": 8}).json()
    assert abstract["live"] is False and abstract["platform"] is None
    assert abstract["device_grid"] == live["device_grid"]  # CPU devices are 0..7 row-major
    assert abstract["shards"] == live["shards"]
    assert abstract["batch"] == live["batch"]


def test_abstract_plan_for_65536_devices(plans_api):
    n = 65_536
    body = {
        "axes": {"data": -1, "model": 256},
        "batch_shape": [512, 8],
        "num_devices": n,
        "platform": "tpu",
        "name": "pod",
    }
    response = plans_api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["axes"] == {"data": 256, "model": 256}
    assert plan["platform"] == "tpu" and plan["live"] is False
    assert np.asarray(plan["device_grid"]).shape == (256, 256)
    shards = plan["shards"]
    assert len(shards) == n
    i = np.arange(n)
    assert [s["device"] for s in shards] == i.tolist()
    assert [s["coords"]["data"] for s in shards] == (i // 256).tolist()
    assert [s["index"][0] for s in shards] == np.stack(
        [2 * (i // 256), 2 * (i // 256) + 2], 1
    ).tolist()
    assert all(s["index"][1] == [0, 8] for s in shards)
    assert [s["replica"] for s in shards] == (i % 256).tolist()
    assert plan["batch"]["shard_shape"] == [2, 8]
    # Stored byte for byte.
    assert plans_api.get(f"/v1/meshes/{plan['id']}").content == response.content


def test_abstract_plan_with_two_batch_axes_at_scale(api):
    body = {
        "axes": {"data": 64, "fsdp": 32, "model": 8},
        "batch_shape": [4096],
        "batch_axes": ["data", "fsdp"],
        "num_devices": 16_384,
    }
    plan = api.post("/v1/meshes", json=body).json()
    d = np.arange(16_384)
    data, fsdp = d // 256, (d // 8) % 32
    start = (data * 32 + fsdp) * 2
    assert [s["index"][0] for s in plan["shards"]] == np.stack([start, start + 2], 1).tolist()
    assert [s["replica"] for s in plan["shards"]] == (d % 8).tolist()
    assert plan["batch"]["spec"] == [["data", "fsdp"]]


@pytest.mark.parametrize("rule", ["replicate", "model", "fsdp"])
def test_params_and_memory_follow_the_library_rules(api, rule):
    features = [16, 64, 4]
    body = {
        "axes": {"data": 2, "model": 4} if rule != "fsdp" else {"data": 2, "fsdp": 4},
        "batch_shape": [32, 16],
        "num_devices": 8,
        "model": {"kind": "mlp", "features": features},
        "param_sharding": rule,
        "optimizer": "adam",
    }
    plan = api.post("/v1/meshes", json=body).json()
    axes = plan["axes"]
    params = plan["params"]
    assert [p["path"] for p in params] == [path for path, _ in mlp_param_shapes(features)]
    total = 0
    for entry, (path, shape) in zip(params, mlp_param_shapes(features), strict=True):
        spec, _ = param_partition_spec(shape, axes, rule, path)
        assert entry["shape"] == list(shape)
        assert entry["spec"] == list(spec)
        block = [d // (axes[a] if a else 1) for d, a in zip(shape, spec, strict=True)]
        assert entry["shard_shape"] == block
        assert entry["bytes_per_device"] == math.prod(block) * 4
        total += entry["bytes_per_device"]
    memory = plan["memory_per_device"]
    assert memory["params"] == total
    assert memory["optimizer"] == 2 * total
    assert memory["batch"] == 16 * 16 * 4
    assert memory["total"] == 3 * total + 16 * 16 * 4
    if rule == "replicate":
        assert all(entry["spec"] == [None] * len(entry["shape"]) for entry in params)


def test_param_rule_on_missing_axis_warns_and_replicates(api):
    body = {
        "axes": {"data": 8},
        "num_devices": 8,
        "model": {"kind": "mlp", "features": [8, 8]},
        "param_sharding": "model",
        "optimizer": {"name": "sgd", "learning_rate": 0.1},
    }
    plan = api.post("/v1/meshes", json=body).json()
    assert all(p["spec"] == [None] * len(p["shape"]) for p in plan["params"])
    # the optimizer's one form (DESIGN v1.2) is taken, and its learning rate said unread
    assert any("optimizer.learning_rate" in w for w in plan["warnings"]), plan["warnings"]
    params = [w for w in plan["warnings"] if not w.startswith("optimizer.")]
    assert len(params) == 2 and "model" in params[0]
    assert plan["memory_per_device"]["optimizer"] == 0


def test_list_get_delete(plans_api):
    ids = [
        plans_api.post(
            "/v1/meshes", json={"axes": {"data": 2}, "num_devices": 2, "name": f"p{i}"}
        ).json()["id"]
        for i in range(3)
    ]
    listing = plans_api.get("/v1/meshes", params={"limit": 2}).json()
    assert [item["id"] for item in listing["items"]] == ids[::-1][:2]  # newest first
    total = listing["total"]
    assert total >= 3
    page2 = plans_api.get("/v1/meshes", params={"limit": 1, "offset": 2}).json()
    assert [item["id"] for item in page2["items"]] == [ids[0]]
    full = plans_api.get(f"/v1/meshes/{ids[2]}").json()
    summary = plans_api.get("/v1/meshes", params={"limit": 1, "view": "summary"}).json()["items"][0]
    assert summary == {k: v for k, v in full.items() if k not in ("shards", "device_grid")}

    one = plans_api.get(f"/v1/meshes/{ids[1]}")
    assert one.status_code == 200 and one.json()["name"] == "p1"
    assert plans_api.delete(f"/v1/meshes/{ids[1]}").status_code == 204
    assert_problem(plans_api.get(f"/v1/meshes/{ids[1]}"), 404, "mesh_not_found")
    assert plans_api.get("/v1/meshes").json()["total"] == total - 1


@pytest.mark.parametrize(
    ("axes", "num_devices", "shape", "cells"),
    [
        ({"data": 8}, None, [16], 8),
        ({"data": 2, "model": 4}, None, [8, 2], 8),
        ({"data": 2, "fsdp": 2, "model": 2}, 8, [8], 8),
        ({"data": 64}, 64, [64], 64),
    ],
    ids=["1d", "2d", "3d", "1d-wrapped"],
)
def test_layout_svg(api, axes, num_devices, shape, cells):
    body = {"axes": axes, "batch_shape": shape, "name": "pic <&> test"}
    if num_devices:
        body["num_devices"] = num_devices
    plan = api.post("/v1/meshes", json=body).json()
    response = api.get(f"/v1/meshes/{plan['id']}/layout.svg")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("image/svg+xml")
    root = ET.fromstring(response.content)  # well-formed, text escaped
    ns = "{http://www.w3.org/2000/svg}"
    assert root.tag == f"{ns}svg" and root.get("viewBox")
    groups = root.findall(f"{ns}g")
    assert len(groups) == cells
    text = response.text
    for axis in axes:
        assert axis in text
    assert "pic &lt;&amp;&gt; test" in text
    # Replicas share a colour: as many fills among cells as distinct dim-0 slices drawn.
    fills = {g.find(f"{ns}rect").get("fill") for g in groups}
    slices = {tuple(s["index"][0]) for s in plan["shards"][:cells]}
    assert len(fills) == len(slices)


def test_layout_svg_of_a_big_plan_draws_blocks(api):
    """Above ~1,024 devices the picture groups devices into blocks instead of cutting it off
    (tests/app/services/test_layout_svg.py checks the blocks in detail)."""
    body = {"axes": {"data": 128, "model": 64}, "batch_shape": [256], "num_devices": 8192}
    plan = api.post("/v1/meshes", json=body).json()
    response = api.get(f"/v1/meshes/{plan['id']}/layout.svg")
    assert response.status_code == 200
    assert "8,192 devices drawn as 64 blocks (2 rows of data each)" in response.text
    assert len(response.content) < 2_000_000


@pytest.mark.parametrize(
    ("body", "live"),
    [
        ({"axes": {"data": 2}, "num_devices": 2, "hardware": None, "slices": 1}, False),
        ({"axes": {"data": 2}, "num_devices": None, "maxtext": None, "ici": None}, True),
        (
            {"hardware": "cpu", "hosts": 1, "ici": {"data": -1}, "axes": None, "maxtext": None},
            False,
        ),
    ],
    ids=["abstract", "live", "hardware"],
)
def test_a_body_goes_down_its_modes_path(api, body, live):
    """The body has no tag: its members say its mode, and a member of another mode sent
    at its default (null, ``"slices": 1``) means the same as leaving it out."""
    answer = api.post("/v1/meshes", json=body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["live"] is live


def test_a_body_mixing_modes_is_a_validation_error_naming_the_body(api):
    body = assert_problem(
        api.post("/v1/meshes", json={"axes": {"data": 2}, "ici": {"data": 2}}),
        422,
        "validation_error",
    )
    assert body["errors"][0]["loc"] == ["body"] and "ici need hardware" in body["detail"]
    body = assert_problem(
        api.post("/v1/meshes", json={"hardware": "cpu", "hosts": 1, "ici": {"data": "x"}}),
        422,
        "validation_error",
    )
    assert body["errors"][0]["loc"] == ["body", "ici", "data"]  # no mode in the location
    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    modes = [one["$ref"].rsplit("/", 1)[1] for one in schemas["MeshPlanRequest"]["oneOf"]]
    assert modes == [
        "LivePlanBody", "AbstractPlanBody", "HardwarePlanBody", "MaxTextPlanBody", "ServingPlanBody"
    ]  # fmt: skip
