#!/usr/bin/env bash
# One check of the service on a lent one-GPU machine, from bare, in under 8 minutes:
#   1. install the CUDA variant (`make venv ACCEL=cuda` when PyPI answers; else, offline,
#      the machine's own CUDA JAX plus the wheels in var/device-wheels);
#   2. the GPU tests (tests/gpu, against a real datarax-serve on the GPU, required to run)
#      while the rest of the suite runs beside them on the CPU (as in CI);
#   3. a live compile and training step on the GPU (compile time, step time, memory);
#   4. benchmarks.gpu_mlp: MFU of a bf16 MLP step against the measured bf16 dot peak
#      (target >= 60%);
#   5. benchmarks.host_calibration --local: the host calibration on the device, then the
#      fidelity of six transformers' step time and memory against the estimate under the
#      published profile and the host profile;
# and writes ONE JSON file: the path given, else $OUT/device_check.json, else
# var/device_check.json. Exit status 0 only when every stage passed.
#
#   benchmarks/device_check.sh [--dry-run] [--skip-suite] [OUT.json]
#   benchmarks/device_check.sh --fetch-wheels   # here, with PyPI: fill var/device-wheels
#
# --dry-run: on a host without a GPU, runs every stage small and on the CPU (no install,
#   the existing venv; tests/gpu must skip; gpu_mlp --size small) to prove the script and
#   its JSON. tests/test_install.py runs it.
# The lent machine reaches no network: before calling it, run --fetch-wheels here and
# carry var/device-wheels (about 20 MB; the service's packages that its image lacks).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)
DRY=0
SKIP_SUITE=0
FETCH=0
DEST=""
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    --skip-suite) SKIP_SUITE=1 ;;
    --fetch-wheels) FETCH=1 ;;
    -h | --help) sed -n '2,25p' "$0"; exit 0 ;;
    -*) echo "unknown option $arg" >&2; exit 2 ;;
    *) DEST=$arg ;;
  esac
done
if [ -z "$DEST" ]; then
  if [ -n "${OUT:-}" ]; then DEST=$OUT/device_check.json; else DEST=$ROOT/var/device_check.json; fi
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/device-check.XXXXXX")
WHEELS=$ROOT/var/device-wheels
# Packages the lent machine's image lacks or has at other versions: the closure of the
# service's resolved dependencies less the compiled stack its image keeps (JAX's jaxlib
# and plugins, numpy, scipy), derived by benchmarks/offline_wheels.py from this venv when
# fetching, never listed by hand. Versions come from constraints.txt.
offline_packages() { "$ROOT/.venv/bin/python" -m benchmarks.offline_wheels; }

log() { echo "[device_check +$(($(date +%s) - START))s] $*" >&2; }
pin() { grep -i -m1 -E "^$(echo "$1" | sed 's/[-_]/[-_]/g')==" "$ROOT/constraints.txt"; }

if [ "$FETCH" = 1 ]; then
  mkdir -p "$WHEELS"
  packages=$(offline_packages) || { echo "cannot derive the wheel list (make venv first)" >&2; exit 1; }
  specs=$(for p in $packages; do pin "$p" || { echo "no pin for $p" >&2; exit 1; }; done)
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$WHEELS" $specs || exit 1
  du -sh "$WHEELS"
  echo "carry var/device-wheels in the device call"
  exit 0
fi

# stage NAME TIMEOUT_S CMD...: runs CMD with a time limit, output to $WORK/NAME.log;
# records {"rc", "seconds"} in $WORK/NAME.stage.
stage() {
  local name=$1 limit=$2
  shift 2
  local t0 rc
  t0=$(date +%s)
  log "$name: $*"
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  rc=$?
  echo "{\"rc\": $rc, \"seconds\": $(($(date +%s) - t0))}" >"$WORK/$name.stage"
  log "$name: rc=$rc after $(($(date +%s) - t0)) s"
  return $rc
}

has_cuda_jax() { "$1" -c 'import jax; jax.devices("gpu")' >/dev/null 2>&1; }

pypi_reachable() {
  timeout 8 python3 -c "import urllib.request as u; u.urlopen('https://pypi.org/simple/pip/', timeout=5)" \
    >/dev/null 2>&1
}

install_online() {
  make venv ACCEL=cuda VENV="$VENV" && make "$VENV/.installed-cuda12-test" ACCEL=cuda VENV="$VENV"
}

# Offline: the machine's own python3 with CUDA JAX (a venv made from it would not see its
# packages when it is itself a venv), the wheels installed into a folder put first on
# PYTHONPATH: they shadow the image's versions, its jaxlib and CUDA plugin stay.
offline_python() {
  local p
  for p in python3 python3.12 /opt/torch/.venv/bin/python3; do
    if command -v "$p" >/dev/null && has_cuda_jax "$p"; then command -v "$p"; return 0; fi
  done
  return 1
}

