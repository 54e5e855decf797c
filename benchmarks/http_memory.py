"""Issue 41: what the HTTP process holds after mixed load, and what bounds it.

Starts the real ``datarax-serve`` once per allocator variant (a free port, a temporary
SQLite file, 8 simulated CPU devices; all variants' servers run at once), drives the same
fixed amount of mixed work with ten concurrent clients at one server at a time, variant
after variant and round after round, and records the server process's memory: before the
load, at its peak (``VmHWM``) and after the load has settled, split by where glibc keeps
it (the main heap, the worker arenas' heaps, other anonymous mappings; from
``/proc/<pid>/smaps``), with the server's CPU seconds and minor page faults for the work.
Then it times 32 MB npz reduces on every variant, interleaved, back to back and after an
idle spell: the cost that keeping freed memory exists to avoid (page faults on fresh
buffers). ``--diagnose`` adds glibc's own account (``malloc_info``, through gdb).

The variants: ``today`` (the allocator settings before issue 41, reproduced here),
``arena_max_2`` (the same with ``MALLOC_ARENA_MAX=2``), ``no_keep`` (glibc's defaults),
``fix`` (the server as shipped), and any ``--variant NAME=JSON`` of
:func:`app.core.allocator.keep_freed_memory` arguments.

Run: ``python -m benchmarks.http_memory [--rounds 6] [--repeats 3] [--diagnose]``
(about 20 minutes for the four variants on 2 cores). ``tests/e2e/test_memory_plateau.py``
runs a smaller load of the same mix (:data:`SMALL_WORKLOAD`, ``--small`` here).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
IDLE_S = 5.0
"""app.core.allocator.IDLE_S (not imported: the benchmark runs older allocators too)."""
MiB = 1 << 20
HEAP_MAX_BYTES = 64 * MiB
"""glibc's per-thread arena heaps are mapped ``2 * DEFAULT_MMAP_THRESHOLD_MAX`` (64 MiB on
64-bit) long and aligned to it, which is how they are told apart in smaps."""
NPZ = "application/x-npz"


# ------------------------------------------------------------------------------ memory


@dataclass(frozen=True)
class Memory:
    """One reading of a process's memory, in MiB.

    Attributes:
      rss: ``VmRSS`` (resident, all kinds).
      peak: ``VmHWM`` (the highest ``VmRSS`` since the process started).
      anon: ``Anonymous`` of ``smaps_rollup`` (resident memory not backed by a file).
      main_heap: resident part of ``[heap]``, glibc's main arena (``brk``).
      heaps: heaps of glibc's other arenas (the worker threads'), 64 MiB each at most.
      heap_rss: resident memory in those heaps.
      other_anon: every other resident anonymous mapping (``mmap``-ed blocks above the
        mmap threshold, pymalloc arenas, thread stacks, numpy's and SQLite's own).
    """

    rss: float
    peak: float
    anon: float
    main_heap: float
    heaps: int
    heap_rss: float
    other_anon: float


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def rss_mib(pid: int) -> float:
    """``VmRSS`` of ``pid`` in MiB."""
    return _status_kib(pid, "VmRSS") / 1024


def _anonymous_mappings(pid: int) -> list[tuple[int, int, str, int]]:
    """``(start, end, name, anonymous KiB)`` of every mapping of ``pid``, in address order."""
    mappings: list[tuple[int, int, str, int]] = []
    current: list = []
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if not head[0].endswith(":") and "-" in head[0]:
            low, high = (int(x, 16) for x in head[0].split("-"))
            current = [low, high, head[5] if len(head) > 5 else "", 0]
            mappings.append(current)  # type: ignore[arg-type]
        elif head[0] == "Anonymous:":
            current[3] = int(head[1])
    return [tuple(m) for m in sorted(mappings)]  # type: ignore[misc]


def read_memory(pid: int) -> Memory:
    """Where ``pid``'s resident memory is (see :class:`Memory`).

    A worker arena's heap is one 64 MiB reservation aligned to 64 MiB: an unnamed
    mapping that starts on such a boundary, and every mapping right after it up to the
    next boundary (numpy's ``madvise`` of huge pages splits one heap into several
    mappings).
    """
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    anon_kib = next(
        int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Anonymous:")
    )
    main_kib = heap_kib = other_kib = heaps = 0
    window_end = previous_end = 0
    for start, end, name, kib in _anonymous_mappings(pid):
        if name == "[heap]":
            main_kib += kib
            continue
        if not name and start % HEAP_MAX_BYTES == 0:
            heaps, window_end = heaps + 1, start + HEAP_MAX_BYTES
        elif name or start != previous_end or end > window_end:
            window_end = 0
        previous_end = end
        if window_end:
            heap_kib += kib
        else:
            other_kib += kib
    return Memory(
        rss=rss_mib(pid),
        peak=_status_kib(pid, "VmHWM") / 1024,
        anon=anon_kib / 1024,
        main_heap=main_kib / 1024,
        heaps=heaps,
        heap_rss=heap_kib / 1024,
        other_anon=other_kib / 1024,
    )


# ------------------------------------------------------------------------------ workload


@dataclass(frozen=True)
class Workload:
    """A fixed amount of mixed work: every client runs ``rounds`` rounds of the mix.

    Attributes:
      clients: concurrent clients (threads, one keep-alive connection each).
      rounds: rounds of the mix per client.
      npz_values: float32 values of the large npz reduce body (8 devices).
      json_values: numbers of the large JSON reduce and collect bodies (8 devices).
      big_plan_devices: devices of the large abstract plan (its answer is ~128 B each).
    """

    clients: int = 10
    rounds: int = 6
    npz_values: int = 8_000_000
    json_values: int = 400_000
    big_plan_devices: int = 65_536


SMALL_WORKLOAD = Workload(
    clients=10, rounds=2, npz_values=4_000_000, json_values=200_000, big_plan_devices=16_384
)
"""The end-to-end test's load: the same mix, smaller bodies, within a minute on 2 cores."""


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def build_bodies(work: Workload) -> dict[str, bytes]:
    """Every request body of the mix, encoded once (the clients only send them)."""
    rng = np.random.default_rng(41)
    big = rng.standard_normal((8, work.npz_values // 8), dtype=np.float32)
    rows = rng.standard_normal((8, work.json_values // 8)).round(6).tolist()
    steps = np.arange(1000, dtype=np.int64)
    side = 1 << (work.big_plan_devices.bit_length() - 1) // 2
    return {
        "reduce_npz": _npz(loss=big),
        "reduce_json": orjson.dumps({"metrics": {"loss": rows}, "reduce": {"loss": "mean"}}),
        "collect_json": orjson.dumps({"metrics": {"loss": rows[:4] * 2}}),
        "push_npz": _npz(loss=rng.standard_normal((8, 512), dtype=np.float32)),
        "batch_npz": _npz(
            _step=steps, loss=rng.standard_normal((1000, 8), dtype=np.float32), acc=steps
        ),
        "small_plan": orjson.dumps({"axes": {"data": 4, "model": 2}, "num_devices": 8}),
        "big_plan": orjson.dumps(
            {
                "axes": {"data": work.big_plan_devices // side, "model": side},
                "num_devices": work.big_plan_devices,
                "batch_shape": [work.big_plan_devices, 4096],
                "batch_axes": ["data", "model"],
            }
        ),
    }


@dataclass
class LoadResult:
    """What one load run did: its wall time, per-kind latencies (s), 503 retries."""

    wall_s: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=dict)
    retries: int = 0
    errors: list[str] = field(default_factory=list)


def _post(client: httpx.Client, path: str, body: bytes, media: str, result: LoadResult) -> str:
    """POSTs until it is not 503 busy (plans over 4,096 devices queue in the heavy lane)."""
    for _ in range(200):
        answer = client.post(path, content=body, headers={"content-type": media})
        if answer.status_code != 503:
            if answer.status_code >= 300:
                result.errors.append(f"{path}: {answer.status_code} {answer.text[:200]}")
            return answer.headers.get("location", "")
        result.retries += 1
        time.sleep(0.2)  # sooner than Retry-After (1 s): the lane frees within tenths
    result.errors.append(f"{path}: busy 200 times")
    return ""


def _client(
    base: str,
    index: int,
    work: Workload,
    bodies: Mapping[str, bytes],
    result: LoadResult,
    lock: threading.Lock,
) -> None:
    """One client: ``work.rounds`` rounds of the mix, each started at another step of it
    (client ``index`` begins at kind ``index``), so the ten clients send different kinds
    at once."""
    job = f"mem-{index}"
    js = "application/json"
    steps: list[tuple[str, str, str, str]] = [
        ("reduce_npz", "/v1/metrics/reduce?reduce=loss:mean", "reduce_npz", NPZ),
        ("reduce_json", "/v1/metrics/reduce", "reduce_json", js),
        ("collect_json", "/v1/metrics/collect", "collect_json", js),
        ("push_npz", f"/v1/jobs/{job}/metrics?step={{step}}", "push_npz", NPZ),
        ("batch_npz", f"/v1/jobs/{job}-b{{round}}/metrics/batch", "batch_npz", NPZ),
        ("small_plan", "/v1/meshes", "small_plan", js),
        ("big_plan", "/v1/meshes", "big_plan", js),
        ("read_plan", "", "", ""),
        ("read_history", f"/v1/jobs/{job}-b{{round}}/metrics?limit=1000", "", ""),
    ]
    plans: list[str] = []
    timings: dict[str, list[float]] = {}
    with httpx.Client(base_url=base, timeout=300.0) as client:
        for round_ in range(work.rounds):
            for offset in range(len(steps)):
                kind, path, body, media = steps[(index + offset) % len(steps)]
                path = path.format(step=round_ * len(steps) + offset, round=round_)
                start = time.perf_counter()
                try:
                    if kind == "read_plan":
                        if not plans:
                            continue
                        client.get(plans[-1]).raise_for_status()
                    elif not body:
                        client.get(path).raise_for_status()
                    else:
                        where = _post(client, path, bodies[body], media, result)
                        if kind.endswith("plan") and where:
                            plans.append(where)
                except httpx.HTTPError as err:
                    result.errors.append(f"{kind}: {err!r}")
                    continue
                timings.setdefault(kind, []).append(time.perf_counter() - start)
    with lock:
        for kind, times in timings.items():
            result.latencies.setdefault(kind, []).extend(times)


def run_load(base: str, work: Workload, bodies: Mapping[str, bytes]) -> LoadResult:
    """Runs ``work`` against ``base`` with ``work.clients`` concurrent clients."""
    result, lock = LoadResult(), threading.Lock()
    threads = [
        threading.Thread(target=_client, args=(base, i, work, bodies, result, lock), daemon=True)
        for i in range(work.clients)
    ]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result.wall_s = time.perf_counter() - start
    if len(result.latencies) == 0:
        result.errors.append("no request completed")
    return result


# ------------------------------------------------------------------------------ servers


@dataclass(frozen=True)
class Variant:
    """One allocator setting of the server.

    Attributes:
      name: the row's name.
      allocator: arguments of :func:`app.core.allocator.keep_freed_memory` applied instead
        of ``datarax-serve``'s own call (``{"legacy": true}``: the settings before issue 41,
        reproduced by :func:`legacy_keep_freed_memory`); None: the server as shipped.
      env: extra environment of the server.
      what: one line for the table.
    """

    name: str
    allocator: Mapping[str, object] | None
    env: Mapping[str, str]
    what: str


VARIANTS = (
    Variant(
        "today",
        {"legacy": True},
        {},
        "before issue 41: M_MMAP_THRESHOLD 32 MiB, M_TRIM_THRESHOLD max(256 MiB, 4 x body)",
    ),
    Variant(
        "arena_max_2",
        {"legacy": True},
        {"MALLOC_ARENA_MAX": "2"},
        "the same, with MALLOC_ARENA_MAX=2 in the environment",
    ),
    Variant(
        "no_keep", None, {"DATARAX_MALLOC_KEEP_MB": "0"}, "no keep_freed_memory: glibc's defaults"
    ),
    Variant("fix", None, {}, "as shipped: see app/core/allocator.py"),
)

ALLOCATOR_ENV = "DATARAX_BENCH_ALLOCATOR"
"""Read only by :func:`serve_with_allocator`, the benchmark's entry point of the server."""


def legacy_keep_freed_memory(trim_bytes: int, arenas: int = 0) -> None:
    """``keep_freed_memory`` as it was before issue 41 (two ``mallopt`` calls), with an
    optional ``M_ARENA_MAX`` (no trimmer thread)."""
    import ctypes  # noqa: PLC0415

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 32 * MiB)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, min(trim_bytes, 2**31 - 1))  # M_TRIM_THRESHOLD
    if arenas:
        libc.mallopt(-8, arenas)  # M_ARENA_MAX


def serve_with_allocator() -> None:
    """``datarax-serve`` with the allocator settings of ``$DATARAX_BENCH_ALLOCATOR``."""
    import app.cli  # noqa: PLC0415
    from app.core import allocator  # noqa: PLC0415
    from app.core.settings import Settings  # noqa: PLC0415

    spec = json.loads(os.environ[ALLOCATOR_ENV])
    if spec.pop("legacy", False):
        default_trim = max(256 * MiB, 4 * Settings().max_body_bytes)
        legacy_keep_freed_memory(
            int(spec.get("trim_mb", 0) * MiB) or default_trim, spec.get("arenas", 0)
        )
    else:
        allocator.keep_freed_memory(int(spec.pop("keep_mb") * MiB), **spec)
    app.cli.keep_freed_memory = lambda *_, **__: False  # type: ignore[assignment]
    app.cli.cli(["--host", "127.0.0.1", "--port", os.environ["DATARAX_PORT"]])


@contextlib.contextmanager
def serve(variant: Variant, ready_timeout_s: float = 180.0) -> Iterator[tuple[str, int]]:
    """The real ``datarax-serve`` of ``variant`` on a free port over a temporary database;
    yields its base URL and the pid of its HTTP process. Killed by process group on exit."""
    from benchmarks.server import free_port  # noqa: PLC0415

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        full_env = {
            **os.environ,
            "DATARAX_DB": str(Path(tmp) / "memory.sqlite"),
            "DATARAX_CPU_DEVICES": "8",
            "DATARAX_PLATFORMS": "cpu",
            "JAX_PLATFORMS": "cpu",
            "DATARAX_LOG_LEVEL": "warning",
            "DATARAX_PORT": str(port),
            "PYTHONPATH": str(ROOT),
            **variant.env,
        }
        command = [sys.executable, "-m", "app.cli", "--host", "127.0.0.1", "--port", str(port)]
        if variant.allocator is not None:
            full_env[ALLOCATOR_ENV] = json.dumps(variant.allocator)
            entry = "from benchmarks.http_memory import serve_with_allocator as s; s()"
            command = [sys.executable, "-c", entry]
        with open(Path(tmp) / "server.log", "wb") as log_file:  # the server has its own fd
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
                start_new_session=True,
            )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/health/ready", timeout=2).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (Path(tmp) / "server.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"server did not become ready:\n{log}")
                time.sleep(0.2)
            yield base, proc.pid
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def cpu_and_faults(pid: int) -> tuple[float, int]:
    """CPU seconds (user + system, every thread) and minor page faults of ``pid`` so far:
    the load's cost, much less sensitive than wall time to what else the machine runs."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the name: state is field 3 of proc(5), so field n is fields[n - 3].
    ticks = int(fields[14 - 3]) + int(fields[15 - 3])
    return ticks / os.sysconf("SC_CLK_TCK"), int(fields[10 - 3])


def measure_load(
    base: str, pid: int, work: Workload, bodies: Mapping[str, bytes], settle_s: float
) -> dict:
    """Memory before, at peak and ``settle_s`` after one run of ``work`` on one server,
    with the run's wall time and per-kind median latencies."""
    before, (cpu, faults) = read_memory(pid), cpu_and_faults(pid)
    load = run_load(base, work, bodies)
    cpu_after, faults_after = cpu_and_faults(pid)
    time.sleep(settle_s)
    after = read_memory(pid)
    return {
        "before": asdict(before),
        "after": asdict(after),
        "peak_mib": after.peak,
        "cpu_s": cpu_after - cpu,
        "minor_faults": faults_after - faults,
        "wall_s": load.wall_s,
        "retries": load.retries,
        "errors": load.errors[:5],
        "latencies": load.latencies,
    }


