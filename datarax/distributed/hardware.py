"""Hardware catalog: chips, their memory, peak FLOP/s and networks, each figure with a source.

Plain data and arithmetic: nothing here touches a device. The planner (``topology``), the
step-time model (``cost``) and the recommender (``recommend``) read figures from here.

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
what ``tests/datarax/distributed/test_cost.py`` reproduces, so where Google's pages and the book
differ for a link bandwidth, the book's figure is taken and the difference is recorded.

Example:
  >>> hw = get_hardware("tpu-v5p")
  >>> hw.peak_bf16_flops, hw.fast_link_bytes_per_s
  (459000000000000.0, 90000000000.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from datarax.distributed.planning import PlanError

__all__ = [
    "HARDWARE",
    "LINK_CLASSES",
    "AxisLink",
    "Hardware",
    "get_hardware",
    "has_wraparound",
    "topology_shape",
]

LINK_CLASSES: tuple[str, ...] = ("ici", "nvlink", "dcn", "infiniband", "host")
"""Network classes, fastest first; an axis's ``link`` is the slowest class it crosses."""

GIB = 2**30

_BOOK = "https://jax-ml.github.io/scaling-book/"
_BOOK_TPU = "scaling-book, 'How to Think About TPUs' (https://jax-ml.github.io/scaling-book/tpus/)"
_BOOK_GPU = "scaling-book, 'How to Think About GPUs' (https://jax-ml.github.io/scaling-book/gpus/)"
_JAX_TPU_INFO = (
    "JAX's TPU hardware table, jax/_src/tpu_info.py (https://github.com/jax-ml/jax/blob/"
    "main/jax/_src/tpu_info.py; jax 0.12, exposed as jax.experimental.pallas.tpu.TpuInfo"
    ".vmem_capacity_bytes)"
)
_BOOK_COLL = (
    "scaling-book, 'Sharded Matrices and How to Multiply Them' "
    "(https://jax-ml.github.io/scaling-book/sharding/): ~1 us per ICI hop"
)


@dataclass(frozen=True)
class Hardware:
    """One accelerator type and the networks around it.

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
      fast_link: link class of the fast network: ``"ici"``, ``"nvlink"`` or ``"host"``.
      slow_link: link class of the slow network: ``"dcn"``, ``"infiniband"`` or ``"host"``.
      fast_link_latency_s: per-hop latency of the fast network (the alpha of alpha-beta).
      slow_link_latency_s: per-step latency of the slow network.
      max_slices: most slices (TPU) or hosts' domains a job may span, 0 when unbounded.
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
    """

    name: str
    kind: str
    device_kind: str
    hbm_bytes: int
    peak_bf16_flops: float
    devices_per_host: int
    fast_domain_devices: int
    fast_link_bytes_per_s: float
    slow_link_bytes_per_s: float
    topologies: tuple[str, ...]
    sources: Mapping[str, str]
    hbm_bytes_per_s: float = 0.0
    fast_links_per_device: int = 1
    cores_per_chip: int = 1
    fast_link: str = "ici"
    slow_link: str = "dcn"
    fast_link_latency_s: float = 1e-6
    slow_link_latency_s: float = 1e-5
    max_slices: int = 0
    vmem_bytes: int | None = None
    usable_hbm_bytes: int | None = None
    update_layout_copies: bool = False
    peak_fp32_flops: float = 0.0
    host_memory_bytes: int | None = None
    host_link_bytes_per_s: float = 0.0
    notes: str = ""
    torus_dims: int = field(default=0)

    def __post_init__(self) -> None:
        if self.kind not in ("tpu", "gpu", "cpu"):
            raise ValueError(f"Hardware.kind must be tpu, gpu or cpu, got {self.kind!r}")
        for link in (self.fast_link, self.slow_link):
            if link not in LINK_CLASSES:
                raise ValueError(f"link class {link!r} is not one of {LINK_CLASSES}")
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

    def to_json(self) -> dict[str, Any]:
        """The catalog entry as ``GET /v1/hardware/{name}`` answers it (DESIGN v1.1)."""
        return {
            "name": self.name,
            "kind": self.kind,
            "device_kind": self.device_kind,
            "hbm_bytes": self.hbm_bytes,
            "peak_bf16_flops": self.peak_bf16_flops,
            "devices_per_host": self.devices_per_host,
            "fast_domain_devices": self.fast_domain_devices,
            "fast_link_bytes_per_s": self.fast_link_bytes_per_s,
            "slow_link_bytes_per_s": self.slow_link_bytes_per_s,
            "topologies": list(self.topologies),
            "sources": dict(self.sources),
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "fast_links_per_device": self.fast_links_per_device,
            "cores_per_chip": self.cores_per_chip,
            "fast_link": self.fast_link,
            "slow_link": self.slow_link,
            "fast_link_latency_s": self.fast_link_latency_s,
            "slow_link_latency_s": self.slow_link_latency_s,
            "torus_dims": self.torus_dims,
            "vmem_bytes": self.vmem_bytes,
            "usable_hbm_bytes": self.usable_hbm_bytes,
            "update_layout_copies": self.update_layout_copies,
            "peak_fp32_flops": self.peak_fp32_flops,
            "host_memory_bytes": self.host_memory_bytes,
            "host_link_bytes_per_s": self.host_link_bytes_per_s,
            "notes": self.notes,
        }


