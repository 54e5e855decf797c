"""Two and three ``datarax-serve`` replicas on one PostgreSQL database (issue 42), for real.

One PostgreSQL server of the module's own (tests/postgres_server.py: it is stopped,
killed and restarted by the last tests) and three replicas on one database of it, each
with its own ``--db`` folder, shared by the module's tests:

- steps pushed alternately, and at the same time, to 2 and to 3 replicas: every replica
  reads every step once, the job's point count right;
- the same step pushed to two replicas at once: stored once, both answers 2xx;
- other content for a step pushed to replicas at once: one 2xx, the others 409
  ``step_conflict``, whichever replica loses;
- parts of one step from several sources sent to different replicas: merged exactly as
  on one replica and as on a single SQLite process (reduced values and spread);
- three replicas pushing batches of one job at once: none refused with a 503, no
  readiness 503 (write contention is not unavailability); the other tests retry such
  503s as a client would, and print how many they met;
- kill -9 of a replica during batch pushes: every acknowledged step is read from the
  survivors and from the killed replica restarted, no half batch;
- the database stopped, or killed, and restarted while the replicas run: 503
  ``storage_unavailable`` with Retry-After and a 503 readiness naming the fault during
  the outage, recovery without a service restart, nothing acknowledged lost, and the
  503'd pushes retried end stored once.

Job pushes need no devices: the replicas are waited for until live (ready only where
readiness is under test).
"""

from __future__ import annotations

import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from app.main import create_app
from datarax.client import ApiError, Client
from datarax.distributed.metrics import reduce_custom
from tests.helpers import ServiceProcess, StubRuntime, TestClient, assert_problem, make_settings
from tests.postgres_fixtures import new_postgres_server
from tests.postgres_server import PostgresServer

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

LIVE_TIMEOUT_S = 60.0
CONDITION_TIMEOUT_S = 90.0  # a bound on waiting for a condition, never asserted as a timing
SOURCES = 3
PASSWORD = "pw-Never-Printed-7"  # in the replicas' URL: the test server trusts local users


