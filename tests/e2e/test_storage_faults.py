"""Storage faults against the real ``datarax-serve`` and real SQLite files.

- An unusable database at start: one line, its own exit status, the file untouched.
- Faults while serving, made for real: ``chattr +i`` (which even root cannot write past)
  on the WAL, on the database file, on its directory, on a stale ``-shm`` file; a real
  full disk (a small tmpfs, filled). Each answers writes with the right status and code
  (503 ``storage_unavailable``, 507 ``storage_full``) or keeps taking them where the data
  stays durable, readiness says so and recovers once the fault is lifted, the process
  never dies (no SIGBUS: nothing maps a ``-shm`` file), and every acknowledged write is
  still there, also after a ``kill -9`` and a restart.
- A full disk under the in-process app, with SQLite's ``max_page_count`` (SQLITE_FULL
  exactly as a full disk gives it): runs wherever tmpfs cannot be mounted.
- Deletes on a real full disk (issue 41): every ``DELETE`` route answers 2xx through the
  space reserve (``<db>-reserve``), a job too big for its room in pieces; what was deleted
  is gone, everything else stays, writes work again in the freed room, also after a
  ``kill -9``; on a disk full before the reserve could be made, deletes are 507
  ``storage_full`` saying so, until space is freed.

Faults that need root tricks skip loudly, naming what is missing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

import app.storage.db as store_module
from app.cli import EXIT_BAD_DATABASE
from app.main import create_app
from app.storage import migrations
from app.storage.reserve import RESERVE_BYTES, SIGNATURE, disk_free
from tests.helpers import (
    ServiceProcess,
    StubRuntime,
    TestClient,
    assert_problem,
    make_settings,
    pid_alive,
)

pytestmark = pytest.mark.timeout(300)

JOB = "faults"
RECOVERY_TIMEOUT_S = 30.0
CHECKPOINT_WAL_BYTES = 1000 * 4096  # SQLite's wal_autocheckpoint, in 4 KiB pages


def _garbage(path):
    path.write_bytes(b"this is not an SQLite database, it is the user's file\n" * 200)


def _truncated(path):
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [(b"x" * 1000,) for _ in range(50)])
    conn.close()
    data = path.read_bytes()
    path.write_bytes(data[:100] + b"\xff" * 400)  # a header, then noise


@pytest.mark.parametrize("damage", [_garbage, _truncated], ids=["not-sqlite", "truncated"])
def test_unusable_database_is_one_line_and_its_own_exit_code(tmp_path, damage):
    db = tmp_path / "datarax.sqlite"
    damage(db)
    before = db.read_bytes()
    service = ServiceProcess(db, tmp_path / "server.log")
    done = subprocess.run(
        service.command(),
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "DATARAX_PLATFORMS": "cpu"},
        check=False,
    )
    assert done.returncode == EXIT_BAD_DATABASE, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert str(db) in lines[0] and "Traceback" not in done.stderr
    assert db.read_bytes() == before  # never overwritten


# ------------------------------------------------------------------------ helpers


class Writes:
    """Plans and job points written through the API; remembers every acknowledged one."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client
        self.plans: dict[str, dict] = {}
        self.steps: list[int] = []
        self._next_step = 0

    def plan(self, devices: int = 64) -> httpx.Response:
        answer = self.client.post("/v1/meshes", json={"axes": {"data": -1}, "num_devices": devices})
        if answer.status_code == 201:
            self.plans[answer.json()["id"]] = answer.json()
        return answer

    def push(self) -> httpx.Response:
        step, self._next_step = self._next_step, self._next_step + 1
        body = {"step": step, "metrics": {"loss": [float(step), step + 1.0]}}
        answer = self.client.post(f"/v1/jobs/{JOB}/metrics", json=body)
        if answer.status_code in (200, 201):
            self.steps.append(step)
        return answer

    def some(self, count: int = 3) -> None:
        for _ in range(count):
            assert self.plan().status_code == 201
            assert self.push().status_code == 201

    def check_all_stored(self, client: httpx.Client | None = None) -> None:
        """Every acknowledged write reads back as answered, and nothing else was stored."""
        client = client or self.client
        for plan_id, body in self.plans.items():
            answer = client.get(f"/v1/meshes/{plan_id}")
            assert answer.status_code == 200, (plan_id, answer.text)
            assert answer.json() == body
        listed = client.get("/v1/meshes", params={"limit": 100}).json()
        assert listed["total"] == len(self.plans)  # a refused write left no plan behind
        points = client.get(f"/v1/jobs/{JOB}/metrics", params={"limit": 1000}).json()
        assert [p["step"] for p in points["points"]] == self.steps
        for point in points["points"]:
            assert point["reduced"]["loss"] == point["step"] + 0.5


