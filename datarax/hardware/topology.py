"""Device order of hardware plans: TPU topologies, slices, GPU hosts and ICI/DCN axes.

A hardware plan names a catalog entry (:mod:`datarax.hardware.chips`) and how the
mesh rides the networks, MaxText-style: ``ici`` and ``dcn`` map mesh axis names to sizes
(``ici_*`` / ``dcn_*`` parallelism). The mesh axes are the keys of ``ici`` in order, each
of size ``ici[a] * dcn[a]``; ``prod(ici)`` is the devices of one TPU slice or GPU NVLink
domain, ``prod(dcn)`` the number of slices or domains. Each network may hold one ``-1``.

Everything is numpy over integer arrays: no device, no ``jax.Device`` object. A
65,536-device plan (``v5e:16x16`` x 256 slices) takes ~3 ms; JAX's own
``create_hybrid_device_mesh`` over the same topology takes 0.2-0.4 s, after ~0.35 s to
build the topology's devices (``python -m benchmarks.hardware_plan``, 2-core host).

Device order on TPU equals JAX's ``jax.experimental.mesh_utils`` (jax 0.12.0.1):
``create_device_mesh(ici_shape, devices)`` for one slice and
``create_hybrid_device_mesh(ici_shape, dcn_shape, devices)`` for several, with the same
``allow_split_physical_axes``, over the devices that
``jax.experimental.topologies.get_topology_desc(platform="tpu", topology_name="v5e:16x16",
num_slices=s)`` describes (one device per chip: the megacore mode that JAX uses by default
on v4 and v5p; pass ``chip_config_name="megacore"`` to get it for v4). The algorithm is
re-implemented over chip coordinates: the small-slice ring orders of v5e/v6e/v5p, the
assignment of mesh axes to whole physical axes (largest products first, last mesh axis
first), and with ``allow_split_physical_axes`` the split assignment and its preference
order. Requests JAX refuses are refused with a :class:`PlanError` giving the same reason.

Device ids are the ids JAX gives those devices, so a plan can be matched with the real
job: in one slice, ``x + X * (y + Y * z)`` for chip ``(x, y, z)`` of an ``X x Y x Z``
slice (TPU7x, two devices per chip: ``2 * (x + X * (y + Y * z)) + core``, as libtpu
0.0.50.1 numbers them); with several slices, ``(slice + 1) * 100000`` plus that. TPU
hosts are 2x2x1 chip blocks numbered x-fastest within a slice and then slice by slice,
as the ``process_index`` of those devices. On GPU and CPU, device
``h * devices_per_host + i`` is local device ``i`` of host ``h`` (JAX's process-ordered
ids), ``physical`` is ``[host, local index]`` and ``slice`` is the NVLink domain; the
``ici`` axes of a domain are its ids in order (``create_device_mesh`` on GPU sorts by id),
and domains are laid out over ``dcn`` as ``create_hybrid_device_mesh`` lays out granules,
so every ``ici`` axis stays inside one NVLink domain.

Example:
  >>> layout = plan_hardware_devices(
  ...     "tpu-v5e", topology="16x16", slices=2,
  ...     ici={"data": 1, "fsdp": 64, "tensor": 4}, dcn={"data": -1},
  ...     allow_split_physical_axes=True)
  >>> layout.axes
  {'data': 2, 'fsdp': 64, 'tensor': 4}
  >>> [(a.name, a.link) for a in layout.axes_detail]
  [('data', 'dcn'), ('fsdp', 'ici'), ('tensor', 'ici')]
  >>> int(layout.device_grid[1, 0, 0]), layout.physical[256].tolist()
  (200000, [0, 0, 0])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from datarax.errors import PlanError
from datarax.hardware.chips import AxisLink, Hardware, get_hardware, has_wraparound
from datarax.hardware.tpu_slices import (
    format_tpu_topology,
    parse_tpu_topology,
    tpu_slice_order,
)
from datarax.plan.layout import AxesLike, resolve_axes

__all__ = [
    "HardwareLayout",
    "format_tpu_topology",
    "parse_tpu_topology",
    "plan_hardware_devices",
    "tpu_slice_order",
]

# JAX numbers the devices of slice s in a multi-slice topology (s + 1) * 100000 + local id
# (measured: jax 0.12.0.1, libtpu 0.0.50.1, topologies.get_topology_desc(..., num_slices)).
MULTI_SLICE_ID_STRIDE = 100_000

# Chips per TPU host, (x, y, z): get_topology_desc gives process_index over 2x2x1 blocks
# for v4, v5e, v5p and v6e (libtpu 0.0.50.1); Cloud TPU docs, "TPU v4"/"TPU v5p"/"TPU v5e"
# system architecture pages (https://cloud.google.com/tpu/docs/system-architecture-tpu-vm):
# 4 chips per host, and the 4-chip VM type for multi-host v5e/v6e slices.
TPU_HOST_BLOCK = (2, 2, 1)


@dataclass(frozen=True, eq=False)
class HardwareLayout:
    """Where every device of a hardware plan sits, in mesh order.

    Per-device arrays are indexed in mesh order: entry ``i`` belongs to device
    ``device_grid.flat[i]``, which holds mesh coordinates
    ``np.unravel_index(i, device_grid.shape)`` (the order of a plan's ``shards``).

    Attributes:
      hardware: the catalog entry.
      topology: chips of one TPU slice ``(x, y, z)`` (``z == 1`` for 2-D chips), or
        ``None`` on GPU/CPU.
      slices: TPU slices, or NVLink domains on GPU/CPU.
      hosts: hosts of the whole plan.
      ici: resolved ici sizes ``{axis: size}``, mesh axis order.
      dcn: resolved dcn sizes, same keys and order (1 where not given).
      axes: mesh axes ``{axis: ici * dcn}``.
      device_grid: ``[*axes.values()] int64`` JAX device ids (see the module docstring).
      slice_index: ``[n] int64`` slice (TPU) or NVLink domain (GPU/CPU) of each device.
      host_index: ``[n] int64`` host of each device, numbered over the whole plan.
      physical: ``[n, 3] int64`` chip ``(x, y, z)`` within its slice on TPU;
        ``[n, 2] int64`` ``(host, local index)`` on GPU/CPU.
      core: ``[n] int64`` core on chip on TPU (JAX's ``core_on_chip``: always 0 with one
        device per chip; 0 or 1 on TPU7x), ``None`` elsewhere.
      axes_detail: one :class:`AxisLink` per mesh axis: the slowest network it crosses
        (the catalog's ``slow_link`` when ``dcn > 1``, else its ``fast_link``) and the
        one-way bandwidth a device drives on it: ICI ``fast_link_bytes_per_s`` times the
        links the axis uses (1 per torus dimension it spans, 2 where it spans a whole
        dimension with wraparound), NVLink the GPU's egress, DCN / InfiniBand the host's
        slow link divided by its devices; ``ici_bytes_per_s`` is the ICI figure of an
        axis that crosses both.
      axes_physical: TPU only (``{}`` elsewhere): per mesh axis, how many distinct
        ``(x, y, z)`` chip coordinates its ici part spans, e.g. ``(16, 1, 1)`` for an axis
        along x of a 16x16 slice and ``(16, 16, 1)`` for one over the whole plane.
      split_physical_axes: whether the order needed ``allow_split_physical_axes``.
    """

    hardware: Hardware
    topology: tuple[int, int, int] | None
    slices: int
    hosts: int
    ici: dict[str, int]
    dcn: dict[str, int]
    axes: dict[str, int]
    device_grid: np.ndarray
    slice_index: np.ndarray
    host_index: np.ndarray
    physical: np.ndarray
    core: np.ndarray | None
    axes_detail: tuple[AxisLink, ...]
    axes_physical: dict[str, tuple[int, ...]] = field(default_factory=dict)
    split_physical_axes: bool = False

    @property
    def num_devices(self) -> int:
        """Devices in the plan."""
        return int(self.device_grid.size)

    @property
    def device_ids(self) -> np.ndarray:
        """``[n] int64`` device ids in mesh order (``device_grid.ravel()``)."""
        return self.device_grid.ravel()

    @property
    def topology_name(self) -> str | None:
        """The topology in JAX's form, e.g. ``"v5e:16x16"``; ``None`` on GPU/CPU."""
        if self.topology is None:
            return None
        return format_tpu_topology(self.hardware, self.topology)


# --------------------------------------------------------------------------- whole plans


def _check_count(value: object, what: str, code: str, hint: str) -> int:
    if value is None:  # not "hosts is None": the member is missing
        raise PlanError(code, f"{what} is missing; give an integer >= 1 ({hint})")
    if not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
        raise PlanError(code, f"{what} is {value!r}; it must be an integer >= 1 ({hint})")
    return int(value)


def _resolve_networks(
    ici: AxesLike, dcn: AxesLike | None, per_domain: int, domains: int, unit: str
) -> tuple[dict[str, int], dict[str, int]]:
    try:
        ici_sizes = resolve_axes(ici, per_domain)
    except PlanError as error:
        raise PlanError(
            error.code,
            f"ici: {error.message} (ici sizes multiply to the {per_domain} devices of one {unit})",
        ) from None
    items: list[tuple[str, int]]
    if dcn is None:
        items = [(name, 1) for name in ici_sizes]
    else:
        try:
            dcn_map = dict(dcn.items()) if isinstance(dcn, Mapping) else dict(dcn)
        except (TypeError, ValueError):
            raise PlanError(
                "invalid_axis_name",
                f"dcn must be a mapping such as {{'data': -1}} or a list of (name, size) "
                f"pairs, got {dcn!r}",
            ) from None
        unknown = [name for name in dcn_map if name not in ici_sizes]
        if unknown:
            raise PlanError(
                "unknown_dcn_axis",
                f"dcn names {unknown}, which are not ici axes; the mesh axes are the ici "
                f"keys {list(ici_sizes)}: add them to ici (size 1) or drop them from dcn",
            )
        items = [(name, dcn_map.get(name, 1)) for name in ici_sizes]
    try:
        dcn_sizes = resolve_axes(items, domains)
    except PlanError as error:
        raise PlanError(
            error.code,
            f"dcn: {error.message} (dcn sizes multiply to the {domains} {unit}s)",
        ) from None
    return ici_sizes, dcn_sizes


def _lay_out_domains(local: np.ndarray, dcn_shape: tuple[int, ...], per_domain: int) -> np.ndarray:
    """Global device positions ``domain * per_domain + local``, domains over ``dcn``.

    Axis ``a`` of the result is ``dcn_index * ici[a] + ici_index``, as ``np.block`` puts
    per-granule meshes together in ``create_hybrid_device_mesh``.
    """
    rank = local.ndim
    domains = np.arange(math.prod(dcn_shape), dtype=np.int64).reshape(dcn_shape)
    outer = domains.reshape([v for d in dcn_shape for v in (d, 1)]) * per_domain
    inner = local.reshape([v for i in local.shape for v in (1, i)])
    sizes = [dcn_shape[a] * local.shape[a] for a in range(rank)]
    positions: np.ndarray = (outer + inner).reshape(sizes)
    return positions


def _axes_detail(
    entry: Hardware,
    ici: Mapping[str, int],
    dcn: Mapping[str, int],
    spans: Mapping[str, tuple[int, ...]],
    chips: tuple[int, int, int] | None,
) -> tuple[AxisLink, ...]:
    """One :class:`AxisLink` per mesh axis, bandwidths as ``AxisLink`` defines them.

    ICI: one link per torus dimension the axis spans, two where it spans a whole
    dimension that wraps around (``has_wraparound``); NVLink / host: the device's fast
    link; DCN / InfiniBand: the host's slow link shared by its devices.
    """
    out = []
    for name, size in ici.items():
        if chips is not None and size > 1:
            links = sum(
                2 if span == chips[d] and has_wraparound(entry, chips, d) else 1
                for d, span in enumerate(spans[name])
                if span > 1
            )
        else:
            links = 1
        fast = float(entry.fast_link_bytes_per_s) * max(links, 1)
        if dcn[name] > 1:
            link, bytes_per_s = entry.slow_link, float(entry.slow_link_bytes_per_s_per_device)
            ici_bytes_per_s = fast if size > 1 else None
        else:
            link, bytes_per_s, ici_bytes_per_s = entry.fast_link, fast, None
        out.append(
            AxisLink(
                name=name,
                size=size * dcn[name],
                ici=size,
                dcn=dcn[name],
                link=link,
                bytes_per_s=bytes_per_s,
                ici_bytes_per_s=ici_bytes_per_s,
            )
        )
    return tuple(out)


def _axes_physical(
    order: np.ndarray, chips: tuple[int, int, int], names: Sequence[str]
) -> dict[str, tuple[int, ...]]:
    """Distinct chip coordinates each mesh axis spans (within a slice, from the origin)."""
    spans = {}
    for axis, name in enumerate(names):
        index: list[int | slice] = [0] * order.ndim
        index[axis] = slice(None)
        line = order[tuple(index)]
        coords = np.stack(
            [line % chips[0], line // chips[0] % chips[1], line // (chips[0] * chips[1])]
        )
        spans[name] = tuple(int(np.unique(row).size) for row in coords)
    return spans


def plan_hardware_devices(
    hardware: str | Hardware,
    *,
    ici: AxesLike,
    dcn: AxesLike | None = None,
    topology: str | None = None,
    slices: int = 1,
    hosts: int | None = None,
    allow_split_physical_axes: bool = False,
) -> HardwareLayout:
    """Lays out a hardware plan's devices in mesh order, as JAX would on that hardware.

    Args:
      hardware: catalog name (``"tpu-v5e"``, ``"h100-sxm"``) or entry.
      ici: ordered ``{axis: size}`` (or ``[(axis, size)]``) over the fast network; these
        keys are the mesh axes. Sizes multiply to the devices of one TPU slice or one
        NVLink domain; one may be ``-1``.
      dcn: ``{axis: size}`` over the slow network, keys among ``ici``'s (missing: 1);
        sizes multiply to the number of slices or domains; one may be ``-1``. ``None``:
        all 1.
      topology: TPU only, required there: ``"16x16"`` or ``"v5e:16x16"``.
      slices: TPU slices, >= 1.
      hosts: GPU/CPU only, required there: hosts in the job; with
        ``devices_per_host`` from the catalog they must fill whole NVLink domains.
      allow_split_physical_axes: TPU only, as in JAX's ``create_device_mesh``.

    Returns:
      A :class:`HardwareLayout` for all ``slices * chips`` (TPU) or
      ``hosts * devices_per_host`` (GPU/CPU) devices.

    Raises:
      PlanError: ``unknown_hardware``; ``invalid_topology`` or ``missing_topology``
        (TPU);
        ``invalid_host_count`` (GPU/CPU); ``option_not_applicable`` (``topology`` or
        ``slices`` on GPU/CPU, ``hosts`` on TPU); ``invalid_slice_count``;
        ``invalid_axis_name``, ``invalid_axis_size``, ``multiple_auto_axes``,
        ``axes_product_mismatch`` or ``unknown_dcn_axis`` (ici/dcn);
        ``physical_axes_split_required`` or ``device_mesh_unsupported`` (JAX refuses the
        order).

    Example:
      >>> layout = plan_hardware_devices("h100-sxm", hosts=4, ici={"fsdp": 2, "tensor": 4},
      ...                                dcn={"fsdp": -1})
      >>> layout.device_grid.shape, layout.axes_detail[0].link
      ((8, 4), 'infiniband')
    """
    entry = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    if entry.kind == "tpu":
        return _plan_tpu(entry, ici, dcn, topology, slices, hosts, allow_split_physical_axes)
    return _plan_domains(entry, ici, dcn, topology, slices, hosts)


def _plan_tpu(
    entry: Hardware,
    ici: AxesLike,
    dcn: AxesLike | None,
    topology: str | None,
    slices: int,
    hosts: int | None,
    allow_split: bool,
) -> HardwareLayout:
    if topology is None:
        raise PlanError(
            "missing_topology",
            f"{entry.name} is a TPU: give the slice shape as topology, one of "
            f"{', '.join(entry.topologies) or 'AxB or AxBxC'}",
        )
    if hosts is not None:
        raise PlanError(
            "option_not_applicable",
            f"hosts={hosts!r} is for GPU/CPU hardware; a TPU plan's hosts follow from "
            f"topology and slices, drop hosts",
        )
    slices = _check_count(slices, "slices", "invalid_slice_count", "TPU slices joined by DCN")
    entry, chips = parse_tpu_topology(topology, entry)
    cores = int(entry.devices_per_chip)
    per_slice = math.prod(chips) * cores
    ici_sizes, dcn_sizes = _resolve_networks(ici, dcn, per_slice, slices, "slice")
    names = list(ici_sizes)
    local, split = tpu_slice_order(
        entry,
        chips,
        tuple(ici_sizes.values()),
        allow_split_physical_axes=allow_split,
        axis_names=names,
    )
    position = _lay_out_domains(local, tuple(dcn_sizes.values()), per_slice)
    flat = position.ravel()
    slice_index, device = np.divmod(flat, per_slice)
    chip, core = np.divmod(device, cores)
    x = chip % chips[0]
    y = chip // chips[0] % chips[1]
    z = chip // (chips[0] * chips[1])
    block = tuple(min(b, c) for b, c in zip(TPU_HOST_BLOCK, chips, strict=True))
    grid = tuple(-(-c // b) for b, c in zip(block, chips, strict=True))
    hosts_per_slice = math.prod(grid)
    host_local = x // block[0] + grid[0] * (y // block[1] + grid[1] * (z // block[2]))
    ids = device if slices == 1 else (slice_index + 1) * MULTI_SLICE_ID_STRIDE + device
    spans = _axes_physical(local // cores, chips, names)
    return HardwareLayout(
        hardware=entry,
        topology=chips,
        slices=slices,
        hosts=hosts_per_slice * slices,
        ici=ici_sizes,
        dcn=dcn_sizes,
        axes={name: ici_sizes[name] * dcn_sizes[name] for name in names},
        device_grid=ids.reshape(position.shape),
        slice_index=slice_index,
        host_index=slice_index * hosts_per_slice + host_local,
        physical=np.stack([x, y, z], axis=1),
        core=core,
        axes_detail=_axes_detail(entry, ici_sizes, dcn_sizes, spans, chips),
        axes_physical=spans,
        split_physical_axes=split,
    )


def _plan_domains(
    entry: Hardware,
    ici: AxesLike,
    dcn: AxesLike | None,
    topology: str | None,
    slices: int,
    hosts: int | None,
) -> HardwareLayout:
    if topology is not None or slices != 1:
        given = f"topology={topology!r}" if topology is not None else f"slices={slices!r}"
        raise PlanError(
            "option_not_applicable",
            f"{given} is for TPUs; {entry.name} is a {entry.kind}: give hosts=<n> and let "
            f"dcn span the NVLink domains",
        )
    per_host = int(entry.devices_per_host)
    per_domain = int(entry.fast_domain_devices or per_host)
    hosts = _check_count(hosts, "hosts", "invalid_host_count", f"{per_host} devices per host")
    total = hosts * per_host
    if total % per_domain:
        raise PlanError(
            "invalid_host_count",
            f"hosts={hosts} gives {total} devices, which do not fill whole "
            f"{per_domain}-device NVLink domains of {entry.name}; use a multiple of "
            f"{per_domain // math.gcd(per_domain, per_host)} hosts",
        )
    domains = total // per_domain
    unit = "NVLink domain" if entry.kind == "gpu" else "host domain"
    ici_sizes, dcn_sizes = _resolve_networks(ici, dcn, per_domain, domains, unit)
    names = list(ici_sizes)
    # create_device_mesh on GPU sorts a granule's devices by id and reshapes.
    local = np.arange(per_domain, dtype=np.int64).reshape(tuple(ici_sizes.values()))
    grid = _lay_out_domains(local, tuple(dcn_sizes.values()), per_domain)
    flat = grid.ravel()
    host, local_index = np.divmod(flat, per_host)
    return HardwareLayout(
        hardware=entry,
        topology=None,
        slices=domains,
        hosts=hosts,
        ici=ici_sizes,
        dcn=dcn_sizes,
        axes={name: ici_sizes[name] * dcn_sizes[name] for name in names},
        device_grid=grid,
        slice_index=flat // per_domain,
        host_index=host,
        physical=np.stack([host, local_index], axis=1),
        core=None,
        axes_detail=_axes_detail(entry, ici_sizes, dcn_sizes, {}, None),
    )