class Cluster:
    """The module's PostgreSQL server, the database the replicas share, and the replicas
    (``live[i]``; a replica restarted takes its index again)."""

    def __init__(self, server: PostgresServer, url: str, folder: Path) -> None:
        self.server = server
        self.url = url
        self.folder = folder
        self.started: list[ServiceProcess] = []
        self.live: list[ServiceProcess] = []

    def __getitem__(self, index: int) -> ServiceProcess:
        return self.live[index]

    def start(self, index: int) -> ServiceProcess:
        """Starts replica ``index`` (its own --db folder, kept across restarts)."""
        db = self.folder / f"replica-{index}" / "datarax.sqlite"
        db.parent.mkdir(exist_ok=True)
        log = self.folder / f"replica-{index}-{len(self.started)}.log"
        replica = ServiceProcess(db, log, env={"DATARAX_DATABASE_URL": self.url})
        self.started.append(replica)
        return replica.start()

    def restart(self, index: int) -> ServiceProcess:
        self.live[index].stop()
        self.live[index] = replica = self.start(index)
        replica.wait_live(LIVE_TIMEOUT_S)
        return replica

    def logs(self) -> str:
        return "\n".join(
            f"--- replica {i} log tail:\n{r.log_tail(2000)}" for i, r in enumerate(self.live)
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    server = new_postgres_server().start()
    with server:
        url = server.create_database().replace("://datarax@", f"://datarax:{PASSWORD}@")
        cluster = Cluster(server, url, tmp_path_factory.mktemp("replicas"))
        try:
            started = time.monotonic()
            cluster.live = [cluster.start(i) for i in range(3)]
            for replica in cluster.live:
                replica.wait_live(LIVE_TIMEOUT_S)
            print(f"\n3 replicas live {time.monotonic() - started:.1f} s after their start")
            yield cluster
        finally:
            for replica in cluster.started:
                replica.stop()


# ------------------------------------------------------------------------ helpers


def _loss(step: int, device: int) -> float:
    return float((step * 7 + device * 3) % 11) / 4.0  # 4 distinct values: one min, one max


def _metrics(step: int) -> dict:
    return {"loss": [_loss(step, d) for d in range(4)], "lr": 0.5}


def _point(step: int) -> dict:
    return {"step": step, "metrics": _metrics(step)}


def _reduced(step: int) -> dict:
    return {"loss": float(np.mean([_loss(step, d) for d in range(4)])), "lr": 0.5}


def _spread(step: int) -> dict:
    values = [_loss(step, d) for d in range(4)]
    low, high = int(np.argmin(values)), int(np.argmax(values))
    return {"min": values[low], "max": values[high], "min_device": low, "max_device": high}


def _history(replica: ServiceProcess, job: str, **query: Any) -> list[dict]:
    with Client(replica.base_url, timeout_s=120) as api:
        return [dict(p) for p in api.iter_job_metrics(job, **query)]


def _job(replica: ServiceProcess, job: str) -> dict:
    with Client(replica.base_url, timeout_s=60) as api:
        return dict(api.get_job(job))


def _differences(got: list[int], expected: list[int]) -> str:
    counts = Counter(got)
    twice = sorted(s for s, n in counts.items() if n > 1)
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    return f"twice: {twice[:20]}, missing: {missing[:20]}, extra: {extra[:20]}"


def _assert_stored_once(cluster: Cluster, job: str, steps: Iterable[int]) -> None:
    """Every replica reads each of ``steps`` once, in order, with its values and spread,
    and counts them in the job's points."""
    expected = sorted(set(steps))
    for i, replica in enumerate(cluster.live):
        points = _history(replica, job, limit=997)  # several pages
        got = [p["step"] for p in points]
        assert got == expected, f"replica {i}: {_differences(got, expected)}"
        for point in points:
            assert point["reduced"] == _reduced(point["step"]), (i, point)
            assert point["spread"] == {"loss": _spread(point["step"])}, (i, point)
            assert point["complete"] and point["sources"] == 1, (i, point)
        summary = _job(replica, job)
        assert summary["points"] == len(expected), (i, summary)
        assert (summary["first_step"], summary["last_step"]) == (expected[0], expected[-1])


def _in_threads(target: Callable[[int], Any], count: int) -> list[Any]:
    """``target(i)`` for i < ``count``, each in its own thread; their results. Fails
    with the first exception any raised."""
    results: list[Any] = [None] * count
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = target(i)
        except BaseException as err:  # re-raised below, in the test's thread
            errors.append(err)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if errors:
        raise errors[0]
    return results


CONTENTION_503S: Counter[str] = Counter()
"""503 ``storage_unavailable`` answers the tests retried while the database was up: write
contention between replicas (see the contention test), counted per test and printed."""


def _is_503(answer: httpx.Response) -> bool:
    return answer.status_code == 503 and answer.json().get("code") == "storage_unavailable"


def _post(client: httpx.Client, path: str, body: dict, counter: str) -> httpx.Response:
    """POST, retried (at once, a bounded number of times) while the answer is 503
    ``storage_unavailable``: nothing was written then; the retry is what a client does."""
    for _ in range(50):
        answer = client.post(path, json=body)
        if not _is_503(answer):
            return answer
        CONTENTION_503S[counter] += 1
        time.sleep(0.01)
    return answer


def _stored[T](push: Callable[[], T], counter: str) -> T:
    """``push()`` (a datarax.client call without retries), again while it is refused 503
    ``storage_unavailable``: nothing was written then; the retry is what a client does."""
    for _ in range(50):
        try:
            return push()
        except ApiError as err:
            if (err.status, err.code) != (503, "storage_unavailable"):
                raise
            CONTENTION_503S[counter] += 1
            time.sleep(0.01)
    return push()


def _wait_for(condition: Callable[[], bool], what: str, cluster: Cluster) -> None:
    deadline = time.monotonic() + CONDITION_TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {CONDITION_TIMEOUT_S} s\n{cluster.logs()}")
        time.sleep(0.02)


# ------------------------------------------------------------ interleaved pushes


@pytest.mark.parametrize("n", [2, 3])
def test_interleaved_pushes_are_stored_once_and_read_alike_on_every_replica(cluster, n):
    job = f"interleaved-{n}"
    clients = [Client(r.base_url, retries=0, timeout_s=120) for r in cluster.live[:n]]
    try:
        for step in range(30):  # one after another, each to the next replica
            push = functools.partial(clients[step % n].push_job_metrics, job, step, _metrics(step))
            answer = _stored(push, job)
            assert answer["reduced"] == _reduced(step)

        def pusher(i: int) -> None:  # all replicas at once, steps interleaved among them
            with Client(cluster[i].base_url, retries=0, timeout_s=120) as api:
                for k in range(i, 24, n):  # batches of 5: steps 30-149
                    points = [_point(s) for s in range(30 + 5 * k, 35 + 5 * k)]
                    result = _stored(
                        functools.partial(api.push_job_metrics_batch, job, points), job
                    )
                    assert result["created"] == 5, result
                for step in range(150 + i, 240, n):
                    _stored(functools.partial(api.push_job_metrics, job, step, _metrics(step)), job)

        started = time.monotonic()
        _in_threads(pusher, n)
        print(f"{n} replicas at once: 150 steps in {time.monotonic() - started:.2f} s, "
              f"{CONTENTION_503S[job]} contention 503s retried")  # fmt: skip
    finally:
        for client in clients:
            client.close()
    _assert_stored_once(cluster, job, range(240))
    for i, replica in enumerate(cluster.live):
        with Client(replica.base_url) as api:
            listed = {j["job"]: j for j in api.list_jobs(limit=1000)["items"]}
        assert listed[job]["points"] == 240, (i, listed[job])


# ------------------------------------------------------------ pushes racing


def _race(cluster: Cluster, bodies: Callable[[int, int], dict], replicas: int, rounds: int,
          path: str) -> list[list[httpx.Response]]:  # fmt: skip
    """For each round, ``replicas`` threads (one a replica) POST ``bodies(i, round)`` to
    ``path`` at once (a barrier before each round); the answers, per round."""
    barrier = threading.Barrier(replicas)

    def racer(i: int) -> list[httpx.Response]:
        answers = []
        with cluster[i].client(timeout=120) as client:
            for n in range(rounds):
                body = bodies(i, n)
                barrier.wait(timeout=120)
                answers.append(_post(client, path, body, path))
        return answers

    per_replica = _in_threads(racer, replicas)
    if CONTENTION_503S[path]:
        print(f"{path}: {CONTENTION_503S[path]} contention 503s retried")
    return [[per_replica[i][n] for i in range(replicas)] for n in range(rounds)]


def test_the_same_step_pushed_to_two_replicas_at_once_is_stored_once(cluster):
    job, steps = "same-at-once", 60
    rounds = _race(cluster, lambda _i, n: _point(n), 2, steps, f"/v1/jobs/{job}/metrics")
    for step, answers in enumerate(rounds):
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 201], (step, [a.text for a in answers], cluster.logs())
        first, second = (a.json() for a in answers)
        assert first["reduced"] == second["reduced"] == _reduced(step)
        assert first["received_at"] == second["received_at"]  # the one stored point's

    # whole batches of the same steps, at once: each step created by one of them
    batch = 20
    body = lambda _i, n: {"points": [_point(steps + batch * n + k) for k in range(batch)]}  # noqa: E731
    for n, answers in enumerate(_race(cluster, body, 2, 5, f"/v1/jobs/{job}/metrics/batch")):
        assert all(a.status_code in (200, 201) for a in answers), [a.text for a in answers]
        results = [a.json() for a in answers]
        assert sum(r["created"] for r in results) == batch, (n, results)
        assert sum(r["unchanged"] for r in results) == batch, (n, results)
    _assert_stored_once(cluster, job, range(steps + 5 * batch))


