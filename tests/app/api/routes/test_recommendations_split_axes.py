"""``POST /v1/recommendations`` says which layouts it skipped for needing
``allow_split_physical_axes`` and prices the best of them aside (issue 56, item 4)."""

from __future__ import annotations

import pytest

from datarax.answers.estimates import Recommendations, SplitPhysicalAxes
from tests.helpers import assert_problem

MODEL = {
    "kind": "transformer", "layers": 2, "d_model": 1024, "d_ff": 4096, "heads": 8,
    "kv_heads": 8, "vocab": 32000, "seq_len": 1024,
}  # fmt: skip
BODY = {"hardware": "tpu-v5e", "topology": "4x4", "model": MODEL, "global_batch": 16, "top_k": 3}


def test_skipped_split_layouts_are_named_and_their_best_posts_back(api):
    response = api.post("/v1/recommendations", json=BODY)
    assert response.status_code == 200, response.text
    answer = response.json()
    split = answer["split_physical_axes"]
    assert split["skipped"] == answer["rejected"]["physical_axes_split_required"] == 9
    assert split["would_rank"] == 1 and split["best"]["fits"] is True
    assert "send allow_split_physical_axes: true" in split["note"]
    best = split["best"]
    assert best["step_estimate"]["step_s"] < answer["candidates"][0]["step_estimate"]["step_s"]
    parsed = Recommendations.from_json(answer)
    assert isinstance(parsed.split_physical_axes, SplitPhysicalAxes)
    assert parsed.to_json() == answer
    # its plan request is a mesh body as it is, and prices the same step
    assert best["plan_request"]["allow_split_physical_axes"] is True
    posted = api.post("/v1/meshes", json=best["plan_request"])
    assert posted.status_code == 201, posted.text
    assert posted.json()["step_estimate"]["step_s"] == pytest.approx(
        best["step_estimate"]["step_s"]
    )
    # with the flag it is ranked first, and nothing is priced aside
    allowed = api.post("/v1/recommendations", json={**BODY, "allow_split_physical_axes": True})
    assert allowed.status_code == 200, allowed.text
    ranked = allowed.json()
    assert "split_physical_axes" not in ranked
    assert "physical_axes_split_required" not in ranked["rejected"]
    first = ranked["candidates"][0]
    assert (first["ici"], first["dcn"]) == (best["ici"], best["dcn"])
    assert first["step_estimate"]["step_s"] == best["step_estimate"]["step_s"]
    # nothing fits but a split layout: the problem says to send the flag
    pinned = {**BODY, "fixed_ici": {"fsdp": 1, "tensor": 2}}
    problem = assert_problem(api.post("/v1/recommendations", json=pinned), 422, "no_plan_fits")
    assert "send allow_split_physical_axes: true" in problem["detail"]
