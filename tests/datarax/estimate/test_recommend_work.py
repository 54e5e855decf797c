"""A recommendation's budget counts work, not candidates (issue 58, class 5).

A candidate's collectives are priced in closed form of the layers (one entry counted
``layers`` times, not one entry a layer), so its work does not grow with the layers; what
it does grow with, the model's parameter groups, is what the budget weighs a candidate by.
"""

from __future__ import annotations

import pytest

from datarax.estimate.cost import estimate_step
from datarax.estimate.recommend import (
    SearchSpaceTooLarge,
    budget_limit,
    recommend_meshes,
    search_space,
)
from datarax.hardware.topology import plan_hardware_devices
from datarax.parallel.context import mesh_context
from datarax.parallel.options import ParallelOptions, Pipeline
from datarax.specs.model_specs import model_spec

MOE = {
    "kind": "transformer",
    "layers": 4096,
    "d_model": 64,
    "d_ff": 128,
    "heads": 4,
    "kv_heads": 4,
    "vocab": 1000,
    "seq_len": 128,
    "num_experts": 8,
    "experts_per_token": 2,
    "remat": "full",
}
# Every kind whose traffic once had a per-layer term: tensor and sequence (activation
# all-reduces), expert (all-to-all), context (keys and values), stage (sends).
AXES = (
    {"tensor": 2, "expert": 2, "fsdp": 4},
    {"sequence": 2, "expert": 2, "stage": 2, "fsdp": 2},
    {"context": 2, "tensor": 2, "expert": 4},
)


@pytest.mark.parametrize("axes", AXES, ids=lambda a: "-".join(a))
def test_a_steps_collectives_do_not_grow_with_the_layers(axes):
    options = ParallelOptions(pipeline=Pipeline(microbatches=2))
    traffic = {
        layers: mesh_context({**MOE, "layers": layers}, axes, 16, options=options).traffic()
        for layers in (4, 4096)
    }
    # the same collectives, only their counts scale: no entry per layer
    assert len(traffic[4096]) == len(traffic[4]), (len(traffic[4]), len(traffic[4096]))


def test_the_closed_form_counts_every_layers_all_reduce():
    # forward: the embedding and each layer's o and down projections; backward: their
    # gradients, and with remat the recomputed o and down all-reduce again
    layout = plan_hardware_devices("tpu-v5e", ici={"fsdp": 4, "tensor": 4}, topology="4x4")
    for layers in (1, 7, 4096):
        est = estimate_step("tpu-v5e", layout.axes_detail, {**MOE, "layers": layers}, 16)
        counts = {
            (c.phase, c.kind): c.count
            for c in est.collectives
            if c.axis == "tensor" and c.what == "activations"
        }
        assert counts == {
            ("forward", "all-reduce"): 1 + 2 * layers,
            ("backward", "all-reduce"): 1 + 2 * layers + 2 * layers,
        }


@pytest.mark.parametrize(
    ("layers", "first_dense", "every"),
    [(1, 0, 1), (4096, 0, 1), (4096, 3, 2), (61, 3, 1), (48, 0, 2), (7, 2, 5), (10, 9, 1)],
)
def test_moe_layers_are_counted_in_closed_form(layers, first_dense, every):
    spec = model_spec({**MOE, "layers": layers, "first_dense_layers": first_dense or None,
                       "moe_every": every})  # fmt: skip
    assert spec.moe_layers == sum(spec.is_moe_layer(i) for i in range(layers))
    assert spec.dense_layers == layers - spec.moe_layers


def test_a_4096_layer_moe_recommendation_finishes():
    # 2 slices of a v5e 4x4 over data, fsdp, tensor and expert: 35 x 4 candidates, each
    # once ~50 ms of per-layer sums (17,640 of them took minutes); now under a ms each
    out = recommend_meshes("tpu-v5e", topology="4x4", slices=2, global_batch=64, model=MOE,
                           max_search_space=20_000)  # fmt: skip
    assert out["considered"] == search_space(16, 2, ["data", "fsdp", "tensor", "expert"])
    assert out["candidates"], out
    for candidate in out["candidates"]:
        all_to_all = [
            c for c in candidate["step_estimate"]["collectives"] if c["kind"] == "all-to-all"
        ]
        # dispatch and combine in each of the 4,096 MoE layers, forward and backward
        assert all(c["count"] == 2 * 4096 for c in all_to_all), all_to_all


def test_budget_limit_counts_parameter_groups_not_candidates():
    assert budget_limit(20_000, 12) == 20_000  # a dense transformer: one unit a candidate
    assert budget_limit(20_000, 16) == 20_000
    assert budget_limit(20_000, 32) == 10_000
    assert budget_limit(20_000, 128) == 2_500
    assert budget_limit(1, 17) == 0


MLP_63 = {"kind": "mlp", "features": [64] * 64}  # 63 layers: 126 parameter groups
CLUSTER = {"topology": "4x4", "slices": 1, "axes": ["data", "fsdp", "tensor"]}  # 15


def test_a_search_over_budget_in_work_is_refused_before_any_candidate():
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return False

    assert len(model_spec(MLP_63).params()) == 126
    with pytest.raises(SearchSpaceTooLarge) as caught:
        recommend_meshes("tpu-v5e", model=MLP_63, global_batch=64, max_search_space=100,
                         should_stop=should_stop, **CLUSTER)  # fmt: skip
    error = caught.value
    assert error.code == "search_space_too_large"
    assert (error.count, error.limit, error.groups) == (15, 100 * 16 // 126, 126)
    assert "126 parameter groups" in str(error) and "at most 12 are searched" in str(error)
    assert not calls  # refused before any work
    assert all(s["search_space"] < 15 for s in error.suggestions), error.suggestions


def test_usual_models_keep_a_candidate_a_unit():
    # the same space and budget search a transformer and a small MLP whole
    small_mlp = {"kind": "mlp", "features": [64] * 9}
    for model in (MOE, {**MOE, "layers": 4, "num_experts": None, "experts_per_token": None},
                  small_mlp):  # fmt: skip
        model = {k: v for k, v in model.items() if v is not None}
        axes = ["data", "fsdp", "tensor"]
        out = recommend_meshes("tpu-v5e", model=model, global_batch=64, max_search_space=15,
                               **{**CLUSTER, "axes": axes})  # fmt: skip
        assert out["considered"] == 15


def test_the_refusal_pickles_with_its_members():
    import pickle

    error = SearchSpaceTooLarge(30, 12, [], 126)
    back = pickle.loads(pickle.dumps(error))
    assert (back.count, back.limit, back.groups, str(back)) == (30, 12, 126, str(error))


def test_the_closed_form_prices_as_the_sum_of_the_layers():
    # a 2-layer model's estimate against its 1-layer one: the tensor axis's activation
    # all-reduces are the same op, counted per layer
    layout = plan_hardware_devices("tpu-v5e", ici={"fsdp": 4, "tensor": 4}, topology="4x4")
    one, two = (
        {
            (c.phase, c.kind): c
            for c in estimate_step(
                "tpu-v5e", layout.axes_detail, {**MOE, "layers": n, "remat": "none"}, 16
            ).collectives
            if c.axis == "tensor" and c.what == "activations"
        }  # fmt: skip
        for n in (1, 2)
    )
    for key, c in one.items():
        per_op = c.seconds / c.count
        assert two[key].seconds == pytest.approx(per_op * two[key].count, rel=1e-12)
        assert two[key].bytes_per_device == c.bytes_per_device // c.count * two[key].count
