"""GPU behaviour of the real service, through its public HTTP API.

Each test drives a real ``datarax-serve`` process whose runtime owns the GPU
(``JAX_PLATFORMS=cuda``), so the tests depend on the HTTP contract only, not on how
``app/`` is laid out. They need an NVIDIA GPU and a CUDA JAX plugin (``make test
ACCEL=cuda``). Without them the module skips, loudly, with the reason; CI has no GPU, so
there it skips too. ``DATARAX_REQUIRE_GPU=1`` (set by ``benchmarks/device_check.sh``) turns
that skip into a failure, so a GPU check cannot pass by skipping.

What is proven on one GPU:

- the devices are the GPU's (platform ``gpu``, one per ``nvidia-smi -L`` line);
- the memory budget comes from XLA's ``bytes_limit`` (set small here with
  ``XLA_PYTHON_CLIENT_MEM_FRACTION``), and admission refuses a session above it;
- state donation: a session whose state is 19% of the device's memory steps; without
  donation the step would hold the old and the new state (6 x 19% > 100%) and XLA would
  fail with RESOURCE_EXHAUSTED;
- the compiled step cache: the first call compiles, the next ones and an identical
  second session hit the cache, a new batch shape compiles again;
- multi-process: a one-process JAX distributed group on the GPU (coordinator, leader
  path, a training step). NCCL *between* processes needs two GPUs (NCCL refuses two
  ranks on one device); on a one-GPU machine it is not tested;
- compile checks of a live plan compile in the compile worker on the same GPU the runtime
  holds (``done`` with XLA's figures, the memory figure from XLA's ``bytes_limit``, a
  repeat answered from the cache), the worker holds no memory pool afterwards, and the
  runtime's sessions still train.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 180.0
MEM_FRACTION = 0.1
"""XLA_PYTHON_CLIENT_MEM_FRACTION for the servers: a small pool keeps the donation test
fast and makes its memory limit real."""
CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def _gpu_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _why_no_gpu() -> str | None:
    if _gpu_count() == 0:
        return "no NVIDIA GPU here (nvidia-smi -L lists none): GPU tests not run"
    if not any(_has_module(name) for name in CUDA_PLUGINS):
        return "a GPU is present but JAX has no CUDA plugin: install with `make test ACCEL=cuda`"
    return None


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


_REASON = _why_no_gpu()
if _REASON is not None:
    if os.environ.get("DATARAX_REQUIRE_GPU") == "1":
        pytest.fail(f"DATARAX_REQUIRE_GPU=1 but {_REASON}", pytrace=False)
    pytest.skip(_REASON, allow_module_level=True)


def _serve_command(port: int, db: Path) -> list[str]:
    """``datarax-serve`` next to this interpreter, else its entry point from pyproject."""
    args = ["--host", "127.0.0.1", "--port", str(port), "--db", str(db)]
    script = Path(sys.executable).parent / "datarax-serve"
    if script.exists():
        return [str(script), *args]
    with open(ROOT / "pyproject.toml", "rb") as f:
        module, func = tomllib.load(f)["project"]["scripts"]["datarax-serve"].split(":")
    program = f"import sys; from {module} import {func} as main; sys.exit(main())"
    return [sys.executable, "-c", program, *args]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def gpu_server(tmp: Path, **env: str) -> Iterator[httpx.Client]:
    """A real server on the GPU, in its own process group; killed by group on exit."""
    port = _free_port()
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in ("JAX_PLATFORMS", "DATARAX_PLATFORMS", "DATARAX_CPU_DEVICES")
    }
    environment.update(
        {
            "JAX_PLATFORMS": "cuda",
            "DATARAX_PLATFORMS": "cuda",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": str(MEM_FRACTION),
            # the checkout first, then whatever the caller put there (the device check's
            # off-line wheels): replacing it left the server without pydantic
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            **env,
        }
    )
    log_path = tmp / f"server-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _serve_command(port, tmp / f"db-{port}.sqlite"),
            cwd=ROOT,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300.0) as client:
            _wait_ready(client, proc, log_path)
            yield client
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)


def _wait_ready(client: httpx.Client, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{_tail(log_path)}")
        with contextlib.suppress(httpx.TransportError):
            if client.get("/health/ready", timeout=5.0).status_code == 200:
                return
        time.sleep(0.3)
    pytest.fail(f"server not ready within {READY_TIMEOUT_S} s:\n{_tail(log_path)}")


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:]


def _ok(response: httpx.Response, status: int = 200) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    return response.json()


def _session(client: httpx.Client, features: list[int], status: int = 201) -> httpx.Response:
    plan = _ok(client.post("/v1/meshes", json={"axes": {"data": 1}}), 201)
    response = client.post(
        f"/v1/meshes/{plan['id']}/sessions",
        json={
            "model": {"kind": "mlp", "features": features},
            "optimizer": {"name": "adam", "learning_rate": 1e-3},
            "loss": "mse",
            "seed": 0,
            "param_sharding": "replicate",
            "strategy": "spmd",
        },
    )
    assert response.status_code == status, (response.status_code, response.text)
    return response


def _steps(client: httpx.Client, session_id: str, steps: int, batch: int) -> dict:
    body = {"steps": steps, "synthetic": {"seed": 0, "batch_size": batch}}
    return _ok(client.post(f"/v1/sessions/{session_id}/steps", json=body))


def _mlp_bytes(features: list[int]) -> int:
    """float32 bytes of an MLP's weights and biases."""
    return 4 * sum(a * b + b for a, b in zip(features[:-1], features[1:], strict=True))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    # The whole device pool is the budget, so the donation test can size against it.
    with gpu_server(tmp_path_factory.mktemp("gpu"), DATARAX_MEMORY_FRACTION="1.0") as client:
        yield client


