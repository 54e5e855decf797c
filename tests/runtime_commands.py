"""Runtime commands that only tests use, loaded into a real runtime with
``RuntimeClient(settings, command_modules=[MODULE])``.

The runtime imports this module by name with only the project root on its path, so it
imports nothing of the test tree and no JAX at module level (the runtime loads it after
its environment is set, but the test process imports it too, for :data:`MODULE`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from app.runtime.server import command

MODULE = __name__
"""What to pass as a command module (``tests.runtime_commands``)."""


@command("echo", local=True)
def echo(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Answers the payload and arrays it was sent."""
    return payload, arrays


@command("sleep", local=True)
def sleep(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Blocks the runtime for ``payload["seconds"]`` (writing ``payload["started_file"]``, if
    given, as it starts); answers CLOCK_MONOTONIC times."""
    seconds = payload.get("seconds", 0)
    if not isinstance(seconds, int | float) or seconds < 0:
        raise ValueError(f"'seconds' must be a non-negative number, got {seconds!r}")
    started = time.monotonic()
    if signal_file := payload.get("started_file"):
        # A test that must act while this call runs waits for the file, not a fixed time.
        Path(signal_file).write_text(str(os.getpid()))
    time.sleep(seconds)
    return {"started": started, "finished": time.monotonic(), "tag": payload.get("tag")}, {}


@command("crash", local=True)
def crash(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Dies like a JAX abort (``{"how": "abort"}``) or a hard exit (default)."""
    if payload.get("how") == "abort":
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test directory
        os.abort()
    os._exit(int(payload.get("exit_code", 70)))


@command("boom")
def boom(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Raises an unexpected error (500 ``runtime_error``)."""
    raise RuntimeError(f"boom {payload.get('n')}")


# ----------------------------------------------------------------------------- multi-host


@command("mh_fail_on_followers")
def fail_on_followers(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Succeeds on process 0 and fails elsewhere (the processes diverge)."""
    import jax

    if jax.process_index() != 0:
        raise RuntimeError("only followers fail")
    return {"process": jax.process_index()}, {}


@command("mh_local_rows")
def local_rows(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """The batch rows this process's devices hold on a plan's mesh."""
    import jax

    from app.runtime.sessions import batch_sharding, mesh_from_plan
    from datarax.spmd.global_arrays import process_local_rows

    sharding = batch_sharding(mesh_from_plan(payload), "spmd", None)
    rows = process_local_rows(sharding, (payload["rows"], 1))
    return {"process": jax.process_index(), "rows": [list(r) for r in rows]}, {}


@command("mh_place_local")
def place_local(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Every process passes only its own rows to place_batch_on_shards."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from app.runtime.sessions import batch_sharding, mesh_from_plan
    from datarax.distributed import place_batch_on_shards
    from datarax.spmd.global_arrays import process_local_slice
    from datarax.spmd.multihost import fetch_global

    mesh = mesh_from_plan(payload)
    sharding = batch_sharding(mesh, "spmd", None)
    whole = np.arange(payload["rows"] * 3, dtype=np.float32).reshape(payload["rows"], 3)
    local = process_local_slice(whole, sharding)
    placed = place_batch_on_shards({"x": local}, sharding)["x"]
    total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))(placed)
    starts = sorted({s.index[0].start or 0 for s in placed.addressable_shards})
    return {
        "shape": list(placed.shape),
        "sum": float(fetch_global(total)),
        "local_rows": int(local.shape[0]),
        "shard_starts": starts,
    }, {}
