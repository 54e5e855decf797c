"""TPU topologies and the device order within one slice, as JAX's ``mesh_utils`` builds it.

:func:`parse_tpu_topology` and :func:`format_tpu_topology` read and write JAX's topology
names (``"v5e:16x16"``) against the catalog; :func:`tpu_slice_order` re-implements
``jax.experimental.mesh_utils.create_device_mesh`` (jax 0.12.0.1) over chip coordinates:
the small-slice ring orders of v5e/v6e/v5p, the assignment of mesh axes to whole physical
axes (largest products first, last mesh axis first), and with
``allow_split_physical_axes`` the split assignment and its preference order. Requests JAX
refuses are refused with a :class:`PlanError` giving the same reason. Whole plans (slices,
hosts, DCN) are built from these orders by :mod:`datarax.hardware.topology`.

Example:
  >>> hw, shape = parse_tpu_topology("v5e:4x4")
  >>> hw.name, shape, format_tpu_topology(hw, shape)
  ('tpu-v5e', (4, 4, 1), 'v5e:4x4')
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from datarax.errors import PlanError
from datarax.hardware.chips import Hardware, accelerator_type, get_hardware, topology_shape

__all__ = ["format_tpu_topology", "parse_tpu_topology", "tpu_slice_order"]

# Orders JAX uses for small slices instead of the torus assignment, as indices into the
# chips sorted x-fastest (source: jax/_src/mesh_utils.py of jax 0.12.0.1,
# _TRAY_2x2_RING_ORDER, _V5E_TRAY_RING_ORDER, _V5E_TRAY_IOTA_ORDER,
# _TRAY_4x4_RING_ORDER, _V5P_2x2x2_ORDER and the handlers that pick them).
_RING_2X2 = (0, 1, 3, 2)
_RING_2X4 = (0, 1, 2, 3, 7, 6, 5, 4)
_IOTA_2X2X2 = (0, 4, 2, 6, 1, 5, 3, 7)
_RING_4X4 = (0, 1, 2, 3, 7, 6, 5, 9, 10, 11, 15, 14, 13, 12, 8, 4)
_V5P_2X2X2 = (0, 1, 3, 2, 6, 7, 5, 4)
# TPU7x (two devices per chip): each run of 8 devices in id order (2x2 chips x 2 cores)
# is ringed; jax/_src/mesh_utils.py, _7X_TRAY_2x2x2_RING_ORDER and _7x_create_device_mesh.
_RING_7X_TRAY = (0, 1, 2, 3, 6, 7, 4, 5)
# The priority create_device_mesh gives TPU7x's physical axes (x, y, z, core): the core
# axis first, as the fastest (jax/_src/mesh_utils.py, _create_device_mesh_for_nd_torus).
_PRIORITY_7X = (1, 2, 3, 0)

# Which small-slice handler JAX dispatches to, by the device_kind the chips report.
_SMALL_SLICE_FAMILY = {
    "TPU v5 lite": "lite",
    "TPU v5e": "lite",
    "TPU v6 lite": "lite",
    "TPU v6e": "lite",
    "TPU v5": "v5p",
    "TPU v5p": "v5p",
    "TPU7x": "7x",
    "TPU7": "7x",
}
_FAMILY_BY_NAME = {"tpu-v5e": "lite", "tpu-v6e": "lite", "tpu-v5p": "v5p", "tpu7x": "7x"}


# --------------------------------------------------------------------------- topologies


def _jax_prefix(hardware_name: str) -> str:
    return hardware_name.removeprefix("tpu-")


def _catalog_name(prefix: str) -> str:
    """The catalog name of JAX's chip prefix: ``"v5e"`` -> ``"tpu-v5e"``, ``"tpu7x"`` as is."""
    return prefix if prefix.startswith("tpu") else f"tpu-{prefix}"


def _chip_rank(hardware: Hardware) -> int:
    """2 for planar chips (v5e, v6e), 3 for 3-D tori, from the catalog's shapes."""
    ranks = {len(shape.split("x")) for shape in hardware.topologies}
    return ranks.pop() if len(ranks) == 1 else 3


