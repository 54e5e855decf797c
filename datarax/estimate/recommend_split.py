"""Split physical axes, priced aside: what a recommendation skipped, and whether it wins.

Without ``allow_split_physical_axes`` (JAX's ``create_device_mesh`` default), an ICI
factorisation JAX would lay out only by cutting a physical torus axis between mesh axes
is rejected before pricing (``physical_axes_split_required``). On a TPU,
:func:`price_split_axes` lays those out once more with the flag (the same
:func:`~datarax.hardware.topology.plan_hardware_devices` path), prices each of their
(ici, dcn) candidates as a ranked one is priced (counted against the same search budget,
stopped by the same ``should_stop``), keeps only the best and says where it would rank:
the answer's ``split_physical_axes``. They stay out of the ranking unless the request
allows split axes (then they are ranked with the others and nothing is priced aside).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from datarax.answers.estimates import SplitCandidate, SplitPhysicalAxes
from datarax.errors import PlanError
from datarax.estimate.factorisations import factorisations_with
from datarax.estimate.results import StepEstimate
from datarax.specs.model_specs import ModelSpec

if TYPE_CHECKING:
    from datarax.estimate.recommend import _Cluster, _Ranked

__all__ = ["SPLIT_CODE", "price_split_axes", "split_hint"]

SPLIT_CODE = "physical_axes_split_required"
"""The code a factorisation is rejected with when its layout needs a split physical axis."""

_FLAG = "allow_split_physical_axes: true"

type _Best = tuple[tuple[float, ...], dict[str, int], dict[str, int], StepEstimate]
"""``(sort key, ici, dcn, estimate)`` of the best split candidate so far."""


def price_split_axes(
    cluster: _Cluster,
    spec: ModelSpec,
    global_batch: int,
    optimizer: str,
    rejected: Mapping[str, int],
    ranked: Sequence[_Ranked],
    top_k: int,
) -> SplitPhysicalAxes | None:
    """The answer's ``split_physical_axes``: ``None`` unless, on a TPU without
    ``allow_split_physical_axes``, some candidates were rejected for needing it.

    ``ranked`` are the search's best ``top_k`` survivors (best first); the skipped
    candidates are those of the ICI factorisations ``cluster`` recorded under
    :data:`SPLIT_CODE`. The best of them is the fastest that fits (ties by the smaller
    total memory, as :data:`~datarax.estimate.recommend.RANKING`), else the smallest;
    only it is held.

    Raises:
      PlanCancelled: ``should_stop`` answered true while pricing them.
    """
    skipped = rejected.get(SPLIT_CODE, 0)
    if cluster.allow_split or cluster.hw.kind != "tpu" or not skipped:
        return None
    if cluster.budget is not None and cluster.budget < skipped:
        note = f"{_need(skipped)} (not priced: search budget)"
        return SplitPhysicalAxes(skipped, None, None, f"{note}; send {_FLAG} to rank them")
    twin = dataclasses.replace(cluster, allow_split=True, inner={})
    best, codes = _best_split(cluster, twin, spec, global_batch, optimizer)
    if best is None:
        why = ", ".join(f"{code}: {n}" for code, n in sorted(codes.items()))
        note = f"{_need(skipped)}; none of them works either ({why})"
        return SplitPhysicalAxes(skipped, None, None, note)
    _, ici, dcn, est = best
    fits = bool(est.memory_per_device.fits)
    answer = SplitCandidate(
        ici=ici,
        dcn=dcn,
        step_estimate=est,
        memory_per_device=est.memory_per_device,
        fits=fits,
        plan_request=twin.plan_request(spec, ici, dcn, global_batch, optimizer),
    )
    rank = _would_rank(est, ranked, top_k) if fits else None
    return SplitPhysicalAxes(skipped, answer, rank, _note(skipped, est, rank, ranked))


def _best_split(
    cluster: _Cluster, twin: _Cluster, spec: ModelSpec, global_batch: int, optimizer: str
) -> tuple[_Best | None, dict[str, int]]:
    """The best skipped candidate laid out with split axes, and the codes of those that
    could not be priced (a layout JAX refuses even split, a batch that does not divide).
    ``twin`` is ``cluster`` laying out with split axes; the budget spent is ``cluster``'s."""
    names = cluster.names
    dcn_options = [
        dict(zip(names, f, strict=True))
        for f in factorisations_with(cluster.n_dcn, names, cluster.fixed_dcn)
    ]
    best: _Best | None = None
    codes: dict[str, int] = {}
    for sizes in [s for s, inner in cluster.inner.items() if inner == SPLIT_CODE]:
        cluster.spend(0)
        inner = twin.links(sizes)
        if isinstance(inner, str):
            codes[inner] = codes.get(inner, 0) + len(dcn_options)
            continue
        ici = dict(zip(names, sizes, strict=True))
        for dcn in dcn_options:
            cluster.spend(1)
            try:
                est = cluster.price(inner, dcn, spec, global_batch, optimizer)
            except PlanError as err:
                codes[err.code] = codes.get(err.code, 0) + 1
                continue
            memory = est.memory_per_device
            # any fitting one beats every one that does not; then as ranked, or smallest
            key = (0, est.step_s, memory.total) if memory.fits else (1, memory.total)
            if best is None or key < best[0]:
                best = (key, ici, dcn, est)
    return best, codes


def _would_rank(est: StepEstimate, ranked: Sequence[_Ranked], top_k: int) -> int | None:
    """Where ``est`` would sit among the ranked candidates (after any it ties), if within
    ``top_k``."""
    mine = (est.step_s, est.memory_per_device.total)
    rank = 1 + sum(
        1 for step_s, *_, other in ranked if (step_s, other.memory_per_device.total) <= mine
    )
    return rank if rank <= top_k else None


def _note(skipped: int, est: StepEstimate, rank: int | None, ranked: Sequence[_Ranked]) -> str:
    """One sentence: what was skipped, where its best would rank, what to send."""
    head = _need(skipped)
    send = f"send {_FLAG} to consider them"
    if not est.memory_per_device.fits:
        gib = est.memory_per_device.total / 2**30
        return f"{head}; none of them fits (the smallest needs {gib:.2f} GiB per device)"
    if not ranked:
        return f"{head}; the best of them fits ({est.step_s:.4g} s a step): {send}"
    if rank is None:
        last = ranked[-1][0]
        return (
            f"{head}; the best of them would rank below the returned candidates "
            f"({est.step_s:.4g} s vs {last:.4g} s a step for the last): {send}"
        )
    where = ranked[rank - 1][0] if rank <= len(ranked) else ranked[-1][0]
    which = f"rank {rank}'s" if rank <= len(ranked) else "the last's"
    return (
        f"{head}; the best of them would rank {rank} ({est.step_s:.4g} s vs {where:.4g} s "
        f"a step for {which} candidate now): {send}"
    )


def split_hint(split: SplitPhysicalAxes | None) -> str:
    """What a ``no_plan_fits`` message adds when a skipped split layout fits ("" else)."""
    if split is None or split.best is None or not split.best.fits:
        return ""
    step_s = split.best.step_estimate.step_s
    return (
        f"; {_need(split.skipped)} (not ranked) and the best of them fits "
        f"({step_s:.4g} s a step): send {_FLAG}"
    )


def _need(n: int) -> str:
    return f"1 layout needs {_FLAG}" if n == 1 else f"{n} layouts need {_FLAG}"
