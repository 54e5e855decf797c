"""Issue 58, classes 4, 6 and 11, over HTTP on an app of its own (the jobs fit needs no
device: a stand-in runtime): a jobs fit counted before any work and run in the heavy
lane, off the event loop; steps no fit can take kept out; nothing stored unless the fit
succeeds; DELETE, retention and pages of the profiles; a constant fitted at an edge of
its grid said in ``warnings``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import count

import pytest

from app.main import create_app
from app.services.heavy_work import heavy_work
from datarax.estimate.calibrations import GRID_POINTS, fit_work, published_profiles
from datarax.estimate.serving_profiles import serving_profiles
from tests.helpers import StubRuntime, TestClient, assert_problem, make_settings, strict_json

PUBLISHED = len(published_profiles()) + len(serving_profiles())  # both ship
MAX_JOBS = 4  # DATARAX_MAX_CALIBRATION_CELLS below lets a fit take this many jobs
KEEP = 3
WAIT_S = 30.0
PLAN = {"hardware": "tpu-v6e", "topology": "2x4", "ici": {"fsdp": 8},
        "model": {"name": "llama3.1-8b", "remat": "full"}}  # fmt: skip
_names = count()


@pytest.fixture(scope="module")
def client(tmp_path_factory) -> Iterator[TestClient]:
    settings = make_settings(
        tmp_path_factory.mktemp("calibrations"),
        max_calibration_cells=fit_work(MAX_JOBS),
        calibrations_keep=KEEP,
        heavy_workers=1,
        heavy_queue=1,
    )
    with strict_json(TestClient(create_app(settings, runtime=StubRuntime()))) as c:
        yield c


def _until(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"{what} within {WAIT_S} s"
        time.sleep(0.01)


def _job(client, batch: int, *times: float, slowdown: float | None = None) -> str:
    """A job linked to a plan of ``batch``, its step times ``times`` (or ``slowdown`` x
    the plan's estimate)."""
    plan = client.post("/v1/meshes", json={**PLAN, "batch_shape": [batch, 8192]})
    assert plan.status_code == 201, plan.text
    if slowdown is not None:
        times = (slowdown * plan.json()["step_estimate"]["step_s"],) * 3
    job = f"cal-{next(_names)}"
    points = [{"step": i, "metrics": {"step_time": t}} for i, t in enumerate(times)]
    pushed = client.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
    assert pushed.status_code == 201, pushed.text
    linked = client.patch(f"/v1/jobs/{job}", json={"plan": plan.json()["id"]})
    assert linked.status_code == 200, linked.text
    return job


def _fit(client, jobs):
    return client.post("/v1/calibrations", json={"kind": "jobs", "jobs": jobs})


def _total(client) -> int:
    return client.get("/v1/calibrations").json()["total"]


@pytest.fixture(scope="module")
def jobs(client) -> list[str]:
    return [_job(client, batch, slowdown=1.3) for batch in (8, 16, 32)]


def test_a_fit_past_its_cells_is_refused_before_any_work(client):
    before = _total(client)
    names = [f"nobody-{i}" for i in range(MAX_JOBS + 1)]  # none exists: nothing is read
    body = assert_problem(_fit(client, names), 422, "calibration_too_large")
    assert body["cells"] == fit_work(MAX_JOBS + 1) == 2 * (MAX_JOBS + 1) * GRID_POINTS
    assert body["limit"] == fit_work(MAX_JOBS) and body["max_jobs"] == MAX_JOBS
    assert "DATARAX_MAX_CALIBRATION_CELLS" in body["detail"]
    assert f"at most {MAX_JOBS} jobs" in body["detail"]
    assert _total(client) == before
    # a job named twice counts once
    assert_problem(_fit(client, ["nobody-0"] * 9), 404, "job_not_found")


def test_the_fit_waits_and_runs_in_the_heavy_lane_while_liveness_answers(client, jobs):
    lane = heavy_work(client.app)  # 1 slot, 1 waiting
    release = threading.Event()

    def hold(stop: Callable[[], bool]) -> None:
        while not release.is_set() and not stop():
            time.sleep(0.01)

    before = _total(client)
    held = client.portal.start_task_soon(lane.run, "held work", hold)
    with ThreadPoolExecutor(1) as pool:
        try:
            _until(lambda: lane.admitted == 1, "the held work took the slot")
            fitted = pool.submit(_fit, client, jobs)
            _until(lambda: lane.admitted == 2, "the fit queued in the heavy lane")
            live = client.get("/health/live")
            assert live.status_code == 200, live.text
            assert not fitted.done() and _total(client) == before  # nothing stored yet
        finally:
            release.set()
            held.result(timeout=WAIT_S)
        answer = fitted.result(timeout=WAIT_S)
    assert answer.status_code == 201, answer.text
    assert client.get(answer.headers["location"]).json() == answer.json()
    assert lane.admitted == 0


def test_a_fit_cut_by_shutdown_or_a_hang_up_stores_nothing(client, jobs):
    before = _total(client)
    lifecycle = client.app.state.lifecycle
    lifecycle.shutting_down = True  # as SIGTERM sets it (app.cli)
    try:
        assert_problem(_fit(client, jobs), 503, "shutting_down")
    finally:
        lifecycle.shutting_down = False
    assert _total(client) == before


def test_steps_that_cannot_be_real_never_reach_the_fit(client):
    before = _total(client)
    # zero, negative, subnormal and absurdly long step times: no step a fit can take
    bad = _job(client, 8, 0.0, -1.0, 1e-320, 1e20, 1e300)
    refused = assert_problem(_fit(client, [bad]), 409, "no_measured_steps")
    assert "1e-09 s to 1e+07 s" in refused["detail"]
    assert _total(client) == before
    # beside real ones they are left out: the median is of the real ones
    mixed = _job(client, 8, 0.0, 2.0, 1e300, 4.0, 1e-320)
    fitted = _fit(client, [mixed])
    assert fitted.status_code == 201, fitted.text
    assert fitted.json()["measurements"][0]["measured_step_s"] == 3.0


def test_a_fit_at_an_edge_of_its_grid_is_stored_with_a_warning(client, jobs):
    # steps 5x faster than the published profile prices them: faster than the matmuls'
    # peak, so matmul sits at the top of the grid (1.00) and the fit says so
    fast = [_job(client, batch, slowdown=0.2) for batch in (8, 16, 32)]
    answer = _fit(client, fast)
    assert answer.status_code == 201, answer.text
    profile = answer.json()
    assert profile["constants"]["matmul"] == 1.0
    assert any(w.startswith("matmul 1.00 is the highest value the fit searches")
               for w in profile["warnings"]), profile  # fmt: skip
    assert client.get(answer.headers["location"]).json() == profile
    # a fit inside the grid names no matmul edge (warnings omitted when empty)
    inside = _fit(client, jobs).json()
    assert 0.3 < inside["constants"]["matmul"] < 1.0
    assert not any(w.startswith("matmul") for w in inside.get("warnings", []))


def test_profiles_are_deleted_kept_to_the_newest_and_listed_by_pages(client, jobs):
    made = [_fit(client, jobs).json()["id"] for _ in range(KEEP + 2)]
    listed = client.get("/v1/calibrations", params={"limit": 1000}).json()
    assert listed["total"] == PUBLISHED + KEEP == len(listed["items"])  # retention
    assert [p["id"] for p in listed["items"][PUBLISHED:]] == made[::-1][:KEEP]
    # pages: published first, then stored newest first; total counts them all
    pages = [client.get("/v1/calibrations", params={"limit": 2, "offset": offset}).json()
             for offset in range(0, PUBLISHED + KEEP, 2)]  # fmt: skip
    assert [p["id"] for page in pages for p in page["items"]] == [
        p["id"] for p in listed["items"]]  # fmt: skip
    assert {page["total"] for page in pages} == {PUBLISHED + KEEP}
    assert_problem(client.get("/v1/calibrations", params={"limit": 0}), 422, "validation_error")
    # DELETE: 204, then gone; published ones and unknown ids refused
    newest = made[-1]
    assert client.delete(f"/v1/calibrations/{newest}").status_code == 204
    assert_problem(client.get(f"/v1/calibrations/{newest}"), 404, "calibration_not_found")
    assert_problem(client.delete(f"/v1/calibrations/{newest}"), 404, "calibration_not_found")
    published = assert_problem(client.delete("/v1/calibrations/published-tpu-jax"), 409,
                               "calibration_published")  # fmt: skip
    assert "ships with the library" in published["detail"]
    assert _total(client) == PUBLISHED + KEEP - 1
    named = client.post("/v1/meshes", json={**PLAN, "batch_shape": [8, 8192],
                                            "calibration": newest})  # fmt: skip
    assert_problem(named, 422, "unknown_calibration")