@dataclass(frozen=True)
class AxisLink:
    """How one mesh axis is networked (one entry of a plan's ``axes_detail``).

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
    """

    name: str
    size: int
    ici: int
    dcn: int
    link: str
    bytes_per_s: float
    ici_bytes_per_s: float | None = None

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

    def to_json(self) -> dict[str, Any]:
        """DESIGN's ``axes_detail`` entry."""
        return {
            "name": self.name,
            "size": self.size,
            "ici": self.ici,
            "dcn": self.dcn,
            "link": self.link,
            "bytes_per_s": self.bytes_per_s,
        }


# ------------------------------------------------------------------------------ catalog

_V4_SHAPES = (
    "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x4x12", "4x8x8", "8x8x8",
    "8x8x12", "8x8x16", "4x16x16", "8x16x16", "12x12x12", "16x16x16",
)  # fmt: skip
_V5P_SHAPES = (
    "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8",
    "8x8x16", "8x16x16", "16x16x16", "16x16x24",
)  # fmt: skip
_2D_SHAPES = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

_TPU_V4 = Hardware(
    name="tpu-v4",
    kind="tpu",
    device_kind="TPU v4",
    hbm_bytes=32 * GIB,
    usable_hbm_bytes=int(30.75 * GIB),
    peak_bf16_flops=2.75e14,
    hbm_bytes_per_s=1.2e12,
    devices_per_host=4,
    fast_domain_devices=4096,
    fast_link_bytes_per_s=4.5e10,
    fast_links_per_device=6,
    slow_link_bytes_per_s=2.5e10,
    topologies=_V4_SHAPES,
    cores_per_chip=2,
    torus_dims=3,
    vmem_bytes=16 * 2**20,
    peak_fp32_flops=2.75e14 / 6,
    host_memory_bytes=407 * 10**9,
    host_link_bytes_per_s=3.2e10,
    sources={
        "peak_fp32_flops": "XLA runs float32 matmuls at precision HIGHEST as 6 bf16 MXU passes "
        "(jax.lax.Precision docs): a sixth of the bf16 peak",
        "host_memory_bytes": "Google Cloud, TPU v4: a 4-chip TPU VM has 407 GB of memory",
        "host_link_bytes_per_s": "assumption: PCIe Gen4 x16 per chip, 32 GB/s one way (Google "
        "publishes no per-chip host-link figure)",
        "usable_hbm_bytes": "measured here: libtpu 0.0.50.1's CompileTimeHbmOom error, "
        "'exceeds available HBM (30.75G)' (tests/datarax/distributed/test_compile_step.py)",
        "vmem_bytes": f"{_JAX_TPU_INFO}: TPU_V4 16 MiB per core",
        "peak_bf16_flops": "Google Cloud, TPU v4 (https://cloud.google.com/tpu/docs/v4): "
        "275 TFLOPs bf16 per chip",
        "hbm_bytes": "Google Cloud, TPU v4: 32 GiB HBM2, 1200 GBps per chip",
        "hbm_bytes_per_s": "Google Cloud, TPU v4: 1200 GBps",
        "devices_per_host": "Google Cloud, TPU v4: 4 chips per host (2x2x1 per VM)",
        "fast_domain_devices": "Google Cloud, TPU v4: pod of 4096 chips (16x16x16)",
        "fast_link_bytes_per_s": f"{_BOOK_TPU}: ICI 4.5e10 B/s one way per link on v4",
        "fast_links_per_device": "Google Cloud, TPU v4: 3-D torus, 6 neighbours per chip",
        "slow_link_bytes_per_s": f"{_BOOK_TPU}: DCN ~2.5e10 B/s per host (taken as for "
        "v5p; Google publishes no v4 per-host NIC figure)",
        "topologies": "Google Cloud, TPU v4: supported 3-D slice shapes",
        "fast_link_latency_s": _BOOK_COLL,
        "slow_link_latency_s": "assumption: 10 us per DCN step (no public figure)",
        "cores_per_chip": "Google Cloud, TPU v4: two TensorCores per chip (megacore)",
    },
)

