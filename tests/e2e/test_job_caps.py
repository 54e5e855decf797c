"""Job metric caps on every push path, bounded history answers, proportional coverage,
names, integer fields and the one history shape: against the real ``datarax-serve``.

Issues 26 and 27. Each cap is tried on every path (JSON single, JSON batch, npz single,
npz batch, and a multi-source part), at the cap (accepted) and one past it (refused with
its code, nothing stored). Job pushes need no device: the servers are waited on for
liveness only.
"""

from __future__ import annotations

import http.client as http_client
import io
import sqlite3
import time
import zipfile

import httpx
import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from datarax.client import Client, history_points
from tests.helpers import PROBLEM_TYPE, ServiceProcess, assert_problem, npz_bytes

pytestmark = pytest.mark.timeout(300)

LIVE_TIMEOUT_S = 90.0
NPZ = {"content-type": "application/x-npz"}
ANSWER_MB = 0.25  # the capped server's DATARAX_MAX_ANSWER_MB
ANSWER_BYTES = int(ANSWER_MB * 1024 * 1024)
MAX_VALUES = 4096  # DATARAX_MAX_POINT_VALUES's default
TOKEN = "caps-token"


def orjson_dumps(value) -> bytes:
    return orjson.dumps(value)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module, its answers capped at ``ANSWER_MB``."""
    root = tmp_path_factory.mktemp("job-caps")
    env = {"DATARAX_MAX_ANSWER_MB": str(ANSWER_MB)}
    with ServiceProcess(root / "jobs.sqlite", root / "server.log", env=env) as service:
        service.wait_live(LIVE_TIMEOUT_S)
        yield service


@pytest.fixture(scope="module")
def http(server):
    with server.client(timeout=60.0) as client:
        yield client


def _job_exists(http, job: str) -> bool:
    answer = http.get(f"/v1/jobs/{job}")
    assert answer.status_code in (200, 404), answer.text
    return answer.status_code == 200


# ------------------------------------------------------------------ the caps x paths matrix


def _metrics_for(cap: str, over: bool) -> dict[str, np.ndarray]:
    """Per-device metrics (2 devices) at a cap, or one past it."""
    extra = 1 if over else 0
    if cap == "metric_count":
        return {f"m{i}": np.full(2, float(i)) for i in range(1000 + extra)}
    if cap == "name_length":
        return {"n" * (250 + extra): np.ones(2), "loss": np.ones(2)}
    if cap == "values_one_metric":  # [2, k] reduces to k numbers
        return {"hist": np.ones((2, MAX_VALUES + extra))}
    if cap == "values_summed":  # the cap is over all metrics of the point together
        return {"a": np.ones((2, 2048)), "b": np.ones((2, 2047 + extra)), "lr": np.ones(2)}
    if cap == "values_nd":  # [2, 64, 64] is 4,096 numbers; [2, 64, 65] is 4,160
        return {"grid": np.ones((2, 64, 64 + extra))}
    raise AssertionError(cap)


CAP_CODES = {
    "metric_count": "too_many_metrics",
    "name_length": "metric_name_too_long",
    "values_one_metric": "value_too_large",
    "values_summed": "value_too_large",
    "values_nd": "value_too_large",
}
PATHS = ["json-single", "json-batch", "npz-single", "npz-batch", "json-part", "npz-part"]


def _push(http, path: str, job: str, metrics: dict[str, np.ndarray]) -> httpx.Response:
    as_lists = {name: value.tolist() for name, value in metrics.items()}
    if path == "json-single":
        return http.post(f"/v1/jobs/{job}/metrics", json={"metrics": as_lists, "step": 1})
    if path == "json-part":
        body = {"metrics": as_lists, "step": 1, "source": "h0", "sources": 2}
        return http.post(f"/v1/jobs/{job}/metrics", json=body)
    if path == "json-batch":
        points = [{"metrics": as_lists, "step": s} for s in (1, 2)]
        return http.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
    if path in ("npz-single", "npz-part"):
        query = "step=1" + ("&source=h0&sources=2" if path == "npz-part" else "")
        return http.post(
            f"/v1/jobs/{job}/metrics?{query}", content=npz_bytes(**metrics), headers=NPZ
        )
    if path == "npz-batch":
        stacked = {name: np.stack([value, value]) for name, value in metrics.items()}
        body = npz_bytes(_step=np.array([1, 2]), **stacked)
        return http.post(f"/v1/jobs/{job}/metrics/batch", content=body, headers=NPZ)
    raise AssertionError(path)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cap", list(CAP_CODES))
def test_every_cap_holds_on_every_path(http, cap, path):
    job = f"cap-{cap}-{path}".replace("_", "-")
    refused = _push(http, path, job + "-over", _metrics_for(cap, over=True))
    body = assert_problem(refused, 422, CAP_CODES[cap])
    assert "point" in body["detail"], body
    assert not _job_exists(http, job + "-over"), "a refused push stored something"
    accepted = _push(http, path, job + "-at", _metrics_for(cap, over=False))
    assert accepted.status_code == 201, (accepted.status_code, accepted.text[:500])
    assert _job_exists(http, job + "-at")


@pytest.mark.parametrize("path", ["json-batch", "npz-batch"])
def test_points_per_batch_cap_on_both_batch_paths(http, path):
    over, at = 1001, 1000
    for count, status in ((over, 422), (at, 201)):
        job = f"batch-points-{path}-{count}"
        if path == "json-batch":
            points = [{"metrics": {"loss": [1.0, 2.0]}, "step": s} for s in range(count)]
            answer = http.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
        else:
            body = npz_bytes(_step=np.arange(count), loss=np.ones((count, 2)))
            answer = http.post(f"/v1/jobs/{job}/metrics/batch", content=body, headers=NPZ)
        if status == 422:
            assert_problem(answer, 422, "validation_error")
            assert not _job_exists(http, job)
        else:
            assert answer.status_code == 201 and answer.json()["created"] == at, answer.text


def test_a_small_compressed_npz_of_a_huge_value_is_refused_and_stores_nothing(http):
    buffer = io.BytesIO()
    np.savez_compressed(buffer, v=np.zeros((1, 1_000_000)))
    body = buffer.getvalue()
    assert len(body) < 16_384, len(body)  # the attacker's ~8 KB body
    for query in ("step=1", "step=1&source=h0&sources=2"):
        answer = http.post(f"/v1/jobs/zeros/metrics?{query}", content=body, headers=NPZ)
        assert_problem(answer, 422, "value_too_large")
    batch = io.BytesIO()
    np.savez_compressed(batch, _step=np.arange(40), v=np.zeros((40, 1, 25_000)))
    answer = http.post("/v1/jobs/zeros/metrics/batch", content=batch.getvalue(), headers=NPZ)
    assert_problem(answer, 422, "value_too_large")
    assert not _job_exists(http, "zeros")


@pytest.mark.parametrize(("metrics", "status"), [(1000, 422), (10, 201)], ids=["1000", "10"])
def test_an_npz_batch_stores_no_more_text_than_a_body_may_carry(http, metrics, status):
    # 100-character names: each point fits an answer (~130 KB), 1,000 of them do not fit
    # a body (~130 MB of text from an ~8 MB npz).
    names = [f"{i:04d}".ljust(100, "n") for i in range(metrics)]
    arrays = {name: np.full(1000, 0.5) for name in names}  # one number per point
    body = npz_bytes(_step=np.arange(1000), **arrays)
    job = f"npz-names-{metrics}"
    answer = http.post(f"/v1/jobs/{job}/metrics/batch", content=body, headers=NPZ)
    if status == 422:
        detail = assert_problem(answer, 422, "value_too_large")["detail"]
        assert "DATARAX_MAX_BODY_MB" in detail, detail
        assert not _job_exists(http, job)
        print(f"npz batch of {len(body)} bytes that would store ~130 MB: refused")
    else:
        assert answer.status_code == 201 and answer.json()["created"] == 1000, answer.text


def _many_members_npz(count: int) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        member = io.BytesIO()
        np.save(member, np.ones(2))
        data = member.getvalue()
        for i in range(count):
            archive.writestr(f"m{i}.npy", data)
    return buffer.getvalue()


@pytest.mark.parametrize("path", ["single", "batch"])
def test_an_npz_of_50000_members_is_refused_before_it_is_loaded(http, path):
    body = _many_members_npz(50_000)
    url = "/v1/jobs/members/metrics" + ("?step=1" if path == "single" else "/batch")
    start = time.perf_counter()
    answer = http.post(url, content=body, headers=NPZ)
    took = time.perf_counter() - start
    assert_problem(answer, 422, "too_many_metrics")
    print(f"npz {path} push of 50,000 members ({len(body)} bytes): refused in {took:.3f} s")
    assert not _job_exists(http, "members")


# ------------------------------------------------------------------- bounded history reads


def _wide_points(first: int, count: int, width: int) -> list[dict]:
    """Points whose reduced value is ``width`` numbers of ~18 characters each."""
    rng = np.random.default_rng(first)
    return [
        {"step": s, "metrics": {"v": rng.random((2, width)).tolist(), "loss": [1.0, float(s)]}}
        for s in range(first, first + count)
    ]


def test_history_pages_stay_within_the_answer_limit_and_page_on(http, server):
    job = "wide"
    for first in range(0, 300, 100):  # 300 points of ~18 KB: ~5.4 MB of history
        pushed = http.post(
            f"/v1/jobs/{job}/metrics/batch", json={"points": _wide_points(first, 100, 1000)}
        )
        assert pushed.status_code == 201, pushed.text[:300]
    seen: list[int] = []
    after = None
    pages = 0
    while True:
        params = {"limit": 10_000, **({} if after is None else {"after_step": after})}
        answer = http.get(f"/v1/jobs/{job}/metrics", params=params)
        assert answer.status_code == 200, answer.text[:300]
        assert len(answer.content) <= ANSWER_BYTES, len(answer.content)
        page = answer.json()
        assert page["kind"] == "points" and page["downsampled"] is False
        seen += [p["step"] for p in page["points"]]
        pages += 1
        after = page["next_after_step"]
        if after is None:
            break
        assert after == page["points"][-1]["step"]
    assert seen == list(range(300)), seen[:20]
    assert pages >= 300 * 18_000 // ANSWER_BYTES, pages
    print(f"300 points of ~18 KB read in {pages} pages of at most {ANSWER_BYTES} bytes")
    with Client(server.base_url) as api:  # the client's reader follows the cut pages
        assert [p["step"] for p in api.iter_job_metrics(job, limit=10_000)] == list(range(300))


def test_a_cut_page_with_partial_steps_skips_no_step(http):
    job = "wide-partial"
    points = _wide_points(0, 60, 1000)
    assert http.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points}).status_code == 201
    for step in (5, 25, 45, 65):  # partial steps among (and after) the complete ones
        part = {"metrics": {"v": [[0.5] * 1000], "loss": [1.0]}, "step": 1000 + step}
        part.update(source="h0", sources=2)
        assert http.post(f"/v1/jobs/{job}/metrics", json=part).status_code == 201
    seen, after = [], None
    while True:
        params = {"include_partial": "true", **({} if after is None else {"after_step": after})}
        answer = http.get(f"/v1/jobs/{job}/metrics", params=params)
        assert answer.status_code == 200 and len(answer.content) <= ANSWER_BYTES
        page = answer.json()
        seen += [(p["step"], p["complete"]) for p in page["points"]]
        after = page["next_after_step"]
        if after is None:
            break
    expected = [(s, True) for s in range(60)] + [(1000 + s, False) for s in (5, 25, 45, 65)]
    assert seen == expected


def test_partial_steps_are_read_within_the_budget_of_stored_parts(http):
    job = "heavy-partials"
    rng = np.random.default_rng(5)
    for step in range(20):  # each its own segment of 32 x 500 float64: 128 KB of parts
        body = npz_bytes(v=rng.random((32, 500)))
        query = f"step={step}&source=h0&sources=2"
        pushed = http.post(f"/v1/jobs/{job}/metrics?{query}", content=body, headers=NPZ)
        assert pushed.status_code == 201, pushed.text[:300]
    seen, after, pages = [], None, 0
    while True:
        params = {"include_partial": "true", **({} if after is None else {"after_step": after})}
        answer = http.get(f"/v1/jobs/{job}/metrics", params=params)
        assert answer.status_code == 200 and len(answer.content) <= ANSWER_BYTES
        page = answer.json()
        seen += [p["step"] for p in page["points"]]
        assert all(p["complete"] is False and len(p["reduced"]["v"]) == 500 for p in page["points"])
        pages += 1
        after = page["next_after_step"]
        if after is None:
            break
    assert seen == list(range(20))
    assert pages >= 20 * 128_000 // ANSWER_BYTES, pages  # no page read more parts than that
    print(f"20 partial steps of 128 KB of parts each: {pages} pages")


def _huge_point_metrics() -> dict[str, list[float]]:
    """Within every push cap (1,000 metrics, 250-character names), yet ~273 KB of reduced
    text: more than the capped server's 256 KiB answer limit."""
    rng = np.random.default_rng(0)
    return {f"{i:04d}".ljust(250, "n"): [float(rng.random())] for i in range(1000)}


