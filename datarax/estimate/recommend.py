"""Mesh recommendations: every (ici, dcn) factorisation of a cluster, priced and ranked.

For a hardware entry, a TPU topology and slice count (or GPU hosts), a model and a
global batch, :func:`recommend_meshes` enumerates every ordered factorisation of one
slice's / NVLink domain's devices over the requested axes (``ici``) and of the slices /
domains over the same axes (``dcn``), lays each ``ici`` factorisation out once on one
slice with :func:`datarax.hardware.topology.plan_hardware_devices` (JAX's device
order; what JAX refuses is rejected with its code), prices every candidate with
:func:`datarax.estimate.cost.estimate_step`, rejects what does not fit HBM or does
not divide the batch (counted by code), and ranks the rest by estimated step time.

Bounded before it starts: the search space (ICI factorisations x DCN factorisations,
:func:`search_space`) is counted in closed form from the prime factors of the device
counts, and the cluster is validated by laying out one slice / domain only, so a
request for a million devices or millions of candidates is refused
(``max_devices``, ``max_search_space``: :class:`SearchSpaceTooLarge` with the count and
the request changes that would shrink it) in milliseconds. The budget counts work, not
candidates: a candidate's collectives are priced in closed form (its work does not grow
with the layers) and one of a model with many parameter groups counts for more than one
(:func:`~datarax.estimate.factorisations.budget_limit`). ``fixed_ici`` /
``fixed_dcn`` pin some sizes and search only the rest. A running search checks
``should_stop`` between candidates, so a caller can abandon it (a client gone).

Each candidate's ``plan_request`` is a ``POST /v1/meshes`` body (DESIGN "Contract
v1.1": ``hardware``, ``topology``/``slices`` or ``hosts``, ``ici``, ``dcn``,
``batch_shape``, ``batch_axes``, ``model``, ``optimizer``).

Example:
  >>> out = recommend_meshes(
  ...     "tpu-v5e", topology="4x4", slices=2, global_batch=64,
  ...     model={"kind": "transformer", "layers": 4, "d_model": 1024, "d_ff": 4096,
  ...            "heads": 8, "kv_heads": 8, "vocab": 32000, "seq_len": 2048})
  >>> out["considered"], out["candidates"][0]["rank"]
  (45, 1)
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datarax.errors import PlanError
from datarax.estimate.calibrations import CalibrationProfile, profile_for
from datarax.estimate.cost import estimate_step
from datarax.estimate.factorisations import (
    SearchSpaceTooLarge,
    budget_limit,
    count_factorisations,
    factorisations,
    factorisations_with,
    fixed_sizes,
    search_space,
)
from datarax.estimate.recommend_split import price_split_axes, split_hint
from datarax.estimate.results import Candidate, Recommendations, StepEstimate
from datarax.hardware.chips import AxisLink, Hardware, get_hardware
from datarax.hardware.topology import plan_hardware_devices
from datarax.json_types import JSONObject
from datarax.parallel.axis_roles import axis_roles, batch_axes
from datarax.parallel.kinds import KINDS, axes_where, check_priced
from datarax.parallel.options import ParallelOptions
from datarax.plan.layout import PlanCancelled
from datarax.specs.model_specs import ModelSpec, TransformerSpec, model_spec

__all__ = [
    "RANKING",
    "SearchSpaceTooLarge",
    "budget_limit",
    "count_factorisations",
    "default_axes",
    "factorisations",
    "recommend_meshes",
    "search_space",
]


DENSE_AXES: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.searched == "always")
"""The kinds a recommendation searches for every model (the registry's
:attr:`~datarax.parallel.kinds.ParallelismKind.searched`): ``data``, ``fsdp``, ``tensor``."""


def default_axes(model: ModelSpec) -> tuple[str, ...]:
    """The axes a recommendation searches when the request names none: the registry's
    kinds searched always (``data``, ``fsdp``, ``tensor``) and, when the model has
    experts, those searched for them (``expert``), in the registry's (MaxText's) order."""
    moe = isinstance(model, TransformerSpec) and model.is_moe
    wanted = ("always", "moe") if moe else ("always",)
    return tuple(k.name for k in KINDS.values() if k.searched in wanted)


def _check_axes(axes: Sequence[str]) -> list[str]:
    if isinstance(axes, str) or not axes or len(set(axes)) != len(axes):
        raise PlanError(
            "invalid_axis_name",
            f"axes must list distinct mesh axis names such as ['data', 'fsdp', 'tensor'], "
            f"got {axes!r}",
        )
    roles = axis_roles(list(axes))  # every axis needs a kind
    # the search sizes every axis over 1 somewhere: each must be of a kind it prices
    check_priced(dict.fromkeys(axes, 2), roles)
    return list(axes)


def dcn_links(hw: Hardware, inner: Sequence[AxisLink], dcn: Mapping[str, int]) -> list[AxisLink]:
    """A candidate's ``axes_detail`` (training or serving): the slice's links, an axis with
    ``dcn > 1`` riding the slow network."""
    out = []
    for link in inner:
        d = dcn.get(link.name, 1)
        if d == 1:
            out.append(link)
            continue
        out.append(
            AxisLink(
                name=link.name,
                size=link.ici * d,
                ici=link.ici,
                dcn=d,
                link=hw.slow_link,
                bytes_per_s=hw.slow_link_bytes_per_s_per_device,
                ici_bytes_per_s=link.bytes_per_s if link.ici > 1 else None,
            )
        )
    return out


def recommend_meshes(
    hardware: str | Hardware,
    *,
    model: ModelSpec | Mapping[str, Any],
    global_batch: int,
    topology: str | None = None,
    slices: int = 1,
    hosts: int | None = None,
    axes: Sequence[str] | None = None,
    top_k: int = 5,
    optimizer: str = "adam",
    allow_split_physical_axes: bool = False,
    fixed_ici: Mapping[str, int] | None = None,
    fixed_dcn: Mapping[str, int] | None = None,
    max_search_space: int | None = None,
    max_devices: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    options: ParallelOptions | None = None,
    calibration: str | CalibrationProfile | None = None,
) -> Recommendations:
    """Ranks every (ici, dcn) factorisation of a cluster for one training job.

    Args:
      hardware: catalog name or entry.
      model: model spec or request object (dtype default bfloat16).
      global_batch: examples or sequences per step.
      topology: TPU slice shape (``"16x16"`` or ``"v5e:16x16"``); TPU only.
      slices: TPU slices joined by DCN.
      hosts: GPU/CPU hosts; they must fill whole NVLink domains.
      axes: mesh axis names in order; each must have a priced role (``data``,
        ``fsdp``, ``tensor``, ``expert`` or their aliases), see
        :func:`datarax.parallel.axis_roles.axis_roles`. ``None``: :func:`default_axes`
        (``data``, ``fsdp``, ``tensor``, and ``expert`` for a mixture-of-experts model).
      top_k: candidates to return, >= 1.
      optimizer: ``adam``, ``adamw`` or ``sgd``.
      allow_split_physical_axes: as in JAX's ``create_device_mesh``; without it, ICI
        factorisations JAX refuses count under ``physical_axes_split_required``.
      fixed_ici: ``{axis: size}`` ICI sizes to keep as given; only the other axes are
        searched (shrinks the search space).
      fixed_dcn: the same for DCN (``{"fsdp": 1, "tensor": 1}``: DCN over ``data``
        only, as MaxText's usual ``dcn_data_parallelism``).
      max_search_space: units of work to spend, a unit being one candidate of a model
        of at most :data:`~datarax.estimate.factorisations.WORK_UNIT_GROUPS` parameter
        groups (:func:`~datarax.estimate.factorisations.budget_limit`); a larger space
        is refused before any work with :class:`SearchSpaceTooLarge` (its count, the
        limit in candidates of this model and what would shrink it). The re-searches
        that explain a ``no_plan_fits`` (``remat: full``, a smaller batch) price at most
        3x that limit more, then stop (the message says which hints were not searched).
        ``None``: no limit.
      max_devices: most devices the cluster may have (``too_many_devices`` beyond);
        ``None``: no limit.
      should_stop: called between candidates; when it answers true the search stops
        with :class:`~datarax.plan.layout.PlanCancelled` (a client gone).
      options: the pipeline, the context strategy and ZeRO-1 every candidate is priced
        with (and its ``plan_request`` carries); a candidate its pipeline does not suit
        (microbatches that do not divide its local batch) counts under
        ``invalid_parallelism``.
      calibration: the calibration profile every candidate is priced with (default: the
        hardware's, :func:`~datarax.estimate.calibrations.default_profile`).

    Returns:
      The :class:`~datarax.answers.estimates.Recommendations` answer: ``candidates``
      (each ``rank``, ``ici``, ``dcn``, ``step_estimate``, ``memory_per_device``,
      ``plan_request`` and, with tensor or expert axes on the slow network, ``flags``),
      best first by :data:`RANKING`, ``considered``, ``rejected`` ``{code: n}``,
      ``ranked_by``, ``note`` (only when fewer than ``top_k`` candidates survive: how
      many did and why the others were rejected) and ``split_physical_axes`` (layouts
      skipped for needing split axes, :mod:`~datarax.estimate.recommend_split`).

    Raises:
      PlanError: bad inputs (``unknown_hardware``, ``invalid_topology``,
        ``missing_topology``, ``invalid_host_count``, ``invalid_model``,
        ``invalid_axis_name``, ``unknown_axis_role``, ``invalid_top_k``,
        ``too_many_devices``), or ``no_plan_fits`` when every candidate is rejected; its
        message says what would fit (more devices, ``remat: full``, a smaller batch).
      SearchSpaceTooLarge: ``search_space_too_large``, before any candidate is priced.
      PlanCancelled: ``should_stop`` answered true.
    """
    hw = get_hardware(hardware)
    profile_for(hw, calibration)  # an unknown profile is the request's fault, not a candidate's
    spec = model_spec(model)
    names = _check_axes(default_axes(spec) if axes is None else axes)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise PlanError("invalid_top_k", f"top_k must be a positive integer, got {top_k!r}")
    cluster = _Cluster.of(hw, names, topology, slices, hosts, allow_split_physical_axes)
    if max_devices is not None and cluster.n_ici * cluster.n_dcn > max_devices:
        raise PlanError(
            "too_many_devices",
            f"the cluster has {cluster.n_ici * cluster.n_dcn} devices; plans and "
            f"recommendations cover at most {max_devices}: use fewer slices or hosts",
        )
    cluster.fixed_ici = fixed_sizes(names, cluster.n_ici, fixed_ici, "ici")
    cluster.fixed_dcn = fixed_sizes(names, cluster.n_dcn, fixed_dcn, "dcn")
    cluster.bound(spec, max_search_space)
    cluster.should_stop = should_stop
    cluster.options = options or ParallelOptions()
    cluster.calibration = calibration
    considered, rejected, survivors, smallest, n_survivors = cluster.rank(
        spec, global_batch, optimizer, keep=top_k
    )
    split = price_split_axes(cluster, spec, global_batch, optimizer, rejected, survivors, top_k)
    if not survivors:
        why = cluster.explain(spec, global_batch, optimizer, rejected, smallest)
        raise PlanError("no_plan_fits", why + split_hint(split))
    candidates = _candidates(cluster, spec, names, survivors[:top_k], global_batch, optimizer)
    note = None
    if len(candidates) < top_k:
        note = (
            f"{len(candidates)} of the top_k {top_k} asked for: only {n_survivors} of the "
            f"{considered} factorisations survive"
            + (f" (rejected: {_counts(rejected)})" if rejected else "")
        )
    return Recommendations(
        candidates=candidates,
        considered=considered,
        rejected=rejected,
        ranked_by=RANKING,
        note=note,
        split_physical_axes=split,
    )


def slow_model_axes(dcn: Mapping[str, int], roles: Mapping[str, str]) -> list[str]:
    """The axes over 1 across the slow network (DCN or InfiniBand) whose kind splits the
    model's tensors or experts (tensor, expert): their collectives run inside every layer,
    where the slow network hurts most."""
    return [
        name
        for name, size in dcn.items()
        if size > 1 and (KINDS[roles[name]].splits_width or KINDS[roles[name]].splits_experts)
    ]


def _slow_link_flags(
    dcn: Mapping[str, int],
    roles: Mapping[str, str],
    est: StepEstimate,
    hw: Hardware,
    best_on_fast: float,
) -> list[str]:
    """One line per tensor or expert axis a candidate puts across the slow network, with
    why it ranks where it does anyway: faster than the best candidate that keeps those
    kinds on the fast network (by how much), or the only kind of layout that fits."""
    out = []
    network = "InfiniBand" if hw.kind == "gpu" else "the data-centre network (DCN)"
    for name in slow_model_axes(dcn, roles):
        if math.isinf(best_on_fast):
            why = "no candidate keeping tensor and expert axes within a slice or NVLink domain fits"
        elif best_on_fast >= est.step_s:
            why = (
                f"the best candidate keeping them within a slice or NVLink domain is "
                f"{best_on_fast / est.step_s - 1:.0%} slower ({best_on_fast:.4g} s a step)"
            )
        else:
            why = (
                f"none: it is {est.step_s / best_on_fast - 1:.0%} slower than the best "
                f"candidate keeping them within a slice or NVLink domain "
                f"({best_on_fast:.4g} s a step), which ranks above it"
            )
        out.append(
            f"{roles[name]} axis {name!r} crosses {network} ({dcn[name]} ways): its "
            f"collectives run inside every layer on the slow link; why it ranks here: {why}"
        )
    return out


RANKING = (
    "step_estimate.step_s (the predicted wall time of one step), fastest first; equal "
    "times by the smaller memory_per_device.total, then by enumeration order (ici sizes "
    "ascending over the axes in order, then dcn)"
)
"""How :func:`recommend_meshes` orders its candidates (its answer's ``ranked_by``)."""


def _counts(rejected: Mapping[str, int]) -> str:
    return ", ".join(f"{code}: {n}" for code, n in sorted(rejected.items()))


type _Ranked = tuple[float, dict[str, int], dict[str, int], StepEstimate]
"""One priced candidate: ``(step_s, ici, dcn, estimate)``."""


def _candidates(
    cluster: _Cluster,
    spec: ModelSpec,
    names: Sequence[str],
    survivors: Sequence[_Ranked],
    global_batch: int,
    optimizer: str,
) -> list[Candidate]:
    """The answer's candidates, best first, each with its plan request and flags."""
    roles = axis_roles(list(names))
    return [
        Candidate(
            rank=rank,
            ici=ici,
            dcn=dcn,
            step_estimate=est,
            memory_per_device=est.memory_per_device,
            plan_request=cluster.plan_request(spec, ici, dcn, global_batch, optimizer),
            flags=_slow_link_flags(dcn, roles, est, cluster.hw, cluster.best_on_fast) or None,
        )
        for rank, (_, ici, dcn, est) in enumerate(survivors, start=1)
    ]


@dataclass
class _Cluster:
    """One cluster's fixed facts, and its ICI layouts cached per factorisation."""

    hw: Hardware
    names: list[str]
    where: dict[str, Any]
    n_ici: int
    n_dcn: int
    per_domain_hosts: int
    allow_split: bool
    inner: dict[tuple[int, ...], tuple[AxisLink, ...] | str] = field(default_factory=dict)
    fixed_ici: dict[str, int] = field(default_factory=dict)
    fixed_dcn: dict[str, int] = field(default_factory=dict)
    should_stop: Callable[[], bool] | None = None
    budget: int | None = None
    best_on_fast: float = math.inf  # the fastest survivor keeping tensor/expert off DCN
    options: ParallelOptions = field(default_factory=ParallelOptions)
    calibration: str | CalibrationProfile | None = None
    """Candidates left to price, over the search and its explaining re-searches."""

    @classmethod
    def of(
        cls,
        hw: Hardware,
        names: list[str],
        topology: str | None,
        slices: int,
        hosts: int | None,
        allow_split: bool,
    ) -> _Cluster:
        # One layout of ONE slice / domain checks topology / slices / hosts with the
        # planner's own codes; the whole cluster (up to millions of devices) is never
        # laid out here, so its size is known, and bounded, before any work.
        whole = {names[0]: -1, **dict.fromkeys(names[1:], 1)}
        if hw.kind == "tpu":
            plan_hardware_devices(hw, ici=whole, topology=topology, hosts=hosts)
            if isinstance(slices, bool) or not isinstance(slices, int) or slices < 1:
                # the planner's own check and message
                plan_hardware_devices(hw, ici=whole, topology=topology, slices=slices)
            probe = plan_hardware_devices(hw, ici=whole, topology=topology, slices=1)
            where: dict[str, Any] = {"topology": topology, "slices": slices}
            n_ici, n_dcn, per_domain_hosts = probe.num_devices, int(slices), 0
        else:
            per_host = int(hw.devices_per_host)
            per_domain = int(hw.fast_domain_devices or per_host)
            valid = (
                not isinstance(hosts, bool)
                and isinstance(hosts, int)
                and hosts >= 1
                and (hosts * per_host) % per_domain == 0
                and per_domain % per_host == 0
            )
            if not valid or topology is not None or slices != 1:
                # the planner's own checks and messages (it fails before laying out)
                plan_hardware_devices(
                    hw, ici=whole, dcn={names[0]: -1}, hosts=hosts, topology=topology,
                    slices=slices,
                )  # fmt: skip
            if not isinstance(hosts, int):  # the planner refused it just above
                raise PlanError("invalid_host_count", f"hosts is {hosts!r}; give hosts=<n>")
            per_domain_hosts = per_domain // per_host
            probe = plan_hardware_devices(hw, ici=whole, hosts=per_domain_hosts)
            where = {"hosts": hosts}
            n_ici, n_dcn = probe.num_devices, hosts * per_host // per_domain
        return cls(
            hw=hw,
            names=names,
            where=where,
            n_ici=n_ici,
            n_dcn=n_dcn,
            per_domain_hosts=per_domain_hosts,
            allow_split=bool(allow_split),
        )

    def search_space(
        self,
        names: Sequence[str] | None = None,
        n_dcn: int | None = None,
        fixed_ici: Mapping[str, int] | None = None,
        fixed_dcn: Mapping[str, int] | None = None,
    ) -> int:
        """Candidates of this cluster, or of it with other axes / slices / fixed sizes."""
        names = self.names if names is None else names
        return search_space(
            self.n_ici,
            self.n_dcn if n_dcn is None else n_dcn,
            names,
            {k: v for k, v in (self.fixed_ici if fixed_ici is None else fixed_ici).items()
             if k in names},
            {k: v for k, v in (self.fixed_dcn if fixed_dcn is None else fixed_dcn).items()
             if k in names},
        )  # fmt: skip

    def shrink(self, limit: int) -> list[dict[str, Any]]:
        """Changes to the request that shrink its search space, with the size each gives:
        DCN over the first axis only, one more fixed ICI size, fewer axes, fewer slices
        (TPU) or hosts (GPU)."""
        out = []
        others = [n for n in self.names[1:] if n not in self.fixed_dcn]
        if others and self.n_dcn > 1:
            fixed = {**self.fixed_dcn, **dict.fromkeys(others, 1)}
            out.append(
                {
                    "change": f"dcn over {self.names[0]!r} only (fixed_dcn)",
                    "request": {"fixed_dcn": fixed},
                    "search_space": self.search_space(fixed_dcn=fixed),
                }
            )
        free = [n for n in self.names if n not in self.fixed_ici]
        left = self.n_ici // math.prod(self.fixed_ici.values())
        if len(free) > 1 and left > 1:
            # e.g. a tensor axis of 4 or 8: the largest divisor of what is left, up to 8
            size = max(d for d in range(1, 9) if left % d == 0)
            fixed = {**self.fixed_ici, free[-1]: size}
            out.append(
                {
                    "change": f"fix the ici size of {free[-1]!r} (fixed_ici)",
                    "request": {"fixed_ici": fixed},
                    "search_space": self.search_space(fixed_ici=fixed),
                }
            )
        for k in range(len(self.names) - 1, 0, -1):
            count = self.search_space(names=self.names[:k])
            if count <= limit or k == 1:
                out.append(
                    {
                        "change": f"{k} axes",
                        "request": {"axes": self.names[:k]},
                        "search_space": count,
                    }
                )
                break
        fewer = self._fewer_domains(limit)
        if fewer is not None:
            out.append(fewer)
        return out

    def _fewer_domains(self, limit: int) -> dict[str, Any] | None:
        """The most slices (TPU) or hosts (GPU) below the request's whose space fits."""
        tried = set()
        n = self.n_dcn
        while n > 1:
            n //= 2
            tried.add(n)
        tried |= {2**k for k in range(self.n_dcn.bit_length()) if 2**k < self.n_dcn}
        for n in sorted(tried, reverse=True):
            count = self.search_space(n_dcn=n, fixed_dcn={})
            if count <= limit:
                if self.hw.kind == "tpu":
                    return {"change": f"{n} slices", "request": {"slices": n},
                            "search_space": count}  # fmt: skip
                hosts = n * self.n_ici // int(self.hw.devices_per_host)
                return {"change": f"{hosts} hosts", "request": {"hosts": hosts},
                        "search_space": count}  # fmt: skip
        return None

    def bound(self, spec: ModelSpec, max_units: int | None) -> None:
        """Refuses a search past its budget before any work (:class:`SearchSpaceTooLarge`),
        and sets the budget: the search's candidates, and 3x the limit more for the
        re-searches that explain a ``no_plan_fits``. The budget counts work: a candidate of
        a model with many parameter groups costs more than one
        (:func:`~datarax.estimate.factorisations.budget_limit`); the layers cost nothing
        more, a step's collectives being priced in closed form."""
        count = self.search_space()
        groups = len(spec.params())
        limit = None if max_units is None else budget_limit(max_units, groups)
        if limit is not None and count > limit:
            raise SearchSpaceTooLarge(count, limit, self.shrink(limit), groups)
        self.budget = None if limit is None else count + 3 * limit

    def spend(self, n: int) -> None:
        """Counts ``n`` candidates against the budget; stops if ``should_stop`` says so."""
        if self.should_stop is not None and self.should_stop():
            raise PlanCancelled("the recommendation search was abandoned")
        if self.budget is not None:
            self.budget -= n

    def price(
        self, inner: Sequence[AxisLink], dcn: Mapping[str, int], spec: ModelSpec,
        global_batch: int, optimizer: str,
    ) -> StepEstimate:  # fmt: skip
        """One candidate's step estimate: its slice's links, ``dcn`` on the slow network."""
        return estimate_step(
            self.hw, dcn_links(self.hw, inner, dcn), spec, global_batch, optimizer=optimizer,
            options=self.options, calibration=self.calibration,
        )  # fmt: skip

    def links(self, ici_sizes: tuple[int, ...]) -> tuple[AxisLink, ...] | str:
        """The ICI axes of one slice / domain, or the code the planner refused it with."""
        if ici_sizes not in self.inner:
            ici = dict(zip(self.names, ici_sizes, strict=True))
            try:
                if self.hw.kind == "tpu":
                    layout = plan_hardware_devices(
                        self.hw,
                        ici=ici,
                        topology=self.where["topology"],
                        slices=1,
                        allow_split_physical_axes=self.allow_split,
                    )
                else:
                    layout = plan_hardware_devices(self.hw, ici=ici, hosts=self.per_domain_hosts)
                self.inner[ici_sizes] = layout.axes_detail
            except PlanError as err:
                self.inner[ici_sizes] = err.code
        return self.inner[ici_sizes]

    def rank(
        self, spec: ModelSpec, global_batch: int, optimizer: str, keep: int = 1
    ) -> tuple[int, dict[str, int], list[_Ranked], float, int]:
        """``(considered, rejected by code, the best ``keep`` survivors best first,
        smallest total bytes of the candidates that did not fit, survivors in all)``.

        Only the best ``keep`` are held (a bounded heap), so memory does not grow with
        the search space (~5 KB per priced candidate otherwise)."""
        rejected: dict[str, int] = {}
        # max-heap of the best `keep` by (step_s, total bytes, enumeration order), negated
        best: list[tuple[float, int, int, _Ranked]] = []
        survivors = 0
        smallest = math.inf
        dcn_options = [
            dict(zip(self.names, f, strict=True))
            for f in factorisations_with(self.n_dcn, self.names, self.fixed_dcn)
        ]
        considered = 0
        self.best_on_fast = math.inf
        roles = axis_roles(list(self.names))
        for ici_sizes in factorisations_with(self.n_ici, self.names, self.fixed_ici):
            considered += len(dcn_options)
            self.spend(0)
            inner = self.links(ici_sizes)
            if isinstance(inner, str):
                rejected[inner] = rejected.get(inner, 0) + len(dcn_options)
                continue
            ici = dict(zip(self.names, ici_sizes, strict=True))
            for dcn in dcn_options:
                self.spend(1)
                try:
                    est = self.price(inner, dcn, spec, global_batch, optimizer)
                except PlanError as err:
                    rejected[err.code] = rejected.get(err.code, 0) + 1
                    continue
                memory = est.memory_per_device
                if not memory.fits:
                    smallest = min(smallest, memory.total)
                    rejected["does_not_fit"] = rejected.get("does_not_fit", 0) + 1
                    continue
                if not slow_model_axes(dcn, roles):
                    self.best_on_fast = min(self.best_on_fast, est.step_s)
                # enumeration order (ici factorisations ascending, then dcn) breaks the
                # last ties
                entry = (-est.step_s, -memory.total, -survivors, (est.step_s, ici, dcn, est))
                survivors += 1
                if len(best) < keep:
                    heapq.heappush(best, entry)
                else:
                    heapq.heappushpop(best, entry)
        ranked = [item for *_, item in sorted(best, reverse=True)]
        return considered, rejected, ranked, smallest, survivors

    def plan_request(
        self,
        spec: ModelSpec,
        ici: Mapping[str, int],
        dcn: Mapping[str, int],
        global_batch: int,
        optimizer: str,
    ) -> JSONObject:
        """A ``POST /v1/meshes`` body for one candidate."""
        roles = axis_roles(list(ici))
        request: dict[str, Any] = {
            "hardware": self.hw.name,
            **self.where,
            "ici": dict(ici),
            "dcn": dict(dcn),
        }
        if self.allow_split:
            request["allow_split_physical_axes"] = True
        request["batch_shape"] = spec.batch_shape(global_batch)
        request["batch_axes"] = list(batch_axes(ici, roles))
        request["model"] = spec.to_json()
        request["optimizer"] = optimizer
        sizes = {name: ici[name] * dcn[name] for name in ici}
        staged = bool(axes_where(sizes, lambda kind: kind.splits_layers, roles))
        split = bool(axes_where(sizes, lambda kind: kind.splits_sequence, roles))
        pipe, context = self.options.pipeline, self.options.context
        if staged:
            request["pipeline"] = {
                k: v for k, v in dataclasses.asdict(pipe).items() if v is not None
            }
        if split:
            request["context_parallel"] = dataclasses.asdict(context)
        if self.options.shard_over_data:
            request["optimizer"] = {"name": optimizer, "shard_over_data": True}
        if self.calibration is not None:
            request["calibration"] = (
                self.calibration.id
                if isinstance(self.calibration, CalibrationProfile)
                else self.calibration
            )
        return request

    def explain(
        self,
        spec: ModelSpec,
        global_batch: int,
        optimizer: str,
        rejected: Mapping[str, int],
        smallest: float,
    ) -> str:
        """Why nothing fits, and what would: more devices, remat, a smaller batch."""
        counts = _counts(rejected)
        devices = self.n_ici * self.n_dcn
        head = f"no mesh of {devices} {self.hw.name} devices works ({counts})"
        if not rejected.get("does_not_fit"):
            return (
                f"{head}; the global_batch of {global_batch} must split over the data x fsdp "
                f"shards and the model over tensor: try a global_batch that is a multiple "
                f"of {devices}"
            )
        gib = 2**30
        usable = self.hw.usable_hbm_bytes or self.hw.hbm_bytes
        hints = [
            f"the smallest candidate needs {smallest / gib:.2f} GiB per device and HBM holds "
            f"{usable / gib:.2f} GiB for one program; about {math.ceil(smallest / usable)}"
            f"x the devices would hold it"
        ]
        # Each re-search prices the whole space again: only while the budget lasts.
        space = self.search_space()
        if spec.remat == "none":
            if not self._affords(space):
                hints.append("remat 'full' was not searched (search budget)")
            elif self.rank(dataclasses.replace(spec, remat="full"), global_batch, optimizer)[2]:
                hints.append("model remat 'full' fits")
            else:
                hints.append("model remat 'full' does not fit either")
        batch = global_batch // 2
        for _ in range(_BATCH_HALVINGS):
            if batch < 1:
                break
            if not self._affords(space):
                hints.append(f"global batches of {batch} and below were not searched "
                             "(search budget)")  # fmt: skip
                break
            if self.rank(spec, batch, optimizer)[2]:
                hints.append(f"a global_batch of {batch} fits")
                break
            batch //= 2
        return f"{head}; " + "; ".join(hints)

    def _affords(self, space: int) -> bool:
        return self.budget is None or self.budget >= space


_BATCH_HALVINGS = 12
