"""Test set-up: 8 simulated CPU devices, fixed before JAX initialises its backends; libtpu
shared with the host's other test processes; and, under pytest-xdist (``make test``), the
tests that share a fixture built once per module kept on one worker, the longest first."""

import os
import resource
from collections import defaultdict

os.environ["JAX_PLATFORMS"] = "cpu"
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
# libtpu (the TPU topology tests load it here, in subprocesses and in compile workers)
# takes the host-wide /tmp/libtpu_lockfile and refuses to start beside its holder unless
# told otherwise. Several test processes load it at once under pytest-xdist, beside a test
# (tests/e2e/test_libtpu_sharing.py) whose own process holds that lock on purpose.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

NUM_DEVICES = 8

# Fixtures shared by the service tests (``api``, ...).
pytest_plugins = ["tests.helpers", "tests.postgres_fixtures"]


def require_devices(n: int) -> None:
    """Skip loudly (with the numbers) when fewer than ``n`` devices exist."""
    have = jax.device_count()
    if have < n:
        pytest.skip(f"needs {n} devices, this process has {have}")


@pytest.fixture(scope="session")
def eight_devices():
    require_devices(NUM_DEVICES)
    return jax.devices()[:NUM_DEVICES]


# ------------------------------------------------------------------ pytest-xdist
# ``make test`` runs ``--dist loadfile --no-loadscope-reorder``: xdist hands out whole test
# modules (their tests keep their order, and a fixture built once per module is built
# once), in the order of each module's first test. (``--dist loadgroup`` would group by
# ``xdist_group`` marks, but xdist 3.8 names the groups by rewriting ``item._nodeid``, which
# pytest 9.2 no longer reads: its groups are silently ignored.) Here the modules are put
# longest first, by the seconds each took the last time it ran (kept in pytest's cache);
# without that record, modules holding a ``slow`` test go first. So no long module starts
# near the end while the other workers idle.

SECONDS_KEY = "datarax/seconds_per_module"


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On xdist's workers (which all collect, and sort, the same way): the modules longest
    first, each module's tests together and in their order."""
    if not hasattr(config, "workerinput"):
        return
    cache = getattr(config, "cache", None)
    seconds: dict[str, float] = (cache.get(SECONDS_KEY, {}) if cache else {}) or {}
    modules = [_module(item.nodeid) for item in items]
    first: dict[str, int] = {}
    slow: set[str] = set()
    for index, (item, module) in enumerate(zip(items, modules, strict=True)):
        first.setdefault(module, index)
        if item.get_closest_marker("slow") is not None:
            slow.add(module)
    # A module not in the record (new, or renamed): as long as the longest if it is slow.
    unknown_slow = max(seconds.values(), default=1.0)
    rank = {
        module: (-seconds.get(module, unknown_slow if module in slow else 0.0), index)
        for module, index in first.items()
    }
    ordered = sorted(zip(items, modules, strict=True), key=lambda pair: rank[pair[1]])
    items[:] = [item for item, _ in ordered]


_busy: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
_module_seconds: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Seconds per module (for the next run's order) and, on xdist's controller, each
    worker's busy seconds and tests (for the summary)."""
    _module_seconds[_module(report.nodeid)] += report.duration
    node = getattr(report, "node", None)
    if node is None:
        return
    busy = _busy[node.gateway.id]
    busy[0] += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        busy[1] += 1


def _cpu_seconds() -> float:
    """User + system CPU of this process and of its children it has reaped (servers,
    subprocesses and compile workers the tests started and stopped)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


_cpu: dict[str, float] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node) -> None:  # noqa: ANN001 - xdist's hook (controller)
    cpu = getattr(node, "workeroutput", {}).get("cpu_s")
    if cpu is not None:
        _cpu[node.gateway.id] = cpu


def pytest_sessionfinish(session: pytest.Session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: its CPU goes to the controller
        workeroutput["cpu_s"] = _cpu_seconds()
    cache = getattr(session.config, "cache", None)
    if cache is None or hasattr(session.config, "workerinput") or not _module_seconds:
        return  # xdist's workers report to the controller, which keeps the record
    kept = cache.get(SECONDS_KEY, {}) or {}
    kept.update({module: round(s, 2) for module, s in _module_seconds.items()})
    cache.set(SECONDS_KEY, kept)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's type
    if _busy:
        split = ", ".join(
            f"{worker} {seconds:.0f} s / {tests:.0f} tests"
            for worker, (seconds, tests) in sorted(_busy.items())
        )
        terminalreporter.write_line(f"time per xdist worker (setup + call + teardown): {split}")
    if _cpu:
        split = ", ".join(f"{worker} {seconds:.0f} s" for worker, seconds in sorted(_cpu.items()))
        terminalreporter.write_line(
            f"CPU per xdist worker (its own and its reaped children's): {split}; "
            f"{sum(_cpu.values()):.0f} CPU-s in all"
        )
