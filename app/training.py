"""Training sessions, executed inside the runtime process (loaded with ``--command-module``).

A session is a built-in MLP and its optimizer placed on a live mesh. Its parameters live
here, in the runtime; the HTTP process keeps only metadata. After a runtime restart the
parameters are gone and the HTTP layer answers 410 ``session_lost`` (no checkpoint restore:
a silently restored older state would make step counts lie).

Compiled steps are cached by everything that changes the compiled program: mesh devices
and axes, model features, optimizer and learning rate, loss, strategy, parameter sharding,
and the batch's shapes and dtypes. JAX's persistent compilation cache lives under the data
directory, so a restarted runtime compiles known programs from disk. Its
``min_compile_time_secs`` is lowered from 1 s to 0.1 s: served steps on CPU compile in a
few tenths of a second, exactly the programs worth keeping across restarts, while eager
one-op programs (well under 0.1 s) stay out of it.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from app.channel import CommandError
from app.plans import BYTES_PER_ELEMENT, OPTIMIZER_STATE_FACTOR
from app.plans import param_layouts as planned_param_layouts
from app.worker import command, memory_budgets, settings
from datarax.distributed import (
    place_model_state_on_shards,
    reduce_gradients_across_devices,
    spmd_train_step,
)
from datarax.distributed.multihost import (
    fetch_global,
    global_array_from_host,
    owns_devices_of,
    place_global_batch,
)
from datarax.distributed.planning import nearest_valid_sizes
from datarax.distributed.train_step import compiled_collective_step
from datarax.models import LOSS_FNS, MLP, make_optimizer, synthetic_batch

COLLECTIVE_AXIS = "batch"
_MAX_COMPILED = 64


def _configure_compilation_cache() -> None:
    cache_dir = settings().data_dir / "jax-cache"
    cache_dir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


_configure_compilation_cache()


@dataclass
class Session:
    """One placed model and optimizer. ``state``: the split (model, optimizer) state."""

    id: str
    features: tuple[int, ...]
    loss: str
    strategy: str
    param_sharding: str
    optimizer: tuple[str, float]
    mesh: Mesh
    batch_sharding: NamedSharding
    graphdef: Any
    state: Any
    state_shardings: Any
    step: int = 0
    last_loss: float | None = None
    key_prefix: tuple = field(default_factory=tuple)
    participates: bool = True
    """False on a process that holds no device of the mesh (multi-host): no state here."""
    reserved: dict[Any, int] = field(default_factory=dict)
    """Memory pool -> bytes this session's state may take there (see ``_admit``)."""


SESSIONS: dict[str, Session] = {}
_COMPILED: OrderedDict[tuple, Any] = OrderedDict()


# ------------------------------------------------------------------------------ set-up


def _mesh_from(payload: dict[str, Any]) -> Mesh:
    axes = {str(k): int(v) for k, v in payload["axes"].items()}
    by_id = {d.id: d for d in jax.devices()}
    ids = np.asarray(payload["device_grid"], dtype=np.int64).reshape(tuple(axes.values()))
    missing = sorted({int(i) for i in ids.flat} - set(by_id))
    if missing:
        raise CommandError(409, "devices_changed", "Plan devices not present", f"ids {missing}")
    devices = np.vectorize(by_id.__getitem__, otypes=[object])(ids)
    return Mesh(devices, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def _batch_sharding(mesh: Mesh, strategy: str, batch_axes: list[str] | None) -> NamedSharding:
    names = list(mesh.axis_names)
    if strategy == "collective":
        chosen = names  # one flattened device axis, as pmap sees it
    elif batch_axes is not None:
        chosen = [a for a in batch_axes if a in names]
    else:
        chosen = [a for a in ("data", "fsdp") if a in names]
    if not chosen:
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, P(chosen[0] if len(chosen) == 1 else tuple(chosen)))


