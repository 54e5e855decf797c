"""Training sessions, executed inside the runtime process.

A session is a built-in MLP and its optimizer placed on a live mesh. Its parameters live
here, in the runtime; the HTTP process keeps only metadata. After a runtime restart the
parameters are gone and the commands answer 410 ``session_lost`` (no checkpoint restore:
a silently restored older state would make step counts lie).

Compiled steps are cached (:class:`app.runtime.compile_cache.CompiledSteps`) by everything
that changes the compiled program: mesh devices and axes, model features, optimizer and
learning rate, loss, strategy, parameter sharding, and the batch's shapes and dtypes.
Sessions and steps are admitted against the memory budgets first
(:mod:`app.runtime.admission`); a step is compiled from shapes before that, so that XLA's
``memory_analysis()`` of it decides, and it runs only once admitted.

Commands: ``session_create``, ``session_info``, ``session_delete``, ``session_step``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from app.core.errors import (
    DevicesChanged,
    InsufficientMemory,
    InvalidBatch,
    InvalidStrategy,
    SessionLost,
)
from app.runtime.admission import (
    Pool,
    admit,
    compiled_step_need,
    per_device_step_need,
    replicated_session_need,
    session_need,
    step_need,
)
from app.runtime.compile_cache import CompiledSteps, compiled_peak
from app.runtime.devices import memory_budgets
from app.runtime.environment import settings
from app.runtime.server import command
from datarax.distributed import (
    place_model_state_on_shards,
    reduce_gradients_across_devices,
    spmd_train_step,
)
from datarax.distributed.cost import memory_estimate
from datarax.distributed.global_arrays import global_array_from_host
from datarax.distributed.model_specs import DTYPE_BYTES, TransformerSpec, model_spec
from datarax.distributed.multihost import fetch_global, owns_devices_of, place_global_batch
from datarax.distributed.planning import PlanError, nearest_valid_sizes, spec_shard_counts
from datarax.distributed.sharding import path_to_str
from datarax.distributed.train_step import compiled_collective_step
from datarax.models import (
    LOSS_FNS,
    MLP,
    ActivationLayout,
    Transformer,
    make_optimizer,
    synthetic_batch,
    synthetic_tokens,
    transformer_loss,
)

COLLECTIVE_AXIS = "batch"

log = logging.getLogger("datarax.runtime")


@dataclass
class Session:
    """One placed model and optimizer.

    Attributes:
      state: the split (model, optimizer) state, placed on ``mesh``; ``None`` on a process
        that holds no device of the mesh.
      participates: False on a process that holds no device of the mesh (multi-host).
      reserved: memory pool -> bytes this session's state may take there.
    """

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
    reserved: dict[Pool, int] = field(default_factory=dict)
    spec: TransformerSpec | None = None


NEXT_TOKEN = "next_token"
"""A transformer session's loss: mean next-token cross-entropy (``transformer_loss``)."""

SESSIONS: dict[str, Session] = {}


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, or None (musl, macOS): XLA's CPU buffers come from malloc."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_memory() -> None:
    """Hands the memory of dropped arrays back to the OS, so that it is free for the next
    session and for the rest of the host.

    Without it, glibc keeps freed CPU buffers in its arenas: three rounds of 10 sessions
    created and deleted left the runtime at 7.7-8.1 GiB RSS with no session (see
    docs/LIMITS.md); admission, which counts reservations, would admit new sessions into memory
    the process still held.
    """
    gc.collect()  # arrays held only by reference cycles (NNX graphs) go first
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


COMPILED = CompiledSteps()


# ------------------------------------------------------------------------------ set-up


def mesh_from_plan(plan: Mapping[str, Any]) -> Mesh:
    """The live mesh of a plan's ``{"axes", "device_grid"}``.

    Raises:
      DevicesChanged: a device id of the grid that this runtime does not have.
    """
    axes = {str(k): int(v) for k, v in plan["axes"].items()}
    by_id = {d.id: d for d in jax.devices()}
    ids = np.asarray(plan["device_grid"], dtype=np.int64).reshape(tuple(axes.values()))
    missing = sorted({int(i) for i in ids.flat} - set(by_id))
    if missing:
        raise DevicesChanged(
            f"the plan's device ids {missing} are not present; plan the mesh again"
        )
    devices = np.vectorize(by_id.__getitem__, otypes=[object])(ids)
    return Mesh(devices, tuple(axes), axis_types=(AxisType.Auto,) * len(axes))


