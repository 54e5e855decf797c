"""The host measures itself: a ``host`` calibration profile (DESIGN v1.3, "Calibrations").

Each stage runs on every local device at once (SPMD over a one-axis mesh of them, each
device its own shard), as a training step keeps them all busy: on a host whose devices
share cores or memory (simulated CPU devices do) a device measured alone would look
faster than it trains.

Stages (:data:`STAGES`), each answering measurement rows:

- ``overhead``: a trivial jitted step's dispatch and return, the step's fixed cost.

The compute stages time a loop of the work inside one program at two lengths and take
the slope, so the dispatch (which dwarfs a small matmul on an accelerator) is not
counted as compute; their sizes are training-sized on accelerators and smaller on CPU
devices.
- ``matmul``: ``[m, k] @ [k, n]`` per device at the compute dtypes and sizes that matter
  for training.
- ``attention``: the kernel the model uses on this platform
  (:func:`datarax.models.attention.flash_attention`: splash on TPU, cuDNN on GPU, the
  blockwise one on CPU), forward and backward, causal.
- ``hbm``: an elementwise pass over a large array (one read, one write), in float32 (the
  fitted one) and bfloat16 (recorded: on a CPU and on TPU v5e its conversions bound it).
- ``collectives``: all-gather, reduce-scatter, all-reduce and all-to-all over the
  devices at several sizes (bytes per second as the ring model prices them); the fit
  reads from them how far the catalog's link figures hold and what each op costs
  besides its bytes.
- ``overlap``: a loop of matmuls and an all-gather, each alone and then side by side in
  one program, sized to take about as long: the share of the shorter one the runtime
  hides behind the other.
- ``step``: the library's own training step (``abstract_train_step``: the transformer,
  Adam, fsdp over the devices) of a tiny transformer, one layer and two, whose work is
  next to nothing: what a step and a layer cost whatever their size (the kernels'
  launches, the host loop).

:func:`~datarax.estimate.host_fit.fit_host_profile` (no JAX: the service fits there)
turns the rows into constants the way the step model reads them (see that module).
Quick mode (the default) measures fewer and smaller cases: under a minute on
a two-core host with 8 simulated CPU devices; the full mode adds the larger sizes.

This module imports JAX: it runs in the device runtime, never in the HTTP process.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.estimate.host_fit import (
    STAGES,
    Measurement,
    attention_priced_flops,
    fit_host_profile,
)

__all__ = ["STAGES", "Measurement", "fit_host_profile", "measure_stage"]

# per device, by platform kind (``cpu``, or ``accelerator`` for TPU and GPU) and mode
# (quick: True); training-sized on accelerators, small enough for a two-core CPU host
_SIZES: dict[str, dict[tuple[str, bool], tuple[Any, ...]]] = {
    # (m, k): [m, k] @ [k, k]
    "matmul": {("cpu", True): ((512, 512), (1024, 1024)),
               ("cpu", False): ((512, 512), (1024, 1024), (2048, 2048)),
               ("accelerator", True): ((8192, 2048), (8192, 4096)),
               ("accelerator", False): ((8192, 2048), (8192, 4096), (16384, 8192))},
    # (batch, seq, heads, head_dim)
    "attention": {("cpu", True): ((1, 512, 8, 64),),
                  ("cpu", False): ((1, 512, 8, 64), (1, 2048, 8, 64)),
                  ("accelerator", True): ((4, 2048, 8, 128),),
                  ("accelerator", False): ((4, 2048, 8, 128), (2, 8192, 8, 128))},
    # float32 elements
    "hbm": {("cpu", True): (1 << 24,), ("cpu", False): (1 << 24, 1 << 25),
            ("accelerator", True): (1 << 26,), ("accelerator", False): (1 << 26, 1 << 28)},
    # bytes
    "collectives": {("cpu", True): (1 << 20, 1 << 23), ("cpu", False): (1 << 20, 1 << 23, 1 << 26),
                    ("accelerator", True): (1 << 23, 1 << 26),
                    ("accelerator", False): (1 << 23, 1 << 26, 1 << 28)},
}  # fmt: skip
_DTYPES = ("bfloat16", "float32")
_TARGET_S = 0.2
"""A timed run lasts about this long: enough iterations in one program that the
dispatch is a small part, which the slope between two run lengths then removes (at
0.05 s a 512-wide bfloat16 matmul on this two-core host's 8 CPU devices once timed at
136 GFLOP/s a device, several times what the cores can do)."""


def _mesh(devices: Sequence[Any] | None) -> Mesh:
    return Mesh(np.array(list(devices or jax.local_devices())), ("d",))


def _sizes(stage: str, mesh: Mesh, quick: bool) -> tuple[Any, ...]:
    kind = "cpu" if mesh.devices.flat[0].platform == "cpu" else "accelerator"
    return _SIZES[stage][(kind, quick)]


def _seconds(fn: Callable[..., Any], *args: Any, repeats: int) -> float:
    """The median of ``repeats`` timed calls after one warm-up call (which compiles)."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _per_iteration(
    body: Callable[[Any], Any], carry: Any, mesh: Mesh, specs: Any, repeats: int
) -> float:
    """Seconds of one ``body(carry) -> carry`` on every device at once: a
    ``lax.fori_loop`` of ``n`` iterations in one program, timed at ``n = 1`` and at an
    ``n`` that runs about :data:`_TARGET_S`; the slope between the two leaves the
    dispatch and the transfer of the answer out."""

    def local(n: jax.Array, carry: Any) -> Any:
        return jax.lax.fori_loop(0, n, lambda _, c: body(c), carry)

    run = jax.jit(
        jax.shard_map(local, mesh=mesh, in_specs=(P(), specs), out_specs=specs, check_vma=False)
    )
    one = _seconds(run, jnp.int32(1), carry, repeats=repeats)
    n = int(min(1000, max(2, round(_TARGET_S / max(one, 1e-6)))))
    many = _seconds(run, jnp.int32(n), carry, repeats=repeats)
    return max((many - one) / (n - 1), 1e-9)