def _device_budget(client: httpx.Client) -> int:
    budget = _ok(client.get("/v1/devices"))["memory_budget"]["device"]
    assert isinstance(budget, int) and budget > 0, budget
    return budget


def test_devices_are_the_gpus(server: httpx.Client) -> None:
    info = _ok(server.get("/v1/devices"))
    assert info["platform"] == "gpu", info
    assert len(info["devices"]) == _gpu_count(), info
    assert {d["platform"] for d in info["devices"]} == {"gpu"}, info


def test_memory_budget_is_xla_bytes_limit(server: httpx.Client) -> None:
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    total = min(int(line) for line in smi.stdout.split()) * 2**20
    budget = _device_budget(server)
    # XLA's pool (bytes_limit) is MEM_FRACTION of the device; the service's budget is all
    # of it here (DATARAX_MEMORY_FRACTION=1). Host memory would be far larger.
    assert 0.85 * MEM_FRACTION * total <= budget <= 1.01 * MEM_FRACTION * total, (budget, total)

    # Admission uses it: 5 copies of a model of 25% of the budget do not fit.
    width = int(math.sqrt(0.25 * budget / 4))
    refused = _session(server, [width, width], status=422)
    assert refused.json()["code"] == "insufficient_memory", refused.text
    assert "device" in refused.json()["detail"], refused.text


def test_state_donation_lets_a_big_state_step(server: httpx.Client) -> None:
    budget = _device_budget(server)
    width = int(math.sqrt(0.19 * budget / 4))
    features = [width, width]
    state = 3 * _mlp_bytes(features)  # parameters + adam's two slots
    assert 2 * state > budget, "the test needs a state whose second copy would not fit"
    session = _session(server, features).json()
    first = _steps(server, session["id"], steps=2, batch=8)
    assert first["step"] == 2 and all(math.isfinite(x) for x in first["losses"]), first
    again = _steps(server, session["id"], steps=2, batch=8)
    assert again["step"] == 4 and again["timing"]["cache_hit"] is True, again
    server.delete(f"/v1/sessions/{session['id']}")


def test_compiled_step_cache(server: httpx.Client) -> None:
    features = [256, 1024, 256]
    first = _session(server, features).json()
    cold = _steps(server, first["id"], steps=3, batch=64)
    assert cold["timing"]["cache_hit"] is False and cold["timing"]["compile_s"] > 0, cold
    warm = _steps(server, first["id"], steps=3, batch=64)
    assert warm["timing"]["cache_hit"] is True and warm["timing"]["compile_s"] == 0, warm

    # The same program for another session on the same devices: compiled once.
    second = _session(server, features).json()
    shared = _steps(server, second["id"], steps=1, batch=64)
    assert shared["timing"]["cache_hit"] is True, shared
    # A new batch shape is a new program.
    reshaped = _steps(server, second["id"], steps=1, batch=128)
    assert reshaped["timing"]["cache_hit"] is False, reshaped
    for session in (first, second):
        server.delete(f"/v1/sessions/{session['id']}")


