"""The hardware catalog (datarax.hardware.catalog): DESIGN's names and fields, a
public source for every figure, the issue's reference points, and the figures the batch-size
recommendations read."""

from __future__ import annotations

import math

import jax
import pytest

from datarax.hardware.catalog import HARDWARE
from datarax.hardware.chips import LINK_CLASSES, get_hardware, topology_shape
from datarax.hardware.entry import GIB

DESIGN_FIELDS = (
    "name", "kind", "device_kind", "hbm_bytes", "peak_bf16_flops", "devices_per_host",
    "fast_domain_devices", "fast_link_bytes_per_s", "slow_link_bytes_per_s", "topologies",
    "sources",
)  # fmt: skip


FIGURES = (
    "peak_bf16_flops", "hbm_bytes", "devices_per_host", "fast_domain_devices",
    "fast_link_bytes_per_s", "slow_link_bytes_per_s", "fast_link_latency_s",
    "slow_link_latency_s",
)  # fmt: skip


def test_catalog_names_are_designs():
    # DESIGN's names, plus the A100 and V100 that device_placement's recommendations read
    # and Google Cloud's A3 High (H100 on a TCPX network)
    assert set(HARDWARE) == {
        "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu7x", "h100-sxm", "h100-a3-high",
        "h200-sxm", "b200", "gb200-nvl72", "a100-sxm", "v100-sxm", "cpu",
    }  # fmt: skip


@pytest.mark.parametrize("name", list(HARDWARE))
def test_entry_has_designs_fields_and_a_source_per_figure(name):
    entry = get_hardware(name).to_json()
    assert set(DESIGN_FIELDS) <= set(entry)
    assert entry["name"] == name and entry["kind"] in ("tpu", "gpu", "cpu")
    for figure in FIGURES:
        source = entry["sources"].get(figure, "")
        if name == "cpu":
            assert source, figure  # nominal figures say so
        else:
            public = any(w in source for w in ("http", "scaling-book", "NVIDIA", "Google Cloud"))
            assert public or source.startswith("assumption"), (figure, source)
    assert entry["fast_link"] in LINK_CLASSES and entry["slow_link"] in LINK_CLASSES
    assert entry["hbm_bytes"] > 0 and entry["peak_bf16_flops"] > 0


@pytest.mark.parametrize("name", [n for n, h in HARDWARE.items() if h.kind == "tpu"])
def test_tpu_fast_domain_is_the_largest_topology(name):
    hw = get_hardware(name)
    largest = max(math.prod(topology_shape(hw, t)) for t in hw.topologies)
    assert hw.fast_domain_devices == largest * hw.devices_per_chip
    assert hw.fast_links_per_device == 2 * hw.torus_dims