_TPU_V5E = Hardware(
    name="tpu-v5e",
    kind="tpu",
    device_kind="TPU v5 lite",
    hbm_bytes=16 * GIB,
    usable_hbm_bytes=int(15.75 * GIB),
    peak_bf16_flops=1.97e14,
    hbm_bytes_per_s=8.1e11,
    devices_per_host=4,
    fast_domain_devices=256,
    fast_link_bytes_per_s=4.5e10,
    fast_links_per_device=4,
    slow_link_bytes_per_s=2.5e10,
    topologies=_2D_SHAPES,
    torus_dims=2,
    vmem_bytes=128 * 2**20,
    peak_fp32_flops=1.97e14 / 6,
    host_memory_bytes=256 * GIB,
    host_link_bytes_per_s=3.2e10,
    sources={
        "peak_fp32_flops": "a sixth of the bf16 peak (HIGHEST = 6 bf16 passes, jax.lax.Precision)",
        "host_memory_bytes": "Google Cloud, TPU v5e (https://cloud.google.com/tpu/docs/v6e "
        "comparison table): DRAM per host 512 GiB for 8 chips; the catalog's 4-chip VM gets "
        "half",
        "host_link_bytes_per_s": "assumption: PCIe Gen4 x16 per chip, 32 GB/s one way (Google "
        "publishes no per-chip host-link figure)",
        "usable_hbm_bytes": "measured here: libtpu 0.0.50.1's CompileTimeHbmOom error, "
        "'exceeds available HBM (15.75G)' (tests/datarax/distributed/test_compile_step.py)",
        "vmem_bytes": f"{_JAX_TPU_INFO}: TPU_V5E 128 MiB per core; "
        f"{_BOOK_TPU}: '128 MiB on TPU v5e'",
        "peak_bf16_flops": "Google Cloud, TPU v5e (https://cloud.google.com/tpu/docs/v5e): "
        "197 TFLOPs bf16 per chip",
        "hbm_bytes": "Google Cloud, TPU v5e: 16 GB HBM2 (XLA reports 15.75 GiB usable)",
        "hbm_bytes_per_s": "Google Cloud, TPU v5e: 819 GBps; scaling-book rounds to 8.1e11",
        "devices_per_host": "Google Cloud, TPU v5e: multi-host slices run on 4-chip VMs "
        "(ct5lp-hightpu-4t, 2x2 chips); libtpu's own topology (get_topology_desc('v5e:16x16')) "
        "puts 2x2 chips on each process, which this catalog follows (the single-host "
        "v5litepod-8 has 8)",
        "fast_domain_devices": "Google Cloud, TPU v5e: pod of 256 chips (16x16)",
        "fast_link_bytes_per_s": f"{_BOOK_TPU}: ICI 4.5e10 B/s one way per link (Google "
        "Cloud gives 1600 Gbps per chip = 5e10 B/s per link one way over 4 links; the "
        "book's figure is taken)",
        "fast_links_per_device": "Google Cloud, TPU v5e: 2-D torus, 4 ICI ports per chip",
        "slow_link_bytes_per_s": "Google Cloud, TPU v6e page (https://cloud.google.com/tpu/"
        "docs/v6e): v5e per-host NIC 2 x 100 Gbps = 2.5e10 B/s",
        "topologies": "Google Cloud, TPU v5e: supported 2-D slice shapes",
        "fast_link_latency_s": _BOOK_COLL,
        "slow_link_latency_s": "assumption: 10 us per DCN step (no public figure)",
    },
)

