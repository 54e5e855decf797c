"""Device spread of job points (app.services.jobs.spread, app.storage.spreads): computed
as a brute-force loop over devices would, stored by every push path (single, batch as
columns and point by point, npz, parts merged across sources), answered on history
points, and kept as extremes by downsampled buckets at every rollup level."""

from __future__ import annotations

import io
import math

import anyio
import numpy as np
import orjson
import pytest

from app.services.jobs.decode import decode_point
from app.services.jobs.history import history
from app.services.jobs.push import push_batch, push_npz_batch, push_single
from app.services.jobs.spread import point_spread, spread_rows
from app.storage.jobs import delete_job


def brute(devices: list[list[float]]) -> dict | None:
    """min, max and their (first) devices over the finite values, device by device."""
    best = None
    for device, values in enumerate(devices):
        for v in values:
            if not math.isfinite(v):
                continue
            if best is None:
                best = {"min": v, "max": v, "min_device": device, "max_device": device}
                continue
            if v < best["min"]:
                best["min"], best["min_device"] = v, device
            if v > best["max"]:
                best["max"], best["max_device"] = v, device
    return best


def _rows(array: np.ndarray) -> list[list[float]]:
    return [np.asarray(d, dtype=np.float64).reshape(-1).tolist() for d in array]


@pytest.mark.parametrize("seed", range(6))
def test_spread_rows_match_a_loop_over_devices(seed):
    rng = np.random.default_rng(seed)
    points, devices = 7, int(rng.integers(2, 9))
    loss = rng.integers(-3, 4, size=(points, devices)).astype(np.float64)  # ties on purpose
    loss[0, :] = np.nan  # no finite value: no spread for it
    loss[1, 0] = np.inf
    grads = rng.normal(size=(points, devices, 3))
    grads[2, 1, 2] = -np.inf
    counts = rng.integers(0, 100, size=(points, devices))  # integers count too
    columns = {"loss": loss, "grads": grads, "count": counts, "lr": np.ones(points)}
    columns["_weights"] = np.ones((points, devices))
    got = spread_rows(columns, points)
    for i in range(points):
        want = {}
        for name in ("loss", "grads", "count"):
            found = brute(_rows(columns[name][i]))
            if found is not None:
                want[name] = found
        assert (got[i] or {}) == want, i


def test_one_device_and_one_number_have_no_spread():
    assert point_spread({"loss": np.array([1.0]), "lr": np.float64(0.1)}) is None
    assert point_spread({"loss": np.array([[1.0, 2.0]])}) is None  # one device, two values
    assert point_spread({"flag": np.array(["a", "b"])}) is None
    assert point_spread({"loss": np.array([2.0, 1.0])}) == {
        "loss": {"min": 1.0, "max": 2.0, "min_device": 1, "max_device": 0}
    }


def _history(store, job: str, **options) -> dict:
    async def run() -> bytes:
        return await history(store, job, **options)

    return orjson.loads(anyio.run(run))


def _single(store, job: str, point: dict) -> None:
    options = {"step": None, "reduce": None, "nan_policy": None, "source": None, "sources": None}
    batch = decode_point(
        orjson.dumps(point), "application/json", None, max_bytes=1 << 20, **options
    )
    anyio.run(push_single, store, job, batch)


def _spreads(store, job: str) -> dict[int, dict]:
    points = _history(store, job, limit=10_000)["points"]
    return {p["step"]: p.get("spread") for p in points}


