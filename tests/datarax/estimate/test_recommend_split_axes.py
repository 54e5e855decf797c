"""Split physical axes priced aside (issue 56, item 4): without
``allow_split_physical_axes`` the layouts JAX lays out only by cutting a torus axis are
not ranked, but the best of them is priced as a ranked candidate is and the answer says
what was skipped and where that best would rank; with the flag they are ranked as before.

The cluster: one v5e 4x4 slice. ``data`` 8 x ``tensor`` 2 (and 9 other factorisations)
cut a physical axis of 4; at a global batch of 16 that layout is the fastest of all."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.estimate.recommend import recommend_meshes
from datarax.hardware.topology import plan_hardware_devices
from datarax.plan.layout import PlanCancelled

MODEL = {
    "kind": "transformer", "layers": 2, "d_model": 1024, "d_ff": 4096, "heads": 8,
    "kv_heads": 8, "vocab": 32000, "seq_len": 1024,
}  # fmt: skip
V5E = {"topology": "4x4", "model": MODEL}
SPLIT = "physical_axes_split_required"


def _key(candidate) -> tuple:
    return tuple(sorted(candidate["ici"].items())), tuple(sorted(candidate["dcn"].items()))


def _would_rank(step_s: float, total: int, ranked, top_k: int) -> int | None:
    """The rank by RANKING's order (step time, then total memory), within top_k."""
    above = [c for c in ranked
             if (c.step_estimate.step_s, c.memory_per_device.total) <= (step_s, total)]  # fmt: skip
    rank = len(above) + 1
    return rank if rank <= top_k else None


@pytest.mark.parametrize("global_batch", [16, 64])
def test_skipped_split_layouts_are_priced_aside_and_ranked_with_the_flag(global_batch):
    out = recommend_meshes("tpu-v5e", **V5E, global_batch=global_batch, top_k=3)
    split = out.split_physical_axes
    assert split is not None and split.skipped == out.rejected[SPLIT] == 9
    assert "split_physical_axes" in out.to_json()
    # every candidate of the cluster, split ones ranked among them
    allowed = recommend_meshes(
        "tpu-v5e", **V5E, global_batch=global_batch, top_k=10_000, allow_split_physical_axes=True
    )
    assert allowed.split_physical_axes is None and "split_physical_axes" not in allowed.to_json()
    unsplit = recommend_meshes("tpu-v5e", **V5E, global_batch=global_batch, top_k=10_000)
    plain = {_key(c) for c in unsplit.candidates}
    needing_split = [c for c in allowed.candidates if _key(c) not in plain]
    assert needing_split, "the flag ranks the skipped layouts"
    # the best skipped one is the best of those the flag ranks, priced the same
    best = split.best
    assert best is not None and best.fits is True
    twin = needing_split[0]
    assert _key(best) == _key(twin)
    assert best.step_estimate.step_s == twin.step_estimate.step_s
    assert best.memory_per_device.total == twin.memory_per_device.total
    assert best.plan_request == twin.plan_request
    assert best.plan_request["allow_split_physical_axes"] is True
    with pytest.raises(PlanError) as refused:  # it does need the flag
        plan_hardware_devices("tpu-v5e", ici=best.ici, topology="4x4")
    assert refused.value.code == SPLIT
    # where it would rank among the returned candidates
    step_s, total = best.step_estimate.step_s, best.memory_per_device.total
    assert split.would_rank == _would_rank(step_s, total, out.candidates, 3)
    assert split.would_rank is not None
    assert f"would rank {split.would_rank} " in split.note
    assert "9 layouts need allow_split_physical_axes: true" in split.note
    assert "send allow_split_physical_axes: true" in split.note
    if global_batch == 16:  # the split layout wins: it is first with the flag
        assert split.would_rank == 1 and allowed.candidates[0]["ici"] == best.ici
        assert best.ici == {"data": 8, "fsdp": 1, "tensor": 2}
        assert step_s < out.candidates[0].step_estimate.step_s