_TPU_V5P = Hardware(
    name="tpu-v5p",
    kind="tpu",
    device_kind="TPU v5",
    hbm_bytes=95 * GIB,
    usable_hbm_bytes=int(95.73 * GIB),
    peak_bf16_flops=4.59e14,
    hbm_bytes_per_s=2.765e12,
    devices_per_host=4,
    fast_domain_devices=6144,
    fast_link_bytes_per_s=9e10,
    fast_links_per_device=6,
    slow_link_bytes_per_s=2.5e10,
    topologies=_V5P_SHAPES,
    cores_per_chip=2,
    torus_dims=3,
    vmem_bytes=64 * 2**20,
    peak_fp32_flops=4.59e14 / 6,
    host_memory_bytes=448 * 10**9,
    host_link_bytes_per_s=3.2e10,
    sources={
        "peak_fp32_flops": "a sixth of the bf16 peak (HIGHEST = 6 bf16 passes, jax.lax.Precision)",
        "host_memory_bytes": "Google Cloud, TPU v5p: ct5p-hightpu-4t VM (4 chips), 448 GB",
        "host_link_bytes_per_s": "assumption: PCIe Gen4 x16 per chip, 32 GB/s one way (Google "
        "publishes no per-chip host-link figure)",
        "usable_hbm_bytes": "measured here: libtpu 0.0.50.1's CompileTimeHbmOom error, "
        "'exceeds available HBM (95.73G)' (tests/datarax/distributed/test_compile_step.py); "
        "above the public 95 GB taken for hbm_bytes",
        "vmem_bytes": f"{_JAX_TPU_INFO}: TPU_V5P 64 MiB per core (each of the "
        "megacore's two TensorCores has its own)",
        "peak_bf16_flops": "Google Cloud, TPU v5p (https://cloud.google.com/tpu/docs/v5p): "
        "459 TFLOPs bf16 per chip",
        "hbm_bytes": "Google Cloud, TPU v5p: 95 GiB HBM per chip (the book rounds to 96 GB)",
        "hbm_bytes_per_s": "Google Cloud, TPU v5p: 2765 GBps",
        "devices_per_host": "Google Cloud, TPU v5p: 4-chip VM (2x2x1 per host)",
        "fast_domain_devices": "Google Cloud, TPU v5p: largest single slice 6144 chips "
        "(16x16x24); the book's 16x20x28 (8960) is the whole pod, not one job's slice",
        "fast_link_bytes_per_s": f"{_BOOK_TPU}: ICI 9e10 B/s one way per link (Google Cloud "
        "gives 1200 GBps bidirectional per chip = 1e11 B/s per link one way over 6 links; "
        "the book's figure is taken, its rules of thumb use it)",
        "fast_links_per_device": "Google Cloud, TPU v5p: 3-D torus, 6 neighbours per chip",
        "slow_link_bytes_per_s": "Google Cloud, TPU v5p: DCN 50 Gbps per chip x 4 chips per "
        "host = 2.5e10 B/s per host (the book's figure too)",
        "topologies": "Google Cloud, TPU v5p: common single-slice shapes",
        "fast_link_latency_s": _BOOK_COLL,
        "slow_link_latency_s": "assumption: 10 us per DCN step (no public figure)",
        "cores_per_chip": "Google Cloud, TPU v5p: two TensorCores per chip (megacore)",
    },
)

