"""Training steps of a session, executed inside the runtime process.

Compiled steps are cached (:class:`app.runtime.compile_cache.CompiledSteps`, the
sessions' :data:`~app.runtime.sessions.COMPILED`) by everything that changes the compiled
program: mesh devices and axes, model features, optimizer and learning rate, loss,
strategy, parameter sharding, and the batch's shapes and dtypes. Steps are admitted
against the memory budgets first (:mod:`app.runtime.admission`); a step is compiled from
shapes before that, so that XLA's ``memory_analysis()`` of it decides, and it runs only
once admitted. Before anything is lowered (:func:`check_before_lowering`), a step whose
arrays the kernels cannot index is refused (:mod:`app.runtime.sizes`), and a
transformer's step is admitted by the library's estimate first: lowering alone can take
gigabytes (``dot`` attention's ``[S, S]`` mask is a constant of the program) and XLA's
compiler more.

Commands: ``session_step``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from app.core.errors import InsufficientMemory, InvalidBatch
from app.runtime.admission import (
    Pool,
    admit,
    compiled_step_need,
    per_device_step_need,
    step_need,
)
from app.runtime.compile_cache import compiled_peak
from app.runtime.server import command
from app.runtime.sessions import (
    COLLECTIVE_AXIS,
    COMPILED,
    NEXT_TOKEN,
    Session,
    donates,
    memory_budget_of,
    reservations,
    row_shards,
    session_of,
)
from app.runtime.sizes import (
    MAX_ELEMENTS,
    check_elements,
    mlp_step_elements,
    parameter_elements,
    transformer_step_elements,
)
from datarax.distributed import reduce_gradients_across_devices, spmd_train_step
from datarax.estimate.memory import memory_estimate
from datarax.models import (
    LOSS_FNS,
    synthetic_batch,
    synthetic_tokens,
    transformer_loss,
)
from datarax.parallel.kinds import shards_where
from datarax.plan.layout import nearest_valid_sizes
from datarax.specs.model_specs import model_spec
from datarax.spmd.multihost import fetch_global, place_global_batch
from datarax.spmd.train_step import compiled_collective_step

log = logging.getLogger("datarax.runtime")

# nnx.jit under functools.partial hides the step's signature from type checkers.
_spmd_train_step = cast(Callable[..., jax.Array], spmd_train_step)


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
        loss = _spmd_train_step(model, optimizer, loss_fn, batch)
        _, new_state = nnx.split((model, optimizer))
        return new_state, loss

    return program


def _host_batch_bytes(s: Session, size: int) -> int:
    if s.spec is not None:
        return size * s.spec.seq_len * 8  # int32 inputs and targets
    return size * (s.features[0] + _target_width(s)) * 4


def _expert_shards(s: Session) -> int:
    return shards_where(dict(s.mesh.shape), lambda kind: kind.splits_experts)


def _step_need(s: Session, size: int) -> dict[Pool, int]:
    """A step's estimated need (before XLA's figure is known): the MLP's arithmetic, or the
    transformer's activations, temporaries and batch by the library's ``memory_estimate``
    (a mixture of experts with its expert axes: their dispatch buffers), plus, for ``dot``
    attention, the causal mask the lowering captures (``[S, S]`` bytes on each device,
    and twice on the host: numpy's array and the program's copy)."""
    shards = row_shards(s.batch_sharding)
    if s.spec is None:
        return step_need(s.mesh, shards, s.features, size)
    experts = _expert_shards(s)
    axes = {"data": shards}
    if s.spec.is_moe and experts > 1 and shards % experts == 0:
        axes = {"data": shards // experts, "expert": experts}
    estimate = memory_estimate(s.spec, axes, size)
    per_device = estimate.activations + estimate.temporaries + estimate.batch
    host = _host_batch_bytes(s, size)
    if s.spec.attention == "dot":
        per_device += s.spec.seq_len**2
        host += 2 * s.spec.seq_len**2
    return per_device_step_need(s.mesh, per_device, host)


def step_elements(s: Session, size: int) -> dict[str, int]:
    """Elements of each array a step of ``size`` rows holds (:mod:`app.runtime.sizes`)."""
    per_device = size // max(1, row_shards(s.batch_sharding))
    if s.spec is None:
        params = parameter_elements(model_spec({"kind": "mlp", "features": list(s.features)}))
        return {**params, **mlp_step_elements(s.features, size, per_device)}
    platform = s.mesh.devices.flat[0].platform
    arrays = transformer_step_elements(
        s.spec, size, per_device, _expert_shards(s), s.mesh.devices.size, platform
    )
    return {**parameter_elements(s.spec), **arrays}


def check_before_lowering(
    s: Session, size: int, need: Mapping[Pool, int], what: str, budgets: Mapping[str, int | None]
) -> None:
    """What is checked before a step is lowered, alike on every process of a group.

    A transformer's step is admitted by the estimate (``need``): lowering and compiling
    it can take gigabytes before XLA's figure exists. An MLP's lowering holds no large
    constant and its compile is small, so XLA's figure alone decides (the estimate is
    high for it), unless one of its arrays is too large to lower: then the estimate
    decides whether the answer is ``insufficient_memory`` (it would not fit anyway) or
    ``model_too_large``.

    Raises:
      InsufficientMemory: the estimate does not fit beside the other sessions.
      ServiceError: ``model_too_large``, an array past :data:`app.runtime.sizes.MAX_ELEMENTS`.
    """
    arrays = step_elements(s, size)
    if s.spec is not None or max(arrays.values()) > MAX_ELEMENTS:
        admit(f"{what} (the estimate, before lowering)", need, budgets, reservations())
    check_elements(what, arrays)


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
        step = compiled_collective_step(
            _COLLECTIVE_FNS[s.loss], s.graphdef, COLLECTIVE_AXIS, devices
        )
        return cast(jax.stages.Wrapped, step).lower(s.state, batch).compile()
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
        holds devices of the mesh, else by the estimate of its batch and activations; a
        transformer's by the estimate before lowering as well.
      ServiceError: ``model_too_large``, an array the kernels cannot index (nothing was
        lowered).
    """
    s = session_of(payload)
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
    budgets = memory_budget_of(payload)
    check_before_lowering(s, size, need, what, budgets)
    if s.participates and _whole_group(s.mesh):
        executable, hit, compile_s = _compiled(s, _abstract_batch(s, size))
        figures = compiled_peak(executable)
        if figures is not None:
            host_bytes = _host_batch_bytes(s, size)
            need = compiled_step_need(s.mesh, figures["peak"], s.reserved, host_bytes)
            what += f" ({_quote_xla(figures)})"
    admit(what, need, budgets, reservations())
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
        # place_global_batch keeps the batch's structure: a dict of arrays.
        executable, hit, compile_s = _compiled(s, cast(dict[str, jax.Array], first))

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