def _poll(check: Callable[[], bool], what: str, timeout: float = RECOVERY_TIMEOUT_S) -> float:
    """Waits until ``check()`` is true; returns the seconds it took."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if check():
            return time.monotonic() - start
        time.sleep(0.1)
    pytest.fail(f"{what} within {timeout} s")


def _ready(client: httpx.Client) -> bool:
    return client.get("/health/ready").status_code == 200


def _maps_shm(pid: int) -> list[str]:
    """The lines of ``/proc/<pid>/maps`` that map a ``-shm`` file (SQLite's wal-index)."""
    return [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "-shm" in line]


def _assert_alive_and_unmapped(
    service: ServiceProcess, pid: int, runtime_pid: int, *, stale_shm: bool = False
) -> None:
    """The same server and runtime processes still run; no ``-shm`` is mapped or made."""
    assert service.proc is not None and service.proc.poll() is None, service.log_tail()
    assert service.proc.pid == pid
    assert pid_alive(runtime_pid)  # the runtime did not go down with a storage fault
    assert _maps_shm(pid) == []
    assert Path(f"{service.db}-shm").exists() == stale_shm


def _probed_after(client: httpx.Client, checked_at: str, status: int, code: str) -> dict:
    """Polls readiness until its store check is newer than ``checked_at`` (the probe ran
    again); that answer must still be the fault's."""
    answers: list[dict] = []

    def probed() -> bool:
        body = assert_problem(client.get("/health/ready"), status, code)
        answers.append(body)
        return body["store_checked_at"] > checked_at

    _poll(probed, "a new readiness probe")
    return answers[-1]


class Immutable:
    """``chattr +i`` / ``-i`` on paths; every flag still set is lifted at teardown."""

    def __init__(self) -> None:
        self.held: set[Path] = set()

    def set(self, *paths: Path) -> None:
        subprocess.run(["chattr", "+i", *map(str, paths)], check=True, capture_output=True)
        self.held.update(paths)

    def lift(self, *paths: Path) -> None:
        subprocess.run(["chattr", "-i", *map(str, paths)], check=True, capture_output=True)
        self.held.difference_update(paths)


@pytest.fixture
def immutable(tmp_path) -> Iterator[Immutable]:
    probe = tmp_path / "chattr-probe"
    probe.write_text("x")
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: the immutable-file faults need it")
    done = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i does not work here (root on ext4/xfs/btrfs): {done.stderr}")
    try:
        with pytest.raises(PermissionError):
            probe.write_text("y")  # immutable binds root too, unlike chmod
    finally:
        subprocess.run(["chattr", "-i", str(probe)], check=True)
    flags = Immutable()
    yield flags
    for path in list(flags.held):
        subprocess.run(["chattr", "-i", str(path)], check=False)


def _restart_and_check(service: ServiceProcess, writes: Writes, tmp_path: Path) -> None:
    """kill -9 the server, start a new one on the same file, read everything back."""
    service.stop()
    with ServiceProcess(service.db, tmp_path / "server-2.log") as again:
        again.wait_ready()
        with again.client() as client:
            writes.check_all_stored(client)


# ------------------------------------------------------- faults that stop writes


def _wal(db: Path) -> list[Path]:
    return [Path(f"{db}-wal")]


def _database_and_wal(db: Path) -> list[Path]:
    return [db, Path(f"{db}-wal")]


@pytest.mark.slow
@pytest.mark.parametrize(
    "targets", [_wal, _database_and_wal], ids=["immutable-wal", "immutable-database-and-wal"]
)
def test_unwritable_storage_is_503_until_lifted_and_loses_nothing(tmp_path, immutable, targets):
    db = tmp_path / "data" / "datarax.sqlite"
    with ServiceProcess(db, tmp_path / "server.log") as service:
        runtime_pid = service.wait_ready()["runtime_pid"]
        pid = service.proc.pid
        with service.client() as client:
            writes = Writes(client)
            writes.some()
            _assert_alive_and_unmapped(service, pid, runtime_pid)

            paths = targets(db)
            immutable.set(*paths)
            for attempt in (writes.plan, writes.push, writes.plan, writes.push):
                body = assert_problem(attempt(), 503, "storage_unavailable")
                assert str(db) in body["detail"]
            assert client.post("/v1/meshes", json={"axes": {"data": 8}}).headers["retry-after"]
            ready = assert_problem(client.get("/health/ready"), 503, "storage_unavailable")
            assert ready["store"] == "unavailable" and "IOERR" in ready["store_reason"]
            # Reads and everything that needs no write keep working meanwhile.
            assert client.get("/health/live").status_code == 200
            writes.check_all_stored()
            _assert_alive_and_unmapped(service, pid, runtime_pid)
            # Readiness stays false with nobody writing: its own probe fails too.
            _probed_after(client, ready["store_checked_at"], 503, "storage_unavailable")

            immutable.lift(*paths)
            took = _poll(lambda: _ready(client), "readiness back after the fault was lifted")
            print(f"readiness recovered {took:.2f} s after the fault was lifted (no writes)")
            writes.some()
            writes.check_all_stored()
            _assert_alive_and_unmapped(service, pid, runtime_pid)
        _restart_and_check(service, writes, tmp_path)


# ----------------------------------------- faults that leave writes durable (no fault)


def _database_file(db: Path) -> list[Path]:
    return [db]


def _directory(db: Path) -> list[Path]:
    return [db.parent]


@pytest.mark.slow
@pytest.mark.parametrize(
    "targets",
    [_database_file, _directory],
    ids=["immutable-database-file", "immutable-directory"],
)
def test_faults_the_wal_absorbs_keep_writes_durable_and_ready(tmp_path, immutable, targets):
    """With only the main file (or the directory) unwritable, commits still go to the WAL,
    fsynced: answering 201 is the truth, and readiness stays 200. A checkpoint that
    cannot write the file is retried later; nothing is lost."""
    db = tmp_path / "data" / "datarax.sqlite"
    with ServiceProcess(db, tmp_path / "server.log") as service:
        runtime_pid = service.wait_ready()["runtime_pid"]
        pid = service.proc.pid
        with service.client() as client:
            writes = Writes(client)
            writes.some()
            paths = targets(db)
            immutable.set(*paths)
            # Large plans (65,536 devices: ~0.6 MB each as stored, compressed) until the
            # WAL passes SQLite's automatic checkpoint (1,000 pages), which then tries to
            # write the database file.
            wal = Path(f"{db}-wal")
            for _ in range(40):
                assert writes.plan(devices=65536).status_code == 201
                assert writes.push().status_code == 201
                if wal.stat().st_size > CHECKPOINT_WAL_BYTES:
                    break
            print(f"WAL extent {wal.stat().st_size} bytes with the fault in place")
            assert wal.stat().st_size > CHECKPOINT_WAL_BYTES
            assert client.get("/health/ready").status_code == 200
            writes.check_all_stored()
            _assert_alive_and_unmapped(service, pid, runtime_pid)
            immutable.lift(*paths)
            writes.some()
            writes.check_all_stored()
        _restart_and_check(service, writes, tmp_path)


@pytest.mark.slow
def test_a_stale_unwritable_shm_file_is_never_mapped(tmp_path, immutable):
    """The attack that killed the old service with SIGBUS: an immutable ``-shm``. A
    ``-shm`` left by an older version is ignored: nothing maps it, writes work."""
    db = tmp_path / "stale" / "datarax.sqlite"
    db.parent.mkdir()
    old = sqlite3.connect(db)
    old.execute("PRAGMA journal_mode = WAL")
    old.executescript(migrations.SCHEMA)  # an older version's file: the service's own tables
    old.execute("CREATE TABLE leftover (x)")
    old.commit()
    old.close()
    shm = Path(f"{db}-shm")
    shm.write_bytes(b"\0" * 32768)
    immutable.set(shm)
    with ServiceProcess(db, tmp_path / "server.log") as service:
        runtime_pid = service.wait_ready()["runtime_pid"]
        pid = service.proc.pid
        with service.client() as client:
            writes = Writes(client)
            writes.some(10)
            _assert_alive_and_unmapped(service, pid, runtime_pid, stale_shm=True)
            assert client.get("/health/ready").status_code == 200
            writes.check_all_stored()
        _restart_and_check(service, writes, tmp_path)


# ------------------------------------------------------------------- a full disk


def _tmpfs(tmp_path: Path, mib: int) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs CAP_SYS_ADMIN): {done.stderr}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 32 MiB tmpfs of its own: a real disk that fills up."""
    yield from _tmpfs(tmp_path, 32)


@pytest.fixture
def disk_64m(tmp_path) -> Iterator[Path]:
    """A 64 MiB tmpfs: room beside the 8 MiB reserve for a job whose delete needs more."""
    yield from _tmpfs(tmp_path, 64)


def _fill(disk: Path) -> Path:
    """Fills ``disk`` to the last byte with one file; returns it."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as out:  # unbuffered: close has nothing left
        for chunk in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while out.write(b"\0" * chunk):
                    pass
    stats = os.statvfs(disk)
    assert stats.f_bavail * stats.f_frsize < 64 * 1024, "the disk did not fill"
    return filler