def _post_npz(client: httpx.Client, body: bytes) -> float:
    start = time.perf_counter()
    client.post(
        "/v1/metrics/reduce?reduce=loss:mean",
        content=body,
        headers={"content-type": NPZ, "accept": NPZ},
    ).raise_for_status()
    return time.perf_counter() - start


def time_npz(
    bases: Mapping[str, str], body: bytes, repeats: int, cold: int, idle_s: float
) -> dict[str, dict[str, float]]:
    """Seconds of one npz reduce (npz answer, so receiving the body is most of it) per
    server, one client, interleaved over the servers (drift hits each alike): the median
    of ``repeats`` back-to-back requests (``warm``), and of ``cold`` requests each sent
    after ``idle_s`` seconds without work, when an idle trim has given freed memory back
    (``after_idle``)."""
    warm: dict[str, list[float]] = {name: [] for name in bases}
    after_idle: dict[str, list[float]] = {name: [] for name in bases}
    clients = {name: httpx.Client(base_url=base, timeout=120.0) for name, base in bases.items()}
    names = list(bases)
    try:
        for name in names:
            _post_npz(clients[name], body)
        for i in range(repeats):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                warm[name].append(_post_npz(clients[name], body))
        for i in range(cold):
            time.sleep(idle_s)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                after_idle[name].append(_post_npz(clients[name], body))
    finally:
        for client in clients.values():
            client.close()
    return {
        name: {
            "warm": statistics.median(warm[name]),
            "after_idle": statistics.median(after_idle[name]) if cold else float("nan"),
        }
        for name in names
    }


