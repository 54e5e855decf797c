"""``POST /v1/recommendations``: the search's budget counts work (issue 58, class 5)."""

from __future__ import annotations

from datarax.estimate.factorisations import WORK_UNIT_GROUPS
from datarax.estimate.recommend import search_space
from tests.helpers import assert_problem

AXES = ["data", "fsdp", "tensor", "batch"]
# 16 chips over 4 axes (35) x 64 slices over 4 axes (84): 2,940 candidates, under the
# default 20,000
BODY = {"hardware": "tpu-v5e", "topology": "4x4", "slices": 64, "axes": AXES, "global_batch": 1024}
LIMIT = 20_000


def test_a_model_whose_candidates_cost_more_is_refused_up_front(api):
    # 63 layers: 126 parameter groups, so a candidate costs 126 / 16 units and the default
    # budget affords 2,539 of them
    body = {**BODY, "model": {"kind": "mlp", "features": [64] * 64}}
    problem = assert_problem(api.post("/v1/recommendations", json=body), 422,
                             "search_space_too_large")  # fmt: skip
    assert problem["search_space"] == search_space(16, 64, AXES) == 2940
    assert problem["limit"] == LIMIT * WORK_UNIT_GROUPS // 126 == 2539
    assert "126 parameter groups" in problem["detail"]
    fitting = [s for s in problem["suggestions"] if s["search_space"] <= problem["limit"]]
    assert fitting, problem


def test_a_4096_layer_moe_model_is_searched(api):
    moe = {
        "kind": "transformer", "layers": 4096, "d_model": 64, "d_ff": 128, "heads": 4,
        "kv_heads": 4, "vocab": 1000, "seq_len": 128, "num_experts": 8,
        "experts_per_token": 2, "remat": "full",
    }  # fmt: skip
    body = {"hardware": "tpu-v5e", "topology": "4x4", "slices": 2, "model": moe,
            "global_batch": 64, "top_k": 2}  # fmt: skip
    answer = api.post("/v1/recommendations", json=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["considered"] == search_space(16, 2, ["data", "fsdp", "tensor", "expert"])