def _fill_until_507(writes: Writes, disk: Path) -> Path:
    """Fills ``disk``, then writes plans, then points, until both are 507 (the WAL full)."""
    filler = _fill(disk)
    for attempt in (writes.plan, writes.push):
        for _ in range(500):
            answer = attempt()
            if answer.status_code not in (200, 201):
                assert_problem(answer, 507, "storage_full")
                break
        else:
            pytest.fail("the writes never hit the full disk")
    return filler


@pytest.mark.slow
def test_a_full_disk_is_507_until_space_is_freed_and_loses_nothing(tmp_path, small_disk):
    db = small_disk / "datarax.sqlite"
    with ServiceProcess(db, tmp_path / "server.log") as service:
        runtime_pid = service.wait_ready()["runtime_pid"]
        pid = service.proc.pid
        with service.client() as client:
            writes = Writes(client)
            writes.some()
            filler = _fill_until_507(writes, small_disk)
            ready = assert_problem(client.get("/health/ready"), 507, "storage_full")
            assert ready["store"] == "full" and ready["store_fault_since"]
            _probed_after(client, ready["store_checked_at"], 507, "storage_full")
            writes.check_all_stored()
            _assert_alive_and_unmapped(service, pid, runtime_pid)

            filler.unlink()
            took = _poll(lambda: _ready(client), "readiness back after space was freed")
            print(f"readiness recovered {took:.2f} s after space was freed (no writes)")
            writes.some()
            writes.check_all_stored()
            _assert_alive_and_unmapped(service, pid, runtime_pid)
        _restart_and_check(service, writes, tmp_path)


