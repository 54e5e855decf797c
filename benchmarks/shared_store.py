"""The shared store (issue 42): job pushes and a downsampled read on PostgreSQL against
SQLite, and one push load over two replicas against one.

    .venv/bin/python -m benchmarks.shared_store [--quick] [--json]

``run(quick=False) -> dict`` (run by ``make bench``; alone: ``python -m benchmarks.run
--only shared_store``) and ``markdown(result)``, its section of BENCHMARKS.md.

One PostgreSQL (``tests/postgres_server.py``: a fresh cluster, ``fsync=on``, 32 MB of
shared buffers; ``pg_stat_statements`` loaded, tracking nothing during the timed runs) and
four ``datarax-serve`` (``benchmarks/server.py``'s ``spawn``: 8 simulated CPU devices),
started once: ``sqlite`` on its own file; ``postgres``, one replica on database ``one``;
``postgres_2``, two replicas on database ``two`` (different ``DATARAX_DB``, the same
``DATARAX_DATABASE_URL``). The same server code, the same client load, sent by a raw
HTTP/1.1 load generator (the client's own bodies, encoded before the clock, so a request
costs the generator microseconds; it still shares the 2 cores with the servers):

- ``single``: ``CLIENTS`` connections at once, each pushing ``SINGLES`` one-step JSON
  pushes of its own job (``POST /v1/jobs/{job}/metrics``, ``METRICS`` metrics x
  ``DEVICES`` devices), one after another; with two replicas, connection i goes to
  replica i % 2;
- ``batch``: the same with ``BATCHES`` npz batches of ``BATCH_STEPS`` steps each (the
  bodies of the client's ``push_job_metrics_arrays``; ``POST .../metrics/batch``);
- ``load``: one connection loading a job of ``LOAD_STEPS`` steps (``--quick``: 100,000) in
  npz batches of 1,000 steps (``METRICS`` metrics x ``LOAD_DEVICES`` devices), one after
  another; ``sqlite`` against ``postgres``;
- ``read``: ``GET /v1/jobs/{job}/metrics?max_points=1000`` over that job (median of
  ``READS`` after one unmeasured read).

``ROUNDS`` rounds of the push loads and ``LOAD_ROUNDS`` of the big job, each load's
variants in a rotated order every round; a figure is the median over the rounds with its
range, a ratio the median of the rounds' paired ratios. Every run records the CPU seconds
(``/proc``) of the servers' process groups, of PostgreSQL's processes, of this load
generator and of the whole machine (everyone's), and PostgreSQL's round trips (``ss -ti``).
Then one profile run of each push load per PostgreSQL variant, read with
``pg_stat_statements``, ``pg_stat_database`` and ``pg_stat_wal``: statements,
transactions, rollbacks (serializable transactions that lost and ran again), rows and
WAL fsyncs per push.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np

from benchmarks.http_load import _read_response
from benchmarks.server import ROOT, free_port, spawn, stop
from datarax.client._core import Call, arrays_batch_call, push_call

CLIENTS = 8
SINGLES = 150
BATCHES = 40
BATCH_STEPS = 100
METRICS = 4
DEVICES = 8
LOAD_STEPS = 1_000_000
LOAD_BATCH = 1000
LOAD_DEVICES = 4
MAX_POINTS = 1000
READS = 7
ROUNDS = 5
LOAD_ROUNDS = 3
PUSH_VARIANTS = ("sqlite", "postgres", "postgres_2")
STATS_FLUSH_S = 11.0
"""PostgreSQL backends report their statistics at most every second, an idle one within
10 s (``PGSTAT_IDLE_INTERVAL``): the profile waits this long before reading them."""
_TICK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------- servers


@dataclass
class Variant:
    """One variant's replicas (``datarax-serve`` processes)."""

    name: str
    procs: list[subprocess.Popen[bytes]]
    ports: list[int]

    @property
    def bases(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]


def _wait_ready(variant: Variant, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    for proc, base in zip(variant.procs, variant.bases, strict=True):
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/health/ready", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{variant.name}: {base} did not become ready")
            time.sleep(0.2)