@pytest.mark.parametrize("replicas,steps", [(2, 40), (3, 20)], ids=["2", "3"])
def test_conflicting_pushes_to_replicas_at_once_are_one_2xx_and_409s(cluster, replicas, steps):
    job = f"conflict-{replicas}"

    def body(i: int, step: int) -> dict:  # racer i's content: its own loss values
        return {"step": step, "metrics": {"loss": [float(i), float(step)]}}

    rounds = _race(cluster, body, replicas, steps, f"/v1/jobs/{job}/metrics")
    winners: Counter[int] = Counter()
    stored = {}
    for step, answers in enumerate(rounds):
        won = [i for i, a in enumerate(answers) if a.status_code < 300]
        assert len(won) == 1, (step, [(a.status_code, a.text) for a in answers], cluster.logs())
        assert answers[won[0]].status_code == 201
        for i, answer in enumerate(answers):
            if i != won[0]:
                problem = assert_problem(answer, 409, "step_conflict")
                assert str(step) in problem["detail"], problem
        winners[won[0]] += 1
        stored[step] = {"loss": (won[0] + step) / 2}
    print(f"{replicas} replicas racing, steps won per replica: {dict(sorted(winners.items()))}")
    for i, replica in enumerate(cluster.live):
        points = _history(replica, job)
        assert {p["step"]: p["reduced"] for p in points} == stored, i
        assert len(points) == steps and _job(replica, job)["points"] == steps