def param_layouts(state: Any) -> list[dict[str, Any]]:
    """Layout of every model parameter, read from the arrays' real shardings."""
    from datarax.distributed.sharding import path_to_str

    entries = []
    for path, arr in jax.tree_util.tree_flatten_with_path(state)[0]:
        spec = list(arr.sharding.spec) + [None] * (arr.ndim - len(arr.sharding.spec))
        shard = arr.sharding.shard_shape(arr.shape)
        entries.append(
            {
                "path": path_to_str(path),
                "shape": list(arr.shape),
                "dtype": str(arr.dtype),
                "spec": [list(s) if isinstance(s, tuple) else s for s in spec],
                "shard_shape": list(shard),
                "bytes_per_device": int(math.prod(shard) * arr.dtype.itemsize),
            }
        )
    return sorted(entries, key=lambda e: e["path"])


# ------------------------------------------------------------------ memory admission
#
# A session or a step that does not fit would be killed by the kernel (CPU) or fail in
# the allocator mid-step (accelerators), and take every other session down with the
# runtime. So both are admitted first, against the budget of each memory *pool*: a host's
# memory, shared by its CPU devices, or one accelerator's (``app.worker.memory_budgets``:
# DATARAX_MEMORY_FRACTION of capacity, or DATARAX_MEMORY_BUDGET_MB). A session reserves
# what its steps need for parameters, optimizer state, gradients and (without donation)
# the next state; a step checks its batch and activations against what is left.
#
# Multi-host, every process must decide alike, or the group restarts (runtime_diverged).
# So the need covers every device of the mesh (pools named globally), every process keeps
# every session's reservation (participating or not), and the budgets come from the
# command (the leader's, which the HTTP process adds), not from each host.


def _pool(device: Any) -> tuple[str, int]:
    return ("host", device.process_index) if device.platform == "cpu" else ("device", device.id)


def _pool_budget(pool: tuple[str, int], budgets: dict[str, Any] | None) -> int:
    if budgets is None:  # a caller without the leader's numbers: one process, local ones
        budgets = memory_budgets(settings())
    value = budgets.get(pool[0])
    return int(value if value is not None else budgets["host"])


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def _admit(what: str, need: dict[Any, int], budgets: dict[str, Any] | None) -> None:
    """422 ``insufficient_memory`` unless ``need`` (pool -> bytes) fits beside the
    reservations of the sessions this runtime holds."""
    for pool, bytes_needed in need.items():
        held = sum(r.reserved.get(pool, 0) for r in SESSIONS.values())
        budget = _pool_budget(pool, budgets)
        if held + bytes_needed > budget:
            kind, index = pool
            where = (
                f"host memory (process {index}, shared by its CPU devices)"
                if kind == "host"
                else f"device {index}"
            )
            raise CommandError(
                422,
                "insufficient_memory",
                "Not enough device memory",
                f"{what} needs about {_size(bytes_needed)} of {where}; sessions hold "
                f"{_size(held)} of its {_size(budget)} budget. Use a smaller model or "
                "batch, shard the parameters (param_sharding fsdp or model), delete "
                "sessions, or raise DATARAX_MEMORY_FRACTION",
            )


def _session_need(
    mesh: Mesh, features: tuple[int, ...], rule: str, opt_name: str, donate: bool
) -> dict[Any, int]:
    """Pool -> bytes of a session's state while it steps, on every device of the mesh,
    plus the whole model once per process (each initialises it unsharded, then places)."""
    layouts, _ = planned_param_layouts(features, dict(mesh.shape), rule)
    per_device = sum(int(e["bytes_per_device"]) for e in layouts)
    state = 1 + OPTIMIZER_STATE_FACTOR.get(opt_name, 2)  # params + optimizer slots
    copies = state + 1 + (0 if donate else state)  # + gradients, + the next state
    whole = sum(math.prod(e["shape"]) for e in layouts) * BYTES_PER_ELEMENT
    need: dict[Any, int] = {}
    first_of_process: dict[int, Any] = {}
    for device in mesh.devices.flat:
        pool = _pool(device)
        need[pool] = need.get(pool, 0) + per_device * copies
        first_of_process.setdefault(device.process_index, pool)
    for pool in first_of_process.values():
        need[pool] += whole
    return need