def batch_sharding(mesh: Mesh, strategy: str, batch_axes: list[str] | None) -> NamedSharding:
    """How a batch's rows split over ``mesh``: every axis for ``collective`` (one flattened
    device axis, as pmap sees it), else ``batch_axes``, else ``data`` and ``fsdp``."""
    names = list(mesh.axis_names)
    if strategy == "collective":
        chosen = names
    elif batch_axes is not None:
        chosen = [a for a in batch_axes if a in names]
    else:
        chosen = [a for a in ("data", "fsdp") if a in names]
    if not chosen:
        return NamedSharding(mesh, P())
    return NamedSharding(mesh, P(chosen[0] if len(chosen) == 1 else tuple(chosen)))


def row_shards(sharding: NamedSharding) -> int:
    """How many shards a batch's rows (dimension 0) are split into."""
    spec = sharding.spec
    return spec_shard_counts(dict(sharding.mesh.shape), spec[:1])[0] if len(spec) else 1


def placed_param_layouts(state: Any) -> list[dict[str, Any]]:
    """Layout of every model parameter, read from the arrays' real shardings."""
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


def donates(mesh: Mesh) -> bool:
    """Whether steps on ``mesh`` donate the old state.

    Donating halves peak memory on accelerators. On CPU it made the benchmark step ~28%
    slower (4.51 s vs 3.53 s for 10 steps of the served-steps MLP), and host memory is
    rarely the limit, so CPU does not donate.
    """
    return mesh.devices.flat[0].platform != "cpu"


def _budgets(payload: Mapping[str, Any]) -> Mapping[str, int | None]:
    budgets = payload.get("memory_budget")
    if budgets is None:  # a caller without the leader's numbers: one process, local ones
        return memory_budgets(settings())
    return budgets


def _reservations() -> list[dict[Pool, int]]:
    return [s.reserved for s in SESSIONS.values()]