@pytest.mark.parametrize(
    ("name", "figures"),
    [
        ("tpu-v5p", {"peak_bf16_flops": 4.59e14, "hbm_bytes": 95 * GIB,
                     "fast_link_bytes_per_s": 9e10, "slow_link_bytes_per_s": 2.5e10}),
        ("tpu-v5e", {"peak_bf16_flops": 1.97e14, "hbm_bytes": 16 * GIB,
                     "fast_link_bytes_per_s": 4.5e10, "fast_domain_devices": 256}),
        ("h100-sxm", {"hbm_bytes": 80 * GIB, "fast_link_bytes_per_s": 4.5e11,
                      "slow_link_bytes_per_s": 4e11, "fast_domain_devices": 8}),
        ("h200-sxm", {"hbm_bytes": 141 * GIB, "fast_link_bytes_per_s": 4.5e11}),
        ("gb200-nvl72", {"fast_domain_devices": 72, "fast_link_bytes_per_s": 9e11}),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)  # fmt: skip
def test_issue_reference_points(name, figures):
    hw = get_hardware(name)
    for figure, value in figures.items():
        assert getattr(hw, figure) == value, figure


def test_h100_dense_bf16_is_half_the_sparse_datasheet_figure():
    assert get_hardware("h100-sxm").peak_bf16_flops == 1.979e15 / 2
    assert get_hardware("h100-sxm").peak_bf16_flops == pytest.approx(9.9e14, rel=1e-3)


def test_cpu_device_kind_is_what_jax_reports_here():
    assert jax.devices()[0].device_kind == get_hardware("cpu").device_kind


@pytest.mark.parametrize(
    ("name", "vmem_mib"),
    [("tpu-v4", 16), ("tpu-v5e", 128), ("tpu-v5p", 64), ("tpu-v6e", 128)],
)
def test_tpu_vmem_per_core_matches_jax_tpu_info_and_has_a_source(name, vmem_mib):
    # jax/_src/tpu_info.py (TpuInfo.vmem_capacity_bytes) is the cited source
    hw = get_hardware(name)
    assert hw.vmem_bytes == vmem_mib * 2**20
    assert "tpu_info.py" in hw.sources["vmem_bytes"]
    assert hw.to_json()["vmem_bytes"] == hw.vmem_bytes


@pytest.mark.parametrize("name", [n for n, h in HARDWARE.items() if h.kind != "tpu"])
def test_only_tpus_have_compiler_managed_vmem(name):
    assert get_hardware(name).vmem_bytes is None


def test_v5e_hbm_bandwidth_is_googles_datasheet_figure():
    # Google Cloud's TPU v5e page: "HBM2 capacity and bandwidth: 16 GB, 819 GBps" (the
    # scaling-book's 8.1e11 is a rounding); device_placement reads this same figure
    hw = get_hardware("tpu-v5e")
    assert hw.hbm_bytes_per_s == 8.19e11
    assert "819 GBps" in hw.sources["hbm_bytes_per_s"]


@pytest.mark.parametrize(
    ("name", "figures"),
    [
        ("a100-sxm", {"hbm_bytes": 80 * GIB, "hbm_bytes_per_s": 2.039e12,
                      "peak_bf16_flops": 3.12e14, "fast_link_bytes_per_s": 3e11}),
        ("v100-sxm", {"hbm_bytes": 32 * GIB, "hbm_bytes_per_s": 9e11,
                      "peak_bf16_flops": 1.25e14, "fast_link_bytes_per_s": 1.5e11}),
    ],
    ids=["a100", "v100"],
)  # fmt: skip
def test_a100_and_v100_datasheet_figures(name, figures):
    hw = get_hardware(name)
    assert {k: getattr(hw, k) for k in figures} == figures
    assert hw.kind == "gpu" and hw.fast_link == "nvlink" and hw.topologies == ()
    for figure in figures:
        assert "NVIDIA" in hw.sources[figure] and "https://" in hw.sources[figure], figure


def test_tpu7x_is_two_devices_per_chip_each_figure_half_the_chips():
    # Google Cloud's TPU7x table: 2307 TFLOPs bf16, 192 GiB HBM, 7380 GB/s per chip
    hw = get_hardware("tpu7x")
    assert hw.kind == "tpu" and hw.device_kind == "TPU7x" and hw.devices_per_chip == 2
    assert hw.cores_per_chip == 1  # each TensorCore is its own device, no megacore
    assert hw.peak_bf16_flops * 2 == pytest.approx(2.307e15)
    assert hw.hbm_bytes * 2 == 192 * GIB
    assert hw.hbm_bytes_per_s * 2 == pytest.approx(7.38e12)
    assert hw.vmem_bytes == 64 * 2**20
    assert hw.devices_per_host == 8 and hw.host_memory_bytes == 960 * 10**9
    assert hw.fast_domain_devices == 2 * 9216
    assert hw.slow_link_bytes_per_s == 5e10
    assert hw.fast_link_bytes_per_s * 2 * hw.fast_links_per_device == pytest.approx(6e11)
    assert topology_shape(hw, "tpu7x:4x4x4") == (4, 4, 4)
    for figure in ("peak_bf16_flops", "hbm_bytes", "hbm_bytes_per_s", "devices_per_chip",
                   "topologies", "vmem_bytes", "host_memory_bytes"):  # fmt: skip
        assert "tpu7x" in hw.sources[figure].lower() or "TPU_7X" in hw.sources[figure]
    assert hw.to_json()["devices_per_chip"] == 2
    assert all(h.devices_per_chip == 1 for n, h in HARDWARE.items() if n != "tpu7x")