_TPU_V6E = Hardware(
    name="tpu-v6e",
    kind="tpu",
    device_kind="TPU v6 lite",
    hbm_bytes=32 * GIB,
    usable_hbm_bytes=int(31.24 * GIB),
    peak_bf16_flops=9.18e14,
    hbm_bytes_per_s=1.64e12,
    devices_per_host=4,
    fast_domain_devices=256,
    fast_link_bytes_per_s=5.6e10,
    fast_links_per_device=4,
    slow_link_bytes_per_s=1e11,
    topologies=_2D_SHAPES,
    torus_dims=2,
    vmem_bytes=128 * 2**20,
    update_layout_copies=True,
    peak_fp32_flops=9.18e14 / 6,
    host_memory_bytes=768 * GIB,
    host_link_bytes_per_s=3.2e10,
    sources={
        "peak_fp32_flops": "a sixth of the bf16 peak (HIGHEST = 6 bf16 passes, jax.lax.Precision)",
        "host_memory_bytes": "Google Cloud, TPU v6e (https://cloud.google.com/tpu/docs/v6e): DRAM "
        "per host 1536 GiB for 8 chips; the catalog's 4-chip VM (ct6e-standard-4t) gets half",
        "host_link_bytes_per_s": "assumption: PCIe Gen4 x16 per chip, 32 GB/s one way (Google "
        "publishes no per-chip host-link figure)",
        "usable_hbm_bytes": "measured here: libtpu 0.0.50.1's CompileTimeHbmOom error, "
        "'exceeds available HBM (31.24G)' (tests/datarax/distributed/test_compile_step.py)",
        "vmem_bytes": f"{_JAX_TPU_INFO}: TPU_V6E 128 MiB per core",
        "update_layout_copies": "measured here: XLA's buffer assignment of compiled steps "
        "(libtpu 0.0.50.1, jax 0.12.0.1; benchmarks/compile_checks.py)",
        "peak_bf16_flops": "Google Cloud, TPU v6e (https://cloud.google.com/tpu/docs/v6e): "
        "918 TFLOPs bf16 per chip",
        "hbm_bytes": "Google Cloud, TPU v6e: 32 GB HBM per chip",
        "hbm_bytes_per_s": "Google Cloud, TPU v6e: 1640 GBps",
        "devices_per_host": "Google Cloud, TPU v6e: multi-host slices run on 4-chip VMs "
        "(ct6e-standard-4t, 2x2 chips), as libtpu's topology places them (the single-host "
        "v6e-8 has 8)",
        "fast_domain_devices": "Google Cloud, TPU v6e: pod of 256 chips (16x16)",
        "fast_link_bytes_per_s": "Google Cloud, TPU v6e (https://cloud.google.com/tpu/docs/v6e):"
        " ICI 3584 Gbps per chip bidirectional = 5.6e10 B/s per link one way over 4 links "
        "(the scaling-book's 9e10 was taken before; the published v6e runs of "
        "benchmarks/calibration_runs.py are predicted within 14% with Google's figure and "
        "up to 26% too fast with the book's: BENCHMARKS.md)",
        "fast_links_per_device": "Google Cloud, TPU v6e: 4 ICI ports per chip",
        "slow_link_bytes_per_s": "Google Cloud, TPU v6e: per-host NIC 4 x 200 Gbps = 1e11 B/s",
        "topologies": "Google Cloud, TPU v6e: supported 2-D slice shapes",
        "fast_link_latency_s": _BOOK_COLL,
        "slow_link_latency_s": "assumption: 10 us per DCN step (no public figure)",
    },
)