def _split(mesh: Mesh, array: np.ndarray | jax.Array) -> jax.Array:
    placed: jax.Array = jax.device_put(array, NamedSharding(mesh, P("d")))
    return placed


def _overhead(mesh: Mesh, quick: bool) -> list[Measurement]:
    x = _split(mesh, np.zeros((mesh.size, 8), np.float32))
    seconds = _seconds(jax.jit(lambda a: a + 1.0), x, repeats=20 if quick else 50)
    return [{"stage": "overhead", "seconds": seconds}]


def _matmul(mesh: Mesh, quick: bool) -> list[Measurement]:
    rows: list[Measurement] = []
    n_dev = mesh.size
    for dtype in _DTYPES:
        for m, k in _sizes("matmul", mesh, quick):
            # x @ (ones / k) keeps x all ones (k a power of two: exact), so nothing
            # overflows however many times the loop multiplies
            w = _split(mesh, jnp.full((n_dev, k, k), 1.0 / k, dtype))
            x = _split(mesh, jnp.ones((n_dev, m, k), dtype))

            def body(c: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
                x, w = c
                return jnp.einsum("dmk,dkn->dmn", x, w).astype(x.dtype), w

            seconds = _per_iteration(body, (x, w), mesh, (P("d"), P("d")), 3 if quick else 5)
            flops = 2.0 * m * k * k
            rows.append({"stage": "matmul", "dtype": dtype, "shape": [m, k, k],
                         "seconds": seconds, "flops_per_s": flops / seconds})  # fmt: skip
    return rows


def _attention(mesh: Mesh, quick: bool) -> list[Measurement]:
    from datarax.models.attention import flash_attention  # noqa: PLC0415

    rows: list[Measurement] = []
    n_dev = mesh.size

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return flash_attention(q, k, v).astype(jnp.float32).sum()

    def body(c: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        # every gradient feeds the next iteration, so none is left out of the program
        grads = jax.grad(loss, argnums=(0, 1, 2))(*c)
        return tuple((x + 1e-6 * g).astype(x.dtype) for x, g in zip(c, grads, strict=True))

    for b, s, h, hd in _sizes("attention", mesh, quick):
        keys = jax.random.split(jax.random.key(0), 3)
        qkv = tuple(
            _split(mesh, jax.random.normal(key, (n_dev * b, s, h, hd), jnp.bfloat16))
            for key in keys
        )
        seconds = _per_iteration(body, qkv, mesh, (P("d"),) * 3, 3 if quick else 5)
        flops = attention_priced_flops(b, s, h, hd)
        rows.append({"stage": "attention", "dtype": "bfloat16", "shape": [b, s, h, hd],
                     "platform": jax.default_backend(), "seconds": seconds,
                     "priced_flops_per_s": flops / seconds})  # fmt: skip
    return rows


def _hbm(mesh: Mesh, quick: bool) -> list[Measurement]:
    rows: list[Measurement] = []
    for dtype in _DTYPES:
        for n in _sizes("hbm", mesh, quick):
            x = _split(mesh, jnp.ones((mesh.size, n), dtype))
            seconds = _per_iteration(
                lambda a: (a * 0.5 + 0.5).astype(a.dtype), x, mesh, P("d"), 5 if quick else 10
            )
            moved = 2.0 * n * jnp.dtype(dtype).itemsize  # one read, one write
            rows.append({"stage": "hbm", "dtype": dtype, "elements": n, "seconds": seconds,
                         "bytes_per_s": moved / seconds})  # fmt: skip
    return rows


def _collectives(mesh: Mesh, quick: bool) -> list[Measurement]:
    rows: list[Measurement] = []
    n = mesh.size
    if n <= 1:
        return rows
    spec = P("d")
    ops: dict[str, Callable[[jax.Array], jax.Array]] = {
        "all-gather": lambda x: jax.lax.all_gather(x, "d", tiled=True),
        "reduce-scatter": lambda x: jax.lax.psum_scatter(x, "d", tiled=True),
        "all-reduce": lambda x: jax.lax.psum(x, "d"),
        "all-to-all": lambda x: jax.lax.all_to_all(x, "d", 0, 0, tiled=True),
    }
    for kind, op in ops.items():
        run = jax.jit(jax.shard_map(op, mesh=mesh, in_specs=spec, out_specs=spec,
                                    check_vma=False))  # fmt: skip
        for size in _sizes("collectives", mesh, quick):
            # V: the array one device holds whole (all-gather: after; the others: before)
            elements = size // 4
            local = elements // n if kind == "all-gather" else elements
            local -= local % n
            x = _split(mesh, jnp.ones((n * local,), jnp.float32))
            seconds = _seconds(run, x, repeats=3 if quick else 5)
            volume = 4.0 * (local * n if kind == "all-gather" else local)
            passes = 2 if kind == "all-reduce" else 1
            ring_bytes = passes * (n - 1) / n * volume
            rows.append({"stage": "collectives", "kind": kind, "bytes_per_device": volume,
                         "devices": n, "seconds": seconds,
                         "ring_bytes_per_s": ring_bytes / seconds})  # fmt: skip
    return rows


def _overlap(mesh: Mesh, quick: bool) -> list[Measurement]:
    """Matmuls and an all-gather, alone and side by side (independent of each other, in
    one program): ``overlap`` = the time saved over running them one after the other,
    as a share of the shorter (XLA may run them at once; a runtime that cannot, or whose
    devices share the cores doing both, saves nothing)."""
    n = mesh.size
    if n <= 1:
        return []
    repeats = 3 if quick else 5
    k = 256 if mesh.devices.flat[0].platform == "cpu" else 2048
    w = _split(mesh, jnp.full((n, k, k), 1.0 / k, jnp.bfloat16))
    a = _split(mesh, jnp.ones((n, k, k), jnp.bfloat16))
    elements = _sizes("collectives", mesh, quick)[-1] // 4 // n
    x = _split(mesh, jnp.ones((n * elements,), jnp.float32))

    def matmuls(steps: int, a: jax.Array, w: jax.Array) -> jax.Array:
        body = lambda _, c: jnp.einsum("dmk,dkn->dmn", c, w).astype(c.dtype)  # noqa: E731
        out: jax.Array = jax.lax.fori_loop(0, steps, body, a)
        return out

    def program(steps: int, what: str) -> Callable[..., Any]:
        def local(a: jax.Array, w: jax.Array, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            out = matmuls(steps, a, w) if what != "gather" else a
            gathered = jax.lax.all_gather(x, "d", tiled=True) if what != "matmul" else x
            return out, gathered[: x.shape[0]]

        return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("d"), P("d"), P("d")),
                                     out_specs=(P("d"), P("d")), check_vma=False))  # fmt: skip

    # every time less the dispatch of an empty program, which each of them pays once
    idle = _seconds(program(0, "matmul"), a, w, x, repeats=repeats)
    gather = _seconds(program(0, "gather"), a, w, x, repeats=repeats) - idle
    one = (_seconds(program(4, "matmul"), a, w, x, repeats=repeats) - idle) / 4
    steps = int(min(1000, max(1, round(gather / max(one, 1e-6)))))
    compute = _seconds(program(steps, "matmul"), a, w, x, repeats=repeats) - idle
    both = _seconds(program(steps, "both"), a, w, x, repeats=repeats) - idle
    saved = compute + gather - both
    share = min(1.0, max(0.0, saved / max(min(compute, gather), 1e-9)))
    return [{"stage": "overlap", "seconds": both, "compute_s": compute, "gather_s": gather,
             "overlap": share}]  # fmt: skip


