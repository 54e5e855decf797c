"""A catalog entry's types (datarax.hardware.entry): Hardware's checks, its JSON and
its per-dtype peak, and AxisLink's checks and JSON; each is its answer class
(HardwareEntry, AxisDetail) with internal fields the JSON leaves out."""

from __future__ import annotations

import dataclasses

import pytest

from datarax.answers.catalog import HardwareEntry
from datarax.answers.estimates import AxisDetail
from datarax.hardware.entry import LINK_CLASSES, AxisLink, Hardware


def test_axis_link_checks_and_json():
    link = AxisLink("data", 16, 8, 2, "dcn", 3.125e9, ici_bytes_per_s=9e10)
    assert link.to_json() == {
        "name": "data", "size": 16, "ici": 8, "dcn": 2, "link": "dcn", "bytes_per_s": 3.125e9,
    }  # fmt: skip
    with pytest.raises(ValueError, match="slowest network"):
        AxisLink("data", 4, 4, 1, "ethernet", 1.0)
    with pytest.raises(ValueError, match="size 5"):
        AxisLink("data", 5, 4, 1, "ici", 1.0)


def _entry(**changes):
    base = {
        "name": "x", "kind": "gpu", "device_kind": "", "hbm_bytes": 2**30,
        "peak_bf16_flops": 1e14, "devices_per_host": 8, "fast_domain_devices": 8,
        "fast_link_bytes_per_s": 1e11, "slow_link_bytes_per_s": 1e10, "topologies": (),
        "sources": {"hbm_bytes": "a datasheet"}, "fast_link": "nvlink", "slow_link": "infiniband",
    }  # fmt: skip
    return Hardware(**{**base, **changes})


def test_hardware_refuses_an_unknown_kind_or_link_class():
    with pytest.raises(ValueError, match="tpu, gpu or cpu"):
        _entry(kind="fpga")
    with pytest.raises(ValueError, match="'ethernet' is not one of"):
        _entry(slow_link="ethernet")


def test_hardware_sources_are_read_only_and_json_copies_them():
    entry = _entry()
    with pytest.raises(TypeError):
        entry.sources["hbm_bytes"] = "changed"  # type: ignore[index]
    as_json = entry.to_json()
    as_json["sources"]["hbm_bytes"] = "changed"
    assert entry.sources["hbm_bytes"] == "a datasheet"
    assert as_json["topologies"] == [] and set(LINK_CLASSES) >= {as_json["fast_link"]}


def test_peak_flops_per_dtype_and_derived_figures():
    entry = _entry(peak_fp32_flops=2e13, devices_per_host=4, fast_domain_devices=16)
    assert entry.peak_flops("float32") == 2e13
    assert entry.peak_flops("bfloat16") == entry.peak_flops("float16") == 1e14
    assert _entry().peak_flops("float32") == 1e14  # no fp32 figure: the bf16 peak
    assert entry.hosts_per_domain == 4
    assert entry.slow_link_bytes_per_s_per_device == 1e10 / 4


def test_an_entry_is_its_answer_and_keeps_its_internal_fields_out():
    entry = _entry(max_slices=4, torus_dims=0)
    assert isinstance(entry, HardwareEntry)
    doc = entry.to_json()
    assert "max_slices" not in doc and "max_slices" not in entry
    assert list(doc) == [f.name for f in dataclasses.fields(HardwareEntry)]
    parsed = HardwareEntry.from_json(doc)
    assert parsed.to_json() == doc and parsed == entry


def test_an_axis_link_is_its_axes_detail_answer():
    link = AxisLink("data", 16, 8, 2, "dcn", 3.125e9, ici_bytes_per_s=9e10)
    assert isinstance(link, AxisDetail) and "ici_bytes_per_s" not in link
    parsed = AxisDetail.from_json(link.to_json())
    assert parsed == link and parsed.to_json() == link.to_json()