def parse_tpu_topology(
    topology: str, hardware: str | Hardware | None = None
) -> tuple[Hardware, tuple[int, int, int]]:
    """Parses a TPU topology in JAX's form and checks it against the catalog.

    Args:
      topology: ``"16x16"``, ``"4x4x8"`` or with JAX's chip prefix, ``"v5e:16x16"``
        (the prefix is the catalog name without ``tpu-``), or a Cloud TPU accelerator
        type, ``"v5p-512"`` (:func:`~datarax.hardware.chips.accelerator_type`).
      hardware: catalog name or entry; may be omitted when ``topology`` has a prefix.

    Returns:
      ``(hardware, (x, y, z))``: the catalog entry and the chips of one slice per axis;
      2-D shapes get ``z = 1``.

    Raises:
      PlanError: ``invalid_topology`` (not a string, no chip named anywhere, a prefix
        that disagrees with ``hardware``, not one of the catalog's ``topologies``, or
        hardware that is no TPU) or ``unknown_hardware``.

    Example:
      >>> hw, shape = parse_tpu_topology("v5e:16x16")
      >>> hw.name, shape
      ('tpu-v5e', (16, 16, 1))
    """
    if not isinstance(topology, str):
        raise PlanError(
            "invalid_topology",
            f"topology is {topology!r}; give a string such as '16x16' or 'v5e:16x16'",
        )
    named = accelerator_type(topology)
    if hardware is not None:
        entry = get_hardware(hardware)
    elif named is not None:
        entry = get_hardware(named[0])
    elif ":" in topology:
        entry = get_hardware(_catalog_name(topology.split(":", 1)[0]))
    else:
        raise PlanError(
            "invalid_topology",
            f"topology {topology!r} does not say which chip it is; name the hardware "
            f"(e.g. hardware='tpu-v5e') or prefix the topology ('v5e:{topology}')",
        )
    dims = topology_shape(entry, topology)
    shape = (*dims, 1) if len(dims) == 2 else dims
    if len(shape) != 3:
        raise PlanError(
            "invalid_topology",
            f"topology {topology!r} has {len(dims)} dimensions; TPU slices have 2 or 3",
        )
    return entry, (shape[0], shape[1], shape[2])


def format_tpu_topology(hardware: str | Hardware, topology: Sequence[int]) -> str:
    """The topology name JAX's ``get_topology_desc`` takes, e.g. ``"v5e:16x16"``.

    Args:
      hardware: a TPU catalog name (``"tpu-v5e"``) or entry.
      topology: chips per axis, ``(16, 16)`` or ``(16, 16, 1)``; a trailing 1 is dropped
        for planar chips (v5e, v6e).

    Returns:
      ``"<chip>:<dims>"`` with the catalog name's ``tpu-`` removed.
    """
    entry = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    dims = [int(d) for d in topology]
    if _chip_rank(entry) == 2 and len(dims) == 3 and dims[2] == 1:
        dims = dims[:2]
    return f"{_jax_prefix(entry.name)}:{'x'.join(map(str, dims))}"


# ------------------------------------------------------------------ order within a slice


def _small_slice_order(
    family: str | None, chips: tuple[int, int, int], mesh_shape: tuple[int, ...]
) -> np.ndarray | None:
    """JAX's hand-made orders for small slices, or ``None`` when none applies."""
    n = math.prod(chips)
    order: tuple[int, ...] | None = None
    if family == "lite":
        if chips == (2, 2, 1):
            order = _RING_2X2
        elif n == 8:
            order = _IOTA_2X2X2 if chips == (2, 2, 2) else _RING_2X4
        elif chips == (4, 4, 1) and max(mesh_shape) == n:
            # JAX rings a 4x4 only when one mesh axis spans all of it.
            order = _RING_4X4
    elif family == "v5p" and chips == (2, 2, 2):
        order = _V5P_2X2X2
    if order is None:
        return None
    return np.asarray(order, dtype=np.int64).reshape(mesh_shape)


def _small_7x_order(
    chips: tuple[int, int, int], cores: int, mesh_shape: tuple[int, ...]
) -> np.ndarray | None:
    """JAX's TPU7x tray rings (8 to 32 devices, at most 2x2 chips in x and y), else ``None``."""
    n = math.prod(chips) * cores
    if n % 8 or n > 32 or chips[0] > 2 or chips[1] > 2:
        return None
    order = [i + start for start in range(0, n, 8) for i in _RING_7X_TRAY]
    return np.asarray(order, dtype=np.int64).reshape(mesh_shape)


