"""Mesh recommendations: every (ici, dcn) factorisation of a cluster, priced and ranked.

For a hardware entry, a TPU topology and slice count (or GPU hosts), a model and a
global batch, :func:`recommend_meshes` enumerates every ordered factorisation of one
slice's / NVLink domain's devices over the requested axes (``ici``) and of the slices /
domains over the same axes (``dcn``), lays each ``ici`` factorisation out once on one
slice with :func:`datarax.distributed.topology.plan_hardware_devices` (JAX's device
order; what JAX refuses is rejected with its code), prices every candidate with
:func:`datarax.distributed.cost.estimate_step`, rejects what does not fit HBM or does
not divide the batch (counted by code), and ranks the rest by estimated step time.

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
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datarax.distributed.cost import AXIS_ROLES, axis_roles, estimate_step
from datarax.distributed.hardware import AxisLink, Hardware, get_hardware
from datarax.distributed.model_specs import ModelSpec, model_spec
from datarax.distributed.planning import PlanError
from datarax.distributed.topology import plan_hardware_devices

__all__ = ["RANKING", "factorisations", "recommend_meshes"]


def factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered tuple of ``parts`` positive ints whose product is ``n``.

    >>> factorisations(4, 2)
    [(1, 4), (2, 2), (4, 1)]
    """
    if parts == 1:
        return [(n,)]
    out = []
    for first in range(1, n + 1):
        if n % first == 0:
            out += [(first, *rest) for rest in factorisations(n // first, parts - 1)]
    return out


def _check_axes(axes: Sequence[str]) -> list[str]:
    if isinstance(axes, str) or not axes or len(set(axes)) != len(axes):
        raise PlanError(
            "invalid_axis_name",
            f"axes must list distinct mesh axis names such as ['data', 'fsdp', 'tensor'], "
            f"got {axes!r}",
        )
    axis_roles(list(axes))  # every axis needs a role: data, fsdp or tensor
    return list(axes)


def _links(hw: Hardware, inner: Sequence[AxisLink], dcn: Mapping[str, int]) -> list[AxisLink]:
    """The candidate's ``axes_detail``: an axis with ``dcn > 1`` rides the slow network."""
    out = []
    for link in inner:
        d = dcn[link.name]
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
    axes: Sequence[str] = AXIS_ROLES,
    top_k: int = 5,
    optimizer: str = "adam",
    allow_split_physical_axes: bool = False,
) -> dict[str, Any]:
    """Ranks every (ici, dcn) factorisation of a cluster for one training job.

    Args:
      hardware: catalog name or entry.
      model: model spec or request object (dtype default bfloat16).
      global_batch: examples or sequences per step.
      topology: TPU slice shape (``"16x16"`` or ``"v5e:16x16"``); TPU only.
      slices: TPU slices joined by DCN.
      hosts: GPU/CPU hosts; they must fill whole NVLink domains.
      axes: mesh axis names in order; each must have a role (``data``, ``fsdp``,
        ``tensor``, or their aliases), see :func:`datarax.distributed.cost.axis_roles`.
      top_k: candidates to return, >= 1.
      optimizer: ``adam``, ``adamw`` or ``sgd``.
      allow_split_physical_axes: as in JAX's ``create_device_mesh``; without it, ICI
        factorisations JAX refuses count under ``physical_axes_split_required``.

    Returns:
      ``{"candidates": [{"rank", "ici", "dcn", "step_estimate", "memory_per_device",
      "plan_request"}], "considered": n, "rejected": {code: n}, "ranked_by", "note"?}``,
      best first by :data:`RANKING`; ``note`` (only when fewer than ``top_k``
      candidates survive) says how many did and why the others were rejected.

    Raises:
      PlanError: bad inputs (``unknown_hardware``, ``invalid_topology``,
        ``missing_topology``, ``invalid_host_count``, ``invalid_model``,
        ``invalid_axis_name``, ``unknown_axis_role``, ``invalid_top_k``), or
        ``no_plan_fits`` when every candidate is rejected; its message says what would
        fit (more devices, ``remat: full``, a smaller batch).
    """
    hw = get_hardware(hardware)
    spec = model_spec(model)
    names = _check_axes(axes)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise PlanError("invalid_top_k", f"top_k must be a positive integer, got {top_k!r}")
    cluster = _Cluster.of(hw, names, topology, slices, hosts, allow_split_physical_axes)
    considered, rejected, survivors, smallest = cluster.rank(spec, global_batch, optimizer)
    if not survivors:
        raise PlanError(
            "no_plan_fits",
            cluster.explain(spec, global_batch, optimizer, rejected, smallest),
        )
    candidates = []
    for rank, (_, ici, dcn, est) in enumerate(survivors[:top_k], start=1):
        memory = est.pop("memory_per_device")
        candidates.append(
            {
                "rank": rank,
                "ici": ici,
                "dcn": dcn,
                "step_estimate": est,
                "memory_per_device": memory,
                "plan_request": cluster.plan_request(spec, ici, dcn, global_batch, optimizer),
            }
        )
    out = {
        "candidates": candidates,
        "considered": considered,
        "rejected": rejected,
        "ranked_by": RANKING,
    }
    if len(candidates) < top_k:
        out["note"] = (
            f"{len(candidates)} of the top_k {top_k} asked for: only {len(survivors)} of the "
            f"{considered} factorisations survive"
            + (f" (rejected: {_counts(rejected)})" if rejected else "")
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

    @classmethod
    def of(cls, hw, names, topology, slices, hosts, allow_split) -> _Cluster:
        # one layout of the whole cluster checks topology / slices / hosts with the
        # planner's own codes
        whole = {names[0]: -1, **dict.fromkeys(names[1:], 1)}
        if hw.kind == "tpu":
            probe = plan_hardware_devices(
                hw, ici=whole, dcn={names[0]: -1}, topology=topology, slices=slices
            )
            where: dict[str, Any] = {"topology": topology, "slices": slices}
            per_domain_hosts = 0
        else:
            probe = plan_hardware_devices(hw, ici=whole, dcn={names[0]: -1}, hosts=hosts)
            where = {"hosts": hosts}
            per_domain_hosts = probe.hosts // probe.slices
        return cls(
            hw=hw,
            names=names,
            where=where,
            n_ici=probe.num_devices // probe.slices,
            n_dcn=probe.slices,
            per_domain_hosts=per_domain_hosts,
            allow_split=bool(allow_split),
        )

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

    def rank(self, spec: ModelSpec, global_batch: int, optimizer: str):
        """``(considered, rejected by code, survivors best first, smallest total bytes
        of the candidates that did not fit)``."""
        rejected: dict[str, int] = {}
        survivors = []
        smallest = math.inf
        dcn_options = [
            dict(zip(self.names, f, strict=True))
            for f in factorisations(self.n_dcn, len(self.names))
        ]
        considered = 0
        for ici_sizes in factorisations(self.n_ici, len(self.names)):
            considered += len(dcn_options)
            inner = self.links(ici_sizes)
            if isinstance(inner, str):
                rejected[inner] = rejected.get(inner, 0) + len(dcn_options)
                continue
            ici = dict(zip(self.names, ici_sizes, strict=True))
            for dcn in dcn_options:
                try:
                    est = estimate_step(
                        self.hw,
                        _links(self.hw, inner, dcn),
                        spec,
                        global_batch,
                        optimizer=optimizer,
                    )
                except PlanError as err:
                    rejected[err.code] = rejected.get(err.code, 0) + 1
                    continue
                memory = est["memory_per_device"]
                if not memory["fits"]:
                    smallest = min(smallest, memory["total"])
                    rejected["does_not_fit"] = rejected.get("does_not_fit", 0) + 1
                    continue
                survivors.append((est["step_s"], ici, dcn, est))
        # enumeration order (ici factorisations ascending, then dcn) breaks the last ties
        survivors.sort(key=lambda item: (item[0], item[3]["memory_per_device"]["total"]))
        return considered, rejected, survivors, smallest

    def plan_request(self, spec, ici, dcn, global_batch, optimizer) -> dict[str, Any]:
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
        request["batch_axes"] = [a for a in ici if roles[a] in ("data", "fsdp")]
        request["model"] = spec.to_json()
        request["optimizer"] = optimizer
        return request

    def explain(self, spec, global_batch, optimizer, rejected, smallest) -> str:
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
        if spec.remat == "none":
            if self.rank(dataclasses.replace(spec, remat="full"), global_batch, optimizer)[2]:
                hints.append("model remat 'full' fits")
            else:
                hints.append("model remat 'full' does not fit either")
        batch = global_batch // 2
        for _ in range(_BATCH_HALVINGS):
            if batch < 1:
                break
            if self.rank(spec, batch, optimizer)[2]:
                hints.append(f"a global_batch of {batch} fits")
                break
            batch //= 2
        return f"{head}; " + "; ".join(hints)


_BATCH_HALVINGS = 12