@command("session_create")
def session_create(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Builds the model on the plan's mesh.

    Payload: ``id``, ``mesh`` {axes, device_grid, batch_axes}, ``model`` {features},
    ``optimizer`` {name, learning_rate}, ``loss``, ``seed``, ``param_sharding``,
    ``strategy``, ``memory_budget`` (the leader's; else this host's).

    Answers ``{"id", "step": 0, "params": placed layouts}``.

    Raises:
      InvalidStrategy: ``collective`` with sharded parameters.
      DevicesChanged: the plan names devices this runtime does not have.
      InsufficientMemory: the session does not fit beside the others.
    """
    sid = payload["id"]
    if payload["model"].get("kind") != "mlp":
        return _create_transformer(payload)
    features = tuple(int(f) for f in payload["model"]["features"])
    strategy = payload.get("strategy", "spmd")
    rule = payload.get("param_sharding", "replicate")
    if strategy == "collective" and rule != "replicate":
        raise InvalidStrategy(
            f"strategy 'collective' (the pmap path) keeps parameters replicated; "
            f"param_sharding {rule!r} needs strategy 'spmd'"
        )
    mesh = mesh_from_plan(payload["mesh"])
    opt = payload.get("optimizer") or {}
    opt_name, lr = opt.get("name", "adam"), float(opt.get("learning_rate", 1e-3))
    reserved = session_need(mesh, features, rule, opt_name, donates(mesh))
    what = f"a session of MLP {list(features)} ({rule}, {opt_name})"
    admit(what, reserved, _budgets(payload), _reservations())
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
        batch_sharding=batch_sharding(mesh, strategy, payload["mesh"].get("batch_axes")),
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
    _place(session, model, tx, rule)
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
    params = placed_param_layouts(nnx.state(model, nnx.Param))
    log.info(
        "session %s created: MLP %s, %s, %s, %s on %d devices",
        sid,
        list(features),
        strategy,
        rule,
        opt_name,
        mesh.devices.size,
        extra={"session": sid},
    )
    return {"id": sid, "step": 0, "params": params, "reserved": reserved_by_pool(reserved)}, {}


def _place(session: Session, model: nnx.Module, tx: Any, rule: str) -> None:
    """Places ``model`` on the session's mesh by ``rule``, builds its optimizer and keeps
    the split state and its shardings in ``session``."""
    mesh = session.mesh
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


def _create_transformer(payload: dict[str, Any]) -> tuple[dict, dict]:
    """:func:`session_create` for a transformer (``datarax.models.Transformer``): data
    parallel, parameters replicated, the batch split over the plan's batch axes, the
    activations pinned there (``ActivationLayout``).

    Raises:
      InvalidStrategy: a strategy or parameter rule other than spmd / replicate, or a model
        the spec refuses. DevicesChanged, InsufficientMemory: as for the MLP.
    """
    sid = payload["id"]
    try:
        spec = model_spec(payload["model"])
    except PlanError as error:
        raise InvalidStrategy(str(error)) from None
    strategy = payload.get("strategy", "spmd")
    rule = payload.get("param_sharding", "replicate")
    if strategy != "spmd" or rule != "replicate":
        raise InvalidStrategy(
            f"transformer sessions are data parallel (strategy 'spmd', param_sharding "
            f"'replicate'); got strategy {strategy!r}, param_sharding {rule!r}. Plan the "
            "sharded run with a hardware plan and a compile check instead"
        )
    mesh = mesh_from_plan(payload["mesh"])
    opt = payload.get("optimizer") or {}
    opt_name, lr = opt.get("name", "adam"), float(opt.get("learning_rate", 1e-3))
    param_bytes = spec.param_count() * DTYPE_BYTES[spec.param_dtype]
    reserved = replicated_session_need(mesh, param_bytes, opt_name, donates(mesh))
    what = f"a session of transformer {spec.param_count():,} parameters ({opt_name})"
    admit(what, reserved, _budgets(payload), _reservations())
    sharding = batch_sharding(mesh, "spmd", payload["mesh"].get("batch_axes"))
    batch_axes = [a for a in (sharding.spec[0:1] or [None]) if a is not None]
    flat = [a for entry in batch_axes for a in (entry if isinstance(entry, tuple) else (entry,))]
    session = Session(
        id=sid,
        features=(),
        loss=NEXT_TOKEN,
        strategy=strategy,
        param_sharding=rule,
        optimizer=(opt_name, lr),
        mesh=mesh,
        batch_sharding=sharding,
        graphdef=None,
        state=None,
        state_shardings=None,
        participates=owns_devices_of(mesh),
        reserved=reserved,
        spec=spec,
    )
    if not session.participates:
        SESSIONS[sid] = session
        return {"id": sid, "step": 0, "params": []}, {}
    model = Transformer(
        spec, rngs=nnx.Rngs(int(payload.get("seed", 0))), constrain=ActivationLayout(mesh, flat)
    )
    _place(session, model, make_optimizer(opt_name, lr), "replicate")
    session.key_prefix = (
        tuple(d.id for d in mesh.devices.flat),
        tuple(mesh.shape.items()),
        repr(sorted(spec.to_json().items())),
        opt_name,
        lr,
        NEXT_TOKEN,
    )
    SESSIONS[sid] = session
    params = placed_param_layouts(nnx.state(model, nnx.Param))
    log.info(
        "session %s created: transformer %d layers d_model %d, %s on %d devices",
        sid,
        spec.layers,
        spec.d_model,
        opt_name,
        mesh.devices.size,
        extra={"session": sid},
    )
    return {"id": sid, "step": 0, "params": params, "reserved": reserved_by_pool(reserved)}, {}


def reserved_by_pool(reserved: Mapping[Pool, int]) -> dict[str, int]:
    """``{"host:0": bytes, "device:3": bytes}``: a session's reservation, for the service's
    ``datarax_memory_reserved_bytes`` gauge."""
    return {f"{kind}:{index}": int(size) for (kind, index), size in reserved.items()}


def _ensure_on_mesh(mesh: Mesh):
    replicated = NamedSharding(mesh, P())

    def fix(a: Any) -> Any:
        if isinstance(a, jax.Array) and isinstance(a.sharding, NamedSharding):
            if a.sharding.mesh.devices.shape == mesh.devices.shape:
                return a
        return global_array_from_host(a, replicated)

    return fix


def _session(payload: Mapping[str, Any]) -> Session:
    sid = payload.get("id")
    session = SESSIONS.get(sid)
    if session is None:
        raise SessionLost(
            f"session {sid!r} is not in this runtime (it was restarted); create a new session"
        )
    return session


@command("session_info")
def session_info(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """``{"id", "step", "last_loss", "params"}`` of session ``payload["id"]``.

    Raises:
      SessionLost: no such session in this runtime.
    """
    s = _session(payload)
    if not s.participates:
        return {"id": s.id, "step": s.step, "last_loss": None, "params": []}, {}
    model, _ = nnx.merge(s.graphdef, s.state)
    return {
        "id": s.id,
        "step": s.step,
        "last_loss": s.last_loss,
        "params": placed_param_layouts(nnx.state(model, nnx.Param)),
    }, {}


@command("session_delete")
def session_delete(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """Drops session ``payload["id"]`` and its reservation: ``{"deleted": existed}``."""
    existed = SESSIONS.pop(payload.get("id"), None) is not None
    if existed:
        release_freed_memory()
    return {"deleted": existed}, {}


# ------------------------------------------------------------------------------ steps


def check_batch(s: Session, batch: Mapping[str, np.ndarray]) -> None:
    """Validates a client batch before anything changes.

    Args:
      s: the session.
      batch: ``inputs`` [B, F_in] numeric; ``targets`` [B, F_out] (mse) or [B] integer
        class ids in ``[0, F_out)`` (cross_entropy).

    Raises:
      InvalidBatch: ``missing_inputs``, ``missing_targets``, ``batch_shape_mismatch``,
        ``invalid_targets``, ``invalid_inputs`` or ``batch_not_divisible``.
    """
    if "inputs" not in batch:
        raise InvalidBatch("the batch has no 'inputs'; send 'inputs' [B, F]", code="missing_inputs")
    if "targets" not in batch:
        raise InvalidBatch(
            "the batch has no 'targets'; send 'targets' with the inputs", code="missing_targets"
        )
    x, y = batch["inputs"], batch["targets"]
    if s.spec is not None:
        _check_tokens(s, x, y)
        return
    f_in, f_out = s.features[0], s.features[-1]
    if x.ndim != 2 or x.shape[1] != f_in:
        raise InvalidBatch(
            f"inputs have shape {list(x.shape)}; the model takes [B, {f_in}]",
            code="batch_shape_mismatch",
        )
    want = (x.shape[0],) if s.loss == "cross_entropy" else (x.shape[0], f_out)
    if tuple(y.shape) != want:
        raise InvalidBatch(
            f"targets have shape {list(y.shape)}; loss {s.loss!r} needs {list(want)}",
            code="batch_shape_mismatch",
        )
    if s.loss == "cross_entropy":
        if not np.issubdtype(y.dtype, np.integer):
            raise InvalidBatch(
                f"targets must be integer class ids, got dtype {y.dtype}", code="invalid_targets"
            )
        if y.size and (y.min() < 0 or y.max() >= f_out):
            raise InvalidBatch(
                f"target class ids must be in [0, {f_out}), got [{y.min()}, {y.max()}]",
                code="invalid_targets",
            )
    if not np.issubdtype(x.dtype, np.number):
        raise InvalidBatch(f"inputs must be numeric, got dtype {x.dtype}", code="invalid_inputs")
    check_divisible(s, x.shape[0])


def _check_tokens(s: Session, x: np.ndarray, y: np.ndarray) -> None:
    """A transformer session's batch: int token ids ``[B, seq_len]`` in ``[0, vocab)``."""
    assert s.spec is not None
    seq, vocab = s.spec.seq_len, s.spec.vocab
    for name, a in (("inputs", x), ("targets", y)):
        if a.ndim != 2 or a.shape[1] != seq or a.shape[0] != x.shape[0]:
            raise InvalidBatch(
                f"{name} have shape {list(a.shape)}; the transformer takes [B, {seq}] token ids",
                code="batch_shape_mismatch",
            )
        if not np.issubdtype(a.dtype, np.integer):
            raise InvalidBatch(
                f"{name} must be integer token ids, got dtype {a.dtype}",
                code="invalid_inputs" if name == "inputs" else "invalid_targets",
            )
        if a.size and (a.min() < 0 or a.max() >= vocab):
            raise InvalidBatch(
                f"{name} token ids must be in [0, {vocab}), got [{a.min()}, {a.max()}]",
                code="invalid_inputs" if name == "inputs" else "invalid_targets",
            )
    check_divisible(s, x.shape[0])


def check_divisible(s: Session, rows: int) -> None:
    """Raises InvalidBatch ``batch_not_divisible`` unless ``rows`` splits evenly over the
    session's data shards (naming the nearest valid sizes)."""
    shards = row_shards(s.batch_sharding)
    if rows < 1 or rows % shards:
        low, high = nearest_valid_sizes(max(rows, 0), shards)
        nearest = f"sizes: {low} or {high}" if low != high else f"size: {low}"
        raise InvalidBatch(
            f"batch size {rows} is not divisible by {shards} data shards; nearest valid {nearest}",
            code="batch_not_divisible",
        )


def _host_batch(s: Session, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    if s.spec is not None:
        return {k: np.ascontiguousarray(batch[k], dtype=np.int32) for k in ("inputs", "targets")}
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
    loss_fn = transformer_loss if loss_name == NEXT_TOKEN else LOSS_FNS[loss_name]

    def program(state: Any, batch: Any) -> tuple[Any, jax.Array]:
        model, optimizer = nnx.merge(graphdef, state)
        loss = spmd_train_step(model, optimizer, loss_fn, batch)
        _, new_state = nnx.split((model, optimizer))
        return new_state, loss

    return program


def _host_batch_bytes(s: Session, size: int) -> int:
    if s.spec is not None:
        return size * s.spec.seq_len * 8  # int32 inputs and targets
    return size * (s.features[0] + _target_width(s)) * 4


def _step_need(s: Session, size: int) -> dict[Pool, int]:
    """A step's estimated need (before XLA's figure is known): the MLP's arithmetic, or the
    transformer's activations and temporaries by ``cost.memory_estimate``."""
    if s.spec is None:
        return step_need(s.mesh, row_shards(s.batch_sharding), s.features, size)
    shards = row_shards(s.batch_sharding)
    estimate = memory_estimate(s.spec, {"data": shards}, size)
    per_device = estimate["activations"] + estimate["temporaries"] + estimate["batch"]
    return per_device_step_need(s.mesh, per_device, _host_batch_bytes(s, size))


def _target_width(s: Session) -> int:
    return 1 if s.loss == "cross_entropy" else s.features[-1]


def _abstract_batch(s: Session, size: int) -> dict[str, jax.ShapeDtypeStruct]:
    """The step's batch as shapes, dtypes and sharding, as ``_host_batch`` and
    ``synthetic_batch`` make it (float32 inputs; int32 class ids or float32 targets; a
    transformer's int32 token ids)."""
    if s.spec is not None:
        tokens = jax.ShapeDtypeStruct((size, s.spec.seq_len), np.int32, sharding=s.batch_sharding)
        return {"inputs": tokens, "targets": tokens}
    targets = (
        jax.ShapeDtypeStruct((size,), np.int32, sharding=s.batch_sharding)
        if s.loss == "cross_entropy"
        else jax.ShapeDtypeStruct((size, s.features[-1]), np.float32, sharding=s.batch_sharding)
    )
    inputs = jax.ShapeDtypeStruct((size, s.features[0]), np.float32, sharding=s.batch_sharding)
    return {"inputs": inputs, "targets": targets}


def _whole_group(mesh: Mesh) -> bool:
    """Whether the mesh has devices on every process, so every process compiles the same
    step and reads the same figures (and so admits alike); else they use the estimate."""
    return {d.process_index for d in mesh.devices.flat} == set(range(jax.process_count()))


def _quote_xla(figures: Mapping[str, int]) -> str:
    return (
        f"XLA's compiled step: {figures['peak']:,} bytes per device; arguments "
        f"{figures['argument']:,} + outputs {figures['output']:,} - aliased "
        f"{figures['alias']:,} + temporaries {figures['temp']:,}, XLA's peak "
        f"{figures['xla_peak']:,}"
    )


def _is_oom(error: BaseException) -> bool:
    text = str(error)
    return "RESOURCE_EXHAUSTED" in text or "HbmOom" in text or "Out of memory" in text


def _compile(s: Session, batch: Mapping[str, Any]) -> Any:
    if s.strategy == "collective":
        # shard_map brings its own one-axis mesh; no context mesh around it.
        devices = tuple(s.mesh.devices.flat)
        fn = compiled_collective_step(_COLLECTIVE_FNS[s.loss], s.graphdef, COLLECTIVE_AXIS, devices)
        return fn.lower(s.state, batch).compile()
    replicated = NamedSharding(s.mesh, P())
    fn = jax.jit(
        _spmd_program(s.graphdef, s.loss),
        out_shardings=(s.state_shardings, replicated),
        donate_argnums=(0,) if donates(s.mesh) else (),
    )
    with jax.set_mesh(s.mesh):
        return fn.lower(s.state, batch).compile()


def _compiled(s: Session, batch: Mapping[str, Any]) -> tuple[Any, bool, float]:
    """The session's step executable for this batch (placed arrays or ``ShapeDtypeStruct``s
    with the batch sharding): ``(executable, cache hit, compile s)``.

    Raises:
      InsufficientMemory: XLA refuses to compile the step for memory (TPU compiles check
        HBM), quoting its text.
    """
    shapes = tuple((k, v.shape, str(v.dtype)) for k, v in sorted(batch.items()))
    key = (*s.key_prefix, shapes)
    cached = COMPILED.get(key)
    if cached is not None:
        return cached, True, 0.0
    start = time.perf_counter()
    try:
        executable = _compile(s, batch)
    except Exception as error:
        if not _is_oom(error):
            raise
        raise InsufficientMemory(
            f"XLA refuses to compile the step for memory: {str(error).strip()[:600]}. "
            "Use a smaller batch or model, or shard the parameters"
        ) from None
    COMPILED.put(key, executable)
    seconds = time.perf_counter() - start
    log.info(
        "compiled the step of session %s in %.3f s",
        s.id,
        seconds,
        extra={"session": s.id, "compile_s": round(seconds, 6)},
    )
    return executable, False, seconds


@command("session_step")
def session_step(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Runs ``steps`` training steps.

    Batch: ``arrays`` inputs/targets (the same batch for every step) or
    ``payload["synthetic"]`` {seed, batch_size} (one batch per step number).

    Answers ``{"step", "losses", "timing": {"compile_s", "run_s", "cache_hit"},
    "examples_per_s"}``.

    Raises:
      SessionLost: no such session in this runtime.
      InvalidBatch: a batch the session cannot take (nothing changed).
      InsufficientMemory: the step does not fit (nothing changed): by XLA's figure for the
        compiled step (compiled from shapes before anything runs) where every process
        holds devices of the mesh, else by the estimate of its batch and activations.
    """
    s = _session(payload)
    steps = int(payload["steps"])
    synthetic = payload.get("synthetic")
    if synthetic is not None:
        size = int(synthetic["batch_size"])
        check_divisible(s, size)
    else:
        check_batch(s, arrays)
        size = int(arrays["inputs"].shape[0])
    # Admission before anything runs: with XLA's figure for the compiled step where this
    # process can have it (the step is compiled from shapes, before any batch is placed),
    # else with the estimate.
    executable, hit, compile_s = None, True, 0.0
    need = _step_need(s, size)
    what = f"a step of batch size {size}"
    if s.participates and _whole_group(s.mesh):
        executable, hit, compile_s = _compiled(s, _abstract_batch(s, size))
        figures = compiled_peak(executable)
        if figures is not None:
            host_bytes = _host_batch_bytes(s, size)
            need = compiled_step_need(s.mesh, figures["peak"], s.reserved, host_bytes)
            what += f" ({_quote_xla(figures)})"
    admit(what, need, _budgets(payload), _reservations())
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
        if s.spec is not None:
            return synthetic_tokens(s.spec, size, seed, s.step + i)
        return synthetic_batch(s.features, s.loss, size, seed, s.step + i)

    # Multi-host: every process holds the whole batch (generated alike, or sent by the
    # leader) and places only the rows its devices hold.
    first = place_global_batch(host_batch(0), s.batch_sharding)
    if executable is None:
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
    return {
        "step": s.step,
        "losses": values,
        "timing": {"compile_s": compile_s, "run_s": run_s, "cache_hit": hit},
        "examples_per_s": steps * size / run_s if run_s > 0 else None,
    }, {}