_NVLINK_LATENCY = "assumption: 1 us per NVLink ring step (no datasheet figure)"
_IB_LATENCY = "assumption: 10 us per InfiniBand ring step (no datasheet figure)"

_H100 = Hardware(
    name="h100-sxm",
    kind="gpu",
    device_kind="NVIDIA H100 80GB HBM3",
    hbm_bytes=80 * GIB,
    peak_bf16_flops=9.895e14,
    hbm_bytes_per_s=3.35e12,
    devices_per_host=8,
    fast_domain_devices=8,
    fast_link_bytes_per_s=4.5e11,
    slow_link_bytes_per_s=4e11,
    topologies=(),
    fast_link="nvlink",
    slow_link="infiniband",
    peak_fp32_flops=6.7e13,
    host_memory_bytes=2 * 10**12,
    host_link_bytes_per_s=6.4e10,
    sources={
        "peak_fp32_flops": "NVIDIA H100 datasheet: FP32 67 TFLOPS (SXM)",
        "host_memory_bytes": "NVIDIA DGX H100 datasheet: 2 TB system memory",
        "host_link_bytes_per_s": "NVIDIA datasheet: PCIe Gen5 x16, 128 GB/s bidirectional = "
        "6.4e10 B/s one way",
        "peak_bf16_flops": "NVIDIA H100 Tensor Core GPU datasheet (https://www.nvidia.com/"
        "en-us/data-center/h100/): BF16 1,979 TFLOPS with sparsity, dense = half, "
        "989.5 TFLOPS (the scaling-book rounds to 9.9e14)",
        "hbm_bytes": "NVIDIA H100 datasheet: 80 GB HBM3 (SXM)",
        "hbm_bytes_per_s": "NVIDIA H100 datasheet: 3.35 TB/s (SXM)",
        "devices_per_host": "NVIDIA DGX H100 datasheet: 8 GPUs per node",
        "fast_domain_devices": "NVIDIA DGX H100: 8 GPUs on NVSwitch per node",
        "fast_link_bytes_per_s": f"NVIDIA H100 datasheet: NVLink 900 GB/s bidirectional = "
        f"4.5e11 B/s egress per GPU; {_BOOK_GPU}",
        "slow_link_bytes_per_s": f"NVIDIA DGX H100 datasheet: 8 x 400 Gb/s ConnectX-7 = "
        f"4e11 B/s per node; {_BOOK_GPU}",
        "fast_link_latency_s": _NVLINK_LATENCY,
        "slow_link_latency_s": _IB_LATENCY,
    },
)

_H200 = Hardware(
    name="h200-sxm",
    kind="gpu",
    device_kind="NVIDIA H200",
    hbm_bytes=141 * GIB,
    peak_bf16_flops=9.895e14,
    hbm_bytes_per_s=4.8e12,
    devices_per_host=8,
    fast_domain_devices=8,
    fast_link_bytes_per_s=4.5e11,
    slow_link_bytes_per_s=4e11,
    topologies=(),
    fast_link="nvlink",
    slow_link="infiniband",
    peak_fp32_flops=6.7e13,
    host_memory_bytes=2 * 10**12,
    host_link_bytes_per_s=6.4e10,
    sources={
        "peak_fp32_flops": "NVIDIA H200 datasheet: FP32 67 TFLOPS (SXM)",
        "host_memory_bytes": "NVIDIA DGX H200 datasheet: 2 TB system memory",
        "host_link_bytes_per_s": "NVIDIA datasheet: PCIe Gen5 x16, 128 GB/s bidirectional = "
        "6.4e10 B/s one way",
        "peak_bf16_flops": "NVIDIA H200 datasheet (https://www.nvidia.com/en-us/data-center/"
        "h200/): BF16 1,979 TFLOPS with sparsity, dense = 989.5 TFLOPS",
        "hbm_bytes": "NVIDIA H200 datasheet: 141 GB HBM3e",
        "hbm_bytes_per_s": "NVIDIA H200 datasheet: 4.8 TB/s",
        "devices_per_host": "NVIDIA HGX H200: 8 GPUs per node",
        "fast_domain_devices": "NVIDIA HGX H200: 8 GPUs on NVSwitch per node",
        "fast_link_bytes_per_s": "NVIDIA H200 datasheet: NVLink 900 GB/s bidirectional = "
        "4.5e11 B/s egress per GPU",
        "slow_link_bytes_per_s": f"8 x 400 Gb/s NICs per HGX node = 4e11 B/s, as for DGX H100; "
        f"{_BOOK_GPU}",
        "fast_link_latency_s": _NVLINK_LATENCY,
        "slow_link_latency_s": _IB_LATENCY,
    },
)