def test_one_process_distributed_group_on_the_gpu(tmp_path: Path) -> None:
    env = {
        "DATARAX_COORDINATOR": f"127.0.0.1:{_free_port()}",
        "DATARAX_NUM_PROCESSES": "1",
        "DATARAX_PROCESS_ID": "0",
    }
    with gpu_server(tmp_path, **env) as client:
        info = _ok(client.get("/v1/devices"))
        assert info["platform"] == "gpu" and info["process_count"] == 1, info
        session = _session(client, [64, 128, 8]).json()
        result = _steps(client, session["id"], steps=2, batch=32)
        assert result["step"] == 2 and all(math.isfinite(x) for x in result["losses"]), result


def _finish_check(client: httpx.Client, location: str, timeout: float = 240.0) -> dict:
    deadline = time.monotonic() + timeout
    check: dict = {}
    while time.monotonic() < deadline:
        check = _ok(client.get(location))
        if check["status"] in ("done", "failed", "cancelled"):
            return check
        time.sleep(0.2)
    pytest.fail(f"{location} did not finish within {timeout} s: {check}")


def _compile_worker_pids() -> list[int]:
    """Compile workers (``python -m app.compiler --platform cuda``, not ``--describe``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"app.compiler" in argv and b"cuda" in argv and b"--describe" not in argv:
            pids.append(int(entry.name))
    return pids


def _gpu_mib_of(pid: int) -> int | None:
    """MiB ``nvidia-smi`` lists for ``pid``; None where it lists no such process (in a
    container it often cannot see the host's process ids)."""
    smi = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    for line in smi.stdout.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return int(fields[1])
    return None


def test_a_compile_check_of_a_live_plan_compiles_on_the_gpu(server: httpx.Client) -> None:
    info = _ok(server.get("/v1/devices"))
    kind = info["devices"][0]["kind"]
    budget = _device_budget(server)  # XLA's bytes_limit here (DATARAX_MEMORY_FRACTION=1)
    count = len(info["devices"])
    plan = _ok(server.post("/v1/meshes", json={"axes": {"data": count}}), 201)
    assert plan["live"] is True and plan["platform"] == "gpu", plan
    model = {"kind": "mlp", "features": [512, 2048, 512], "dtype": "float32"}
    body = {"model": model, "batch_shape": [64]}
    answer = server.post(f"/v1/meshes/{plan['id']}/compile-checks", json=body)
    assert answer.status_code == 202, answer.text
    check = _finish_check(server, answer.headers["location"])
    assert check["status"] == "done", check

    target = check["target"]
    assert target["kind"] == "gpu" and target["device_kind"] == kind, target
    assert target["devices"] == count and target["hbm_source"] == "bytes_limit", target
    result = check["result"]
    memory = result["memory"]
    params = _mlp_bytes([512, 2048, 512])
    assert memory["argument_bytes"] >= 3 * params, memory  # params + adam's two moments
    assert memory["peak_bytes"] > 0 and result["flops"] > 0 and result["compile_s"] > 0
    # The fits verdict is against the GPU's XLA pool, as the runtime sees it (the worker
    # reads it without preallocating: the same size, or the free share of it).
    assert 0.8 * budget <= memory["hbm_bytes"] <= 1.01 * budget, (memory, budget)
    assert result["fits"] is True and result["xla_error"] is None, result
    assert check["estimate_error"]["fits_agrees"] is True, check

    # The worker keeps no pool: at most its CUDA context and loaded code on the GPU.
    for pid in _compile_worker_pids():
        used = _gpu_mib_of(pid)
        assert used is None or used < 2048, (pid, used)

    again = server.post(f"/v1/meshes/{plan['id']}/compile-checks", json=body)
    assert again.status_code == 202 and again.json()["status"] == "done", again.text
    assert again.json()["cached"] is True and again.json()["result"] == result

    # The runtime that holds the GPU still trains.
    session = _session(server, [64, 128, 8]).json()
    steps = _steps(server, session["id"], steps=2, batch=32)
    assert steps["step"] == 2 and all(math.isfinite(x) for x in steps["losses"]), steps
    server.delete(f"/v1/sessions/{session['id']}")