# ------------------------------------------------------------ parts from several sources


def _part(step: int, source: int) -> dict:
    rng = np.random.default_rng(step * 1000 + source)
    loss = rng.normal(size=2)
    if (step + source) % 7 == 0:
        loss[1] = np.nan  # omitted (nan_policy), and named in the answer's warnings
    return {
        "step": step,
        "metrics": {
            "loss": loss,
            "tokens": rng.integers(0, 100, size=2),
            "grad_norm": rng.uniform(0, 5, size=2),
        },
        "reduce": {"loss": "mean", "tokens": "sum", "grad_norm": "max"},
        "weights": rng.uniform(1, 3, size=2),
        "nan_policy": "omit",
    }


def _push_parts(clients: list[Client], job: str, source: int, barrier: Any) -> None:
    """Source ``source``'s parts of steps 0-39: steps 0-19 one push each, 20-39 in
    batches of 5; its k-th push goes to ``clients[(k + source) % len(clients)]``. With a
    barrier, every source pushes its k-th part at once."""
    name = f"host-{source}"
    for step in range(20):
        if barrier is not None:
            barrier.wait(timeout=120)
        part = _part(step, source)
        push = functools.partial(
            clients[(step + source) % len(clients)].push_job_metrics,
            job,
            step,
            part["metrics"],
            part["reduce"],
            weights=part["weights"],
            nan_policy=part["nan_policy"],
            source=name,
            sources=SOURCES,
        )
        _stored(push, job)
    for k, first in enumerate(range(20, 40, 5)):
        if barrier is not None:
            barrier.wait(timeout=120)
        points = [_part(s, source) for s in range(first, first + 5)]
        api = clients[(k + source) % len(clients)]
        _stored(functools.partial(api.push_job_metrics_batch, job, points, source=name,
                                  sources=SOURCES), job)  # fmt: skip


def _merged(step: int) -> dict:
    parts = [_part(step, s) for s in range(SOURCES)]
    reduced = reduce_custom(
        {name: np.concatenate([p["metrics"][name] for p in parts]) for name in parts[0]["reduce"]},
        parts[0]["reduce"],
        weights=np.concatenate([p["weights"] for p in parts]),
        nan_policy="omit",
    )
    return {name: float(value) for name, value in reduced.items()}


def _without_received_at(points: list[dict]) -> list[dict]:
    return [{k: v for k, v in p.items() if k != "received_at"} for p in points]


def test_parts_sent_to_different_replicas_merge_as_on_one_process(cluster, tmp_path):
    # The reference: the same parts, one source after another, to a single process on
    # SQLite (in this process; job pushes need no runtime).
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as app:
        # The TestClient's own transport (httpx keeps it as ``_transport``): the same
        # datarax.client calls as for the replicas, into the in-process app.
        with Client("http://testserver", transport=app._transport) as api:
            for source in range(SOURCES):
                _push_parts([api], "parts", source, None)
            reference = [dict(p) for p in api.iter_job_metrics("parts", include_partial=True)]
            reference_job = dict(api.get_job("parts"))
    assert [p["step"] for p in reference] == list(range(40))
    for point in reference:
        assert point["complete"] and point["sources"] == SOURCES, point
        assert point["reduced"] == pytest.approx(_merged(point["step"]), rel=1e-12), point
        assert set(point["spread"]) == {"loss", "tokens", "grad_norm"}, point
    assert reference_job["points"] == 40 and reference_job["incomplete_step"] is None

    # The sources at once: each part of a step to another replica; and all to one replica.
    for job, replicas in (("parts", [0, 1, 2]), ("parts-one-replica", [0])):
        barrier = threading.Barrier(SOURCES)

        def source(index: int, job=job, replicas=replicas, barrier=barrier) -> None:
            clients = [Client(cluster[i].base_url, retries=0, timeout_s=120) for i in replicas]
            try:
                _push_parts(clients, job, index, barrier)
            finally:
                for client in clients:
                    client.close()

        _in_threads(source, SOURCES)
        print(f"parts of {job!r}: {CONTENTION_503S[job]} contention 503s retried")
        for i, replica in enumerate(cluster.live):
            points = _history(replica, job, include_partial=True)
            assert _without_received_at(points) == _without_received_at(reference), (job, i)
            summary = _job(replica, job)
            assert summary["points"] == 40 and summary["incomplete_step"] is None, summary
            assert summary["lagging_sources"] == reference_job["lagging_sources"]

    # Every part again, to yet other replicas: no-ops, nothing merged twice.
    with Client(cluster[2].base_url) as api:
        again = api.push_job_metrics_batch(
            "parts", [_part(s, 1) for s in range(20, 40)], source="host-1", sources=SOURCES
        )
    assert again["unchanged"] == 20 and again["created"] == 0, again
    assert _without_received_at(_history(cluster[1], "parts", include_partial=True)) == (
        _without_received_at(reference)
    )


