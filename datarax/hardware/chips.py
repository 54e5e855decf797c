"""Hardware catalog: chips, their memory, peak FLOP/s and networks, each figure with a source.

Plain data and arithmetic: nothing here touches a device. The planner (``topology``), the
step-time model (``cost``), the recommender (``recommend``) and the batch-size
recommendations (``device_placement``) read figures from here. This module holds the
lookups (:func:`get_hardware`, :func:`topology_shape`, :func:`has_wraparound`); the entries
are in :mod:`datarax.hardware.catalog` and the entry types in
:mod:`datarax.hardware.entry`, both re-exported here.

Conventions (all figures per device unless a name says otherwise):

- ``peak_bf16_flops``: dense (no 2:4 sparsity) bf16 matmul FLOP/s of one chip or GPU.
- ``hbm_bytes``: HBM capacity in bytes. Vendor pages write "GB" for HBM; every chip here
  reports a binary capacity to JAX (e.g. XLA refuses a v5e program above "15.75G" of
  16 GiB), so ``N GB`` on a datasheet is taken as ``N * 2**30`` bytes.
- ``fast_link_bytes_per_s``: one direction of one fast link of a device. On TPU that is one
  ICI link (a chip has ``fast_links_per_device`` of them: 4 on a 2-D torus, 6 on 3-D); on
  an NVIDIA GPU it is the GPU's whole NVLink egress into the NVSwitch fabric
  (``fast_links_per_device == 1``), which is how "How to Scale Your Model" counts it.
- ``slow_link_bytes_per_s``: one direction of the data-centre network (DCN on TPU,
  InfiniBand on GPU) of one host, shared by its ``devices_per_host`` devices.

Where sources disagree the entry's ``sources`` says which figure was taken and why. The
book "How to Scale Your Model" (Austin et al., Google DeepMind, 2025,
https://jax-ml.github.io/scaling-book/) is cited as "scaling-book"; its rules of thumb are
what ``tests/datarax/estimate/test_cost.py`` reproduces, so where Google's pages and the book
differ for a link bandwidth, the book's figure is taken and the difference is recorded.

Example:
  >>> hw = get_hardware("tpu-v5p")
  >>> hw.peak_bf16_flops, hw.fast_link_bytes_per_s
  (459000000000000.0, 90000000000.0)
"""

from __future__ import annotations

import math

from datarax.errors import PlanError
from datarax.hardware.catalog import HARDWARE
from datarax.hardware.entry import LINK_CLASSES, AxisLink, Hardware
from datarax.names import did_you_mean

__all__ = [
    "HARDWARE",
    "LINK_CLASSES",
    "AxisLink",
    "Hardware",
    "accelerator_type",
    "get_hardware",
    "has_wraparound",
    "topology_shape",
]


def get_hardware(name: str | Hardware) -> Hardware:
    """The catalog entry ``name`` (a :class:`Hardware` passes through unchanged).

    Raises:
      PlanError: code ``unknown_hardware`` naming the known entries.
    """
    if isinstance(name, Hardware):
        return name
    if not isinstance(name, str) or name not in HARDWARE:
        raise PlanError(
            "unknown_hardware",
            f"hardware {name!r} is not in the catalog{did_you_mean(name, HARDWARE)}; use one "
            f"of {sorted(HARDWARE)}",
        )
    return HARDWARE[name]


def topology_shape(hardware: Hardware | str, topology: str) -> tuple[int, ...]:
    """``"4x4x8"`` -> ``(4, 4, 8)``, checked against the hardware's accepted shapes.

    Accepts JAX's form ``"v5e:16x16"`` too when the prefix matches the hardware.

    Raises:
      PlanError: code ``invalid_topology`` for a malformed or unsupported shape, or a
        hardware without TPU topologies.
    """
    hw = get_hardware(hardware)
    if hw.kind != "tpu":
        raise PlanError(
            "invalid_topology",
            f"hardware {hw.name!r} has no TPU topologies; give 'hosts' instead of 'topology'",
        )
    text = str(topology)
    named = accelerator_type(text)
    if named is not None:
        return _accelerator_shape(hw, text, *named)
    if ":" in text:
        prefix, text = text.split(":", 1)
        if hw.name not in (prefix, f"tpu-{prefix}"):
            raise PlanError(
                "invalid_topology",
                f"topology {topology!r} names {prefix!r} but the hardware is {hw.name!r}; "
                f"write e.g. {hw.topologies[-1]!r}",
            )
    try:
        shape = tuple(int(part) for part in text.split("x"))
    except ValueError:
        shape = ()
    if text not in hw.topologies or not shape:
        raise PlanError(
            "invalid_topology",
            f"topology {topology!r} is not a {hw.name} slice shape"
            f"{did_you_mean(text, hw.topologies, 0.5)}; use one of {list(hw.topologies)}",
        )
    return shape