@pytest.mark.parametrize("path", ["json-single", "json-batch", "npz-single", "npz-batch"])
def test_a_point_that_could_not_be_read_back_is_refused_when_pushed(http, path):
    job = f"unreadable-{path}"
    metrics = {name: np.asarray(value) for name, value in _huge_point_metrics().items()}
    body = assert_problem(_push(http, path, job, metrics), 422, "value_too_large")
    assert "DATARAX_MAX_ANSWER_MB" in body["detail"], body
    assert not _job_exists(http, job)


def test_a_stored_point_above_a_lowered_answer_limit_is_answer_too_large(tmp_path):
    db = tmp_path / "lowered.sqlite"
    metrics = _huge_point_metrics()
    with ServiceProcess(db, tmp_path / "first.log") as first:  # the default 64 MiB limit
        first.wait_live(LIVE_TIMEOUT_S)
        pushed = httpx.post(
            f"{first.base_url}/v1/jobs/huge/metrics",
            json={"metrics": metrics, "step": 0},
            timeout=30,
        )
        assert pushed.status_code == 201, pushed.text[:300]
        assert len(orjson_dumps(pushed.json()["reduced"])) > ANSWER_BYTES
    env = {"DATARAX_MAX_ANSWER_MB": str(ANSWER_MB)}
    with ServiceProcess(db, tmp_path / "second.log", env=env) as second:
        second.wait_live(LIVE_TIMEOUT_S)
        with second.client() as client:
            answer = client.get("/v1/jobs/huge/metrics")
            body = assert_problem(answer, 422, "answer_too_large")
            assert "step 0" in body["detail"] and "DATARAX_MAX_ANSWER_MB" in body["detail"]
            small = {"metrics": {"loss": [1.0]}, "step": 1}
            assert client.post("/v1/jobs/huge/metrics", json=small).status_code == 201
            # The page before the huge point still reads; since_step=1 reads past it.
            assert [
                p["step"]
                for p in client.get("/v1/jobs/huge/metrics", params={"since_step": 1}).json()[
                    "points"
                ]
            ] == [1]