_B200 = Hardware(
    name="b200",
    kind="gpu",
    device_kind="NVIDIA B200",
    hbm_bytes=180 * GIB,
    peak_bf16_flops=2.25e15,
    hbm_bytes_per_s=8e12,
    devices_per_host=8,
    fast_domain_devices=8,
    fast_link_bytes_per_s=9e11,
    slow_link_bytes_per_s=4e11,
    topologies=(),
    fast_link="nvlink",
    slow_link="infiniband",
    peak_fp32_flops=7.5e13,
    host_memory_bytes=2 * 10**12,
    host_link_bytes_per_s=6.4e10,
    sources={
        "peak_fp32_flops": "NVIDIA HGX B200 datasheet: FP32 600 TFLOPS per 8 GPUs = 75",
        "host_memory_bytes": "NVIDIA DGX B200 datasheet: 2 TB system memory (up to 4 TB)",
        "host_link_bytes_per_s": "NVIDIA datasheet: PCIe Gen5 x16, 128 GB/s bidirectional = "
        "6.4e10 B/s one way",
        "peak_bf16_flops": "NVIDIA HGX B200 datasheet (https://www.nvidia.com/en-us/data-"
        "center/hgx/): BF16 36 PFLOPS with sparsity per 8 GPUs -> 2.25e15 dense per GPU",
        "hbm_bytes": "NVIDIA DGX B200 datasheet: 1,440 GB for 8 GPUs = 180 GB per GPU "
        "(the 2024 announcement said 192 GB; the shipping figure is taken)",
        "hbm_bytes_per_s": "NVIDIA DGX B200 datasheet: 64 TB/s for 8 GPUs = 8 TB/s per GPU",
        "devices_per_host": "NVIDIA DGX B200: 8 GPUs per node",
        "fast_domain_devices": "NVIDIA DGX B200: 8 GPUs on NVSwitch per node",
        "fast_link_bytes_per_s": f"NVIDIA DGX B200: NVLink 5 1.8 TB/s bidirectional per GPU "
        f"= 9e11 B/s egress; {_BOOK_GPU}",
        "slow_link_bytes_per_s": "NVIDIA DGX B200 datasheet: 8 x 400 Gb/s ConnectX-7 = 4e11 B/s",
        "fast_link_latency_s": _NVLINK_LATENCY,
        "slow_link_latency_s": _IB_LATENCY,
    },
)

