"""The OpenAPI document: every route, the problem schemas, examples, resolvable refs."""

from __future__ import annotations

import re


def test_openapi_is_complete(api):
    doc = api.get("/openapi.json").json()
    paths = doc["paths"]
    expected = {
        "/health/live": {"get"},
        "/health/ready": {"get"},
        "/v1/devices": {"get"},
        "/v1/meshes": {"get", "post"},
        "/v1/meshes/{mesh_id}": {"get", "delete"},
        "/v1/meshes/{mesh_id}/layout.svg": {"get"},
        "/v1/metrics/reduce": {"post"},
        "/v1/metrics/collect": {"post"},
        "/v1/jobs/{job}/metrics": {"get", "post"},
        "/v1/meshes/{mesh_id}/sessions": {"post"},
        "/v1/sessions/{session_id}": {"get", "delete"},
        "/v1/sessions/{session_id}/steps": {"post"},
        "/metrics": {"get"},
    }
    for path, methods in expected.items():
        assert methods <= set(paths[path]), path
    schemas = doc["components"]["schemas"]
    for name in (
        "Problem",
        "ValidationProblem",
        "MeshPlan",
        "MeshPlanRequest",
        "MetricsReduceRequest",
    ):
        assert name in schemas, name

    post_plan = paths["/v1/meshes"]["post"]
    assert post_plan["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/MeshPlan"
    )
    assert "Location" in post_plan["responses"]["201"]["headers"]
    problem = post_plan["responses"]["422"]["content"]["application/problem+json"]["schema"]
    assert problem["$ref"].endswith("/ValidationProblem")
    examples = post_plan["requestBody"]["content"]["application/json"]["examples"]
    assert examples["live"]["value"]["axes"] == {"data": -1, "model": 4}

    reduce_body = paths["/v1/metrics/reduce"]["post"]["requestBody"]["content"]
    assert {"application/json", "application/x-npz"} <= set(reduce_body)
    assert reduce_body["application/json"]["example"]["reduce"]["step"] == "max"
    # No token set (this app): the document declares no auth, as the server enforces none
    # (the token case: tests/app/test_hostile_inputs.py).
    assert "securitySchemes" not in doc["components"]
    assert "security" not in post_plan and "401" not in post_plan["responses"]

    # Every $ref resolves.
    refs = set(
        re.findall(r'"\$ref": ?"#/components/schemas/([^"]+)"', api.get("/openapi.json").text)
    )
    assert refs <= set(schemas), refs - set(schemas)
