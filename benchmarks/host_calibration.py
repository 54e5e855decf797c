"""Issue 39, section 2: the host measures itself, and its profile predicts the library's
transformer step on this host's devices.

One run (``python -m benchmarks.host_calibration``, ``make bench``), on 8 simulated CPU
devices (``--xla_force_host_platform_device_count=8``):

1. the quick host calibration (:mod:`datarax.estimate.host_calibration`, every stage),
   timed: it must finish in under 60 s;
2. the library's transformer (``abstract_train_step``: ``transformer_loss_fn``, Adam,
   donation) trained on the 8 devices as fsdp 8 for several sizes, the median of the
   measured steps after a warm-up;
3. ``estimate_step`` of each on the catalog's ``cpu`` entry, priced with the host profile
   and with the default ``published-cpu-jax`` constants, against the measured step.

Run: ``python -m benchmarks.host_calibration`` (prints markdown; ``--json PATH`` writes
the rows). ``--local`` runs on the machine's own devices (an accelerator: the device
check's fidelity stage) with ~0.1-0.4B-parameter models, and compares the memory
estimate with XLA's compiled figure too; ``--small`` one small size (the dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

LOCAL = "--local" in sys.argv  # the machine's own devices (an accelerator), not 8 CPUs
if not LOCAL:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from benchmarks.host_table import markdown  # noqa: E402
from datarax.estimate.calibrations import default_profile  # noqa: E402
from datarax.estimate.cost import estimate_step  # noqa: E402
from datarax.estimate.host_calibration import STAGES, fit_host_profile, measure_stage  # noqa: E402
from datarax.hardware.chips import HARDWARE, get_hardware  # noqa: E402
from datarax.hardware.topology import plan_hardware_devices  # noqa: E402
from datarax.models import Transformer, synthetic_tokens  # noqa: E402
from datarax.models.mlp import make_optimizer  # noqa: E402
from datarax.specs.model_specs import model_spec  # noqa: E402
from datarax.spmd.compile_step import abstract_train_step  # noqa: E402

BASE = {"kind": "transformer", "kv_heads": 4, "vocab": 4096, "dtype": "bfloat16",
        "attention": "flash", "remat": "none"}  # fmt: skip
# on an accelerator (--local): ~0.1-0.4B-parameter models a 16 GiB chip holds with Adam
ACCELERATOR_SIZES = [
    {"layers": 8, "d_model": 1024, "d_ff": 4096, "heads": 8, "seq_len": 2048, "batch": 8},
    {"layers": 16, "d_model": 1024, "d_ff": 4096, "heads": 8, "seq_len": 2048, "batch": 8,
     "remat": "full"},
    {"layers": 8, "d_model": 1536, "d_ff": 6144, "heads": 12, "seq_len": 2048, "batch": 8,
     "remat": "full"},
    {"layers": 4, "d_model": 2048, "d_ff": 8192, "heads": 16, "seq_len": 1024, "batch": 16},
    {"layers": 8, "d_model": 1024, "d_ff": 4096, "heads": 8, "seq_len": 4096, "batch": 4,
     "remat": "full"},
    {"layers": 12, "d_model": 768, "d_ff": 3072, "heads": 12, "seq_len": 1024, "batch": 8},
]  # fmt: skip
SIZES = [
    {"layers": 2, "d_model": 256, "d_ff": 1024, "heads": 4, "seq_len": 512, "batch": 16},
    {"layers": 4, "d_model": 512, "d_ff": 2048, "heads": 8, "seq_len": 512, "batch": 16},
    {"layers": 4, "d_model": 512, "d_ff": 2048, "heads": 8, "seq_len": 1024, "batch": 8},
    {"layers": 2, "d_model": 1024, "d_ff": 4096, "heads": 8, "seq_len": 512, "batch": 16},
]


def hardware() -> Any:
    """The catalog entry of the devices (``cpu`` for CPU ones)."""
    device = jax.devices()[0]
    if device.platform == "cpu":
        return get_hardware("cpu")
    return next(hw for hw in HARDWARE.values() if hw.device_kind == device.device_kind)


def calibrate(quick: bool = True) -> tuple[Any, float]:
    hw = hardware()
    devices = jax.devices()[:8] if not LOCAL else jax.local_devices()
    start = time.perf_counter()
    rows = [row for stage in STAGES for row in measure_stage(stage, quick=quick, devices=devices)]
    seconds = time.perf_counter() - start
    profile = fit_host_profile(
        rows, hw, profile_id="host-bench", created_at="now",
        stack={"framework": "jax", "jax": jax.__version__}, device_kind=devices[0].device_kind,
    )  # fmt: skip
    return profile, seconds


def _devices() -> list[Any]:
    return list(jax.local_devices()) if LOCAL else list(jax.devices()[:8])


def measured_step(size: dict[str, Any], steps: int = 5) -> tuple[float, float | None]:
    """The median step of the library's transformer with the devices as fsdp, after two
    warm-ups, and XLA's compiled memory of one device (arguments, outputs and
    temporaries less aliases; ``None`` where the backend does not say)."""
    model = {**BASE, **{k: v for k, v in size.items() if k != "batch"}}
    spec = model_spec(model)
    mesh = Mesh(np.array(_devices()), ("fsdp",))
    step = abstract_train_step(model, mesh, size["batch"])
    params = Transformer(spec, rngs=nnx.Rngs(0)).param_arrays()
    params = jax.tree.map(lambda x, s: jax.device_put(x, s.sharding), params, step.args[0])
    opt_state = make_optimizer("adam", 1e-4).init(params)
    opt_state = jax.tree.map(lambda x, s: jax.device_put(x, s.sharding), opt_state, step.args[1])
    tokens = synthetic_tokens(spec, size["batch"], 0, 0)
    batch = jax.tree.map(lambda x, s: jax.device_put(x, s.sharding), dict(tokens), step.args[2])
    run = step.jitted()
    xla_bytes = None
    try:
        m = run.lower(*step.args).compile().memory_analysis()
        xla_bytes = float(m.argument_size_in_bytes + m.output_size_in_bytes
                          + m.temp_size_in_bytes - m.alias_size_in_bytes)  # fmt: skip
    except Exception:  # a backend without memory_analysis
        xla_bytes = None
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        params, opt_state, loss = run(params, opt_state, batch)
        jax.block_until_ready(loss)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times), xla_bytes


def predicted(size: dict[str, Any], calibration: Any) -> tuple[float, float]:
    """``(step_s, memory per device in bytes)`` of ``estimate_step``."""
    hw = hardware()
    n = len(_devices())
    if hw.kind == "tpu":
        layout = plan_hardware_devices(hw, ici={"fsdp": n}, topology="1x1" if n == 1 else None)
    else:
        layout = plan_hardware_devices(hw, ici={"fsdp": n}, hosts=1)
    model = {**BASE, **{k: v for k, v in size.items() if k != "batch"}}
    est = estimate_step(hw, layout.axes_detail, model, size["batch"], calibration=calibration)
    return float(est.step_s), float(est.memory_per_device.total)


def study(sizes: Sequence[dict[str, Any]] = SIZES, quick: bool = True) -> dict[str, Any]:
    profile, calibration_s = calibrate(quick)
    published = default_profile(hardware())
    rows = []
    for size in sizes:
        try:
            measured, xla_bytes = measured_step(size)
        except Exception as error:  # out of memory on a small device: said, not hidden
            rows.append({"size": size, "failed": f"{type(error).__name__}: {error}"[:300]})
            continue
        host, memory = predicted(size, profile)
        default, _ = predicted(size, published.id)
        rows.append({"size": size, "measured_s": measured, "host_s": host,
                     "host_error": (host - measured) / measured, "published_s": default,
                     "published_error": (default - measured) / measured,
                     "estimate_bytes": memory, "xla_bytes": xla_bytes,
                     "memory_error": (memory / xla_bytes - 1) if xla_bytes else None})  # fmt: skip
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    device = _devices()[0]
    return {"calibration_s": calibration_s, "constants": profile.to_json()["constants"],
            "device_kind": device.device_kind, "devices": len(_devices()),
            "published": published.id, "jax": jax.__version__, "rows": rows,
            "measurements": [dict(m) for m in profile.measurements]}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", help="write the rows to this path")
    parser.add_argument(
        "--local",
        action="store_true",
        help="the machine's own devices (an accelerator) and the larger sizes",
    )
    parser.add_argument("--full", action="store_true", help="the full calibration, not quick")
    parser.add_argument("--small", action="store_true", help="one small size (a dry run)")
    args = parser.parse_args(argv)
    sizes = SIZES[:1] if args.small else ACCELERATOR_SIZES if args.local else SIZES
    result = study(sizes, quick=not args.full)
    print(markdown(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