# Cloud TPU accelerator-type names: ``<prefix>-<count>``, the catalog entry and how many
# of the counted units a chip is. v4 and v5p count TensorCores (two a chip; Google Cloud,
# "TPU types and topologies": "v4-128 specifies ... 128 TensorCores", and its v5p page,
# v5p-8 a 2x2x1 slice), v5e (``v5litepod``) and v6e count chips (v5litepod-16 and v6e-16 are
# 4x4), TPU7x counts TensorCores, two a chip (xpk, src/xpk/core/system_characteristics.py
# at 073d687d02524fdd10e94f901c27147501ee469a: tpu7x-128 is topology 4x4x4).
_ACCELERATOR_TYPES = {
    "v4": ("tpu-v4", 2),
    "v5p": ("tpu-v5p", 2),
    "v5litepod": ("tpu-v5e", 1),
    "v6e": ("tpu-v6e", 1),
    "tpu7x": ("tpu7x", 2),
}


def accelerator_type(text: str) -> tuple[str, int, int] | None:
    """``(catalog name, units counted, units per chip)`` of a Cloud TPU accelerator-type
    name such as ``"v5p-512"``; ``None`` for anything else (a shape, ``"v5e:16x16"``)."""
    prefix, _, count = text.rpartition("-")
    if prefix not in _ACCELERATOR_TYPES or not count.isdigit():
        return None
    name, per_chip = _ACCELERATOR_TYPES[prefix]
    return name, int(count), per_chip


def _accelerator_shape(
    hw: Hardware, text: str, name: str, units: int, per_chip: int
) -> tuple[int, ...]:
    """The slice shape an accelerator-type name stands for: the catalog's shape with its
    number of chips (the first listed, the most cube-like, where there are two: v4's
    1,024 chips are 8x8x16, Google Cloud's default for v4-2048)."""
    if name != hw.name:
        raise PlanError(
            "invalid_topology",
            f"topology {text!r} is a {name} accelerator type but the hardware is "
            f"{hw.name!r}; drop the hardware or name one of its slices",
        )
    chips, rest = divmod(units, per_chip)
    shapes = [shape for shape in hw.topologies
              if math.prod(int(d) for d in shape.split("x")) == chips]  # fmt: skip
    if rest or not shapes:
        prefix = text.rpartition("-")[0]
        sizes = sorted({math.prod(int(d) for d in t.split("x")) * per_chip for t in hw.topologies})
        raise PlanError(
            "invalid_topology",
            f"topology {text!r} is no {hw.name} slice: its accelerator types are "
            f"{prefix}-N for N in {sizes}",
        )
    return tuple(int(d) for d in shapes[0].split("x"))


def has_wraparound(hardware: Hardware | str, shape: tuple[int, ...], dim: int) -> bool:
    """Whether physical dimension ``dim`` of a slice of ``shape`` is a ring (torus).

    v4 / v5p: every dimension wraps once the slice is made of full 4x4x4 cubes (all
    dimensions multiples of 4); smaller slices are open meshes. v5e / v6e: only a
    dimension of the full pod's 16 wraps. Source: scaling-book, 'How to Think About
    TPUs' (https://jax-ml.github.io/scaling-book/tpus/), and Google Cloud, TPU v4
    ("3D torus on slices ... where each dimension is a multiple of 4").
    """
    hw = get_hardware(hardware)
    if hw.kind != "tpu":
        return False
    if hw.torus_dims == 3:
        return all(s % 4 == 0 for s in shape)
    return shape[dim] == 16