@contextlib.contextmanager
def _variants(tmp: Path, postgres: Any) -> Iterator[dict[str, Variant]]:
    """The three variants, every replica started at once, stopped on exit."""
    plan = {"sqlite": (1, None), "postgres": (1, "one"), "postgres_2": (2, "two")}
    out: dict[str, Variant] = {}
    with contextlib.ExitStack() as stack:
        for name, (count, dbname) in plan.items():
            url = postgres.create_database(dbname) if dbname else None
            variant = out[name] = Variant(name, [], [])
            for i in range(count):
                port = free_port()
                env = {"DATARAX_MAX_BODY_MB": "256", "DATARAX_DATABASE_URL": url or ""}
                proc = spawn(port, tmp / f"{name}-{i}" / "datarax.sqlite", env)
                stack.callback(stop, proc, 10)
                variant.procs.append(proc)
                variant.ports.append(port)
        for variant in out.values():
            _wait_ready(variant)
        yield out


def _start_postgres() -> Any:
    """A running ``PostgresServer`` with ``pg_stat_statements`` loaded (not tracking)."""
    import psycopg

    from tests.postgres_server import PostgresServer

    server = PostgresServer().start()
    try:
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        server.restart()
        with psycopg.connect(server.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'none'")
            conn.execute("SELECT pg_reload_conf()")
    except BaseException:
        server.close()
        raise
    return server


# ---------------------------------------------------------------------------- the load


def _http(call: Call[Any], host: str = "bench") -> bytes:
    """``call`` as HTTP/1.1 request bytes (its JSON or npz body, as the client sends it)."""
    body, headers = call.body()
    query = "?" + urlencode(call.params) if call.params else ""
    head = [f"{call.method} {call.path}{query} HTTP/1.1", f"Host: {host}"]
    head += [f"{k}: {v}" for k, v in headers.items()]
    head.append(f"Content-Length: {len(body or b'')}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + (body or b"")


async def _send(ports: list[int], requests: list[Iterable[bytes]]) -> tuple[float, int]:
    """Connection i (to ``ports[i % len(ports)]``) sends ``requests[i]`` one after
    another, all connections at once. Returns the seconds from the first write to the
    last answer and how many 503 answers were sent again (the client's retry)."""
    streams = [
        await asyncio.open_connection("127.0.0.1", ports[i % len(ports)])
        for i in range(len(requests))
    ]
    retried = 0

    async def connection(index: int) -> None:
        nonlocal retried
        reader, writer = streams[index]
        for request in requests[index]:
            while True:
                writer.write(request)
                status = await _read_response(reader)
                if status in (200, 201):
                    break
                if status != 503:
                    raise RuntimeError(f"a push was answered {status}")
                retried += 1
                await asyncio.sleep(0.05)

    start = time.perf_counter()
    await asyncio.gather(*(connection(i) for i in range(len(requests))))
    seconds = time.perf_counter() - start
    for _, writer in streams:
        writer.close()
    return seconds, retried


def _values(rng: np.random.Generator, steps: int, devices: int) -> dict[str, np.ndarray]:
    return {f"m{k}": rng.random((steps, devices)).round(6) for k in range(METRICS)}


def _single_requests(job: str, count: int, first: int = 0) -> list[bytes]:
    values = _values(np.random.default_rng(1), count, DEVICES)
    return [
        _http(push_call(job, first + i, {k: v[i].tolist() for k, v in values.items()},
                        None, None, None, None, None, False))
        for i in range(count)
    ]  # fmt: skip


def _batch_requests(job: str, batches: int, steps: int, first: int = 0) -> list[bytes]:
    return [
        _http(arrays_batch_call(job, np.arange(first + b * steps, first + (b + 1) * steps),
                                _values(np.random.default_rng(b), steps, DEVICES),
                                None, None, None, None, None))
        for b in range(batches)
    ]  # fmt: skip


def _load_requests(job: str, total: int) -> Iterator[bytes]:
    """The load's batches, built as they are sent (the client's cost, alike for all)."""
    values = _values(np.random.default_rng(7), LOAD_BATCH, LOAD_DEVICES)
    for first in range(0, total, LOAD_BATCH):
        steps = np.arange(first, min(first + LOAD_BATCH, total))
        metrics = {k: v[: len(steps)] + first * 1e-7 for k, v in values.items()}
        yield _http(arrays_batch_call(job, steps, metrics, None, None, None, None, None))


# ---------------------------------------------------------------------------- meters


def _proc_stats() -> list[tuple[int, int, int, float]]:
    """``(pid, ppid, pgrp, cpu seconds)`` of every process."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / _TICK
        out.append((int(entry), int(fields[1]), int(fields[2]), cpu))
    return out


def _machine() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle + iowait
    return (sum(ticks) - idle) / _TICK, sum(ticks) / _TICK


def _round_trips(port: int) -> int:
    """Data segments PostgreSQL sent on its open TCP connections: it sends only when a
    client waits (a Sync: the end of a statement or of an ``executemany`` pipeline) or its
    8 kB buffer fills, so they count the round trips."""
    done = subprocess.run(
        ["ss", "-tinH", "state", "established", f"( sport = :{port} )"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return sum(int(n) for n in re.findall(r"data_segs_out:(\d+)", done.stdout))


@dataclass
class Meter:
    """CPU and segment counters around one run."""

    groups: list[int]  # the servers' process groups (each replica and its runtime)
    postmaster: int
    pg_port: int
    start: dict[str, float] = field(default_factory=dict)

    def read(self) -> dict[str, float]:
        procs = _proc_stats()
        busy, total = _machine()
        return {
            "server_cpu_s": sum(c for _, _, g, c in procs if g in self.groups),
            "postgres_cpu_s": sum(c for p, pp, _, c in procs if self.postmaster in (p, pp)),
            "client_cpu_s": time.process_time(),
            "machine_busy_s": busy,
            "machine_s": total,
            "pg_round_trips": _round_trips(self.pg_port),
        }

    def __enter__(self) -> Meter:
        self.start = self.read()
        return self

    def __exit__(self, *_: object) -> None:
        end = self.read()
        self.start = {k: end[k] - self.start[k] for k in end}


def _run_one(variant: Variant, postgres: Any, requests: list[Iterable[bytes]]) -> dict[str, Any]:
    meter = Meter([p.pid for p in variant.procs], postgres.process.pid, postgres.port)
    with meter:
        seconds, retried = asyncio.run(_send(variant.ports, requests))
    return {"seconds": seconds, "retried": retried, **meter.start}


# ---------------------------------------------------------------------------- runs


def _push_runs(
    variants: dict[str, Variant], postgres: Any, sizes: dict[str, int], rounds: int
) -> list[dict[str, Any]]:
    """Every round: the single-step load, then the batch load, on each variant."""
    runs = []
    for turn in range(rounds):
        for load in ("single", "batch"):
            for name in PUSH_VARIANTS[turn % 3 :] + PUSH_VARIANTS[: turn % 3]:
                requests = _load_of(load, f"{load}-{turn}", sizes)
                record = _run_one(variants[name], postgres, requests)
                pushes = sum(len(r) for r in requests)
                steps = pushes * (BATCH_STEPS if load == "batch" else 1)
                runs.append({"load": load, "variant": name, "round": turn,
                             "pushes": pushes, "steps": steps, **record})  # fmt: skip
                print("shared_store", load, name, turn,
                      f"{pushes / record['seconds']:.0f} pushes/s", file=sys.stderr)  # fmt: skip
    return runs


def _load_of(load: str, job: str, sizes: dict[str, int]) -> list[Iterable[bytes]]:
    if load == "single":
        return [_single_requests(f"{job}-c{c}", sizes["singles"]) for c in range(CLIENTS)]
    return [_batch_requests(f"{job}-c{c}", sizes["batches"], BATCH_STEPS) for c in range(CLIENTS)]


def _read_ms(base: str, job: str) -> list[float]:
    times = []
    with httpx.Client(base_url=base, timeout=600) as http:
        for i in range(READS + 1):
            start = time.perf_counter()
            answer = http.get(f"/v1/jobs/{job}/metrics", params={"max_points": MAX_POINTS})
            elapsed = time.perf_counter() - start
            answer.raise_for_status()
            body = answer.json()
            assert body["downsampled"] and len(body["buckets"]) <= MAX_POINTS, body.keys()
            if i:  # the first read is unmeasured (cold caches)
                times.append(elapsed * 1e3)
    return times


def _load_runs(
    variants: dict[str, Variant], postgres: Any, steps: int, rounds: int
) -> list[dict[str, Any]]:
    """Every round: the big job loaded by batches, then read downsampled, on each engine."""
    runs = []
    for turn in range(rounds):
        for name in (("sqlite", "postgres"), ("postgres", "sqlite"))[turn % 2]:
            job = f"load-{turn}"
            record = _run_one(variants[name], postgres, [_load_requests(job, steps)])
            reads = _read_ms(variants[name].bases[0], job)
            runs.append({"load": "load", "variant": name, "round": turn,
                         "pushes": -(-steps // LOAD_BATCH), "steps": steps,
                         "read_ms": statistics.median(reads), **record})  # fmt: skip
            print("shared_store load", name, turn, f"{steps / record['seconds']:.0f} steps/s",
                  f"read {statistics.median(reads):.1f} ms", file=sys.stderr)  # fmt: skip
    return runs


# ---------------------------------------------------------------------------- profile


def _counters(conn: Any) -> dict[str, Any]:
    """PostgreSQL's cumulative counters: per database, and the WAL's."""
    rows = conn.execute(
        "SELECT datname, xact_commit, xact_rollback, tup_inserted, tup_updated, tup_fetched "
        "FROM pg_stat_database WHERE datname IN ('one', 'two')"
    ).fetchall()
    wal = conn.execute("SELECT wal_records, wal_bytes, wal_write, wal_sync FROM pg_stat_wal")
    names = ("commits", "rollbacks", "rows_inserted", "rows_updated", "rows_fetched")
    out: dict[str, Any] = {row[0]: dict(zip(names, row[1:], strict=True)) for row in rows}
    names = ("records", "bytes", "writes", "fsyncs")
    out["wal"] = dict(zip(names, map(float, wal.fetchone()), strict=True))
    return out


def _statements(conn: Any, dbname: str) -> list[tuple[str, int, float]]:
    """``(query, calls, total ms)`` of the database's statements since the last reset, but
    transaction control (``BEGIN``, ``SAVEPOINT``, ``COMMIT``...): psycopg prepares a
    statement on its 5th run, and ``pg_stat_statements`` stops counting a prepared one of
    those (its ``pg_stat_database`` commits count the transactions instead)."""
    rows = conn.execute(
        "SELECT query, calls, total_exec_time FROM pg_stat_statements "
        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) ORDER BY calls DESC",
        (dbname,),
    ).fetchall()
    control = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")
    return [r for r in rows if not r[0].lstrip().upper().startswith(control)]


def _profile(
    variants: dict[str, Variant], postgres: Any, sizes: dict[str, int]
) -> list[dict[str, Any]]:
    """One run of each push load on each PostgreSQL variant with ``pg_stat_statements``
    tracking; per push: statements (the most frequent named), transactions, rollbacks,
    rows, WAL fsyncs, PostgreSQL's execution time and the round trips."""
    import psycopg

    out = []
    with psycopg.connect(postgres.url(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'top'")
        conn.execute("SELECT pg_reload_conf()")
        time.sleep(STATS_FLUSH_S)
        before = _counters(conn)
        for load in ("single", "batch"):
            for name, dbname in (("postgres", "one"), ("postgres_2", "two")):
                conn.execute("SELECT pg_stat_statements_reset()")
                requests = _load_of(load, f"profile-{load}", sizes)
                record = _run_one(variants[name], postgres, requests)
                time.sleep(STATS_FLUSH_S)
                after = _counters(conn)
                n = sum(len(r) for r in requests)  # type: ignore[arg-type]
                per = {k: (after[dbname][k] - before[dbname][k]) / n for k in after[dbname]}
                wal = {k: (after["wal"][k] - before["wal"][k]) / n for k in after["wal"]}
                before = after
                statements = _statements(conn, dbname)
                per |= {
                    "wal_fsyncs": wal["fsyncs"],
                    "wal_kb": wal["bytes"] / 1024,
                    "statements": sum(s[1] for s in statements) / n,
                    "statement_ms": sum(s[2] for s in statements) / n,
                    "round_trips": record["pg_round_trips"] / n,
                }
                out.append({
                    "load": load, "variant": name, "pushes": n,
                    "pushes_per_s": round(n / record["seconds"], 1), "retried": record["retried"],
                    "per_push": {k: round(v, 3) for k, v in per.items()},
                    "top": [[" ".join(q.split())[:60], round(calls / n, 2), round(ms / n, 3)]
                            for q, calls, ms in statements[:10]],
                })  # fmt: skip
                print("shared_store profile", load, name, out[-1]["per_push"], file=sys.stderr)
        conn.execute("ALTER SYSTEM SET pg_stat_statements.track = 'none'")
        conn.execute("SELECT pg_reload_conf()")
    return out


# ---------------------------------------------------------------------------- results


def _spread(values: list[float], digits: int = 0) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
    }


def _figures(rs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's runs of one load: rates, CPU ms per push and cores busy (servers,
    PostgreSQL, everything else on the machine), PostgreSQL round trips per push."""

    def of(fn: Any, digits: int = 0) -> dict[str, float]:
        return _spread([fn(r) for r in rs], digits)

    def others(r: dict[str, Any]) -> float:
        mine = r["server_cpu_s"] + r["postgres_cpu_s"] + r["client_cpu_s"]
        return max(r["machine_busy_s"] - mine, 0.0) / r["seconds"]

    out = {
        "pushes_per_s": of(lambda r: r["pushes"] / r["seconds"], 1),
        "steps_per_s": of(lambda r: r["steps"] / r["seconds"]),
        "retried": sum(r["retried"] for r in rs),
        "server_cpu_ms": of(lambda r: r["server_cpu_s"] / r["pushes"] * 1e3, 2),
        "postgres_cpu_ms": of(lambda r: r["postgres_cpu_s"] / r["pushes"] * 1e3, 2),
        "client_cpu_ms": of(lambda r: r["client_cpu_s"] / r["pushes"] * 1e3, 2),
        "server_cores": of(lambda r: r["server_cpu_s"] / r["seconds"], 2),
        "postgres_cores": of(lambda r: r["postgres_cpu_s"] / r["seconds"], 2),
        "others_cores": of(others, 2),
        "machine_busy": of(lambda r: r["machine_busy_s"] / r["machine_s"], 2),
        "round_trips": of(lambda r: r["pg_round_trips"] / r["pushes"], 1),
    }
    if "read_ms" in rs[0]:
        out["read_ms"] = of(lambda r: r["read_ms"], 1)
    return out


def _paired(runs: list[dict[str, Any]], a: str, b: str, key: str) -> dict[str, float]:
    """``a``'s figure over ``b``'s, round by round (median and range)."""
    of = {(r["variant"], r["round"]): r[key] for r in runs}
    rounds = sorted({r["round"] for r in runs})
    return _spread([of[a, t] / of[b, t] for t in rounds if (a, t) in of and (b, t) in of], 2)


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per load: each variant's figures; the paired ratios of each round."""
    out: dict[str, Any] = {}
    for load in ("single", "batch", "load"):
        mine = [{**r, "rate": r["steps"] / r["seconds"]} for r in runs if r["load"] == load]
        rows: dict[str, Any] = {}
        for name in PUSH_VARIANTS:
            if any(r["variant"] == name for r in mine):
                rows[name] = _figures([r for r in mine if r["variant"] == name])
        rows["postgres_over_sqlite"] = _paired(mine, "postgres", "sqlite", "rate")
        if load == "load":
            rows["read_postgres_over_sqlite"] = _paired(mine, "postgres", "sqlite", "read_ms")
        else:
            rows["two_over_one"] = _paired(mine, "postgres_2", "postgres", "rate")
        out[load] = rows
    return out


def _warm(variants: dict[str, Variant]) -> None:
    """A push of each kind to every replica (first requests pay imports and connects)."""
    for variant in variants.values():
        for i, port in enumerate(variant.ports):
            requests: list[Iterable[bytes]] = [
                _single_requests(f"warm-{i}", 3) + _batch_requests(f"warm-{i}", 1, 10, 10)
            ]
            asyncio.run(_send([port], requests))


def _commit() -> str:
    """The commit the servers run, and whether ``app/`` or ``datarax/`` differ from it."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "app", "datarax"],
                           capture_output=True, text=True).stdout.strip()  # fmt: skip
    return head.stdout.strip() + (" with local changes" if dirty else "")


def run(quick: bool = False, rounds: int = ROUNDS) -> dict[str, Any]:
    """Every run and its summary (see the module docstring); ``quick``: a 100,000-step
    load and a fifth of the push loads."""
    import psycopg

    scale = 5 if quick else 1
    sizes = {
        "singles": SINGLES // scale,
        "batches": BATCHES // scale,
        "load_steps": LOAD_STEPS // 10 if quick else LOAD_STEPS,
    }
    loadavg_before, started, commit = os.getloadavg(), time.time(), _commit()
    postgres = _start_postgres()
    try:
        with tempfile.TemporaryDirectory() as tmp, _variants(Path(tmp), postgres) as variants:
            _warm(variants)
            runs = _push_runs(variants, postgres, sizes, rounds)
            runs += _load_runs(variants, postgres, sizes["load_steps"], min(rounds, LOAD_ROUNDS))
            profile = _profile(variants, postgres, sizes)
        with psycopg.connect(postgres.url()) as conn:
            versions = f"PostgreSQL {conn.execute('SHOW server_version').fetchone()[0]}, "
            versions += f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__})"
    finally:
        postgres.close()
    return {
        "date": time.strftime("%Y-%m-%d", time.localtime(started)),
        "commit": commit,
        "quick": quick,
        "rounds": rounds,
        "clients": CLIENTS,
        "sizes": sizes,
        "minutes": round((time.time() - started) / 60, 1),
        "loadavg_before": [round(x, 2) for x in loadavg_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "summary": _summary(runs),
        "versions": versions,
        "profile": profile,
        "per_round": per_round(runs),
    }


def per_round(runs: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Each load's steps/s per variant, round by round (and the reads' ms)."""
    out: dict[str, dict[str, list[float]]] = {}
    for r in sorted(runs, key=lambda r: r["round"]):
        rates = out.setdefault(r["load"], {})
        rates.setdefault(r["variant"], []).append(round(r["steps"] / r["seconds"], 1))
        if "read_ms" in r:
            rates.setdefault(f"{r['variant']}_read_ms", []).append(round(r["read_ms"], 1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--quick", action="store_true", help="a 100,000-step job, fewer pushes")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    result = run(args.quick, args.rounds)
    print(json.dumps(result) if args.json else markdown(result), flush=True)


def _cell(figure: dict[str, float], unit: str = "") -> str:
    """``median (min-max)`` of a figure over the rounds."""
    return f"{figure['median']:,g}{unit} ({figure['min']:,g}-{figure['max']:,g})"


def _met(ratio: dict[str, float], ok: bool) -> str:
    return f"{_cell(ratio)} {'yes' if ok else '**no**'}"


def markdown(result: dict[str, Any]) -> str:
    """The section of BENCHMARKS.md: the rates and ratios, where the CPU went, the profile."""
    s, sizes, c = result["summary"], result["sizes"], result["clients"]
    single, batch, load = s["single"], s["batch"], s["load"]
    steps = f"{sizes['load_steps']:,}"
    pg_half = {k: s[k]["postgres_over_sqlite"] for k in ("single", "batch", "load")}
    lines = [
        "## Shared store: PostgreSQL against SQLite, two replicas against one "
        "(`benchmarks/shared_store.py`, issue 42)",
        "",
        f"`python -m benchmarks.run --only shared_store` on {result['date']}, commit "
        f"{result.get('commit', '?')} "
        f"({result['minutes']} min{', quick' if result['quick'] else ''}; the machine: the "
        "`--only shared_store` line at the top); the module's docstring describes the "
        "set-up. Figures are the median (and range) of "
        f"{result['rounds']} rounds, each load's variants interleaved; ratios are paired "
        "round by round. Other people's tests shared the 2 cores: load average "
        f"{result['loadavg_before'][1]:.1f} (5 min) before, {result['loadavg_after'][1]:.1f} "
        f"after. {result['versions']}. `others` below is the CPU everything but the "
        "servers, PostgreSQL and the load generator took during the runs.",
        "",
        "| load | SQLite | PostgreSQL, 1 replica | PostgreSQL, 2 replicas "
        "| PostgreSQL / SQLite (>= 0.5) | 2 replicas / 1 (> 1) |",
        "|---|---|---|---|---|---|",
        f"| {c} clients, each {sizes['singles']} one-step JSON pushes to a job of its own "
        f"({METRICS} metrics x {DEVICES} devices; 2 replicas: {c // 2} clients each), pushes/s "
        f"| {_cell(single['sqlite']['pushes_per_s'])} "
        f"| {_cell(single['postgres']['pushes_per_s'])} "
        f"| {_cell(single['postgres_2']['pushes_per_s'])} "
        f"| {_met(pg_half['single'], pg_half['single']['median'] >= 0.5)} "
        f"| {_met(single['two_over_one'], single['two_over_one']['median'] > 1)} |",
        f"| the same clients, each {sizes['batches']} npz batches of {BATCH_STEPS} steps, "
        "steps/s "
        f"| {_cell(batch['sqlite']['steps_per_s'])} | {_cell(batch['postgres']['steps_per_s'])} "
        f"| {_cell(batch['postgres_2']['steps_per_s'])} "
        f"| {_met(pg_half['batch'], pg_half['batch']['median'] >= 0.5)} "
        f"| {_met(batch['two_over_one'], batch['two_over_one']['median'] > 1)} |",
        f"| one client loading {steps} steps in npz batches of {LOAD_BATCH:,} ({METRICS} "
        f"metrics x {LOAD_DEVICES} devices), steps/s | {_cell(load['sqlite']['steps_per_s'])} "
        f"| {_cell(load['postgres']['steps_per_s'])} | - "
        f"| {_met(pg_half['load'], pg_half['load']['median'] >= 0.5)} | - |",
        f"| `GET /v1/jobs/{{job}}/metrics?max_points={MAX_POINTS}` over that job, ms "
        f"(median of {READS} a round) | {_cell(load['sqlite']['read_ms'])} "
        f"| {_cell(load['postgres']['read_ms'])} | - "
        f"| {_cell(load['read_postgres_over_sqlite'])} (time; report) | - |",
        "",
        "Round by round (steps/s; the reads in ms): "
        + "; ".join(
            f"{load} {name} {', '.join(f'{x:,.0f}' for x in values)}"
            for load, rows in result["per_round"].items()
            for name, values in rows.items()
        )
        + ".",
        "",
        "Per push (median over the rounds): CPU ms of the `datarax-serve` process groups, of "
        "PostgreSQL's processes and of the load generator; cores those and everything else "
        "kept busy (of 2); round trips to PostgreSQL (segments it sent, `ss -ti`).",
        "",
        "| load | variant | server ms | PostgreSQL ms | client ms | server cores "
        "| PostgreSQL cores | others cores | round trips |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in (("single", single), ("batch", batch), ("load", load)):
        for variant in PUSH_VARIANTS:
            if variant in rows:
                f = rows[variant]
                lines.append(
                    f"| {name} | {variant} | {f['server_cpu_ms']['median']:g} "
                    f"| {f['postgres_cpu_ms']['median']:g} | {f['client_cpu_ms']['median']:g} "
                    f"| {f['server_cores']['median']:g} | {f['postgres_cores']['median']:g} "
                    f"| {f['others_cores']['median']:g} | {f['round_trips']['median']:g} |"
                )
    lines += [
        "",
        "Profile (one more run of each push load, `pg_stat_statements`, `pg_stat_database`, "
        "`pg_stat_wal`), per push: statements other than transaction control, transactions "
        "committed and rolled back (a serializable transaction that lost, run again), rows "
        "inserted and updated, WAL fsyncs and kB, PostgreSQL's execution ms, round trips:",
        "",
        "| load | variant | pushes/s | statements | commits | rollbacks | inserted | updated "
        "| WAL fsyncs | WAL kB | exec ms | round trips |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in result["profile"]:
        q = p["per_push"]
        lines.append(
            f"| {p['load']} | {p['variant']} | {p['pushes_per_s']:g} | {q['statements']:.1f} "
            f"| {q['commits']:.2f} | {q['rollbacks']:.2f} | {q['rows_inserted']:.1f} "
            f"| {q['rows_updated']:.1f} | {q['wal_fsyncs']:.2f} | {q['wal_kb']:.1f} "
            f"| {q['statement_ms']:.2f} | {q['round_trips']:.1f} |"
        )
    for p in result["profile"][:1] + result["profile"][2:3]:
        top = "; ".join(f"`{q.split(' (')[0]}` {calls:g}" for q, calls, _ in p["top"])
        lines += ["", f"Statements per {p['load']} push ({p['variant']}): {top}."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