def test_a_split_layout_ranking_below_the_returned_ones_has_no_rank():
    out = recommend_meshes("tpu-v5e", **V5E, global_batch=64, top_k=1)
    split = out.split_physical_axes
    assert split is not None and split.best is not None and split.best.fits
    assert split.best.step_estimate.step_s > out.candidates[0].step_estimate.step_s
    assert split.would_rank is None and "below the returned candidates" in split.note
    assert "split_physical_axes" in out.to_json()
    assert out.to_json()["split_physical_axes"]["would_rank"] is None


def test_nothing_skipped_has_no_member():
    skipping = recommend_meshes("tpu-v5e", **V5E, global_batch=16)
    assert skipping.split_physical_axes is not None  # the contrast: 4x4 skips some
    for where in ({"topology": "2x4"}, {"topology": "2x2x2"}):
        hardware = "tpu-v5p" if where["topology"] == "2x2x2" else "tpu-v5e"
        out = recommend_meshes(hardware, **where, model=MODEL, global_batch=16)
        assert SPLIT not in out.rejected
        assert out.split_physical_axes is None and "split_physical_axes" not in out.to_json()


def test_no_plan_fits_says_a_split_layout_would():
    pinned = {"fixed_ici": {"fsdp": 1, "tensor": 2}}  # only data 8 x tensor 2: a split
    with pytest.raises(PlanError) as nothing:
        recommend_meshes("tpu-v5e", **V5E, global_batch=16, **pinned)
    assert nothing.value.code == "no_plan_fits"
    message = str(nothing.value)
    assert "1 layout needs allow_split_physical_axes: true" in message
    assert "send allow_split_physical_axes: true" in message
    out = recommend_meshes(
        "tpu-v5e", **V5E, global_batch=16, **pinned, allow_split_physical_axes=True
    )
    assert out.candidates[0]["ici"] == {"data": 8, "fsdp": 1, "tensor": 2}
    assert f"({out.candidates[0].step_estimate.step_s:.4g} s a step)" in message


def test_pricing_them_aside_is_checked_by_should_stop_like_ranking_them():
    # The same candidates are priced with the flag (all ranked) as without it (ranked,
    # then the split ones aside); the aside pass asks should_stop once more per split
    # ICI factorisation (9 here), so a client gone stops it too.
    def counted(allow: bool) -> int:
        calls = [0]

        def stop() -> bool:
            calls[0] += 1
            return False

        recommend_meshes(
            "tpu-v5e", **V5E, global_batch=16, should_stop=stop, allow_split_physical_axes=allow
        )
        return calls[0]

    assert counted(False) == counted(True) + 9
    with pytest.raises(PlanCancelled):
        recommend_meshes("tpu-v5e", **V5E, global_batch=16, should_stop=_after(counted(True)))


def _after(n: int):
    """A should_stop that answers true from its (n + 1)th call on."""
    calls = [0]

    def stop() -> bool:
        calls[0] += 1
        return calls[0] > n

    return stop


def test_skipped_layouts_that_cannot_be_priced_are_named_without_a_best():
    # one sequence a step: no split layout of a 4x4 divides it (nor most others)
    big = {**MODEL, "layers": 4, "d_model": 4096, "d_ff": 14336, "heads": 32}
    out = recommend_meshes("tpu-v5e", topology="4x4", model=big, global_batch=1)
    split = out.split_physical_axes
    assert split is not None and split.skipped == out.rejected[SPLIT] == 9
    assert split.best is None and split.would_rank is None
    assert split.note.endswith("none of them works either (batch_not_divisible: 9)")
    allowed = recommend_meshes(
        "tpu-v5e", topology="4x4", model=big, global_batch=1, allow_split_physical_axes=True
    )
    assert allowed.rejected["batch_not_divisible"] == out.rejected["batch_not_divisible"] + 9