def test_a_downsampled_read_of_many_metrics_answers_fewer_buckets_within_the_limit(http):
    job = "many-scalars"
    # 150 metrics of 2 devices: a bucket's answer (each metric's stats and spread, twice
    # for the spread) fits the limit about twice, not 500 times
    names = [f"metric_with_a_long_name_{i:04d}" for i in range(150)]
    points = [{"step": s, "metrics": {n: [float(s), 1.0] for n in names}} for s in range(1000)]
    for start in range(0, 1000, 250):
        pushed = http.post(
            f"/v1/jobs/{job}/metrics/batch", json={"points": points[start : start + 250]}
        )
        assert pushed.status_code == 201, pushed.text[:300]
    answer = http.get(f"/v1/jobs/{job}/metrics", params={"max_points": 500})
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.content) <= ANSWER_BYTES, len(answer.content)
    page = answer.json()
    assert page["kind"] == "buckets" and page["downsampled"] is True
    assert 2 <= len(page["points"]) < 500 and len(page["points"]) == len(page["buckets"])
    assert set(page["points"][0]["reduced"]) == set(names)
    print(f"400 metrics x max_points=500: {len(page['points'])} buckets, {len(answer.content)} B")


# ------------------------------------------------------------------- one history shape


def test_plain_and_downsampled_reads_share_one_shape(http, server):
    job = "shape"
    points = [{"step": s, "metrics": {"loss": [float(s % 7), 1.0], "lr": 0.5}} for s in range(1000)]
    assert http.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points}).status_code == 201
    plain = http.get(f"/v1/jobs/{job}/metrics").json()
    down = http.get(f"/v1/jobs/{job}/metrics", params={"max_points": 10}).json()
    assert plain["kind"] == "points" and plain["downsampled"] is False and "buckets" not in plain
    assert down["kind"] == "buckets" and down["downsampled"] is True
    assert len(plain["points"]) == 1000 and 5 <= len(down["points"]) <= 10
    for page in (plain, down):  # what a script written against plain reads works on both
        for row in page["points"]:
            assert isinstance(row["step"], int) and isinstance(row["reduced"]["loss"], float)
            assert row["complete"] is True
    by_step = {p["step"]: p["reduced"]["loss"] for p in plain["points"]}
    for row, bucket in zip(down["points"], down["buckets"], strict=True):
        inside = [by_step[s] for s in range(bucket["start_step"], bucket["end_step"] + 1)]
        assert row["reduced"]["loss"] == pytest.approx(np.mean(inside))
        assert row["reduced"]["loss"] == pytest.approx(bucket["metrics"]["loss"]["mean"])
        assert (row["start_step"], row["end_step"]) == (bucket["start_step"], bucket["end_step"])
        assert row["step"] == bucket["metrics"]["loss"]["last_step"] == bucket["end_step"]
        assert row["count"] == len(inside) and row["received_at"] is None
    with Client(server.base_url) as api:
        rows = list(api.iter_job_metrics(job, max_points=10))
        assert [r["step"] for r in rows] == [r["step"] for r in down["points"]]
        assert [r["step"] for r in api.iter_job_metrics(job)] == list(range(1000))
        # An older service's downsampled answer (buckets only) reads the same.
        legacy = {k: v for k, v in down.items() if k not in ("points", "kind")}
        assert history_points(legacy) == down["points"]