def test_every_push_path_stores_the_spread(store):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(40, 6))
    data[3, 2] = np.nan
    # single pushes
    for step in range(5):
        _single(store, "single", {"step": step, "metrics": {"loss": data[step].tolist()}})
    # a JSON batch: the column path (plain) and the point-by-point path (weights)
    points = [{"step": s, "metrics": {"loss": data[s].tolist()}} for s in range(5, 20)]
    anyio.run(push_batch, store, "batch", orjson.dumps({"points": points}))
    weighted = [
        {"step": s, "metrics": {"loss": data[s].tolist()}, "weights": [1.0] * 6}
        for s in range(20, 25)
    ]
    anyio.run(push_batch, store, "weighted", orjson.dumps({"points": weighted}))
    # an npz batch
    buffer = io.BytesIO()
    np.savez(buffer, _step=np.arange(25, 30), loss=data[25:30])
    options = {"max_bytes": 1 << 20, "reduce": None, "nan_policy": None}
    anyio.run(
        lambda: push_npz_batch(
            store, "npz", buffer.getvalue(), source=None, sources=None, **options
        )
    )
    expected = {s: {"loss": brute([[v] for v in data[s]])} for s in range(30)}
    for job, steps in (("single", range(5)), ("batch", range(5, 20)), ("npz", range(25, 30))):
        got = _spreads(store, job)
        assert got == {s: expected[s] for s in steps}, job
    assert _spreads(store, "weighted") == {s: expected[s] for s in range(20, 25)}


def test_parts_spread_over_the_merged_devices_in_source_order(store):
    rng = np.random.default_rng(1)
    whole = rng.normal(size=(4, 6))  # steps x (2 sources x 3 devices)
    for source in (1, 0):  # arrival order does not matter: source order does
        for step in range(2):  # single parts
            part = whole[step, 3 * source : 3 * source + 3].tolist()
            _single(
                store,
                "parts",
                {"step": step, "source": f"h{source}", "sources": 2, "metrics": {"loss": part}},
            )
        batch = [  # a batch of parts (one segment)
            {
                "step": step,
                "source": f"h{source}",
                "sources": 2,
                "metrics": {"loss": whole[step, 3 * source : 3 * source + 3].tolist()},
            }
            for step in range(2, 4)
        ]
        anyio.run(push_batch, store, "parts", orjson.dumps({"points": batch}))
    got = _spreads(store, "parts")
    assert got == {s: {"loss": brute([[v] for v in whole[s]])} for s in range(4)}


@pytest.mark.parametrize("window", [(0, 4999), (37, 4321), (1000, 1100)])
def test_buckets_keep_the_extremes_of_their_steps(store, window):
    rng = np.random.default_rng(2)
    steps = 5000
    data = rng.normal(size=(steps, 8))
    data[100, 5] = 50.0  # a straggler
    for first in range(0, steps, 1000):
        points = [
            {"step": s, "metrics": {"loss": data[s].tolist(), "lr": 0.1}}
            for s in range(first, first + 1000)
        ]
        anyio.run(push_batch, store, "long", orjson.dumps({"points": points}))
    low, high = window
    answer = _history(store, "long", since_step=low, until_step=high, max_points=20)
    assert answer["kind"] == "buckets"
    for bucket, row in zip(answer["buckets"], answer["points"], strict=True):
        a, b = bucket["start_step"], bucket["end_step"]
        block = data[a : b + 1]
        lo = np.unravel_index(np.argmin(block), block.shape)
        hi = np.unravel_index(np.argmax(block), block.shape)
        want = {
            "min": float(block[lo]),
            "max": float(block[hi]),
            "min_device": int(lo[1]),
            "max_device": int(hi[1]),
            "min_step": a + int(lo[0]),
            "max_step": a + int(hi[0]),
        }
        assert bucket["spread"] == {"loss": want}, (a, b)
        assert row["spread"] == bucket["spread"]
    if low <= 100 <= high:
        top = max(answer["buckets"], key=lambda k: k["spread"]["loss"]["max"])
        assert top["spread"]["loss"]["max_device"] == 5 and top["spread"]["loss"]["max_step"] == 100


def test_deleting_a_job_deletes_its_spreads(store):
    points = [{"step": s, "metrics": {"loss": [1.0, float(s)]}} for s in range(50)]
    anyio.run(push_batch, store, "gone", orjson.dumps({"points": points}))

    def count(conn) -> tuple[int, int]:
        return tuple(
            conn.execute(f"SELECT count(*) FROM {t} WHERE job = 'gone'").fetchone()[0]
            for t in ("job_spreads", "job_spread_blocks")
        )

    assert all(anyio.run(store.read, count))
    anyio.run(store.write, lambda conn: delete_job(conn, "gone"))
    assert anyio.run(store.read, count) == (0, 0)
