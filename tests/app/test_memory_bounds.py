"""The server's peak memory per request is a bounded multiple of the body, for the worst
body shapes (flat number lists, ``[[x], ...]``, many metrics, many devices) on reduce,
collect, job push and training steps. Measured on the real server process: its peak RSS
(``VmHWM``, reset through ``/proc/<pid>/clear_refs`` before each request) minus its RSS
before. docs/LIMITS.md gives the measured multiples (about 12-29x; see there).
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from tests.helpers import ServiceProcess

BODY_BYTES = 3 * 2**19  # within the JSON counts: the nested shape holds 393,216 lists
MAX_MULTIPLE = 32
"""Peak growth of the server / body size, at most (docs/LIMITS.md: measured 12-29x)."""


def _numbers(item: str, width: int, size: int) -> str:
    """A JSON list of ``item`` repeated to about ``size`` bytes."""
    return "[" + ",".join([item] * (size // width)) + "]"


METRICS = {  # shape -> body size -> the metrics object
    "flat": lambda n: '{"m":' + _numbers("0.5", 4, n) + "}",  # one scalar per device
    "nested": lambda n: '{"m":' + _numbers("[0]", 4, n) + "}",  # a list object per device
    "many-devices": lambda n: '{"m":' + _numbers("[0,1,2,3,4,5,6,7]", 18, n) + "}",
    "many-metrics": lambda n: "{" + ",".join(f'"m{i}":[1,2]' for i in range(n // 12)) + "}",
}
ENDPOINTS = {
    "reduce": ("/v1/metrics/reduce", lambda m: '{"metrics":' + m + "}"),
    "collect": ("/v1/metrics/collect", lambda m: '{"metrics":' + m + "}"),
    "job-push": ("/v1/jobs/mem-{shape}/metrics", lambda m: '{"step":1,"metrics":' + m + "}"),
}
# A job point takes at most 1,000 metrics (app.services.jobs.MAX_METRICS_PER_POINT): the
# many-metrics body is refused, and the refusal must be as cheap as any answer.
REFUSED = {("job-push", "many-metrics"): (422, "too_many_metrics")}
CASES = [
    pytest.param(endpoint, shape, id=f"{endpoint}-{shape}")
    for endpoint in ENDPOINTS
    for shape in METRICS
]


def _peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/<pid>/status")


def _reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not sys.platform.startswith("linux"):
        pytest.fail("peak RSS is read from /proc (Linux only)")
    tmp = tmp_path_factory.mktemp("memory")
    env = {"DATARAX_MAX_BODY_MB": "8", "DATARAX_MAX_ANSWER_MB": "256"}
    with ServiceProcess(tmp / "datarax.sqlite", tmp / "server.log", env=env) as service:
        service.wait_ready()
        with service.client(timeout=300) as client:
            yield service.proc.pid, client


def _settled_rss(pid: int) -> int:
    """The server's RSS once two reads 0.1 s apart agree within 1 MiB (at most 5 s)."""
    deadline = time.monotonic() + 5
    last = psutil.Process(pid).memory_info().rss
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = psutil.Process(pid).memory_info().rss
        if abs(now - last) < 2**20:
            break
        last = now
    return last


def _growth(pid: int, send) -> tuple[int, object]:
    """(peak RSS growth while ``send()`` runs, its answer)."""
    before = _settled_rss(pid)  # the allocator settled after the previous request
    _reset_peak(pid)
    answer = send()
    return _peak_rss(pid) - before, answer


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("endpoint", "shape"), CASES)
def test_metric_bodies_cost_a_bounded_multiple(server, endpoint, shape):
    pid, client = server
    path, wrap = ENDPOINTS[endpoint]
    body = wrap(METRICS[shape](BODY_BYTES)).encode()
    growth, answer = _growth(
        pid,
        lambda: client.post(
            path.format(shape=shape), content=body, headers={"content-type": "application/json"}
        ),
    )
    if (endpoint, shape) in REFUSED:
        status, code = REFUSED[endpoint, shape]
        assert (answer.status_code, answer.json()["code"]) == (status, code), answer.text[:300]
    else:
        assert answer.status_code in (200, 201), answer.text[:300]
    multiple = growth / len(body)
    assert multiple <= MAX_MULTIPLE, (
        f"{endpoint} {shape}: peak +{growth >> 20} MiB = {multiple:.1f}x"
    )


@pytest.mark.timeout(300)
def test_step_batches_cost_a_bounded_multiple(server):
    pid, client = server
    plan = client.post("/v1/meshes", json={"axes": {"data": 8}}).json()
    created = client.post(
        f"/v1/meshes/{plan['id']}/sessions", json={"model": {"kind": "mlp", "features": [1, 8, 1]}}
    )
    assert created.status_code == 201, created.text
    rows = (BODY_BYTES // 2 // 6) // 8 * 8  # [[x], ...] inputs and targets, divisible by 8
    column = "[" + ",".join(["[0.5]"] * rows) + "]"
    body = ('{"steps":1,"batch":{"inputs":' + column + ',"targets":' + column + "}}").encode()
    growth, answer = _growth(
        pid,
        lambda: client.post(
            f"/v1/sessions/{created.json()['id']}/steps",
            content=body,
            headers={"content-type": "application/json"},
        ),
    )
    assert answer.status_code == 200, answer.text[:300]
    with contextlib.suppress(Exception):
        client.delete(f"/v1/sessions/{created.json()['id']}")
    multiple = growth / len(body)
    assert multiple <= MAX_MULTIPLE, f"steps: peak +{growth >> 20} MiB = {multiple:.1f}x"


@pytest.mark.timeout(300)
def test_new_array_lengths_do_not_grow_the_server(server):
    """Job pushes of ``[d, 4096]`` float32 metrics for many distinct device counts ``d``:
    each new length used to leave its content-hash keys cached (``d * 2048`` words, 4 MiB
    at d=256; 64 lengths kept). Now memory comes back: the growth after 12 more lengths
    is bounded well below what keeping them costs (+35 MiB measured with the old cache)."""
    pid, client = server

    def push(devices: int, step: int) -> None:
        buffer = io.BytesIO()
        np.savez(buffer, m=np.full((devices, 4096), 0.5, dtype=np.float32))
        answer = client.post(
            f"/v1/jobs/lengths/metrics?step={step}",
            content=buffer.getvalue(),
            headers={"content-type": "application/x-npz"},
        )
        assert answer.status_code in (200, 201), answer.text[:300]

    for step, devices in enumerate((250, 251, 252)):  # the allocator's working set
        push(devices, step)
    before = _settled_rss(pid)
    for step, devices in enumerate(range(200, 248, 4), start=10):
        push(devices, step)
    growth = _settled_rss(pid) - before
    print(f"\n12 new lengths: server RSS {growth / 2**20:+.1f} MiB")
    assert growth < 16 * 2**20, f"the server grew {growth >> 20} MiB for 12 new lengths"