install_offline() {
  echo "offline: $BASE_PY's CUDA JAX, wheels into $SITE"
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    "$BASE_PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" \
      "$WHEELS"/*.whl || return 1
  else
    echo "no wheels in $WHEELS (run --fetch-wheels where PyPI answers): the image's only" >&2
  fi
}

EXPECT=gpu
SITE=$WORK/site
export ROOT WHEELS SITE
export -f has_cuda_jax install_online install_offline
if [ "$DRY" = 1 ]; then
  EXPECT=cpu
  export JAX_PLATFORMS=cpu
  PY=${DEVICE_CHECK_PYTHON:-$ROOT/.venv/bin/python}
  [ -x "$PY" ] || PY=$(command -v python3)
  echo '{"rc": 0, "seconds": 0, "mode": "dry-run: no install, the existing venv"}' >"$WORK/install.stage"
  log "dry run with $PY: every stage small and on the CPU"
else
  if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "no NVIDIA GPU (nvidia-smi -L); use --dry-run on a host without one" >&2
    exit 2
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$WORK/gpu.txt"
  export VENV=$WORK/venv JAX_PLATFORMS=cuda
  if pypi_reachable; then
    MODE=online
    PY=$VENV/bin/python
  else
    MODE=offline
    BASE_PY=$(offline_python) || { echo "offline, and no python3 here has a CUDA JAX" >&2; exit 2; }
    export BASE_PY
    PY=$BASE_PY
    export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  fi
  stage install 420 bash -c "install_$MODE"
  sed -i "s/}$/, \"mode\": \"$MODE\"}/" "$WORK/install.stage"
  if [ "$MODE" = offline ] && ! has_cuda_jax "$PY"; then
    # The carried jax may not match the image's jaxlib: keep the image's jax instead.
    log "carried jax does not see the GPU with the image's jaxlib; using the image's jax"
    rm -rf "$SITE"/jax "$SITE"/jax-*.dist-info
  fi
  has_cuda_jax "$PY" || { log "the installed JAX sees no GPU"; tail -20 "$WORK/install.log" >&2; }
fi
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
"$PY" -c 'import jax, jaxlib; print(jax.__version__, jaxlib.__version__)' >"$WORK/versions.txt" 2>&1

# The suite (CPU, simulated devices, as CI) beside the GPU tests; install tests excluded
# (this script is the install check) and so is tests/gpu (run on its own, below).
SUITE_PID=""
if [ "$DRY" = 0 ] && [ "$SKIP_SUITE" = 0 ]; then
  stage suite 300 "$PY" -m pytest -q -p no:cacheprovider --junitxml="$WORK/suite.xml" \
    --ignore=tests/gpu --ignore=tests/test_install.py &
  SUITE_PID=$!
fi

GPU_ENV=()
[ "$DRY" = 0 ] && GPU_ENV=(env DATARAX_REQUIRE_GPU=1)
stage gpu_tests 300 "${GPU_ENV[@]}" "$PY" -m pytest -q -p no:cacheprovider -rA \
  --junitxml="$WORK/gpu_tests.xml" tests/gpu

cat >"$WORK/live_check.py" <<'PYEOF'
"""A live compile and training step on the first device: compile and step times, memory."""
import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from datarax.distributed import (
    DeviceMeshManager,
    create_data_parallel_sharding,
    place_batch_on_shards,
    spmd_train_step,
)
from datarax.models import MLP

expect = sys.argv[1]
device = jax.devices()[0]
assert device.platform == expect, f"expected platform {expect}, got {device.platform}"
mesh = DeviceMeshManager.create_data_parallel_mesh()
features = [1024, 4096, 1024] if expect == "gpu" else [64, 128, 16]
batch_size = 1024 if expect == "gpu" else 64
model = MLP(features, rngs=nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
rng = np.random.default_rng(0)
batch = place_batch_on_shards(
    {
        "inputs": jnp.asarray(rng.standard_normal((batch_size, features[0])), jnp.float32),
        "targets": jnp.asarray(rng.standard_normal((batch_size, features[-1])), jnp.float32),
    },
    create_data_parallel_sharding(mesh),
)


def mse(m, b):
    return jnp.mean((m(b["inputs"]) - b["targets"]) ** 2)


x = jnp.ones((2048, 2048), jnp.float32)
start = time.perf_counter()
compiled = jax.jit(lambda a: jnp.tanh(a @ a).sum()).lower(x).compile()
compile_s = time.perf_counter() - start
value = float(compiled(x))
with jax.set_mesh(mesh):
    start = time.perf_counter()
    first = float(spmd_train_step(model, optimizer, mse, batch))
    first_step_s = time.perf_counter() - start
    start = time.perf_counter()
    losses = [float(spmd_train_step(model, optimizer, mse, batch)) for _ in range(20)]
    step_s = (time.perf_counter() - start) / 20
stats = device.memory_stats() or {}
result = {
    "platform": device.platform,
    "device_kind": device.device_kind,
    "device_count": jax.device_count(),
    "compile_s": round(compile_s, 4),
    "compiled_value_finite": bool(np.isfinite(value)),
    "first_step_s": round(first_step_s, 4),
    "step_s": round(step_s, 6),
    "loss_first": first,
    "loss_last": losses[-1],
    "loss_decreased": losses[-1] < first,
    "bytes_limit": stats.get("bytes_limit"),
    "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
}
print(json.dumps(result))
sys.exit(0 if result["compiled_value_finite"] and result["loss_decreased"] else 1)
PYEOF
stage live_check 180 "$PY" "$WORK/live_check.py" "$EXPECT"

if [ -n "$SUITE_PID" ]; then
  wait "$SUITE_PID"
  log "suite finished"
fi

if [ "$DRY" = 1 ]; then
  stage gpu_mlp 180 "$PY" -m benchmarks.gpu_mlp --size small --repeats 2
  # the host calibration and the fidelity stage, small: 8 CPU devices, one model
  stage fidelity 240 "$PY" -m benchmarks.host_calibration --small --json "$WORK/fidelity.json"
else
  stage gpu_mlp 300 "$PY" -m benchmarks.gpu_mlp --size large --repeats 20
  # the host calibration (every stage, quick), then six transformers on the device:
  # measured step and XLA's memory against the estimate, published and host profiles
  stage fidelity 300 "$PY" -m benchmarks.host_calibration --local --json "$WORK/fidelity.json"
fi

mkdir -p "$(dirname "$DEST")"
"$PY" - "$WORK" "$DEST" "$DRY" "$(($(date +%s) - START))" <<'PYEOF'
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

work, dest, dry, total = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])


def stage(name):
    path = work / f"{name}.stage"
    if not path.exists():
        return None
    info = json.loads(path.read_text())
    log = work / f"{name}.log"
    info["log_tail"] = log.read_text(errors="replace")[-2000:] if log.exists() else ""
    return info


def junit(name):
    path = work / f"{name}.xml"
    if not path.exists():
        return None
    counts = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def last_json(name):
    log = work / f"{name}.log"
    for line in reversed(log.read_text(errors="replace").splitlines() if log.exists() else []):
        if line.startswith("{"):
            return json.loads(line)
    return None


gpu = work / "gpu.txt"
report = {
    "dry_run": dry,
    "gpu": gpu.read_text().strip() if gpu.exists() else None,
    "versions": (work / "versions.txt").read_text().strip(),
    "install": stage("install"),
    "suite": stage("suite"),
    "suite_counts": junit("suite"),
    "gpu_tests": stage("gpu_tests"),
    "gpu_tests_counts": junit("gpu_tests"),
    "live_check": stage("live_check"),
    "live": last_json("live_check"),
    "gpu_mlp": stage("gpu_mlp"),
    "mfu": last_json("gpu_mlp"),
    "fidelity_stage": stage("fidelity"),
    "fidelity": json.loads((work / "fidelity.json").read_text())
    if (work / "fidelity.json").exists()
    else None,
    "total_s": total,
    "under_8_min": total < 480,
}
ran = [report[k] for k in ("install", "suite", "live_check", "gpu_mlp", "fidelity_stage")]
report["ok"] = all(s is None or s["rc"] == 0 for s in ran) and report["live"] is not None
if dry:
    # Without a GPU the GPU tests must skip (pytest: 5, nothing ran), never pass vacuously.
    counts = report["gpu_tests_counts"] or {}
    report["ok"] = (
        report["ok"]
        and report["gpu_tests"]["rc"] in (0, 5)
        and counts.get("skipped", 0) >= 1
        and counts.get("passed") == 0
    )
else:
    counts = report["gpu_tests_counts"] or {}
    report["ok"] = (
        report["ok"]
        and report["gpu_tests"]["rc"] == 0
        and counts.get("passed", 0) >= 1
        and counts.get("skipped", 1) == 0
        and bool(report["mfu"] and report["mfu"].get("meets_target"))
    )
dest.write_text(json.dumps(report, indent=2) + "\n")
print(json.dumps({k: report[k] for k in ("ok", "total_s", "suite_counts", "gpu_tests_counts")}))
sys.exit(0 if report["ok"] else 1)
PYEOF
rc=$?
log "wrote $DEST (rc=$rc)"
rm -rf "$WORK"
exit $rc
