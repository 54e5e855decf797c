"""``memory_per_device.program`` (DESIGN v1.4, "The program users launch"): ``maxtext``
for hardware plans (what ``launch`` runs), ``datarax`` for plans of the live host's
devices and abstract plans; absent from serving plans, whose memory prices no training
step."""

from __future__ import annotations

from tests.helpers import api  # noqa: F401 - the real server fixture

TINY = {"kind": "transformer", "layers": 2, "d_model": 256, "d_ff": 512, "heads": 4,
        "kv_heads": 4, "head_dim": 64, "vocab": 1024, "seq_len": 128}  # fmt: skip


def _plan(api, body):  # noqa: F811
    answer = api.post("/v1/meshes", json=body)
    assert answer.status_code == 201, answer.text
    stored = api.get(f"/v1/meshes/{answer.json()['id']}?view=summary").json()
    assert stored["memory_per_device"] == answer.json()["memory_per_device"]
    return answer.json()["memory_per_device"]


def test_hardware_plans_price_maxtexts_program(api):  # noqa: F811
    hardware = {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"fsdp": 4},
                "batch_shape": [4, 128]}  # fmt: skip
    assert _plan(api, {**hardware, "model": TINY})["program"] == "maxtext"
    assert _plan(api, hardware)["program"] == "maxtext"  # no model: still what launch runs
    gpu = {"hardware": "h100-sxm", "hosts": 1, "ici": {"fsdp": 8}, "batch_shape": [8, 128],
           "model": TINY}  # fmt: skip
    assert _plan(api, gpu)["program"] == "maxtext"


def test_live_and_abstract_plans_price_the_librarys_program(api):  # noqa: F811
    assert _plan(api, {"axes": {"data": 2}, "batch_shape": [8, 16]})["program"] == "datarax"
    abstract = {"axes": {"data": 4}, "num_devices": 4, "batch_shape": [8, 16]}
    assert _plan(api, abstract)["program"] == "datarax"
