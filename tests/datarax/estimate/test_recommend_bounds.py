"""The recommendation search is counted and bounded before it starts, and can be stopped."""

from __future__ import annotations

import itertools

import pytest

from datarax.errors import PlanError
from datarax.estimate.recommend import (
    SearchSpaceTooLarge,
    count_factorisations,
    factorisations,
    recommend_meshes,
    search_space,
)
from datarax.plan.layout import MAX_BATCH_ELEMENTS, PlanCancelled, check_batch_shape, resolve_axes

MODEL = {
    "kind": "transformer",
    "layers": 4,
    "d_model": 1024,
    "d_ff": 4096,
    "heads": 8,
    "kv_heads": 8,
    "vocab": 32000,
    "seq_len": 2048,
}
HUGE = {**MODEL, "layers": 80, "d_model": 8192, "d_ff": 28672, "heads": 64, "vocab": 128256}


@pytest.mark.parametrize(
    ("n", "parts"),
    list(itertools.product([1, 2, 7, 12, 16, 64, 72, 97, 360, 1024], [1, 2, 3, 4, 6])),
)
def test_count_factorisations_equals_the_enumeration(n, parts):
    assert count_factorisations(n, parts) == len(factorisations(n, parts))


@pytest.mark.parametrize(
    ("where", "axes", "n_ici", "n_dcn"),
    [
        ({"topology": "4x4", "slices": 2}, ["data", "fsdp", "tensor"], 16, 2),
        ({"topology": "2x4", "slices": 6}, ["data", "tensor"], 8, 6),
        ({"topology": "4x4", "slices": 1}, ["data", "fsdp", "tensor", "batch"], 16, 1),
    ],
    ids=["v5e-4x4x2", "v5e-2x4x6", "v5e-4x4-4-axes"],
)
def test_the_counted_space_is_what_the_search_considers(where, axes, n_ici, n_dcn):
    out = recommend_meshes("tpu-v5e", model=MODEL, global_batch=192, axes=axes, **where)
    assert out["considered"] == search_space(n_ici, n_dcn, axes)


def test_gpu_domains_are_counted_without_laying_out_the_cluster():
    out = recommend_meshes("h100-sxm", hosts=4, model=MODEL, global_batch=64)
    assert out["considered"] == search_space(8, 4, ["data", "fsdp", "tensor"])


@pytest.mark.parametrize(
    ("where", "axes"),
    [
        ({"topology": "16x16", "slices": 4096}, ["data", "fsdp", "tensor", "batch", "model"]),
        ({"topology": "4x4", "slices": 64}, ["data", "fsdp", "tensor", "batch"]),
    ],
    ids=["1M-devices", "64-slices"],
)
def test_a_space_above_the_limit_is_refused_before_any_candidate(where, axes):
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return False

    with pytest.raises(SearchSpaceTooLarge) as caught:
        recommend_meshes(
            "tpu-v5e", model=MODEL, global_batch=64, axes=axes, max_search_space=1000,
            should_stop=should_stop, **where,
        )  # fmt: skip
    error = caught.value
    assert error.code == "search_space_too_large"
    assert error.limit == 1000 and error.count > 1000
    assert not calls  # nothing was searched
    changes = {s["change"].split(" (")[0] for s in error.suggestions}
    assert any("dcn over" in c for c in changes), changes
    assert any(c.endswith("slices") for c in changes), changes
    for suggestion in error.suggestions:
        assert suggestion["search_space"] < error.count


def test_the_device_cap_comes_first():
    with pytest.raises(PlanError) as caught:
        recommend_meshes(
            "tpu-v5e", topology="16x16", slices=4096, model=MODEL, global_batch=64,
            max_devices=262_144, max_search_space=10,
        )  # fmt: skip
    assert caught.value.code == "too_many_devices"


def test_fixed_sizes_restrict_the_search():
    out = recommend_meshes(
        "tpu-v5e", topology="4x4", slices=4, model=MODEL, global_batch=64,
        fixed_ici={"tensor": 4}, fixed_dcn={"fsdp": 1, "tensor": 1},
    )  # fmt: skip
    assert out["considered"] == count_factorisations(4, 2)
    assert all(c["ici"]["tensor"] == 4 for c in out["candidates"])
    assert all(c["dcn"] == {"data": 4, "fsdp": 1, "tensor": 1} for c in out["candidates"])


@pytest.mark.parametrize(
    ("fixed", "code"),
    [
        ({"fixed_ici": {"tensor": 3}}, "axes_product_mismatch"),
        ({"fixed_ici": {"data": 2, "fsdp": 2, "tensor": 2}}, "axes_product_mismatch"),
        ({"fixed_ici": {"other": 2}}, "invalid_axis_name"),
        ({"fixed_dcn": {"data": 0}}, "invalid_axis_size"),
        ({"fixed_dcn": {"data": True}}, "invalid_axis_size"),
    ],
    ids=["not-dividing", "all-fixed-wrong-product", "unknown-axis", "zero", "bool"],
)
def test_bad_fixed_sizes(fixed, code):
    with pytest.raises(PlanError) as caught:
        recommend_meshes("tpu-v5e", topology="4x4", slices=2, model=MODEL, global_batch=64, **fixed)
    assert caught.value.code == code


def test_should_stop_ends_the_search():
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) > 50

    with pytest.raises(PlanCancelled):
        recommend_meshes(
            "tpu-v5e", topology="4x4", slices=16, model=MODEL, global_batch=64,
            axes=["data", "fsdp", "tensor", "batch"], allow_split_physical_axes=True,
            should_stop=should_stop,
        )  # fmt: skip
    assert len(calls) == 51


def test_the_explaining_re_searches_stay_within_the_budget():
    # 45 candidates (18 priced, 27 refused by JAX's layout), 12 batch halvings to search
    kwargs = {"topology": "4x4", "slices": 2, "model": HUGE, "global_batch": 4096}
    with pytest.raises(PlanError) as unbounded:
        recommend_meshes("tpu-v5e", **kwargs)
    assert "remat 'full'" in unbounded.value.message
    assert "not searched" not in unbounded.value.message
    # a budget of 45 + 3 * 45: the re-searches stop before the smallest batches
    with pytest.raises(PlanError) as bounded:
        recommend_meshes("tpu-v5e", max_search_space=45, **kwargs)
    assert bounded.value.code == "no_plan_fits"
    assert "not searched (search budget)" in bounded.value.message


@pytest.mark.parametrize(
    "shape",
    [[2**70], [2**63, 2**63], [int(1e300)], [MAX_BATCH_ELEMENTS + 1], [2**27, 2**27]],
    ids=["2^70", "2^63x2", "1e300", "2^53+1", "product-2^54"],
)
def test_batch_shapes_beyond_2_to_the_53_are_invalid(shape):
    with pytest.raises(PlanError) as caught:
        check_batch_shape(shape)
    assert caught.value.code == "invalid_batch_shape"
    assert len(caught.value.message) < 300


def test_batch_shapes_up_to_2_to_the_53_are_fine():
    assert check_batch_shape([2**53]) == (2**53,)
    assert check_batch_shape([0, 2**53]) == (0, 2**53)


def test_axis_names_have_a_length_limit():
    with pytest.raises(PlanError) as caught:
        resolve_axes({"a" * 65: -1}, 8)
    assert caught.value.code == "invalid_axis_name"
    assert len(caught.value.message) < 200
    assert resolve_axes({"a" * 64: -1}, 8) == {"a" * 64: 8}
