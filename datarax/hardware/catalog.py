"""The hardware catalog: every accelerator entry, each figure with its public source.

Plain data: nothing here touches a device. :data:`HARDWARE` is the one place chip
figures live; the planner, the step-time model, the recommender and the batch-size
recommendations of :mod:`datarax.distributed.device_placement` all read them from here.
What each figure means is written in :mod:`datarax.hardware.chips`.
"""

from __future__ import annotations

from dataclasses import replace

from datarax.hardware.entry import GIB, Hardware

__all__ = ["HARDWARE"]

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
        "'exceeds available HBM (30.75G)' (tests/datarax/spmd/test_compile_step.py)",
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
    hbm_bytes_per_s=8.19e11,
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
        "'exceeds available HBM (15.75G)' (tests/datarax/spmd/test_compile_step.py)",
        "vmem_bytes": f"{_JAX_TPU_INFO}: TPU_V5E 128 MiB per core; "
        f"{_BOOK_TPU}: '128 MiB on TPU v5e'",
        "peak_bf16_flops": "Google Cloud, TPU v5e (https://cloud.google.com/tpu/docs/v5e): "
        "197 TFLOPs bf16 per chip",
        "hbm_bytes": "Google Cloud, TPU v5e: 16 GB HBM2 (XLA reports 15.75 GiB usable)",
        "hbm_bytes_per_s": "Google Cloud, TPU v5e (https://cloud.google.com/tpu/docs/v5e): "
        "'HBM2 capacity and bandwidth: 16 GB, 819 GBps' (the scaling-book rounds to 8.1e11; "
        "Google's figure is taken)",
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
        "'exceeds available HBM (95.73G)' (tests/datarax/spmd/test_compile_step.py); "
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
        "'exceeds available HBM (31.24G)' (tests/datarax/spmd/test_compile_step.py)",
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

_TPU7X_PAGE = (
    "Google Cloud, TPU7x (Ironwood) (https://docs.cloud.google.com/tpu/docs/tpu7x, retrieved "
    "2026-12-05), system architecture table"
)
_LIBTPU_7X = (
    "measured here: jax 0.12.0.1, libtpu 0.0.50.1, JAX_PLATFORMS=cpu, "
    "topologies.get_topology_desc(platform='tpu', topology_name='tpu7x:<shape>')"
)
_TPU7X_SHAPES = (
    "2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8", "8x8x8", "8x8x16",
    "8x16x16", "16x16x16", "16x16x24", "16x24x24",
)  # fmt: skip