def _whole_axes_assignment(
    physical: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    priority: tuple[int, ...] | None = None,
) -> tuple[list[tuple[int, ...]], tuple[int, int, list[int]] | None]:
    """Maps each mesh axis onto whole physical axes, last mesh axis first.

    Each mesh axis takes the first combination of still-free physical axes whose sizes
    multiply to its size, trying combinations of as many axes as possible first and, for
    one count, in lexicographic order of axis indices (as ``itertools.combinations``);
    with ``priority`` (rank per physical axis, lower first: TPU7x's core axis), the
    combinations of one count are first sorted by their best rank, then their rank sum.

    Returns:
      ``(chosen, failure)``: the physical axes of each mesh axis, and ``None`` or
      ``(mesh axis index, size, free sizes)`` for the first axis that found none.
    """
    free = list(physical)
    chosen: list[tuple[int, ...]] = [() for _ in mesh_shape]
    for axis in reversed(range(len(mesh_shape))):
        size = mesh_shape[axis]
        pick = next(
            (
                combo
                for count in range(len(free), 0, -1)
                for combo in _combinations(len(free), count, priority)
                if math.prod(free[p] for p in combo) == size
            ),
            None,
        )
        if pick is None:
            if size > 1:
                return chosen, (axis, size, list(free))
            continue
        chosen[axis] = pick
        for p in pick:
            free[p] = 0  # taken: any product through it is 0, never a valid size
    return chosen, None


def _combinations(n: int, count: int, priority: tuple[int, ...] | None) -> list[tuple[int, ...]]:
    """``count`` of ``n`` axes in the order JAX tries them (stable sort by priority)."""
    combos = list(itertools.combinations(range(n), count))
    if priority is not None:
        combos.sort(key=lambda c: (min(priority[p] for p in c), sum(priority[p] for p in c)))
    return combos


