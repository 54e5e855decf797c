"""``/metrics``: build info, and the training figures moving after a real session step."""

from __future__ import annotations

import platform

from prometheus_client.parser import text_string_to_metric_families

from app.core.telemetry import ALL_JOBS, aggregate_job_gauges
from app.core.version import versions


def _samples(api) -> dict[tuple[str, tuple], float]:
    r = api.get("/metrics")
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def _value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_build_info(api):
    samples = _samples(api)
    build = versions()
    labels = {
        "version": build["version"],
        "jax": build["jax"],
        "jaxlib": build["jaxlib"],
        "python": platform.python_version(),
    }
    assert _value(samples, "datarax_build_info", **labels) == 1.0, [
        k for k in samples if k[0] == "datarax_build_info"
    ]
    assert build["jax"][0].isdigit() and build["version"][0].isdigit(), build


def test_session_figures_move_after_a_step(api):
    before = _samples(api)
    budget = _value(before, "datarax_memory_budget_bytes", kind="host")
    assert budget > 0
    plan = api.post("/v1/meshes", json={"axes": {"data": 8}}).json()
    # Widths no other test uses: this session's first step misses the compile cache.
    created = api.post(
        f"/v1/meshes/{plan['id']}/sessions",
        json={"model": {"kind": "mlp", "features": [8, 24, 3]}},
    )
    assert created.status_code == 201, created.text
    sid = created.json()["id"]
    step = api.post(f"/v1/sessions/{sid}/steps", json={"steps": 3, "synthetic": {"batch_size": 16}})
    assert step.status_code == 200, step.text
    after = _samples(api)

    def moved(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("datarax_sessions_active") == 1
    assert moved("datarax_session_steps_total") == 3
    assert moved("datarax_compile_seconds_count") == 1
    assert moved("datarax_compile_seconds_sum") > 0
    reserved = moved("datarax_memory_reserved_bytes", pool="host:0")
    assert 0 < reserved <= budget
    assert _value(after, "datarax_runtime_restarts_total") == _value(
        before, "datarax_runtime_restarts_total"
    )

    assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    gone = _samples(api)
    assert _value(gone, "datarax_sessions_active") == _value(before, "datarax_sessions_active")
    assert _value(gone, "datarax_memory_reserved_bytes", pool="host:0") == _value(
        before, "datarax_memory_reserved_bytes", pool="host:0"
    )
    assert _value(gone, "datarax_session_steps_total") == _value(
        after, "datarax_session_steps_total"
    )


def test_job_gauges_aggregate_without_job_names():
    snapshot = ({"a": 5.0, "b": 50.0, "<other>": 20.0}, {"a": 2.0, "<other>": 3.0})
    assert aggregate_job_gauges(snapshot) == ({ALL_JOBS: 50.0}, {ALL_JOBS: 5.0})
    assert aggregate_job_gauges(({}, {})) == ({}, {})