def malloc_arenas(pid: int) -> list[dict[str, float]] | None:
    """Per arena of ``pid``: the memory glibc has from the kernel and how much of it is
    free, in MiB, from ``malloc_info`` called in the process by gdb; None without gdb
    (or where it may not attach). A diagnosis: it stops the process for a moment."""
    import shutil  # noqa: PLC0415
    import xml.etree.ElementTree as ET  # noqa: PLC0415

    if shutil.which("gdb") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "malloc_info.xml"
        call = f'call (int)malloc_info(0, (void*)fopen("{out}", "w"))'
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            subprocess.run(
                ["gdb", "-p", str(pid), "-batch", "-ex", call, "-ex", "call (int)fflush(0)"],
                capture_output=True,
                timeout=120,
                check=False,
            )
        if not out.exists() or not out.stat().st_size:
            return None
        arenas = []
        for heap in ET.parse(out).getroot().findall("heap"):
            free = sum(int(t.get("size", 0)) for t in heap.findall("total"))
            system = next(
                int(t.get("size", 0)) for t in heap.findall("system") if t.get("type") == "current"
            )
            if system:
                arenas.append({"system": system / MiB, "free": free / MiB})
        return arenas


def compare(
    variants: list[Variant],
    work: Workload,
    *,
    repeats: int,
    settle_s: float,
    npz_repeats: int,
    idle_repeats: int,
    diagnose: bool,
) -> dict:
    """Every variant's server up at once; the load runs on one at a time, ``repeats``
    rounds of every variant, each round starting at the next variant (so drift hits each
    alike); then the npz timing, interleaved."""
    bodies = build_bodies(work)
    runs: dict[str, list[dict]] = {v.name: [] for v in variants}
    arenas: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        servers = {v.name: stack.enter_context(serve(v)) for v in variants}
        time.sleep(settle_s)  # the servers' start-up work is done before any load
        names = list(servers)
        for i in range(repeats):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                base, pid = servers[name]
                runs[name].append(measure_load(base, pid, work, bodies, settle_s))
                print(name, json.dumps(runs[name][-1]["after"]), flush=True)
        if diagnose:
            arenas = {name: malloc_arenas(pid) for name, (_, pid) in servers.items()}
        npz = time_npz(
            {n: b for n, (b, _) in servers.items()},
            bodies["reduce_npz"],
            npz_repeats,
            cold=idle_repeats,
            idle_s=IDLE_S + 3.0,
        )
    return {
        "runs": runs,
        "npz_s": npz,
        "malloc_arenas": arenas,
        "variants": [asdict(v) for v in variants],
    }


