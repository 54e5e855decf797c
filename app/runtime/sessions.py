"""Training sessions, executed inside the runtime process.

A session is a built-in MLP and its optimizer placed on a live mesh. Its parameters live
here, in the runtime; the HTTP process keeps only metadata. After a runtime restart the
parameters are gone and the commands answer 410 ``session_lost`` (no checkpoint restore:
a silently restored older state would make step counts lie).

Sessions are admitted against the memory budgets first (:mod:`app.runtime.admission`),
and refused when a parameter array is too large for the kernels (:mod:`app.runtime.sizes`).
Their steps are in :mod:`app.runtime.steps`, which keeps its compiled steps in
:data:`COMPILED` (keyed by :attr:`Session.key_prefix` and the batch's shapes).

Commands: ``session_create``, ``session_info``, ``session_delete``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import math
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
    InvalidStrategy,
    SessionLost,
)
from app.runtime.admission import (
    Pool,
    admit,
    replicated_session_need,
    session_need,
)
from app.runtime.compile_cache import CompiledSteps
from app.runtime.devices import memory_budgets
from app.runtime.environment import settings
from app.runtime.server import command
from app.runtime.sizes import check_elements, parameter_elements
from datarax.distributed import (
    place_model_state_on_shards,
)
from datarax.errors import PlanError
from datarax.models import (
    MLP,
    ActivationLayout,
    Transformer,
    make_optimizer,
)
from datarax.models.decode import DecodeLayout, generate
from datarax.parallel.kinds import axes_where
from datarax.plan.layout import spec_shard_counts
from datarax.specs.model_specs import DTYPE_BYTES, TransformerSpec, model_spec
from datarax.spmd.global_arrays import global_array_from_host, path_to_str
from datarax.spmd.multihost import owns_devices_of

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


def memory_budget_of(payload: Mapping[str, Any]) -> Mapping[str, int | None]:
    """The budgets a command admits against: the leader's (``payload["memory_budget"]``),
    else this process's own."""
    budgets = payload.get("memory_budget")
    if budgets is None:  # a caller without the leader's numbers: one process, local ones
        return memory_budgets(settings())
    return budgets


def reservations() -> list[dict[Pool, int]]:
    """What the live sessions of this runtime hold, pool by pool."""
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
      ServiceError: ``model_too_large``, a parameter array the kernels cannot index.
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
    admit(what, reserved, memory_budget_of(payload), reservations())
    mlp_spec = model_spec({"kind": "mlp", "features": list(features)})
    check_elements(what, parameter_elements(mlp_spec))
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
    if not isinstance(spec, TransformerSpec):  # session_create sends only transformers here
        raise InvalidStrategy(f"not a transformer: {payload['model']!r}")
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
    admit(what, reserved, memory_budget_of(payload), reservations())
    check_elements(what, parameter_elements(spec))
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
    # a mixture-of-experts model's dispatched tokens go over the mesh's expert axes
    experts = list(axes_where(dict(mesh.shape), lambda kind: kind.splits_experts))
    layout = ActivationLayout(mesh, flat, (), experts if spec.is_moe else ())
    model = Transformer(spec, rngs=nnx.Rngs(int(payload.get("seed", 0))), constrain=layout)
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


def session_of(payload: Mapping[str, Any]) -> Session:
    """The session ``payload["id"]``; 410 ``session_lost`` when this runtime has none."""
    sid = payload.get("id")
    session = SESSIONS.get(sid) if isinstance(sid, str) else None
    if session is None:
        raise SessionLost(
            f"session {sid!r} is not in this runtime: it has restarted since the session "
            "was created, or the session lives in another replica's runtime; create a new "
            "session (or send its requests to the replica that created it)"
        )
    return session


@command("session_info")
def session_info(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """``{"id", "step", "last_loss", "params"}`` of session ``payload["id"]``.

    Raises:
      SessionLost: no such session in this runtime.
    """
    s = session_of(payload)
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
    sid = payload.get("id")
    existed = isinstance(sid, str) and SESSIONS.pop(sid, None) is not None
    if existed:
        release_freed_memory()
    return {"deleted": existed}, {}


@command("session_generate")
def session_generate(payload: dict[str, Any], arrays: dict[str, np.ndarray]) -> tuple[dict, dict]:  # noqa: ARG001
    """``{"id", "tokens"}``: ``payload["steps"]`` greedy tokens after each row of
    ``payload["prompt"]`` from the session's transformer as it is now, through the
    library's KV-cached decode step (:func:`datarax.models.decode.generate`) on the
    session's mesh (parameters and cache replicated over it).

    Raises:
      SessionLost: no such session in this runtime. InvalidStrategy: an MLP session.
    """
    s = session_of(payload)
    if s.spec is None:
        raise InvalidStrategy("generate takes a transformer session; this one is an MLP")
    if not s.participates:
        return {"id": s.id, "tokens": []}, {}
    model, _ = nnx.merge(s.graphdef, s.state)
    prompt = np.asarray(payload["prompt"], np.int32)
    tokens = generate(
        s.spec, model.param_arrays(), prompt, int(payload["steps"]), layout=DecodeLayout(s.mesh)
    )
    return {"id": s.id, "tokens": np.asarray(tokens).tolist()}, {}
