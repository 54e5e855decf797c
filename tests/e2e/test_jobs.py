"""Job history against the real ``datarax-serve``, driven by ``datarax.client``: kill -9
during batch pushes, many concurrent pushers, multi-source parts under concurrency.

Every test runs on each store (``serve``): the SQLite file ``--db`` names, and a fresh
PostgreSQL database given as DATARAX_DATABASE_URL (a restarted server gets the same one).
Job pushes need no device, so these tests wait for liveness only (not the runtime).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import psycopg
import pytest

from datarax.client import ApiError, AsyncClient, Client
from datarax.distributed.metrics import reduce_custom
from tests.helpers import ServiceProcess

pytestmark = pytest.mark.timeout(240)

LIVE_TIMEOUT_S = 60.0
DATABASE_URL = "DATARAX_DATABASE_URL"


@pytest.fixture(params=["sqlite", "postgres"])
def serve(request) -> Iterator[Callable[[Path, Path], ServiceProcess]]:
    """``serve(db, log_path)``: a ``ServiceProcess`` on each store in turn, the SQLite file
    ``db`` (a DATARAX_DATABASE_URL of the caller's environment removed), or one fresh
    database of the session's PostgreSQL for every server of the test (skips loudly
    without PostgreSQL, fails under CI). Afterwards, checks that the servers stored their
    jobs where they were told to."""
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    options: dict = {"unset": (DATABASE_URL,)} if url is None else {"env": {DATABASE_URL: url}}
    started: list[Path] = []

    def start(db: Path, log_path: Path) -> ServiceProcess:
        started.append(db)
        return ServiceProcess(db, log_path, **options)

    yield start
    if started and url is None:
        assert all(db.exists() for db in started), started
    elif started:
        with psycopg.connect(url) as conn:
            jobs = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        assert jobs > 0, f"the servers stored no job in {url}"


def _loss(step: int, device: int) -> float:
    return float((step * 7 + device * 3) % 11) / 4.0


def _batch(first: int, size: int) -> list[dict]:
    return [
        {"step": s, "metrics": {"loss": [_loss(s, d) for d in range(4)], "lr": 0.5}}
        for s in range(first, first + size)
    ]


def test_kill_9_during_batch_pushes_loses_no_acknowledged_point_and_no_half_batch(tmp_path, serve):
    db = tmp_path / "jobs.sqlite"
    size = 200
    acknowledged: set[int] = set()  # first steps of acknowledged batches
    attempted: set[int] = set()
    stop = threading.Event()
    with serve(db, tmp_path / "first.log") as first:
        first.wait_live(LIVE_TIMEOUT_S)

        def pusher(worker: int) -> None:
            with Client(first.base_url, retries=0, timeout_s=30) as api:
                for n in range(10_000):
                    if stop.is_set():
                        return
                    start = (n * 4 + worker) * size
                    attempted.add(start)
                    try:
                        api.push_job_metrics_batch("crash", _batch(start, size))
                    except (httpx.HTTPError, ApiError):
                        return
                    acknowledged.add(start)

        threads = [threading.Thread(target=pusher, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while len(acknowledged) < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        first.kill()  # SIGKILL while the pushers are mid-request
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert len(acknowledged) >= 12, "too few batches acknowledged before the kill"

    with serve(db, tmp_path / "second.log") as second:
        second.wait_live(LIVE_TIMEOUT_S)
        with Client(second.base_url) as api:
            points = list(api.iter_job_metrics("crash", limit=10_000))
    stored = {p["step"]: p["reduced"] for p in points}
    assert len(stored) == len(points)  # every step once
    for start in attempted:
        present = [s in stored for s in range(start, start + size)]
        assert all(present) or not any(present), f"half of batch {start} is stored"
        if start in acknowledged:
            assert all(present), f"acknowledged batch {start} was lost"
    for step, reduced in stored.items():
        assert reduced == {"loss": float(np.mean([_loss(step, d) for d in range(4)])), "lr": 0.5}


def test_100_concurrent_pushers_to_10_jobs_store_every_point_exactly_once(tmp_path, serve):
    with serve(tmp_path / "db.sqlite", tmp_path / "server.log") as service:
        service.wait_live(LIVE_TIMEOUT_S)

        async def pusher(api: AsyncClient, worker: int) -> list[tuple[str, int]]:
            job = f"job-{worker % 10}"
            done = []
            for k in range(5):
                step = worker * 100 + k
                answer = await api.push_job_metrics(job, step, {"loss": [step, step + 1.0]})
                assert answer["complete"] and answer["reduced"] == {"loss": step + 0.5}
                if k % 3 == 0:  # a retry after a "lost" answer: a no-op
                    again = await api.push_job_metrics(job, step, {"loss": [step, step + 1.0]})
                    assert again["received_at"] == answer["received_at"]
                done.append((job, step))
            return done

        async def main() -> list[tuple[str, int]]:
            limits = httpx.Limits(max_connections=100)
            async with AsyncClient(service.base_url, timeout_s=120) as api:
                api._http._transport = httpx.AsyncHTTPTransport(limits=limits)
                results = await asyncio.gather(*(pusher(api, w) for w in range(100)))
            return [pair for result in results for pair in result]

        acknowledged = asyncio.run(main())
        with Client(service.base_url) as api:
            jobs = {j["job"]: j for j in api.list_jobs(limit=1000)["items"]}
            for n in range(10):
                job = f"job-{n}"
                steps = [p["step"] for p in api.iter_job_metrics(job, limit=37)]
                expected = sorted(step for name, step in acknowledged if name == job)
                assert steps == expected  # each acknowledged point, once, in step order
                assert jobs[job]["points"] == len(expected) == 50


def _part(step: int, source: int) -> dict:
    rng = np.random.default_rng(step * 1000 + source)
    loss = rng.normal(size=2)
    if (step + source) % 17 == 0:
        loss[0] = np.nan
    return {
        "step": step,
        "metrics": {"loss": loss, "tokens": rng.integers(0, 100, size=2)},
        "reduce": {"loss": "mean", "tokens": "sum"},
        "weights": rng.uniform(1, 3, size=2),
        "nan_policy": "omit",
    }


def _expected(step: int, sources: int) -> dict:
    parts = [_part(step, s) for s in range(sources)]
    reduced = reduce_custom(
        {
            "loss": np.concatenate([p["metrics"]["loss"] for p in parts]),
            "tokens": np.concatenate([p["metrics"]["tokens"] for p in parts]),
        },
        {"loss": "mean", "tokens": "sum"},
        weights=np.concatenate([p["weights"] for p in parts]),
        nan_policy="omit",
    )
    return {"loss": float(reduced["loss"]), "tokens": int(reduced["tokens"])}


def test_64_sources_merge_exactly_once_then_survive_kill_9(tmp_path, serve):
    sources, steps, per_batch = 64, 100, 25
    db = tmp_path / "multi.sqlite"

    async def push_all(
        base_url: str,
        first_step: int,
        stop_after: int | None,
        acknowledged: set[tuple[int, int]] | None = None,
    ) -> set:
        acknowledged = set() if acknowledged is None else acknowledged  # read by the test

        async def source(api: AsyncClient, index: int) -> None:
            for start in range(first_step, first_step + steps, per_batch):
                points = [_part(s, index) for s in range(start, start + per_batch)]
                try:
                    await api.push_job_metrics_batch(
                        "multi", points, source=f"host-{index}", sources=sources
                    )
                except (httpx.HTTPError, ApiError):
                    return
                acknowledged.update((s, index) for s in range(start, start + per_batch))
                if stop_after is not None and len(acknowledged) >= stop_after:
                    return

        async with AsyncClient(base_url, timeout_s=120, retries=0) as api:
            await asyncio.gather(*(source(api, i) for i in range(sources)))
        return acknowledged

    with serve(db, tmp_path / "first.log") as first:
        first.wait_live(LIVE_TIMEOUT_S)
        acknowledged = asyncio.run(push_all(first.base_url, 0, None))
        assert len(acknowledged) == sources * steps
        with Client(first.base_url) as api:
            points = list(api.iter_job_metrics("multi", limit=1000))
            assert [p["step"] for p in points] == list(range(steps))
            for point in points:
                assert point["sources"] == sources
                assert point["reduced"] == _expected(point["step"], sources), point["step"]
            # Every part again: all no-ops, nothing counted twice.
            retry = api.push_job_metrics_batch(
                "multi", [_part(s, 5) for s in range(25)], source="host-5", sources=sources
            )
            assert retry["unchanged"] == 25 and retry["created"] == 0

        # Second round of steps, killed mid-way: once a quarter of its parts are stored.
        box: dict[str, set] = {}
        progress: set[tuple[int, int]] = set()
        thread = threading.Thread(
            target=lambda: box.setdefault(
                "ack", asyncio.run(push_all(first.base_url, 100, None, progress))
            )
        )
        thread.start()
        deadline = time.monotonic() + 60
        while len(progress) < sources * steps // 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        first.kill()
        thread.join(timeout=120)
    second_round = box.get("ack", set())
    print(f"second round: {len(second_round)} of {sources * steps} parts acknowledged")

    with serve(db, tmp_path / "second.log") as second:
        second.wait_live(LIVE_TIMEOUT_S)
        with Client(second.base_url) as api:
            partial = list(api.iter_job_metrics("multi", include_partial=True, limit=1000))
            by_step = {p["step"]: p for p in partial}
            for step, index in second_round:  # acknowledged parts survived
                point = by_step[step]
                assert point["complete"] or f"host-{index}" in point["received_sources"]
            # Finish every step: parts already stored are no-ops, the rest are new.
            asyncio.run(push_all(second.base_url, 100, None))
            points = list(api.iter_job_metrics("multi", limit=1000))
            assert [p["step"] for p in points] == list(range(2 * steps))
            for point in points:
                assert point["reduced"] == _expected(point["step"], sources), point["step"]
            job = api.get_job("multi")
            assert job["points"] == 2 * steps and job["incomplete_step"] is None


def test_pushers_keep_batches_in_flight_and_store_what_was_pushed(tmp_path, serve):
    # Client.pusher / AsyncClient.pusher against the real server: 12 batches of 50 steps
    # with 3 in flight, the same array buffer refilled after every push (the pusher
    # encodes at push time, so each batch is stored as it was when pushed), results in
    # push order; then a refused batch raises its problem at flush while the batches
    # pushed with it are stored.
    steps_per, batches, devices = 50, 12, 4

    def values(batch: int) -> np.ndarray:
        return np.arange(steps_per * devices, dtype=np.float64).reshape(steps_per, devices) + (
            1000.0 * batch
        )

    def expected() -> list:
        return [
            {"loss": float(values(b)[i].mean())} for b in range(batches) for i in range(steps_per)
        ]

    with serve(tmp_path / "db.sqlite", tmp_path / "server.log") as service:
        service.wait_live(LIVE_TIMEOUT_S)
        buffer = np.empty((steps_per, devices))
        with Client(service.base_url) as api:
            with api.pusher("bg", in_flight=3) as pusher:
                for b in range(batches):
                    buffer[:] = values(b)
                    pusher.push_arrays(
                        np.arange(b * steps_per, (b + 1) * steps_per), {"loss": buffer}
                    )
            assert [r["created"] for r in pusher.results] == [steps_per] * batches
            assert [p["reduced"] for p in api.iter_job_metrics("bg")] == expected()

            clash = {"step": 0, "metrics": {"loss": [9.0, 9.0, 9.0, 9.0]}}
            pusher = api.pusher("bg", in_flight=2)
            # The refusal surfaces at the next push or at close: pushed last, at close.
            pusher.push_batch([{"step": 10_000, "metrics": {"loss": [1.0, 3.0, 5.0, 7.0]}}])
            pusher.push_batch([clash])  # step 0 holds other content: 409
            with pytest.raises(ApiError) as info:
                pusher.close()
            assert info.value.code == "step_conflict"
            assert api.get_job_metrics("bg", since_step=10_000)["points"][0]["reduced"] == {
                "loss": 4.0
            }
            with pytest.raises(ValueError, match="in_flight"):
                api.pusher("bg", in_flight=0)

        async def main() -> list:
            async with AsyncClient(service.base_url) as api:
                async with api.pusher("bg-async", in_flight=3) as pusher:
                    for b in range(batches):
                        buffer[:] = values(b)
                        steps = np.arange(b * steps_per, (b + 1) * steps_per)
                        await pusher.push_arrays(steps, {"loss": buffer})
                assert len(pusher.results) == batches
                return [p["reduced"] async for p in api.iter_job_metrics("bg-async")]

        assert asyncio.run(main()) == expected()


def test_a_launched_job_links_itself_to_its_plan_and_reports_its_step_time(
    tmp_path, monkeypatch, serve
):
    # The launch config's env (DATARAX_PLAN_ID, DATARAX_URL) is all the job needs: its
    # client reaches the service, its pusher links the job to the plan on the first
    # stored batch, and the job answers the plan's step time against the measured one.
    plan_body = {
        "hardware": "tpu-v5e",
        "topology": "2x2",
        "ici": {"fsdp": 4},
        "batch_shape": [8, 2048],
        "model": {"name": "llama2-7b", "seq_len": 2048, "remat": "full"},
    }
    with serve(tmp_path / "db.sqlite", tmp_path / "server.log") as service:
        service.wait_live(LIVE_TIMEOUT_S)
        with Client(service.base_url) as api:
            plan = api.create_mesh(plan_body)
            env = api.launch(plan["id"], "env", service_url=service.base_url)["env"]
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        with Client() as job_api:  # DATARAX_URL
            with job_api.pusher("trained") as pusher:
                step_times = np.array([[9.0], [1.2], [1.0], [1.1]])
                pusher.push_arrays(np.arange(4), {"step_time": step_times, "loss": step_times})
            assert pusher.link_error is None and pusher.linked is not None
            fidelity = job_api.fidelity("trained")
        predicted = plan["step_estimate"]["step_s"]
        assert fidelity["plan"] == plan["id"] and fidelity["points"] == 4
        assert fidelity["predicted_step_s"] == predicted
        assert fidelity["measured_step_s"] == pytest.approx(1.15)
        assert fidelity["error"] == pytest.approx(predicted / 1.15 - 1)
        # and a profile fitted on what the job measured prices the plan's next run
        with Client() as job_api:
            profile = job_api.calibrate(["trained"])
            assert profile["kind"] == "jobs" and profile["measurements"][0]["job"] == "trained"
            again = job_api.create_mesh({**plan_body, "calibration": profile["id"]})
        assert again["step_estimate"]["calibration"] == profile["id"]
        # within the fit's own error on the job (a grid fit of one row)
        off = abs(again["step_estimate"]["step_s"] / 1.15 - 1)
        assert off == pytest.approx(profile["error"]["training_mae"]) and off < 0.1
        # the host measures its own devices: the client starts it and follows it
        with Client() as job_api:
            host = job_api.calibrate_host()
            assert host["kind"] == "host" and host["status"] == "running"
            deadline = time.monotonic() + 300
            while (host := job_api.get_calibration(host["id"]))["status"] == "running":
                assert time.monotonic() < deadline, host["progress"]
                time.sleep(0.2)
            assert host["status"] == "done" and host["constants"]["matmul"] > 0
        # a plan the service does not hold: the pushes go on, the failed link is kept
        monkeypatch.setenv("DATARAX_PLAN_ID", "no-such-plan")
        with Client() as job_api:
            with pytest.warns(RuntimeWarning, match="no-such-plan"):
                with job_api.pusher("orphan") as pusher:
                    pusher.push_arrays(np.arange(2), {"step_time": np.ones((2, 1))})
            assert isinstance(pusher.link_error, ApiError)
            assert pusher.link_error.code == "mesh_not_found"
            assert job_api.get_job("orphan")["points"] == 2
            assert job_api.fidelity("orphan") is None

        # the asyncio pusher links the same way; plan="" links nothing
        async def pushes() -> tuple:
            async with AsyncClient(service.base_url) as api:
                async with api.pusher("async-linked", plan=plan["id"]) as linked:
                    await linked.push_arrays(np.arange(3), {"step_time": np.full((3, 1), 2.0)})
                async with api.pusher("async-unlinked", plan="") as unlinked:
                    await unlinked.push_arrays(np.arange(1), {"step_time": np.ones((1, 1))})
                return (
                    linked,
                    await api.fidelity("async-linked"),
                    await api.fidelity("async-unlinked"),
                )

        linked, fidelity, none = asyncio.run(pushes())
        assert linked.link_error is None and fidelity["measured_step_s"] == 2.0
        assert none is None