def _step_need(s: Session, rows: int) -> dict[Any, int]:
    """Pool -> bytes of one step's batch and activations (forward kept for backward), and
    of the host copy of the batch every process holds."""
    spec = s.batch_sharding.spec
    entry = spec[0] if len(spec) else None
    names = () if entry is None else entry if isinstance(entry, tuple) else (entry,)
    shard_rows = rows // max(1, math.prod(s.mesh.shape[n] for n in names))
    width = sum(s.features)
    per_device = shard_rows * (2 * width + s.features[0] + s.features[-1]) * BYTES_PER_ELEMENT
    host = rows * (s.features[0] + s.features[-1]) * BYTES_PER_ELEMENT
    need: dict[Any, int] = {}
    for device in s.mesh.devices.flat:
        pool = _pool(device)
        need[pool] = need.get(pool, 0) + per_device
    for pool in need:
        if pool[0] == "host":
            need[pool] += host
    return need


def _donates(mesh: Mesh) -> bool:
    # Donating the old state halves peak memory on accelerators. On CPU it made the
    # benchmark step ~28% slower (4.51 s vs 3.53 s for 10 steps of the served-steps MLP),
    # and host memory is rarely the limit, so CPU does not donate.
    return mesh.devices.flat[0].platform != "cpu"


@command("session_create")
def session_create(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Builds the model on the plan's mesh. Payload: ``id``, ``mesh`` {axes, device_grid,
    batch_axes}, ``model`` {features}, ``optimizer`` {name, learning_rate}, ``loss``,
    ``seed``, ``param_sharding``, ``strategy``."""
    sid = payload["id"]
    features = tuple(int(f) for f in payload["model"]["features"])
    strategy = payload.get("strategy", "spmd")
    rule = payload.get("param_sharding", "replicate")
    if strategy == "collective" and rule != "replicate":
        raise CommandError(
            422,
            "invalid_strategy",
            "Collective strategy needs replicated parameters",
            f"strategy 'collective' (the pmap path) keeps parameters replicated; "
            f"param_sharding {rule!r} needs strategy 'spmd'",
        )
    mesh = _mesh_from(payload["mesh"])
    opt = payload.get("optimizer") or {}
    opt_name, lr = opt.get("name", "adam"), float(opt.get("learning_rate", 1e-3))
    reserved = _session_need(mesh, features, rule, opt_name, _donates(mesh))
    budgets = payload.get("memory_budget")
    _admit(f"a session of MLP {list(features)} ({rule}, {opt_name})", reserved, budgets)
    model = MLP(features, rngs=nnx.Rngs(int(payload.get("seed", 0))))
    tx = make_optimizer(opt_name, lr)
    session = Session(
        id=sid,
        features=features,
        loss=payload.get("loss", "mse"),
        strategy=strategy,
        param_sharding=rule,
        optimizer=(opt_name, lr),
        mesh=mesh,
        batch_sharding=_batch_sharding(mesh, strategy, payload["mesh"].get("batch_axes")),
        graphdef=None,
        state=None,
        state_shardings=None,
        participates=owns_devices_of(mesh),
        reserved=reserved,
    )
    if not session.participates:
        # Multi-host, a mesh without devices of this process: it takes no part in the
        # session's computations, but keeps the bookkeeping (it validated alike above, and
        # validates steps alike) so every process answers every command the same way.
        SESSIONS[sid] = session
        return {"id": sid, "step": 0, "params": []}, {}
    with jax.set_mesh(mesh):
        # Every process built the same model from the same seed: each fills its own
        # shards from its copy (no cross-process equality check).
        nnx.update(model, place_model_state_on_shards(nnx.state(model), mesh, rule))
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
        graphdef, state = nnx.split((model, optimizer))
        # Optimizer slots follow their parameter; counters and scalars are replicated.
        state = jax.tree.map(_ensure_on_mesh(mesh), state)
    session.graphdef, session.state = graphdef, state
    session.state_shardings = jax.tree.map(lambda a: a.sharding, state)
    session.key_prefix = (
        tuple(d.id for d in mesh.devices.flat),
        tuple(mesh.shape.items()),
        features,
        opt_name,
        lr,
        session.loss,
        strategy,
        rule,
    )
    SESSIONS[sid] = session
    return {"id": sid, "step": 0, "params": param_layouts(nnx.state(model, nnx.Param))}, {}


def _ensure_on_mesh(mesh: Mesh):
    replicated = NamedSharding(mesh, P())

    def fix(a: Any) -> Any:
        if isinstance(a, jax.Array) and isinstance(a.sharding, NamedSharding):
            if a.sharding.mesh.devices.shape == mesh.devices.shape:
                return a
        return global_array_from_host(a, replicated)

    return fix


def _session(payload: dict[str, Any]) -> Session:
    sid = payload.get("id")
    session = SESSIONS.get(sid)
    if session is None:
        raise CommandError(
            410,
            "session_lost",
            "Session state lost",
            f"session {sid!r} is not in this runtime (it was restarted); create a new session",
        )
    return session


@command("session_info")
def session_info(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    s = _session(payload)
    if not s.participates:
        return {"id": s.id, "step": s.step, "last_loss": None, "params": []}, {}
    model, _ = nnx.merge(s.graphdef, s.state)
    return {
        "id": s.id,
        "step": s.step,
        "last_loss": s.last_loss,
        "params": param_layouts(nnx.state(model, nnx.Param)),
    }, {}


@command("session_delete")
def session_delete(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    existed = SESSIONS.pop(payload.get("id"), None) is not None
    return {"deleted": existed}, {}


# ------------------------------------------------------------------------------ steps


def _check_batch(s: Session, batch: dict[str, np.ndarray]) -> None:
    """Validates a client batch before anything changes (422 otherwise)."""
    if "inputs" not in batch:
        raise CommandError(422, "missing_inputs", "Batch has no inputs", "send 'inputs' [B, F]")
    if "targets" not in batch:
        raise CommandError(
            422, "missing_targets", "Batch has no targets", "send 'targets' with the inputs"
        )
    x, y = batch["inputs"], batch["targets"]
    f_in, f_out = s.features[0], s.features[-1]
    if x.ndim != 2 or x.shape[1] != f_in:
        raise CommandError(
            422,
            "batch_shape_mismatch",
            "Inputs do not fit the model",
            f"inputs have shape {list(x.shape)}; the model takes [B, {f_in}]",
        )
    want = (x.shape[0],) if s.loss == "cross_entropy" else (x.shape[0], f_out)
    if tuple(y.shape) != want:
        raise CommandError(
            422,
            "batch_shape_mismatch",
            "Targets do not fit the model and loss",
            f"targets have shape {list(y.shape)}; loss {s.loss!r} needs {list(want)}",
        )
    if s.loss == "cross_entropy":
        if not np.issubdtype(y.dtype, np.integer):
            raise CommandError(
                422, "invalid_targets", "Targets must be class ids", f"got dtype {y.dtype}"
            )
        if y.size and (y.min() < 0 or y.max() >= f_out):
            raise CommandError(
                422, "invalid_targets", "Class id out of range", f"ids must be in [0, {f_out})"
            )
    if not np.issubdtype(x.dtype, np.number):
        raise CommandError(422, "invalid_inputs", "Inputs must be numeric", f"got {x.dtype}")
    _check_divisible(s, x.shape[0])


def _check_divisible(s: Session, rows: int) -> None:
    spec = s.batch_sharding.spec
    entry = spec[0] if len(spec) else None
    names = () if entry is None else entry if isinstance(entry, tuple) else (entry,)
    shards = math.prod(s.mesh.shape[n] for n in names)
    if rows < 1 or rows % shards:
        low, high = nearest_valid_sizes(max(rows, 0), shards)
        raise CommandError(
            422,
            "batch_not_divisible",
            "Batch does not split over the data shards",
            f"batch size {rows} is not divisible by {shards} data shards; "
            f"nearest valid sizes: {low} or {high}",
        )


def _host_batch(s: Session, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    x = np.ascontiguousarray(batch["inputs"], dtype=np.float32)
    y = batch["targets"]
    y = y.astype(np.int32) if s.loss == "cross_entropy" else y.astype(np.float32)
    return {"inputs": x, "targets": y}


def _make_collective(loss_fn):
    def step(model: nnx.Module, optimizer: nnx.Optimizer, batch: Any) -> jax.Array:
        loss, grads = nnx.value_and_grad(lambda m: loss_fn(m, batch))(model)
        grads = reduce_gradients_across_devices(grads, "mean", axis_name=COLLECTIVE_AXIS)
        optimizer.update(model, grads)
        return loss

    return step


_COLLECTIVE_FNS = {name: _make_collective(fn) for name, fn in LOSS_FNS.items()}


def _spmd_program(graphdef: Any, loss_name: str):
    loss_fn = LOSS_FNS[loss_name]

    def program(state: Any, batch: Any) -> tuple[Any, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)
        loss = spmd_train_step(model, optimizer, loss_fn, batch)
        _, new_state = nnx.split((model, optimizer))
        return new_state, loss

    return program


def _compiled(s: Session, batch: dict[str, jax.Array]) -> tuple[Any, bool, float]:
    shapes = tuple((k, v.shape, str(v.dtype)) for k, v in sorted(batch.items()))
    key = (*s.key_prefix, shapes)
    hit = key in _COMPILED
    if hit:
        _COMPILED.move_to_end(key)
        return _COMPILED[key], True, 0.0
    start = time.perf_counter()
    if s.strategy == "collective":
        # shard_map brings its own one-axis mesh; no context mesh around it.
        devices = tuple(s.mesh.devices.flat)
        fn = compiled_collective_step(_COLLECTIVE_FNS[s.loss], s.graphdef, COLLECTIVE_AXIS, devices)
        executable = fn.lower(s.state, batch).compile()
    else:
        replicated = NamedSharding(s.mesh, P())
        donate = (0,) if _donates(s.mesh) else ()
        fn = jax.jit(
            _spmd_program(s.graphdef, s.loss),
            out_shardings=(s.state_shardings, replicated),
            donate_argnums=donate,
        )
        with jax.set_mesh(s.mesh):
            executable = fn.lower(s.state, batch).compile()
    _COMPILED[key] = executable
    while len(_COMPILED) > _MAX_COMPILED:
        _COMPILED.popitem(last=False)
    return executable, False, time.perf_counter() - start


@command("session_step")
def session_step(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Runs ``steps`` training steps. Batch: ``arrays`` inputs/targets (the same batch for
    every step) or ``payload["synthetic"]`` {seed, batch_size} (one batch per step number)."""
    s = _session(payload)
    steps = int(payload["steps"])
    synthetic = payload.get("synthetic")
    if synthetic is not None:
        size = int(synthetic["batch_size"])
        _check_divisible(s, size)
    else:
        _check_batch(s, arrays)
        size = int(arrays["inputs"].shape[0])
    _admit(f"a step of batch size {size}", _step_need(s, size), payload.get("memory_budget"))
    if not s.participates:  # multi-host: the processes that own the mesh run the steps
        s.step += steps
        return {
            "step": s.step,
            "losses": [],
            "timing": {"compile_s": 0.0, "run_s": 0.0, "cache_hit": True},
            "examples_per_s": None,
        }, {}
    seed = int(synthetic.get("seed", 0)) if synthetic is not None else 0

    def host_batch(i: int) -> dict[str, np.ndarray]:
        # Synthetic batches are made one step at a time (step i's depends only on the
        # seed and the step number), so K steps never hold K batches.
        if synthetic is None:
            return _host_batch(s, arrays)
        return synthetic_batch(s.features, s.loss, size, seed, s.step + i)

    # Multi-host: every process holds the whole batch (generated alike, or sent by the
    # leader) and places only the rows its devices hold.
    first = place_global_batch(host_batch(0), s.batch_sharding)
    executable, hit, compile_s = _compiled(s, first)

    start = time.perf_counter()
    state, losses = s.state, []
    for i in range(steps):
        batch = first if i == 0 or synthetic is None else None
        if batch is None:
            batch = place_global_batch(host_batch(i), s.batch_sharding)
        state, loss = executable(state, batch)
        losses.append(loss)
    # Replicated spmd losses are read from a local shard; per-device collective losses
    # are gathered (every process runs this line, so the gather lines up).
    values = [float(np.mean(fetch_global(v))) for v in losses]
    run_s = time.perf_counter() - start
    s.state = state
    s.step += steps
    s.last_loss = values[-1]
    rows = size
    return {
        "step": s.step,
        "losses": values,
        "timing": {"compile_s": compile_s, "run_s": run_s, "cache_hit": hit},
        "examples_per_s": steps * rows / run_s if run_s > 0 else None,
    }, {}