# ------------------------------------------------------------------ proportional coverage


def _coverage_bytes(db, job: str) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(length(counts)), 0) FROM job_coverage WHERE job = ?", (job,)
        ).fetchone()
    return int(row[0])


SPACINGS = (4096, 65_536, 1)


def test_coverage_storage_grows_with_the_steps_pushed_not_their_span(tmp_path):
    db = tmp_path / "coverage.sqlite"
    with ServiceProcess(db, tmp_path / "coverage.log") as service:  # read once it is stopped
        service.wait_live(LIVE_TIMEOUT_S)
        with service.client(timeout=60) as http:
            for spacing in SPACINGS:
                _push_spaced(http, spacing)
    for spacing in SPACINGS:
        stored = _coverage_bytes(db, f"spaced-{spacing}")
        print(f"1,000 steps {spacing} apart, 3 sources: {stored} bytes of coverage")
        # 4 bytes a step held (sparse), or 8 KiB per 4,096 steps (dense): never 8 KiB a step.
        assert stored <= 1000 * 4 + 8192, (spacing, stored)


def _push_spaced(http, spacing: int) -> None:
    job = f"spaced-{spacing}"
    steps = [i * spacing for i in range(1000)]
    points = [{"step": s, "metrics": {"loss": [1.0, float(s % 5)]}} for s in steps]
    for source in ("h0", "h1"):
        body = {"points": points, "source": source, "sources": 3}
        answer = http.post(f"/v1/jobs/{job}/metrics/batch", json=body)
        assert answer.status_code == 201, answer.text[:300]
    summary = http.get(f"/v1/jobs/{job}").json()
    assert summary["incomplete_step"] == steps[-1] and summary["missing_count"] == 1
    assert summary["lagging_sources"] == ["h2"]
    body = {"points": points, "source": "h2", "sources": 3}
    last = http.post(f"/v1/jobs/{job}/metrics/batch", json=body)
    assert last.status_code == 201 and last.json()["completed_steps"] == 1000, last.text[:300]
    assert http.get(f"/v1/jobs/{job}").json()["incomplete_step"] is None
    page = http.get(f"/v1/jobs/{job}/metrics", params={"limit": 10_000}).json()
    assert [p["step"] for p in page["points"]] == steps
    assert page["points"][3]["reduced"] == {"loss": pytest.approx((3 + 3 * (steps[3] % 5)) / 6)}
    again = http.post(f"/v1/jobs/{job}/metrics/batch", json=body)  # a retry: a no-op
    assert again.status_code == 200 and again.json()["unchanged"] == 1000, again.text[:300]