# ------------------------------------------------------------ write contention


def _watch_readiness(cluster: Cluster, stop: threading.Event, seen: Counter[int]) -> None:
    """Polls every replica's readiness until ``stop``; counts its 503
    ``storage_unavailable`` answers per replica in ``seen``."""
    clients = [r.client(timeout=60) for r in cluster.live]
    try:
        while not stop.is_set():
            for i, client in enumerate(clients):
                if _is_503(client.get("/health/ready")):
                    seen[i] += 1
            time.sleep(0.005)
    finally:
        for client in clients:
            client.close()


def test_pushes_from_three_replicas_to_one_job_at_once_are_not_refused(cluster):
    # Write contention is not unavailability: three replicas pushing batches of one job at
    # once (each replica one pusher, as three hosts of a job would) must all be stored
    # without a 503, and no replica's readiness may report the storage unavailable.
    job, size, batches = "contention", 50, 30
    stop, readiness_503 = threading.Event(), Counter[int]()
    watcher = threading.Thread(target=_watch_readiness, args=(cluster, stop, readiness_503))
    watcher.start()

    def pusher(i: int) -> list[tuple[int, int, str]]:
        refused = []
        with cluster[i].client(timeout=120) as client:
            for n in range(batches):
                first = (n * 3 + i) * size
                body = {"points": [_point(s) for s in range(first, first + size)]}
                answer = client.post(f"/v1/jobs/{job}/metrics/batch", json=body)
                if answer.status_code != 201:
                    refused.append((first, answer.status_code, answer.text[:400]))
                    retried = _post(client, f"/v1/jobs/{job}/metrics/batch", body, job)
                    assert retried.status_code == 201, retried.text  # stored by the retry
        return refused

    try:
        started = time.monotonic()
        refused = [r for per in _in_threads(pusher, 3) for r in per]
        print(f"contention: {3 * batches} batches from 3 replicas in "
              f"{time.monotonic() - started:.1f} s, {len(refused)} refused, readiness 503 "
              f"storage_unavailable {sum(readiness_503.values())} times")  # fmt: skip
    finally:
        stop.set()
        watcher.join(timeout=60)
    _assert_stored_once(cluster, job, range(3 * batches * size))  # after the retries
    warned = [
        line[:300]
        for replica in cluster.live
        for line in replica.log_path.read_text(errors="replace").splitlines()
        if "cannot take writes" in line
    ]
    assert not refused and not readiness_503, (
        f"{len(refused)} of {3 * batches} pushes refused, first: {refused[:2]}; readiness "
        f"503 storage_unavailable per replica: {dict(readiness_503)}; the replicas logged "
        f"{len(warned)} storage faults, first: {warned[:2]}"
    )


# ------------------------------------------------------------ kill -9 of a replica


def _push_batch(api: Client, job: str, first: int, size: int) -> bool:
    """Pushes the batch of ``size`` steps from ``first``, again while it is answered 503
    ``storage_unavailable`` (nothing written: contention); True once acknowledged, False
    when the replica is gone (a lost connection) or answers anything else."""
    points = [_point(s) for s in range(first, first + size)]
    for _ in range(50):
        try:
            api.push_job_metrics_batch(job, points)
            return True
        except ApiError as err:
            if (err.status, err.code) != (503, "storage_unavailable"):
                return False
            CONTENTION_503S[job] += 1
        except httpx.HTTPError:
            return False
    return False