def summary(result: dict, reference: str) -> list[str]:
    """The markdown table: memory of the first and last load run, time ratios."""
    runs, npz = result["runs"], result["npz_s"]
    ref_runs = runs[reference]

    def pooled(rows: list[dict], kind: str) -> float:
        return statistics.median(t for row in rows for t in row["latencies"].get(kind, []))

    kinds = sorted(ref_runs[0]["latencies"])
    lines = [
        "| variant | RSS before | peak | after run 1 | after last run "
        "| main heap / worker heaps after | server CPU vs ref | minor faults "
        "| request median vs ref | npz alone vs ref | npz after idle vs ref |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ref_cpu = statistics.median(r["cpu_s"] for r in ref_runs)
    for name, rows in runs.items():
        first, last = rows[0], rows[-1]
        cpu = statistics.median(r["cpu_s"] for r in rows)
        faults = statistics.median(r["minor_faults"] for r in rows)
        ratios = [pooled(rows, k) / pooled(ref_runs, k) for k in kinds]
        lines.append(
            f"| {name} | {first['before']['rss']:.0f} | {last['peak_mib']:.0f} "
            f"| {first['after']['rss']:.0f} | {last['after']['rss']:.0f} "
            f"| {last['after']['main_heap']:.0f} / {last['after']['heap_rss']:.0f} "
            f"| {cpu / ref_cpu:.2f} ({cpu:.1f} s) | {faults / 1e3:.0f}k "
            f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"| {npz[name]['warm'] / npz[reference]['warm']:.2f} "
            f"({1e3 * npz[name]['warm']:.0f} ms) "
            f"| {npz[name]['after_idle'] / npz[reference]['after_idle']:.2f} "
            f"({1e3 * npz[name]['after_idle']:.0f} ms) |"
        )
    return lines


def _variant(text: str) -> Variant:
    name, _, spec = text.partition("=")
    return Variant(name, json.loads(spec), {}, f"keep_freed_memory({spec})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of the mix per client")
    parser.add_argument("--repeats", type=int, default=2, help="load runs per variant")
    parser.add_argument("--settle-s", type=float, default=15.0)
    parser.add_argument("--npz-repeats", type=int, default=30, help="back-to-back npz reduces")
    parser.add_argument("--idle-repeats", type=int, default=5, help="npz reduces after idling")
    parser.add_argument("--only", nargs="*", help="variants to run (names)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        type=_variant,
        help="an extra variant: NAME=JSON of keep_freed_memory arguments, e.g. "
        '\'k128={"keep_mb": 128, "arenas": 2}\'',
    )
    parser.add_argument("--small", action="store_true", help="the end-to-end test's load")
    parser.add_argument(
        "--diagnose",
        action="store_true",
        help="after the loads, malloc_info of every server (needs gdb)",
    )
    parser.add_argument("--json", type=Path, help="write every number here")
    args = parser.parse_args(argv)
    variants = [v for v in VARIANTS if not args.only or v.name in args.only] + args.variant
    work = SMALL_WORKLOAD if args.small else Workload(clients=args.clients, rounds=args.rounds)
    result = compare(
        variants,
        work,
        repeats=args.repeats,
        settle_s=args.settle_s,
        npz_repeats=args.npz_repeats,
        idle_repeats=args.idle_repeats,
        diagnose=args.diagnose,
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    print("\n".join(summary(result, variants[0].name)))
    for name, arenas in result["malloc_arenas"].items():
        if arenas:
            print(
                f"{name}: malloc arenas (MiB held / free):",
                ", ".join(f"{a['system']:.0f}/{a['free']:.0f}" for a in arenas),
            )


if __name__ == "__main__":
    main()