# --------------------------------------------------------------------- lagging sources


@pytest.mark.parametrize(
    ("received", "sources", "lagging"),
    [
        (["h0", "h00"], 3, None),  # the attacker's: both "index 0"; names unknown
        (["h1", "h01"], 3, None),
        (["host-007"], 8, None),
        (["h0", "h2"], 3, ["h1"]),
        (["0", "1"], 4, ["2", "3"]),
        (["a", "b"], 3, None),
    ],
    ids=["h0-h00", "h1-h01", "leading-zeros", "h0-h2", "digits", "no-index"],
)
def test_lagging_sources_agree_with_missing_count(http, received, sources, lagging):
    job = "lag-" + "-".join(received)
    for source in received:
        part = {"metrics": {"loss": [1.0]}, "step": 7, "source": source, "sources": sources}
        assert http.post(f"/v1/jobs/{job}/metrics", json=part).status_code == 201
    summary = http.get(f"/v1/jobs/{job}").json()
    assert summary["incomplete_step"] == 7
    assert summary["missing_count"] == sources - len(received)
    assert summary["lagging_sources"] == lagging
    listed = http.get("/v1/jobs", params={"limit": 1000}).json()["items"]
    assert next(j for j in listed if j["job"] == job)["lagging_sources"] == lagging
    pending = http.get(f"/v1/jobs/{job}/metrics", params={"include_partial": "true"}).json()
    assert pending["points"][0]["missing_sources"] == lagging