_TPU_7X = Hardware(
    name="tpu7x",
    kind="tpu",
    device_kind="TPU7x",
    hbm_bytes=96 * GIB,
    peak_bf16_flops=2.307e15 / 2,
    hbm_bytes_per_s=7.38e12 / 2,
    devices_per_host=8,
    fast_domain_devices=2 * 9216,
    fast_link_bytes_per_s=1e11 / 2,
    fast_links_per_device=6,
    slow_link_bytes_per_s=5e10,
    topologies=_TPU7X_SHAPES,
    devices_per_chip=2,
    torus_dims=3,
    vmem_bytes=64 * 2**20,
    peak_fp32_flops=2.307e15 / 2 / 6,
    host_memory_bytes=960 * 10**9,
    notes="two JAX devices per chip (one per TensorCore, core_on_chip 0 and 1): every "
    "per-device figure is half the chip's; the faster link between a chip's two cores is "
    "not priced (no public figure: an axis over the core pair gets the ICI share), and "
    "usable HBM and the host link are not known",
    sources={
        "device_kind": f"{_LIBTPU_7X}: device_kind 'TPU7x'",
        "devices_per_chip": f"{_TPU7X_PAGE}: two TensorCores per chip, each its own device "
        f"('dual-chiplet architecture'); {_LIBTPU_7X}: 2 devices per chip, core_on_chip 0 "
        "and 1, id = 2 * (x + X * (y + Y * z)) + core",
        "peak_bf16_flops": f"{_TPU7X_PAGE}: peak compute per chip (BF16) 2307 TFLOPs, half per "
        "device (FP8: 4614 TFLOPs per chip, not priced); JAX's tpu_info.py TPU_7X agrees "
        "(2.31e15 // tensor_cores_per_chip)",
        "peak_fp32_flops": "a sixth of the bf16 peak (HIGHEST = 6 bf16 passes, jax.lax.Precision)",
        "hbm_bytes": f"{_TPU7X_PAGE}: HBM capacity per chip 192 GiB (HBM3E), 96 GiB per device",
        "hbm_bytes_per_s": f"{_TPU7X_PAGE}: HBM bandwidth per chip 7380 GB/s, half per device",
        "vmem_bytes": f"{_JAX_TPU_INFO}: TPU_7X 64 MiB per core",
        "devices_per_host": f"{_TPU7X_PAGE}: 4-chip VM (tpu7x-standard-4t), 8 devices; "
        f"{_LIBTPU_7X}: process_index over 2x2x1 chip blocks, 8 devices each",
        "host_memory_bytes": f"{_TPU7X_PAGE}: RAM (GB) (4-chip VM) 960",
        "fast_domain_devices": f"{_TPU7X_PAGE}: 9,216 chips per pod = 18,432 devices (the "
        "largest single slice is not given apart from the pod; libtpu describes 16x24x24)",
        "fast_link_bytes_per_s": f"{_TPU7X_PAGE}: bidirectional ICI bandwidth per chip "
        "1200 GB/s = 600 GB/s one way over 6 links = 1e11 B/s per link, shared by the chip's "
        "2 devices: 5e10 B/s per device",
        "fast_links_per_device": "3-D torus, 6 neighbours per chip: Google's Hot Chips 2025 "
        "Ironwood talk, as reported at https://particle.news/story/google-details-ironwood-"
        "tpu-superpods-built-for-inference-at-cloud-scale ('a 3D Torus Inter-Chip "
        f"Interconnect'); {_LIBTPU_7X}: 3-D chip coordinates",
        "slow_link_bytes_per_s": f"{_TPU7X_PAGE}: DCN bandwidth per chip 100 Gb/s x 4 chips per "
        "host = 5e10 B/s per host",
        "topologies": "xpk (https://github.com/AI-Hypercomputer/xpk, src/xpk/core/"
        "system_characteristics.py, PR 834): 2x2x1, 2x2x2, 2x2x4, 2x4x4, then whole 4x4x4 "
        "cubes; the catalog lists v5p's common shapes up to the 9,216-chip pod (16x24x24), "
        f"each accepted by libtpu ({_LIBTPU_7X})",
        "torus_dims": f"{_LIBTPU_7X}: 3-D chip coordinates",
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

_ML_ENGINEERING_NET = (
    "stas00/ml-engineering, network/README.md at 0030e63f5275afee38233676690ce10478647cca "
    "(https://github.com/stas00/ml-engineering/blob/0030e63f5275afee38233676690ce10478647cca/"
    "network/README.md), its inter-node table: GPUDirect-TCPX 4 x 200 Gb/s = 100 GB/s a node"
)
_H100_A3_HIGH = replace(
    _H100,
    name="h100-a3-high",
    slow_link_bytes_per_s=1e11,
    slow_link="dcn",
    host_memory_bytes=1872 * 10**9,
    sources={
        **_H100.sources,
        "devices_per_host": "Google Cloud accelerator-optimized machines (https://cloud.google."
        "com/compute/docs/accelerator-optimized-machines): a3-highgpu-8g, 8 H100 80GB",
        "host_memory_bytes": "Google Cloud accelerator-optimized machines (https://cloud.google."
        "com/compute/docs/accelerator-optimized-machines): a3-highgpu-8g, 1,872 GB",
        "fast_domain_devices": "Google Cloud a3-highgpu-8g: 8 GPUs on NVSwitch per VM",
        "slow_link_bytes_per_s": f"{_ML_ENGINEERING_NET}: 1e11 B/s per host over Google's data-"
        "centre network (not InfiniBand); MaxText's A3 Llama 2 7B table (MaxText/configs/a3/"
        "llama_2_7b/README.md) names this machine 'A3 (h100-80gb-8)', xpk's device type for "
        "a3-highgpu-8g",
        "slow_link_latency_s": "assumption: 10 us per DCN step (no public figure)",
    },
)
"""Google Cloud's A3 High (``a3-highgpu-8g``): the H100 SXM of :data:`_H100` on a quarter of
a DGX H100's inter-node bandwidth (four 200 Gb/s NICs for GPU traffic, GPUDirect-TCPX,
against eight 400 Gb/s ConnectX-7), which is what makes MaxText's data-parallel runs on it
slower as nodes are added."""

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

_A100_DATASHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet (https://www.nvidia.com/content/dam/en-zz/Solutions/"
    "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; product page "
    "https://www.nvidia.com/en-us/data-center/a100/), A100 80GB SXM column"
)
_DGX_A100 = (
    "NVIDIA, 'Defining AI Innovation with NVIDIA DGX A100' (https://developer.nvidia.com/blog/"
    "defining-ai-innovation-with-dgx-a100/)"
)
_V100_DATASHEET = (
    "NVIDIA Tesla V100 datasheet (https://www.nvidia.com/en-us/data-center/v100/), "
    "V100 SXM2 32GB column"
)
_DGX1_V100 = (
    "NVIDIA DGX-1 with Tesla V100 System Architecture white paper (WP-08437-002): 8 V100 on "
    "NVLink in a hybrid cube-mesh, dual Xeon E5-2698 v4, 512 GB DDR4, four 100 Gb/s EDR "
    "InfiniBand NICs"
)

_A100 = Hardware(
    name="a100-sxm",
    kind="gpu",
    device_kind="NVIDIA A100-SXM4-80GB",
    hbm_bytes=80 * GIB,
    peak_bf16_flops=3.12e14,
    hbm_bytes_per_s=2.039e12,
    devices_per_host=8,
    fast_domain_devices=8,
    fast_link_bytes_per_s=3e11,
    slow_link_bytes_per_s=2e11,
    topologies=(),
    fast_link="nvlink",
    slow_link="infiniband",
    peak_fp32_flops=1.95e13,
    host_memory_bytes=2 * 10**12,
    host_link_bytes_per_s=3.2e10,
    sources={
        "peak_bf16_flops": f"{_A100_DATASHEET}: BF16 Tensor Core 312 TFLOPS dense (624 with "
        "sparsity)",
        "peak_fp32_flops": f"{_A100_DATASHEET}: FP32 19.5 TFLOPS",
        "hbm_bytes": f"{_A100_DATASHEET}: 80 GB HBM2e",
        "hbm_bytes_per_s": f"{_A100_DATASHEET}: GPU memory bandwidth 2,039 GB/s",
        "fast_link_bytes_per_s": f"{_A100_DATASHEET}: NVLink 600 GB/s bidirectional = 3e11 "
        "B/s egress per GPU",
        "host_link_bytes_per_s": f"{_A100_DATASHEET}: PCIe Gen4 64 GB/s bidirectional = "
        "3.2e10 B/s one way",
        "devices_per_host": f"{_DGX_A100}: 8 A100 GPUs per DGX A100",
        "fast_domain_devices": f"{_DGX_A100}: 8 GPUs on six NVSwitches, 600 GB/s between any two",
        "slow_link_bytes_per_s": f"{_DGX_A100}: 8 single-port ConnectX-6 200 Gb/s HDR "
        "InfiniBand for compute = 1.6 Tb/s = 2e11 B/s per node",
        "host_memory_bytes": f"{_DGX_A100}: 2 TB system memory (DGX A100 640GB; 1 TB with "
        "the 320GB GPUs)",
        "fast_link_latency_s": _NVLINK_LATENCY,
        "slow_link_latency_s": _IB_LATENCY,
    },
)

_V100 = Hardware(
    name="v100-sxm",
    kind="gpu",
    device_kind="Tesla V100-SXM2-32GB",
    hbm_bytes=32 * GIB,
    peak_bf16_flops=1.25e14,
    hbm_bytes_per_s=9e11,
    devices_per_host=8,
    fast_domain_devices=8,
    fast_link_bytes_per_s=1.5e11,
    slow_link_bytes_per_s=5e10,
    topologies=(),
    fast_link="nvlink",
    slow_link="infiniband",
    peak_fp32_flops=1.57e13,
    host_memory_bytes=512 * 10**9,
    host_link_bytes_per_s=1.6e10,
    notes="V100 has no bfloat16 Tensor Cores: peak_bf16_flops is its FP16 Tensor Core peak, "
    "which a bfloat16 model does not reach on it",
    sources={
        "peak_bf16_flops": f"{_V100_DATASHEET}: Tensor Performance (FP16) 125 TFLOPS; Volta has "
        "no BF16, the FP16 Tensor Core figure is taken",
        "peak_fp32_flops": f"{_V100_DATASHEET}: single-precision 15.7 TFLOPS",
        "hbm_bytes": f"{_V100_DATASHEET}: 32 GB HBM2",
        "hbm_bytes_per_s": f"{_V100_DATASHEET}: memory bandwidth 900 GB/s",
        "fast_link_bytes_per_s": f"{_V100_DATASHEET}: NVLink 300 GB/s bidirectional = 1.5e11 "
        "B/s egress per GPU",
        "host_link_bytes_per_s": f"{_V100_DATASHEET}: PCIe Gen3 32 GB/s bidirectional = 1.6e10 "
        "B/s one way",
        "devices_per_host": f"{_DGX1_V100}: 8 GPUs per node",
        "fast_domain_devices": f"{_DGX1_V100}: the node's 8 GPUs share one NVLink network (a "
        "cube-mesh, not a switch: not every pair is linked directly)",
        "slow_link_bytes_per_s": f"{_DGX1_V100}: 4 x 100 Gb/s = 5e10 B/s per node",
        "host_memory_bytes": f"{_DGX1_V100}: 512 GB",
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
    hw.name: hw
    for hw in (
        _TPU_V4, _TPU_V5E, _TPU_V5P, _TPU_V6E, _TPU_7X, _H100, _H100_A3_HIGH, _H200, _B200,
        _GB200, _A100, _V100, _CPU,
    )
}  # fmt: skip
"""Every catalog entry by name, in the order ``GET /v1/hardware`` lists them."""