def _divisor_vectors(available: Sequence[int], size: int) -> list[tuple[int, ...]]:
    """Every ``z`` with ``z[p]`` dividing ``available[p]`` and ``prod(z) == size``."""
    if not available:
        return [()] if size == 1 else []
    head, rest = available[0], available[1:]
    out: list[tuple[int, ...]] = []
    for d in range(1, head + 1):
        if head % d == 0 and size % d == 0:
            out.extend((d, *tail) for tail in _divisor_vectors(rest, size // d))
    return out


def _split_axes_assignment(physical: tuple[int, ...], mesh_shape: tuple[int, ...]) -> np.ndarray:
    """``[physical, mesh]`` sizes: how much of each physical axis each mesh axis takes.

    Mesh axes are placed last first. Among all feasible splits JAX prefers, in order: the
    larger product of whole physical axes taken, more whole axes taken (of size > 1), the
    larger product over physical axes already used by later mesh axes, then the
    lexicographically larger vector.
    """
    assignment = np.ones((len(physical), len(mesh_shape)), dtype=np.int64)
    full = np.asarray(physical, dtype=np.int64)

    for axis in reversed(range(len(mesh_shape))):
        used = assignment.prod(axis=1)
        available = [int(v) for v in full // used]

        def preference(
            z: tuple[int, ...], used: np.ndarray = used
        ) -> tuple[int, int, int, tuple[int, ...]]:
            whole = [s for s, f in zip(z, physical, strict=True) if s == f]
            return (
                math.prod(whole),
                sum(1 for s in whole if s > 1),
                math.prod(s for s, u in zip(z, used, strict=True) if u > 1),
                z,
            )

        candidates = _divisor_vectors(available, mesh_shape[axis])
        assignment[:, axis] = max(candidates, key=preference)
    return assignment


def _read_split_mesh(
    chip_grid: np.ndarray, mesh_shape: tuple[int, ...], assignment: np.ndarray
) -> np.ndarray:
    """Cuts each physical axis into its mesh axes' pieces (earlier mesh axes major) and
    gathers, per mesh axis, its pieces in physical axis order."""
    n_phys, n_mesh = assignment.shape
    pieces = chip_grid.reshape(assignment.reshape(-1))
    order = sorted(range(n_phys * n_mesh), key=lambda k: (k % n_mesh, k // n_mesh))
    return pieces.transpose(order).reshape(mesh_shape)


def tpu_slice_order(
    hardware: str | Hardware,
    topology: Sequence[int],
    mesh_shape: Sequence[int],
    *,
    allow_split_physical_axes: bool = False,
    axis_names: Sequence[str] | None = None,
) -> tuple[np.ndarray, bool]:
    """The chips of one TPU slice in the order JAX's ``create_device_mesh`` gives them.

    Args:
      hardware: TPU catalog name or entry (chooses JAX's small-slice ring orders).
      topology: chips per axis ``(x, y, z)``.
      mesh_shape: ici sizes per mesh axis, least network-intensive first; their product
        is the chip count.
      allow_split_physical_axes: as in JAX: may a physical axis be cut between mesh axes.
      axis_names: names of the mesh axes, for error messages only.

    Returns:
      ``(order, split)``: ``order`` is ``[*mesh_shape] int64`` device indices
      ``C * (x + X * (y + Y * z)) + core`` with ``C = devices_per_chip`` (the chip index
      where a chip is one device); ``split`` says whether physical axes were split.

    Raises:
      PlanError: ``physical_axes_split_required`` when a mesh axis is not a product of
        whole free physical axes and splitting is not allowed (JAX raises
        ``NotImplementedError`` there); ``axes_product_mismatch`` when the sizes do not
        multiply to the chip count; ``device_mesh_unsupported`` for a shape JAX's own
        transpose rejects.
    """
    entry = hardware if isinstance(hardware, Hardware) else get_hardware(hardware)
    chips = tuple(int(d) for d in topology)
    chips = (*chips, 1) if len(chips) == 2 else chips
    shape = tuple(int(s) for s in mesh_shape)
    names = list(axis_names) if axis_names is not None else [str(i) for i in range(len(shape))]
    cores = int(entry.devices_per_chip)
    n = math.prod(chips) * cores
    if math.prod(shape) != n:
        what = f"{n} chips" if cores == 1 else f"{n} devices ({cores} per chip)"
        raise PlanError(
            "axes_product_mismatch",
            f"ici sizes {dict(zip(names, shape, strict=True))} multiply to "
            f"{math.prod(shape)} but a {'x'.join(map(str, chips))} slice has {what}",
        )
    family = _SMALL_SLICE_FAMILY.get(entry.device_kind or "", _FAMILY_BY_NAME.get(entry.name))
    chips3 = (chips[0], chips[1], chips[2])
    if cores > 1:
        small = _small_7x_order(chips3, cores, shape) if family == "7x" else None
    else:
        small = _small_slice_order(family, chips3, shape)
    if small is not None:
        return small, False
    # chip_grid[x, y, z(, core)] = (x + X * (y + Y * z)) * cores + core: device indices
    # laid out over the torus, with a last axis for the cores of a chip where it has several
    # (JAX's _get_physical_tpu_mesh).
    physical = chips if cores == 1 else (*chips, cores)
    grid = np.arange(n, dtype=np.int64).reshape(chips[2], chips[1], chips[0], cores)
    chip_grid = grid.transpose(2, 1, 0, 3)
    if cores == 1:
        chip_grid = chip_grid[..., 0]
    priority = _PRIORITY_7X if family == "7x" and cores > 1 else None
    chosen, failure = _whole_axes_assignment(physical, shape, priority)
    if failure is None:
        perm = [p for combo in chosen for p in combo]
        try:
            return chip_grid.transpose(perm).reshape(shape), False
        except ValueError as error:
            raise PlanError(
                "device_mesh_unsupported",
                f"ici shape {dict(zip(names, shape, strict=True))} on a "
                f"{'x'.join(map(str, chips))} slice maps onto physical axes {perm}, which "
                f"JAX's create_device_mesh cannot transpose ({error}); reorder the axes",
            ) from None
    if not allow_split_physical_axes:
        axis, size, free = failure
        raise PlanError(
            "physical_axes_split_required",
            f"ici axis {names[axis]!r} of size {size} is not a product of whole physical "
            f"axes still free in the {'x'.join(map(str, chips))} slice (free sizes {free}, "
            f"0 = taken by a later axis); JAX's create_device_mesh refuses this. Use ici "
            f"sizes that are products of the slice's axis sizes, or set "
            f"allow_split_physical_axes to true",
        )
    assignment = _split_axes_assignment(physical, shape)
    return _read_split_mesh(chip_grid, shape, assignment), True