# ------------------------------------------------------------------------------ job names


def _raw(server, method: str, path: str, body: bytes | None = None) -> tuple[int, str, bytes]:
    """A request with the path exactly as written (httpx would remove dot segments)."""
    conn = http_client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        headers = {"content-type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.getheader("content-type", ""), answer.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    "name",
    [".", "..", "...", "%2E", "%2E%2E", ".hidden", "-flag", "trailing.", "a b", "x" * 129],
)
def test_path_unsafe_job_names_are_refused(server, name):
    body = b'{"metrics": {"loss": [1.0]}, "step": 1}'
    for method, path, payload in (
        ("POST", f"/v1/jobs/{name}/metrics", body),
        ("POST", f"/v1/jobs/{name}/metrics/batch", b'{"points": [' + body + b"]}"),
        ("GET", f"/v1/jobs/{name}/metrics", None),
    ):
        status, content_type, text = _raw(server, method, path.replace(" ", "%20"), payload)
        if status == 404 and name in (".", ".."):
            # The server resolved the dot segment itself: no job route matched at all.
            assert content_type.startswith(PROBLEM_TYPE), (content_type, text)
            continue
        assert status == 422, (name, method, path, status, text[:300])
        assert content_type.startswith(PROBLEM_TYPE) and b"validation_error" in text
    listed = httpx.get(f"{server.base_url}/v1/jobs", params={"limit": 1000}).json()["items"]
    assert not [j["job"] for j in listed if not j["job"][:1].isalnum()]


@pytest.mark.parametrize("name", ["a", "run.1", "run_", "x-", "A" * 128, "7.b.c"])
def test_ordinary_names_round_trip(http, name):
    answer = http.post(f"/v1/jobs/{name}/metrics", json={"metrics": {"loss": [2.0]}, "step": 3})
    assert answer.status_code == 201, answer.text
    page = http.get(f"/v1/jobs/{name}/metrics").json()
    assert page["job"] == name and [p["step"] for p in page["points"]] == [3]


# ------------------------------------------------------------------------- integer fields