def test_full_disk_is_507_storage_full_and_readiness_says_so(tmp_path, monkeypatch):
    """In-process, anywhere: SQLite's page limit gives SQLITE_FULL as a full disk does."""
    settings = make_settings(tmp_path)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as client:
        plan = {"axes": {"data": 8}, "num_devices": 8}
        assert client.post("/v1/meshes", json=plan).status_code == 201
        assert client.get("/health/ready").json()["store"] == "ok"
        store = client.app.state.store
        pages = store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        store._run(lambda c: c.execute(f"PRAGMA max_page_count = {pages}"))
        big = {"axes": {"data": -1}, "num_devices": 4096}
        assert_problem(client.post("/v1/meshes", json=big), 507, "storage_full")
        assert store.full and store.fault.code == "storage_full"
        # The real disk has room; make it look full: the fault then outlasts the probe.
        monkeypatch.setattr(store_module, "FREE_BYTES_TO_RECOVER", 2**62)
        monkeypatch.setattr(store_module, "PROBE_INTERVAL_S", 0.0)
        body = assert_problem(client.get("/health/ready"), 507, "storage_full")
        assert body["store"] == "full" and "SQLITE_FULL" in body["store_reason"]
        monkeypatch.setattr(store_module, "FREE_BYTES_TO_RECOVER", 8 * 1024 * 1024)
        store._run(lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
        assert client.get("/health/ready").json()["store"] == "ok"  # the probe succeeded
        assert client.post("/v1/meshes", json=big).status_code == 201
        assert store.fault is None


# ----------------------------------------------------------- deletes on a full disk

DOOMED = "doomed"
LIVE_PLAN = {"axes": {"data": 8}, "batch_shape": [64, 128]}
SESSION = {"model": {"kind": "mlp", "features": [16, 64, 8]}}
CHECK = {"model": {"kind": "mlp", "features": [128, 256, 128]}, "batch_shape": [64]}


def _reserve(db: Path) -> Path:
    return Path(f"{db}-reserve")


def _assert_reserve_held(db: Path) -> None:
    """The space reserve is there, the service's, in real blocks (not sparse)."""
    stats = _reserve(db).stat()
    assert stats.st_size == RESERVE_BYTES and stats.st_blocks * 512 >= RESERVE_BYTES
    assert _reserve(db).read_bytes()[: len(SIGNATURE)] == SIGNATURE


def _doomed_job(client: httpx.Client, disk: Path, size: int) -> None:
    """A job with a long history (points and rollups of 10 metrics, in batches of 1,000
    steps) until it took ``size`` bytes of ``disk`` (its WAL's share included)."""
    start, step = disk_free(disk / "x"), 0
    while disk_free(disk / "x") > start - size:
        points = [
            {"step": s, "metrics": {f"m{k}": [float(s), float(k)] for k in range(10)}}
            for s in range(step, step + 1000)
        ]
        answer = client.post(f"/v1/jobs/{DOOMED}/metrics/batch", json={"points": points})
        assert answer.status_code == 201, answer.text
        step += 1000


def _created(client: httpx.Client, path: str, body: dict, status: int = 201) -> dict:
    answer = client.post(path, json=body)
    assert answer.status_code == status, answer.text
    return answer.json()


def _kept(writes: Writes, body: dict) -> str:
    """A plan the test keeps: remembered, as answered, with the acknowledged writes."""
    plan = _created(writes.client, "/v1/meshes", body)
    writes.plans[plan["id"]] = plan
    return plan["id"]


def _compile_gate(tmp_path: Path) -> Path:
    """The compile worker's test gate, ``start`` closed: a check waits there, starting."""
    gate = tmp_path / "gate"
    gate.mkdir()
    for name in ("lowering", "compiling"):
        (gate / f"{name}.go").touch()
    return gate


def _checks(client: httpx.Client, plan_id: str, gate: Path) -> list[str]:
    """Two compile checks: one starting (held at the gate), one queued behind it."""
    ids = [_created(client, f"/v1/meshes/{plan_id}/compile-checks", CHECK, 202)["id"] for _ in "ab"]
    _poll(lambda: (gate / "start.reached").exists(), "the compile worker at its gate", 120)
    return ids


@pytest.mark.slow
def test_every_delete_works_on_a_full_disk_and_its_room_takes_writes(tmp_path, disk_64m):
    """Issue 41: on a filled disk (writes 507) each ``DELETE`` route answers 2xx, the first
    through the space reserve; what they deleted is gone, all else stays, the freed pages
    take writes (readiness back by itself), also after a ``kill -9``; and once the disk
    has room the reserve is made again."""
    db = disk_64m / "datarax.sqlite"
    gate = _compile_gate(tmp_path)
    env = {"DATARAX_TEST_COMPILE_GATE": str(gate)}
    with ServiceProcess(db, tmp_path / "server.log", env=env) as service:
        runtime_pid = service.wait_ready()["runtime_pid"]
        pid = service.proc.pid
        _assert_reserve_held(db)
        with service.client(timeout=120) as client:
            writes = Writes(client)
            writes.some()
            kept = _kept(writes, LIVE_PLAN)
            ended = _created(client, "/v1/meshes", {"axes": {"data": 8}})["id"]
            plan = _created(client, "/v1/meshes", {"axes": {"data": -1}, "num_devices": 65536})
            sessions = [
                _created(client, f"/v1/meshes/{p}/sessions", SESSION)["id"] for p in [kept, ended]
            ]
            checks = _checks(client, kept, gate)
            # 24 MiB: deleted whole, it would need more than the reserve's room
            _doomed_job(client, disk_64m, 24 << 20)
            filler = _fill_until_507(writes, disk_64m)

            deletes = [
                *(f"/v1/compile-checks/{check}" for check in reversed(checks)),
                f"/v1/sessions/{sessions[0]}",
                f"/v1/meshes/{ended}",  # and its session
                f"/v1/meshes/{plan['id']}",
                f"/v1/jobs/{DOOMED}",
            ]
            for path in deletes:
                answer = client.delete(path)
                assert answer.status_code in (200, 204), (path, answer.text)
            assert not _reserve(db).exists()  # its room went to the first delete
            assert "runs in pieces" in service.log_tail(1_000_000)  # the job's
            for check in checks:
                assert client.get(f"/v1/compile-checks/{check}").json()["status"] == "cancelled"
            for path in deletes[2:]:
                assert client.get(path).status_code == 404, path
            assert client.get(f"/v1/sessions/{sessions[1]}").status_code == 404
            assert_problem(client.delete(f"/v1/jobs/{DOOMED}"), 404, "job_not_found")
            writes.check_all_stored()

            _poll(lambda: _ready(client), "readiness back after the deletes, the disk still full")
            writes.some(10)  # in the pages the deletes freed
            writes.check_all_stored()
            _assert_alive_and_unmapped(service, pid, runtime_pid)
        service.stop()  # kill -9
        with ServiceProcess(db, tmp_path / "server-2.log", env=env) as again:
            again.wait_ready()
            with again.client() as client:
                writes.client = client
                writes.check_all_stored()
                writes.some()
                assert client.get(f"/v1/jobs/{DOOMED}").status_code == 404
                assert not _reserve(db).exists()
                filler.unlink()
                # Readiness's probe (or any write) makes it again once the disk has room.
                _poll(lambda: _ready(client) and _reserve(db).exists(), "the reserve back")
                _assert_reserve_held(db)
                writes.some()
                writes.check_all_stored()


@pytest.mark.slow
def test_deletes_on_a_disk_full_before_the_reserve_was_made_are_507(tmp_path, small_disk):
    """A disk already full when the service starts, with no reserve (a database of a
    version before it, or one whose reserve a delete used): deletes answer 507
    ``storage_full`` naming the missing reserve (never a 500), nothing is lost, and they
    work once space is freed; the reserve is then made."""
    db = small_disk / "datarax.sqlite"
    with ServiceProcess(db, tmp_path / "server.log") as service:
        service.wait_ready()
        with service.client() as client:
            writes = Writes(client)
            writes.some()
            plan = _kept(writes, {"axes": {"data": -1}, "num_devices": 4096})
            _doomed_job(client, small_disk, 1 << 20)
    _reserve(db).unlink()
    filler = _fill(small_disk)
    with ServiceProcess(db, tmp_path / "server-2.log") as service:
        service.wait_live()
        with service.client() as client:
            writes.client = client
            for path in (f"/v1/jobs/{DOOMED}", f"/v1/meshes/{plan}"):
                body = assert_problem(client.delete(path), 507, "storage_full")
                assert "space reserve" in body["detail"] and "missing" in body["detail"], body
                assert "nothing was deleted" in body["detail"], body
            assert_problem(client.get("/health/ready"), 507, "storage_full")
            assert client.get(f"/v1/jobs/{DOOMED}").status_code == 200
            writes.check_all_stored()
            assert not _reserve(db).exists()

            filler.unlink()
            _poll(lambda: _ready(client), "readiness back after space was freed")
            _assert_reserve_held(db)
            assert client.delete(f"/v1/jobs/{DOOMED}").status_code == 204
            assert client.delete(f"/v1/meshes/{plan}").status_code == 204
            del writes.plans[plan]
            writes.some()
            writes.check_all_stored()


def test_a_job_too_big_for_the_reserve_is_deleted_in_pieces_in_process(
    disk_64m, monkeypatch, caplog
):
    """In-process, on the real full disk: a job whose delete needs more WAL than the
    reserve gives is deleted in pieces; a second delete in a row is a plain 404; the freed
    pages take writes (readiness at once); freed disk space brings the reserve back."""
    settings = make_settings(disk_64m)
    with TestClient(create_app(settings, runtime=StubRuntime(ready=True))) as client:
        store = client.app.state.store
        _assert_reserve_held(store.path)
        writes = Writes(client)
        writes.some()
        _doomed_job(client, disk_64m, 24 << 20)
        filler = _fill_until_507(writes, disk_64m)
        assert client.delete(f"/v1/jobs/{DOOMED}").status_code == 204
        assert "runs in pieces" in caplog.text
        assert not _reserve(store.path).exists() and store._db.room.fenced
        assert_problem(client.delete(f"/v1/jobs/{DOOMED}"), 404, "job_not_found")
        assert client.get("/health/ready").status_code == 200  # > 8 MiB of freed pages
        pages = store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        writes.some(10)
        writes.check_all_stored()
        # In the freed pages: the file did not grow into the room the next delete needs.
        assert store._run(lambda c: c.execute("PRAGMA page_count").fetchone()[0]) == pages
        filler.unlink()
        monkeypatch.setattr(store_module, "PROBE_INTERVAL_S", 0.0)
        assert client.get("/health/ready").status_code == 200  # its probe makes the reserve
        _assert_reserve_held(store.path)
        assert not store._db.room.fenced


def test_storage_errors_are_classified_by_sqlite_code(tmp_path):
    """Real SQLite errors: storage faults become their problems, others stay."""
    from app.core.errors import StorageFull, StorageUnavailable

    conn = sqlite3.connect(tmp_path / "x.sqlite")
    conn.execute("CREATE TABLE t (x PRIMARY KEY)")
    conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as constraint:
        conn.execute("INSERT INTO t VALUES (1)")
    assert store_module.storage_error(constraint.value, "x") is None
    conn.execute("PRAGMA max_page_count = 2")
    with pytest.raises(sqlite3.OperationalError) as full:
        conn.executemany(
            "INSERT INTO t VALUES (?)", [(b"y" * 4000 + bytes([i]),) for i in range(9)]
        )
    assert isinstance(store_module.storage_error(full.value, "x"), StorageFull)
    conn.close()
    reader = sqlite3.connect(f"file:{tmp_path / 'x.sqlite'}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as readonly:
        reader.execute("INSERT INTO t VALUES (2)")
    problem = store_module.storage_error(readonly.value, "x")
    assert isinstance(problem, StorageUnavailable) and problem.headers["Retry-After"]
    reader.close()
    assert store_module.storage_error(OSError(errno.EIO, "x"), "x") is None


@pytest.mark.slow
def test_a_fatal_signal_leaves_its_traceback_in_the_log(tmp_path):
    """Should anything still kill the HTTP process (SIGBUS, SIGSEGV), the log says so
    (faulthandler), and the runtime does not outlive it; restarting is the supervisor's
    job (exit by signal, not status 65)."""
    with ServiceProcess(tmp_path / "datarax.sqlite", tmp_path / "server.log") as service:
        runtime_pid = service.wait_ready()["runtime_pid"]
        os.kill(service.proc.pid, signal.SIGBUS)
        assert service.proc.wait(timeout=30) == -signal.SIGBUS
        _poll(
            lambda: "Fatal Python error: Bus error" in service.log_tail(100_000),
            "the fatal signal in the log",
        )
        _poll(lambda: not pid_alive(runtime_pid), "the runtime to exit with the HTTP process")