def test_kill_9_of_a_replica_during_batch_pushes_loses_no_acknowledged_step(cluster):
    job, size, victim = "crash", 100, 1
    targets = [cluster[victim], cluster[victim], cluster[0], cluster[2]]  # per pusher
    attempted: set[int] = set()  # first steps of batches
    acknowledged: set[int] = set()
    survivors_after_kill: list[int] = []
    survivor_errors: list[int] = []  # batches a survivor did not acknowledge
    stop, killed = threading.Event(), threading.Event()

    def pusher(worker: int) -> None:
        with Client(targets[worker].base_url, retries=0, timeout_s=120) as api:
            for n in range(10_000):
                if stop.is_set():
                    return
                first = (n * len(targets) + worker) * size
                attempted.add(first)
                if not _push_batch(api, job, first, size):
                    if targets[worker] is not cluster[victim]:
                        survivor_errors.append(first)
                    return
                acknowledged.add(first)
                if killed.is_set() and targets[worker] is not cluster[victim]:
                    survivors_after_kill.append(first)

    threads = [threading.Thread(target=pusher, args=(w,)) for w in range(len(targets))]
    for thread in threads:
        thread.start()
    try:
        by_victim = lambda: [s for s in acknowledged if (s // size) % len(targets) < 2]  # noqa: E731
        _wait_for(lambda: len(by_victim()) >= 6, "6 batches acknowledged by the victim", cluster)
        cluster[victim].kill()  # SIGKILL while its pushers are mid-request
        killed.set()
        _wait_for(lambda: len(survivors_after_kill) >= 4, "4 batches after the kill", cluster)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    assert not survivor_errors, (survivor_errors, cluster.logs())
    print(f"kill -9: {len(acknowledged)} of {len(attempted)} batches acknowledged, "
          f"{len(by_victim())} by the victim; {CONTENTION_503S[job]} contention 503s "
          "retried")  # fmt: skip

    survivor = _history(cluster[0], job, limit=10_000)
    stored = [p["step"] for p in survivor]
    assert len(stored) == len(set(stored)) and stored == sorted(stored)
    present = set(stored)
    for first in attempted:
        batch = [s in present for s in range(first, first + size)]
        assert all(batch) or not any(batch), f"half of batch {first} is stored"
        if first in acknowledged:
            assert all(batch), f"acknowledged batch {first} was lost"
    for point in survivor:
        assert point["reduced"] == _reduced(point["step"]), point
    landed = [f for f in attempted - acknowledged if f in present]
    print(f"kill -9: {len(landed)} unacknowledged batches were stored whole, the rest not at all")
    assert _job(cluster[0], job)["points"] == len(stored)

    restarted = cluster.restart(victim)
    assert _history(restarted, job, limit=10_000) == survivor
    assert _history(cluster[2], job, limit=10_000) == survivor
    assert _job(restarted, job)["points"] == len(stored)


# ------------------------------------------------------------ the database restarts


class OutagePushers:
    """One thread per replica pushing single steps of its own (retries off) until
    stopped: what was acknowledged, what was answered 503 ``storage_unavailable`` (with
    Retry-After), and anything else (which should not happen)."""

    def __init__(self, cluster: Cluster, job: str) -> None:
        self.cluster, self.job = cluster, job
        self.acked: list[set[int]] = [set() for _ in cluster.live]
        self.failed: list[set[int]] = [set() for _ in cluster.live]
        self.other: list[str] = []
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._push, args=(i,)) for i in range(len(cluster.live))
        ]

    def _push(self, i: int) -> None:
        with self.cluster[i].client(timeout=120) as client:
            for k in range(1_000_000):
                if self.stop.is_set():
                    return
                step = 30_000 + k * len(self.threads) + i  # step % 3 == i
                try:
                    answer = client.post(f"/v1/jobs/{self.job}/metrics", json=_point(step))
                except httpx.HTTPError as err:
                    self.other.append(f"replica {i} step {step}: {err!r}")
                    return
                if answer.status_code in (200, 201):
                    self.acked[i].add(step)
                    continue
                body = answer.json()
                if (answer.status_code, body.get("code")) != (503, "storage_unavailable") or (
                    not answer.headers.get("retry-after")
                ):
                    self.other.append(f"replica {i} step {step}: {answer.status_code} {body}")
                self.failed[i].add(step)
                time.sleep(0.05)

    def __enter__(self) -> OutagePushers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)