@pytest.mark.parametrize(
    ("path", "step", "ok"),
    [
        ("json-single", 1000.0, True),
        ("json-single", 1000.5, False),
        ("json-single", "1000", False),
        ("json-single", True, False),
        ("json-batch", 1000.0, True),
        ("json-batch", 1000.5, False),
        ("npz-query", "1000.0", True),
        ("npz-query", "1000.5", False),
        ("npz-batch", 1000.0, True),
        ("npz-batch", 1000.5, False),
    ],
    ids=lambda v: str(v),
)
def test_integral_floats_are_integers_on_every_path(http, path, step, ok):
    job = f"int-{path}-{str(step).replace('.', '_')}"
    if path == "json-single":
        answer = http.post(f"/v1/jobs/{job}/metrics", json={"metrics": {"x": [1.0]}, "step": step})
    elif path == "json-batch":
        points = [{"metrics": {"x": [1.0]}, "step": step, "sources": 1.0}]
        answer = http.post(f"/v1/jobs/{job}/metrics/batch", json={"points": points})
    elif path == "npz-query":
        body = npz_bytes(x=np.ones(2))
        answer = http.post(f"/v1/jobs/{job}/metrics?step={step}", content=body, headers=NPZ)
    else:
        body = npz_bytes(_step=np.array([step, step + 1.0]), x=np.ones((2, 2)))
        answer = http.post(f"/v1/jobs/{job}/metrics/batch", content=body, headers=NPZ)
    if not ok:
        assert_problem(answer, 422, "validation_error")
        return
    assert answer.status_code == 201, answer.text
    steps = [p["step"] for p in http.get(f"/v1/jobs/{job}/metrics").json()["points"]]
    assert steps[0] == 1000 and all(type(s) is int for s in steps)


def test_integral_float_sources_in_a_part(http):
    part = {"metrics": {"x": [1.0]}, "step": 4.0, "source": "h0", "sources": 2.0}
    answer = http.post("/v1/jobs/int-sources/metrics", json=part)
    assert answer.status_code == 201, answer.text
    assert answer.json()["sources"] == 2 and answer.json()["step"] == 4
    bad = {**part, "sources": 2.5}
    assert_problem(http.post("/v1/jobs/int-sources/metrics", json=bad), 422, "validation_error")


# ------------------------------------------------------------- /metrics under --auth-reads


def _job_samples(text: str) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in ("datarax_job_seconds_since_last_push", "datarax_job_stragglers"):
                out.setdefault(sample.name, {})[sample.labels["job"]] = sample.value
    return out


def _push_secret_jobs(base_url: str, headers: dict[str, str]) -> None:
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as client:
        for job in ("secret-alpha", "secret-beta"):
            part = {"metrics": {"x": [1.0]}, "step": 1, "source": "0", "sources": 3}
            assert client.post(f"/v1/jobs/{job}/metrics", json=part).status_code == 201


@pytest.mark.parametrize("auth_reads", [True, False], ids=["auth-reads", "open-reads"])
def test_prometheus_names_no_job_when_reads_need_the_token(tmp_path, auth_reads):
    env = {"DATARAX_API_TOKEN": TOKEN, "DATARAX_AUTH_READS": str(auth_reads).lower()}
    with ServiceProcess(tmp_path / "auth.sqlite", tmp_path / "auth.log", env=env) as service:
        service.wait_live(LIVE_TIMEOUT_S)
        _push_secret_jobs(service.base_url, {"authorization": f"Bearer {TOKEN}"})
        scrape = httpx.get(f"{service.base_url}/metrics", timeout=30)  # no token
        assert scrape.status_code == 200, scrape.text[:300]
        samples = _job_samples(scrape.text)
        if auth_reads:
            assert "secret" not in scrape.text
            assert set(samples["datarax_job_seconds_since_last_push"]) == {"<all>"}
            assert samples["datarax_job_stragglers"] == {"<all>": 4.0}  # 2 + 2 missing
            listed = httpx.get(f"{service.base_url}/v1/jobs", timeout=30)
            assert_problem(listed, 401, "unauthorized")
        else:
            assert set(samples["datarax_job_stragglers"]) == {"secret-alpha", "secret-beta"}
            assert samples["datarax_job_stragglers"]["secret-alpha"] == 2.0
