"""What one catalog entry holds: :class:`Hardware` (an accelerator type and the networks
around it) and :class:`AxisLink` (how one mesh axis of a plan rides those networks).

Each is its answer (:class:`~datarax.answers.catalog.HardwareEntry`, a plan's
:class:`~datarax.answers.estimates.AxisDetail`) with the library's checks, its derived
figures and the fields the answer leaves out.

The meaning of every figure (per device, one direction, binary HBM sizes) is written in
:mod:`datarax.hardware.chips`; the entries themselves live in
:mod:`datarax.hardware.catalog`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from datarax.answers.base import internal
from datarax.answers.catalog import HardwareEntry
from datarax.answers.estimates import AxisDetail

__all__ = ["GIB", "LINK_CLASSES", "AxisLink", "Hardware"]

LINK_CLASSES: tuple[str, ...] = ("ici", "nvlink", "dcn", "infiniband", "host")
"""Network classes, fastest first; an axis's ``link`` is the slowest class it crosses."""

GIB = 2**30


@dataclass(frozen=True, eq=False)
class Hardware(HardwareEntry):
    """One accelerator type and the networks around it: the catalog entry
    (:class:`~datarax.answers.catalog.HardwareEntry`, whose ``to_json`` is the
    ``GET /v1/hardware/{name}`` answer) with its checks and derived figures.

    Attributes:
      name: catalog name, e.g. ``"tpu-v5p"``.
      kind: ``"tpu"``, ``"gpu"`` or ``"cpu"``.
      device_kind: ``jax.Device.device_kind`` as JAX reports it, where known.
      hbm_bytes: HBM per device, bytes.
      peak_bf16_flops: dense bf16 FLOP/s per device.
      devices_per_host: devices attached to one host (TPU VM / GPU node / NVL72 tray).
      fast_domain_devices: largest ICI slice (TPU) or NVLink domain (GPU).
      fast_link_bytes_per_s: one direction of one fast link (see module docstring).
      slow_link_bytes_per_s: one direction of one host's DCN / InfiniBand.
      topologies: TPU slice shapes accepted (``"16x16"``); empty for GPU and CPU.
      sources: figure name -> public source (and which one was taken where they differ).
      hbm_bytes_per_s: HBM bandwidth per device.
      fast_links_per_device: ICI links per chip (TPU); 1 for the NVLink egress of a GPU.
      cores_per_chip: TensorCores JAX sees as one device (v4/v5p megacore: 2 cores, one
        device); 1 elsewhere.
      devices_per_chip: JAX devices one chip exposes (TPU7x: 2, one per TensorCore, JAX's
        ``core_on_chip`` 0 and 1); 1 elsewhere. Every per-device figure (HBM, peak FLOP/s,
        VMEM, ICI share) is then the chip's divided by it, and ``devices_per_host`` and
        ``fast_domain_devices`` count devices, not chips.
      fast_link: link class of the fast network: ``"ici"``, ``"nvlink"`` or ``"host"``.
      slow_link: link class of the slow network: ``"dcn"``, ``"infiniband"`` or ``"host"``.
      fast_link_latency_s: per-hop latency of the fast network (the alpha of alpha-beta).
      slow_link_latency_s: per-step latency of the slow network.
      torus_dims: TPU: dimensions of the chips' physical coordinates (2 or 3), which
        says where a slice's ICI wraps round (:func:`~datarax.hardware.chips.has_wraparound`);
        0 elsewhere.
      vmem_bytes: on-chip vector memory (VMEM) of one TensorCore (TPU), bytes, where XLA's
        memory-space assignment may place a step's buffers instead of HBM; ``None``
        where the device has no such compiler-managed memory (GPU, CPU).
      usable_hbm_bytes: the HBM XLA lets one program allocate on a device (TPU: the
        "available HBM" of its compile-time out-of-memory error, measured with libtpu
        0.0.50.1), where the estimate's ``fits`` is judged; ``None``: ``hbm_bytes``.
      update_layout_copies: XLA runs the optimizer update of an MLP's first kernel in the
        transposed layout and copies the kernel and its optimizer moments to it (measured
        with libtpu 0.0.50.1 on v6e, never on v5e or v5p: ``cost.memory_estimate``).
      peak_fp32_flops: dense float32 matmul FLOP/s per device, where the compute dtype
        is float32 (the model's matmuls run at ``precision=HIGHEST``): GPU the datasheet's
        non-tensor FP32 figure; TPU a sixth of the bf16 peak (XLA's HIGHEST is six bf16
        MXU passes, ``jax.lax.Precision`` docs); 0: the bf16 peak.
      host_memory_bytes: DRAM of one host (of ``devices_per_host`` devices), where
        offloaded activations live; ``None``: unknown (offload is not checked).
      host_link_bytes_per_s: one direction of one device's link to host memory (PCIe /
        NVLink-C2C), which offload transfers use; 0: unknown.
      notes: one line a reader should know (e.g. nominal figures).
      max_slices: most slices (TPU) or hosts' domains a job may span, 0 when unbounded
        (internal: not in the answer).
    """

    max_slices: int = internal(0)

    def __post_init__(self) -> None:
        if self.kind not in ("tpu", "gpu", "cpu"):
            raise ValueError(f"Hardware.kind must be tpu, gpu or cpu, got {self.kind!r}")
        for link in (self.fast_link, self.slow_link):
            if link not in LINK_CLASSES:
                raise ValueError(f"link class {link!r} is not one of {LINK_CLASSES}")
        if self.devices_per_chip < 1:
            raise ValueError(f"Hardware.devices_per_chip must be >= 1, got {self.devices_per_chip}")
        object.__setattr__(self, "sources", MappingProxyType(dict(self.sources)))

    def peak_flops(self, dtype: str) -> float:
        """Dense matmul FLOP/s of one device in ``dtype`` (bf16 and fp16 run at the bf16
        peak; float32 at ``peak_fp32_flops``)."""
        if dtype == "float32" and self.peak_fp32_flops:
            return self.peak_fp32_flops
        return self.peak_bf16_flops

    @property
    def hosts_per_domain(self) -> int:
        """Hosts in one largest fast domain (at least 1)."""
        return max(1, self.fast_domain_devices // self.devices_per_host)

    @property
    def slow_link_bytes_per_s_per_device(self) -> float:
        """A device's share of its host's slow link when every device sends at once."""
        return self.slow_link_bytes_per_s / self.devices_per_host


@dataclass(frozen=True, eq=False)
class AxisLink(AxisDetail):
    """How one mesh axis is networked: a plan's ``axes_detail`` entry
    (:class:`~datarax.answers.estimates.AxisDetail`) with its checks and the bandwidth of
    its ICI part.

    Attributes:
      name: mesh axis name.
      size: ``ici * dcn``.
      ici: the axis's factor inside one slice / NVLink domain.
      dcn: the axis's factor across slices / domains.
      link: slowest network class the axis crosses, one of :data:`LINK_CLASSES`.
      bytes_per_s: bandwidth, one direction, that one device drives into a ring collective
        over this axis on that slowest network. ICI: ``fast_link_bytes_per_s`` times the
        links the axis uses (2 per torus dimension with wraparound, 1 without); NVLink:
        the GPU's egress; DCN / InfiniBand: the host's slow link divided by its devices.
      ici_bytes_per_s: the same for the axis's ICI / NVLink part when ``dcn > 1`` (used
        by hierarchical collectives); ``None`` when the axis does not cross the fast
        network or when the caller did not compute it (``cost`` then derives it).
        Internal: not in the answer.
    """

    ici_bytes_per_s: float | None = internal(None)

    def __post_init__(self) -> None:
        if self.link not in LINK_CLASSES:
            raise ValueError(
                f"AxisLink.link {self.link!r} is not one of {LINK_CLASSES}; "
                f"use the slowest network the axis crosses"
            )
        if self.size != self.ici * self.dcn:
            raise ValueError(
                f"AxisLink {self.name!r}: size {self.size} != ici {self.ici} * dcn {self.dcn}"
            )
        if not self.bytes_per_s > 0:
            raise ValueError(f"AxisLink {self.name!r}: bytes_per_s must be > 0")
