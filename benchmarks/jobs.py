"""Job metric history: durable batch pushes, downsampled reads, multi-source merges.

    .venv/bin/python -m benchmarks.jobs [--json] [--quick]

``run() -> rows`` (for ``make bench``), each row a dict with ``bench`` and its figures:

- ``durable_push``: 100,000 points of 8 metrics (``[8]`` devices each, JSON) pushed to the
  real server in batches of 1,000 with ``datarax.client``, one after another, each answer
  after the durable commit; then the same points as npz batch bodies (``served_npz_*``);
  each variant against a server of its own on a new database file, as the baseline
  writes into a new file;
  against ``sqlite3.executemany`` writing the same rows (the
  points, and separately the points plus their rollup rows) in this process with the
  same pragmas (WAL, ``synchronous=FULL``), one transaction per 1,000. Target ratio >= 0.5.
- ``downsampled_read``: a 1,000,000-step job (2 scalar metrics), filled with the store's
  own push code; ``GET ?max_points=1000`` over HTTP (median of 7; target < 50 ms) and
  reading every point in pages of 10,000 (reported beside it).
- ``durable_push`` also times the client's columnar call (``push_job_metrics_arrays``:
  the job holds its metrics as ``[1000, 8]`` arrays and sends one npz body per batch,
  ``served_arrays_*``).
- ``multi_source_push``: 64 sources x 1,000 steps (4 devices each: a TPU v5e-256 slice's
  64 hosts of 4 chips), pushed concurrently in batches of 1,000 and of 250 steps (JSON,
  ``AsyncClient``); parts/s and steps/s; against one source pushing the same 256 devices
  in one array per step. Target ratio >= 0.5. Beside it (``raw_arrays_*``) the same
  pushes as npz bodies (the client's ``push_job_metrics_arrays`` bodies, built before
  the clock) sent by a raw HTTP/1.1 load generator, each host on its own connection:
  the server's own cost, without 64 simulated clients sharing its 2 cores; and
  ``reduce_only_floor_ms``: the 64 hosts' part bodies posted at once to
  ``POST /v1/metrics/reduce`` (read, decoded, reduced, nothing stored), what the pushes
  cost before any part is stored or merged.
- ``durable_push`` also times the pusher (``served_pipelined_*``: ``Client.pusher``,
  2 batches in flight, each answered after its durable commit).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np
import orjson

from benchmarks.server import running_server
from datarax.client import AsyncClient, Client
from datarax.client._core import arrays_batch_call, reduce_call

PUSH_POINTS = 100_000
BATCH = 1000
METRICS = 8
DEVICES = 8
READ_STEPS = 1_000_000


def _points(first: int, count: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    values = rng.random((count, METRICS, DEVICES)).round(6)
    return [
        {"step": first + i, "metrics": {f"m{k}": values[i, k].tolist() for k in range(METRICS)}}
        for i in range(count)
    ]


def _baseline_rows(db: Path) -> tuple[list[list[tuple]], list[list[tuple]]]:
    """The rows the service wrote (read back from its file): per batch, the point rows
    and the rollup rows."""
    from app.storage import jobs as store_jobs

    conn = sqlite3.connect(db)
    points = conn.execute(
        "SELECT job, step, reduced, received_at, digest, sources, num_devices FROM job_points "
        "WHERE job = 'bench' ORDER BY step"
    ).fetchall()
    conn.close()
    point_batches = [points[i : i + BATCH] for i in range(0, len(points), BATCH)]
    rollups = [
        store_jobs._rollup_rows(
            "bench", [(r[1], store_jobs.scalar_values(json.loads(r[2]))) for r in batch]
        )
        for batch in point_batches
    ]
    return point_batches, rollups


def _executemany_seconds(batches: list[list[tuple]], rollups: list[list[tuple]] | None) -> float:
    from app.storage import jobs as store_jobs
    from app.storage.db import Store

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "baseline.sqlite")
        store.open()  # the same schema and pragmas (WAL, synchronous=FULL)
        conn = store._conn
        assert conn is not None
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO job_points VALUES (?, ?, ?, ?, ?, ?, ?)", batch)
            if rollups is not None:
                conn.executemany(store_jobs.ROLLUP_UPSERT.sqlite, rollups[i])
            conn.execute("COMMIT")
        seconds = time.perf_counter() - start
        store.close()
    return seconds


def _npz_batch(points: list[dict[str, Any]]) -> bytes:
    """The same batch as the npz batch body: ``_step`` and one ``[P, D]`` array per metric."""
    names = list(points[0]["metrics"])
    arrays = {name: np.array([p["metrics"][name] for p in points]) for name in names}
    out = io.BytesIO()
    np.savez(out, _step=np.array([p["step"] for p in points]), **arrays)
    return out.getvalue()


def _post_npz(http: httpx.Client, job: str, body: bytes, **query: Any) -> None:
    answer = http.post(
        f"/v1/jobs/{job}/metrics/batch",
        content=body,
        params=query,
        headers={"content-type": "application/x-npz"},
    )
    answer.raise_for_status()


def _served_seconds(tmp: str, name: str, push: Any) -> tuple[float, Path, list[Any]]:
    """Runs ``push(base, api)`` (the timed pushes into job ``bench``) against a server of
    its own on a new database, as the baseline writes into a new file; returns the
    seconds, the database and the first 50 stored points."""
    db = Path(tmp) / f"{name}.sqlite"
    with running_server(env={"DATARAX_DB": str(db)}) as base, Client(base) as api:
        seconds = push(base, api)
        first = [p["reduced"] for p in api.get_job_metrics("bench", limit=50)["points"]]
    return seconds, db, first


def bench_durable_push(points: int = PUSH_POINTS) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    bodies = [_points(first, BATCH, rng) for first in range(0, points, BATCH)]
    # The client's columnar call: a job that holds its per-device metrics as arrays
    # ([1000, 8] per metric) pushes them as one npz body each.
    columns = [
        (
            np.array([p["step"] for p in batch]),
            {name: np.array([p["metrics"][name] for p in batch]) for name in names},
        )
        for batch in bodies
        for names in [list(batch[0]["metrics"])]
    ]

    def json_pushes(_base: str, api: Client) -> float:
        api.push_job_metrics_batch("warmup", bodies[0][:10])
        start = time.perf_counter()
        for batch in bodies:
            api.push_job_metrics_batch("bench", batch)
        return time.perf_counter() - start

    def npz_pushes(base: str, _api: Client) -> float:
        # npz bodies built from the same point lists in the timed loop, as the JSON client
        # encodes its bodies.
        with httpx.Client(base_url=base, timeout=600) as http:
            _post_npz(http, "warmup", _npz_batch(bodies[0][:10]))
            start = time.perf_counter()
            for batch in bodies:
                _post_npz(http, "bench", _npz_batch(batch))
            return time.perf_counter() - start

    def array_pushes(_base: str, api: Client) -> float:
        api.push_job_metrics_arrays("warmup", *columns[0])
        start = time.perf_counter()
        for steps, metrics in columns:
            api.push_job_metrics_arrays("bench", steps, metrics)
        return time.perf_counter() - start

    def pipelined_pushes(_base: str, api: Client) -> float:
        # The same columnar calls from the client's pusher: 2 batches in flight, each
        # still acknowledged only after its durable commit; timed until the last answer.
        api.push_job_metrics_arrays("warmup", *columns[0])
        start = time.perf_counter()
        with api.pusher("bench", in_flight=2) as pusher:
            for steps, metrics in columns:
                pusher.push_arrays(steps, metrics)
        assert len(pusher.results) == len(columns)
        return time.perf_counter() - start

    with tempfile.TemporaryDirectory() as tmp:
        served, db, first = _served_seconds(tmp, "json", json_pushes)
        served_npz, _, first_npz = _served_seconds(tmp, "npz", npz_pushes)
        served_arrays, _, first_arrays = _served_seconds(tmp, "arrays", array_pushes)
        served_pipelined, _, first_pipelined = _served_seconds(tmp, "pipelined", pipelined_pushes)
        assert first == first_npz == first_arrays == first_pipelined, (
            "an npz batch must store what JSON stores"
        )
        point_rows, rollup_rows = _baseline_rows(db)
    only_points = _executemany_seconds(point_rows, None)
    with_rollups = _executemany_seconds(point_rows, rollup_rows)
    return {
        "bench": "durable_push",
        "points": points,
        "served_points_per_s": round(points / served),
        "executemany_points_per_s": round(points / only_points),
        "executemany_with_rollups_points_per_s": round(points / with_rollups),
        "ratio_vs_point_rows": round(only_points / served, 3),
        "ratio_vs_same_rows": round(with_rollups / served, 3),
        "served_npz_points_per_s": round(points / served_npz),
        "ratio_npz_vs_same_rows": round(with_rollups / served_npz, 3),
        "served_arrays_points_per_s": round(points / served_arrays),
        "ratio_arrays_vs_same_rows": round(with_rollups / served_arrays, 3),
        "served_pipelined_points_per_s": round(points / served_pipelined),
        "ratio_pipelined_vs_same_rows": round(with_rollups / served_pipelined, 3),
        "target": ">= 0.5",
    }


def _fill_big_job(db: Path, steps: int) -> None:
    from app.storage import jobs as store_jobs
    from app.storage.db import Store

    store = Store(db)
    store.open()
    chunk = 20_000
    for first in range(0, steps, chunk):
        items = []
        for step in range(first, min(first + chunk, steps)):
            loss = 2.0 / (1 + step / 1000) + (step % 97) * 1e-4
            values = {"loss": loss, "lr": 1e-3}
            items.append(
                store_jobs.PushItem(
                    step=step,
                    source="",
                    sources=1,
                    digest=str(step),
                    num_devices=8,
                    reduced=orjson.dumps(values).decode(),
                    values=values,
                )
            )
        store._write(lambda c, i=items: store_jobs.push(c, "big", i, "2026-12-01T00:00:00Z", None))
    store.close()


def bench_downsampled_read(steps: int = READ_STEPS, repeats: int = 7) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "read.sqlite"
        _fill_big_job(db, steps)
        with running_server(env={"DATARAX_DB": str(db)}) as base, Client(base) as api:
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                answer = api.get_job_metrics("big", max_points=1000)
                times.append(time.perf_counter() - start)
            assert answer["downsampled"] and len(answer["buckets"]) <= 1000
            start = time.perf_counter()
            count = sum(1 for _ in api.iter_job_metrics("big", limit=10_000))
            full = time.perf_counter() - start
            assert count == steps
    return {
        "bench": "downsampled_read",
        "steps": steps,
        "buckets": len(answer["buckets"]),
        "downsampled_ms": round(statistics.median(times) * 1000, 1),
        "full_read_s": round(full, 2),
        "target": "< 50 ms",
    }


def _part(step: int, devices: np.ndarray) -> dict[str, Any]:
    return {"step": step, "metrics": {"loss": devices.tolist()}}


async def _push_sources(base: str, values: np.ndarray, sources: int, per_batch: int) -> float:
    steps, devices = values.shape
    per_source = devices // sources

    async def source(api: AsyncClient, index: int) -> None:
        part = values[:, index * per_source : (index + 1) * per_source]
        for first in range(0, steps, per_batch):
            points = [_part(s, part[s]) for s in range(first, min(first + per_batch, steps))]
            await api.push_job_metrics_batch(
                f"multi-{sources}", points, source=f"host-{index}", sources=sources
            )

    async with AsyncClient(base, timeout_s=600) as api:
        start = time.perf_counter()
        await asyncio.gather(*(source(api, i) for i in range(sources)))
        return time.perf_counter() - start


def _raw_request(host: str, call: Any) -> bytes:
    """``call`` (a :class:`datarax.client._core.Call` with an npz body) as HTTP/1.1 bytes."""
    query = "?" + urlencode(call.params) if call.params else ""
    head = (
        f"POST {call.path}{query} HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/x-npz\r\nContent-Length: {len(call.content)}\r\n\r\n"
    )
    return head.encode() + call.content


async def _raw_answer(reader: asyncio.StreamReader) -> None:
    header = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in header.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length)
    status = int(header[9:12])
    assert status in (200, 201), (status, body[:300])


async def _raw_run(base: str, requests: list[list[bytes]]) -> float:
    """Sends each host's requests (pre-encoded HTTP/1.1) one after another on a keep-alive
    connection of its own, all hosts at once, with raw asyncio streams: microseconds of
    load-generator work a request, so the server, not simulated clients sharing its 2
    cores, sets the time (each real host pays its own client on its own CPU). Returns the
    seconds from the first write to the last answer."""
    host, port = base.split("//")[1].split(":")
    streams = [await asyncio.open_connection(host, int(port)) for _ in requests]

    async def source(index: int) -> None:
        reader, writer = streams[index]
        for request in requests[index]:
            writer.write(request)
            await _raw_answer(reader)

    start = time.perf_counter()
    await asyncio.gather(*(source(i) for i in range(len(requests))))
    seconds = time.perf_counter() - start
    for _, writer in streams:
        writer.close()
    return seconds


def _host(base: str) -> str:
    return base.split("//")[1].split(":")[0]


async def _push_sources_raw(base: str, values: np.ndarray, sources: int, per_batch: int) -> float:
    """The same pushes as :func:`_push_sources`, columnar (the client's npz bodies, built
    before the clock starts), sent by :func:`_raw_run`."""
    steps, devices = values.shape
    per_source = devices // sources
    job = f"raw-{sources}-{per_batch}"

    def part(i: int, first: int) -> dict[str, np.ndarray]:
        return {"loss": values[first : first + per_batch, i * per_source : (i + 1) * per_source]}

    requests = [
        [
            _raw_request(
                _host(base),
                arrays_batch_call(
                    job,
                    np.arange(first, min(first + per_batch, steps)),
                    part(i, first),
                    None,
                    None,
                    None,
                    f"host-{i}",
                    sources,
                ),
            )  # fmt: skip
            for first in range(0, steps, per_batch)
        ]
        for i in range(sources)
    ]
    return await _raw_run(base, requests)


async def _reduce_floor_raw(base: str, values: np.ndarray, sources: int) -> float:
    """64 hosts' part bodies (one batch of every step each) posted at once to
    ``POST /v1/metrics/reduce`` (npz: read, decoded, reduced over the device axis, a small
    answer: the part read as 1,000 "devices" of 4 values; nothing stored): what the pushes
    cost before any part is stored or merged."""
    per_source = values.shape[1] // sources
    calls = [
        reduce_call(
            {"loss": values[:, i * per_source : (i + 1) * per_source]}, None, None, None, True
        )  # fmt: skip
        for i in range(sources)
    ]
    return await _raw_run(base, [[_raw_request(_host(base), call)] for call in calls])


def bench_multi_source(
    sources: int = 64, steps: int = 1000, devices: int = 4, batch: int = 1000
) -> dict[str, Any]:
    values = np.random.default_rng(3).random((steps, sources * devices)).round(6)
    with running_server() as base:
        many = asyncio.run(_push_sources(base, values, sources, batch))
        one = asyncio.run(_push_sources(base, values, 1, batch))
        raw_many = asyncio.run(_push_sources_raw(base, values, sources, batch))
        raw_one = asyncio.run(_push_sources_raw(base, values, 1, batch))
        floor = min(asyncio.run(_reduce_floor_raw(base, values, sources)) for _ in range(3))
        with Client(base) as api:
            stored = {
                job: [p["reduced"] for p in api.iter_job_metrics(job, limit=10_000)]
                for job in (
                    f"multi-{sources}",
                    "multi-1",
                    f"raw-{sources}-{batch}",
                    f"raw-1-{batch}",
                )
            }
    a = stored[f"multi-{sources}"]
    assert len(a) == steps and all(v == a for v in stored.values()), (
        "merged parts must equal one push of every device"
    )
    return {
        "bench": "multi_source_push",
        "sources": sources,
        "devices_per_source": devices,
        "steps": steps,
        "batch": batch,
        "parts_per_s": round(sources * steps / many),
        "steps_per_s": round(steps / many),
        "one_source_steps_per_s": round(steps / one),
        "ratio_vs_one_source": round(one / many, 3),
        "raw_arrays_parts_per_s": round(sources * steps / raw_many),
        "raw_arrays_one_source_steps_per_s": round(steps / raw_one),
        "raw_arrays_ratio_vs_one_source": round(raw_one / raw_many, 3),
        "raw_arrays_one_source_ms": round(raw_one * 1000, 1),
        "raw_arrays_many_ms": round(raw_many * 1000, 1),
        "reduce_only_floor_ms": round(floor * 1000, 1),
        "target": ">= 0.5",
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Every row (see the module docstring); ``quick`` runs a tenth of each."""
    scale = 10 if quick else 1
    return [
        bench_durable_push(PUSH_POINTS // scale),
        bench_downsampled_read(READ_STEPS // scale),
        bench_multi_source(64, 1000 // scale, devices=4, batch=1000),
        bench_multi_source(64, 1000 // scale, devices=4, batch=250),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for row in run(args.quick):
        print(json.dumps(row) if args.json else row, flush=True)


if __name__ == "__main__":
    main()