def _during_outage(cluster: Cluster, job: str, failed: set[int]) -> None:
    """Every replica answers a push 503 ``storage_unavailable`` with Retry-After, and
    readiness 503 naming the storage fault (also with Retry-After)."""
    for i, replica in enumerate(cluster.live):
        with replica.client(timeout=120) as client:
            step = 900_000 + i
            answer = client.post(f"/v1/jobs/{job}/metrics", json=_point(step))
            assert_problem(answer, 503, "storage_unavailable")
            assert int(answer.headers["retry-after"]) > 0, answer.headers
            failed.add(step)
            ready = client.get("/health/ready")
            body = assert_problem(ready, 503, "storage_unavailable")
            assert int(ready.headers["retry-after"]) > 0, ready.headers
            assert body["store"] == "unavailable" and body["store_reason"], body
            assert body["store_fault_since"] and body["store_checked_at"], body
            assert PASSWORD not in answer.text + ready.text
            print(f"replica {i} readiness during the outage: {body['detail'][:160]!r}")


def _recovered(cluster: Cluster, pids: list[int]) -> None:
    """Every replica's readiness turns 200 by itself: same processes, no restart."""
    deadline = time.monotonic() + CONDITION_TIMEOUT_S
    for i, replica in enumerate(cluster.live):
        with replica.client(timeout=120) as client:
            while (answer := client.get("/health/ready")).status_code != 200:
                if time.monotonic() > deadline:
                    pytest.fail(f"replica {i} not ready again: {answer.text}\n{cluster.logs()}")
                time.sleep(0.1)
        assert replica.proc is not None and replica.proc.pid == pids[i]
        assert replica.proc.poll() is None, f"replica {i} exited"


@pytest.mark.parametrize("outage", ["stop", "kill"])
def test_a_database_restart_is_503_then_the_replicas_recover_by_themselves(cluster, outage):
    job = f"outage-{outage}"
    for replica in cluster.live:
        replica.wait_ready()  # readiness is under test: the runtimes too
    pids = [r.proc.pid for r in cluster.live if r.proc is not None]
    before = range(30)
    with Client(cluster[0].base_url) as api:
        api.push_job_metrics_batch(job, [_point(s) for s in before])
    probes: set[int] = set()
    with OutagePushers(cluster, job) as pushers:
        counts = lambda sets: [len(s) for s in sets]  # noqa: E731
        _wait_for(lambda: min(counts(pushers.acked)) >= 3, "3 pushes acknowledged", cluster)
        down = time.monotonic()
        if outage == "stop":
            cluster.server.stop()  # fast shutdown: sessions ended, the data kept
        else:
            cluster.server.kill()  # a crash: WAL recovery at the restart
        _during_outage(cluster, job, probes)
        _wait_for(lambda: min(counts(pushers.failed)) >= 2, "2 pushes answered 503", cluster)
        acked_before = counts(pushers.acked)
        cluster.server.restart()
        back = time.monotonic()
        _recovered(cluster, pids)
        print(f"database {outage}: down {back - down:.1f} s, every replica ready "
              f"{time.monotonic() - back:.1f} s after its restart")  # fmt: skip
        _wait_for(
            lambda: all(
                n >= m + 3 for n, m in zip(counts(pushers.acked), acked_before, strict=True)
            ),
            "3 pushes acknowledged per replica after the restart",
            cluster,
        )
    assert not pushers.other, (pushers.other[:10], cluster.logs())
    acked = set().union(*pushers.acked)
    failed = set().union(*pushers.failed) | probes
    assert not acked & failed
    print(f"database {outage}: {len(acked)} pushes acknowledged, {len(failed)} answered 503")

    # A client retrying its 503'd pushes (each to the replica it first tried): all stored.
    for i, replica in enumerate(cluster.live):
        with Client(replica.base_url, retries=10, timeout_s=120) as api:
            for step in sorted(s for s in failed if s % len(cluster.live) == i):
                answer = api.push_job_metrics(job, step, _metrics(step))
                assert answer["reduced"] == _reduced(step)
    _assert_stored_once(cluster, job, [*before, *acked, *failed])
    for i, replica in enumerate(cluster.live):  # their warnings name the database
        log = replica.log_path.read_text(errors="replace")
        assert PASSWORD not in log and "the PostgreSQL database " in log, (i, replica.log_tail())