_GB200 = Hardware(
    name="gb200-nvl72",
    kind="gpu",
    device_kind="NVIDIA GB200",
    hbm_bytes=186 * GIB,
    peak_bf16_flops=2.5e15,
    hbm_bytes_per_s=8e12,
    devices_per_host=4,
    fast_domain_devices=72,
    fast_link_bytes_per_s=9e11,
    slow_link_bytes_per_s=2e11,
    topologies=(),
    fast_link="nvlink",
    slow_link="infiniband",
    peak_fp32_flops=8e13,
    host_memory_bytes=960 * 10**9,
    host_link_bytes_per_s=4.5e11,
    sources={
        "peak_fp32_flops": "NVIDIA GB200 NVL72 datasheet: FP32 5,760 TFLOPS per 72 GPUs = 80",
        "host_memory_bytes": "NVIDIA GB200 NVL72 datasheet: 17 TB LPDDR5X per 36 Grace CPUs, 480 "
        "GB per Grace, 2 per 4-GPU tray",
        "host_link_bytes_per_s": "NVIDIA GB200: NVLink-C2C 900 GB/s bidirectional per Grace = "
        "4.5e11 B/s one way",
        "peak_bf16_flops": "NVIDIA GB200 NVL72 page (https://www.nvidia.com/en-us/data-"
        "center/gb200-nvl72/): FP16/BF16 360 PFLOPS with sparsity per 72 GPUs -> "
        "2.5e15 dense per GPU",
        "hbm_bytes": "NVIDIA GB200 NVL72: up to 13.4 TB HBM3e per 72 GPUs (186 GB per GPU)",
        "hbm_bytes_per_s": "NVIDIA GB200 NVL72: 576 TB/s per 72 GPUs = 8 TB/s per GPU",
        "devices_per_host": "NVIDIA GB200 NVL72: 18 compute trays of 2 superchips = 4 GPUs",
        "fast_domain_devices": f"NVIDIA GB200 NVL72: 72 GPUs in one NVLink domain; {_BOOK_GPU}",
        "fast_link_bytes_per_s": f"NVIDIA GB200 NVL72: NVLink 5 1.8 TB/s per GPU "
        f"bidirectional = 9e11 B/s egress; {_BOOK_GPU}",
        "slow_link_bytes_per_s": "NVIDIA GB200 NVL72 reference: one 400 Gb/s ConnectX-7 per "
        "GPU, 4 per tray = 2e11 B/s per tray",
        "fast_link_latency_s": _NVLINK_LATENCY,
        "slow_link_latency_s": _IB_LATENCY,
    },
)

_CPU = Hardware(
    name="cpu",
    kind="cpu",
    device_kind="cpu",
    hbm_bytes=16 * GIB,
    peak_bf16_flops=1e11,
    hbm_bytes_per_s=2e10,
    devices_per_host=8,
    fast_domain_devices=8,
    fast_link_bytes_per_s=1e10,
    slow_link_bytes_per_s=1e9,
    topologies=(),
    fast_link="host",
    slow_link="host",
    fast_link_latency_s=1e-6,
    slow_link_latency_s=1e-5,
    notes="nominal figures for simulated host devices: memory estimates are validated "
    "against XLA on them, step times are not meaningful",
    sources={
        "peak_bf16_flops": "nominal, not measured: simulated CPU devices have no published "
        "peak; CPU step times rank nothing",
        "hbm_bytes": "nominal: host memory is shared by all simulated devices",
        "hbm_bytes_per_s": "nominal",
        "devices_per_host": "tests/conftest.py: 8 simulated devices "
        "(--xla_force_host_platform_device_count=8)",
        "fast_domain_devices": "one host",
        "fast_link_bytes_per_s": "nominal: collectives between simulated devices are memory copies",
        "slow_link_bytes_per_s": "nominal",
        "fast_link_latency_s": "nominal",
        "slow_link_latency_s": "nominal",
    },
)

HARDWARE: dict[str, Hardware] = {
    hw.name: hw for hw in (_TPU_V4, _TPU_V5E, _TPU_V5P, _TPU_V6E, _H100, _H200, _B200, _GB200, _CPU)
}
"""Every catalog entry by name, in the order ``GET /v1/hardware`` lists them."""


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
            f"hardware {name!r} is not in the catalog; use one of {sorted(HARDWARE)}",
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
    if ":" in text:
        prefix, text = text.split(":", 1)
        if f"tpu-{prefix}" != hw.name:
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
            f"topology {topology!r} is not a {hw.name} slice shape; use one of "
            f"{list(hw.topologies)}",
        )
    return shape


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