TINY = {"kind": "transformer", "d_model": 64, "d_ff": 256, "heads": 4, "kv_heads": 4,
        "vocab": 256, "seq_len": 64, "dtype": "bfloat16", "attention": "flash",
        "remat": "none"}  # fmt: skip
"""The ``step`` stage's transformer (``layers`` 1 and 2), two sequences a device."""


def _step(mesh: Mesh, quick: bool) -> list[Measurement]:
    from flax import nnx  # noqa: PLC0415

    from datarax.models import Transformer, synthetic_tokens  # noqa: PLC0415
    from datarax.models.mlp import make_optimizer  # noqa: PLC0415
    from datarax.specs.model_specs import TransformerSpec, model_spec  # noqa: PLC0415
    from datarax.spmd.compile_step import abstract_train_step  # noqa: PLC0415

    def place(tree: Any, like: Any) -> Any:
        return jax.tree.map(lambda x, s: jax.device_put(x, s.sharding), tree, like)

    rows: list[Measurement] = []
    fsdp = Mesh(mesh.devices, ("fsdp",))
    batch = 2 * mesh.size
    for layers in (1, 2):
        model = {**TINY, "layers": layers}
        spec = model_spec(model)
        if not isinstance(spec, TransformerSpec):  # TINY is one; this narrows the type
            raise TypeError(f"the step stage's model is a {type(spec).__name__}")
        step = abstract_train_step(model, fsdp, batch)
        params = place(Transformer(spec, rngs=nnx.Rngs(0)).param_arrays(), step.args[0])
        state = place(make_optimizer("adam", 1e-4).init(params), step.args[1])
        tokens = place(dict(synthetic_tokens(spec, batch, 0, 0)), step.args[2])
        run = step.jitted()
        times = []
        for i in range(2 + (5 if quick else 10)):
            start = time.perf_counter()
            params, state, loss = run(params, state, tokens)
            jax.block_until_ready(loss)
            if i >= 2:
                times.append(time.perf_counter() - start)
        rows.append({"stage": "step", "model": model, "batch": batch, "devices": mesh.size,
                     "seconds": statistics.median(times)})  # fmt: skip
    return rows


_MEASURE: dict[str, Callable[[Mesh, bool], list[Measurement]]] = {
    "overhead": _overhead,
    "matmul": _matmul,
    "attention": _attention,
    "hbm": _hbm,
    "collectives": _collectives,
    "overlap": _overlap,
    "step": _step,
}


def measure_stage(
    stage: str, *, quick: bool = True, devices: Sequence[Any] | None = None
) -> list[Measurement]:
    """One stage's measurement rows on ``devices`` (default: every local device).

    Raises:
      ValueError: an unknown stage.
    """
    if stage not in _MEASURE:
        raise ValueError(f"calibration stage {stage!r} is not one of {list(STAGES)}")
    return _MEASURE[stage](_mesh(devices), quick)
