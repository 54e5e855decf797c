"""Checks the planner's step estimate against XLA on this host's 8 simulated CPU devices.

For each (mesh, model) case this compiles one real training step (forward, loss,
gradients, optax adam update, parameters and optimizer state donated) with the exact
parameter shardings the estimate assumes (``datarax.estimate.cost.param_specs``) and
compares:

- memory per device: the estimate's ``params + optimizer + batch`` with XLA's
  ``compiled.memory_analysis()`` ``argument + output - alias`` bytes (what lives across
  the step); the estimate's ``grads + activations`` is printed beside XLA's temporaries
  but not scored (XLA's temporaries also hold fusion buffers and reuse memory);
- collectives: the kinds the estimate predicts with those in the compiled HLO text.

Step time is not validated: simulated CPU devices share one host's cores and memory, so
their timings say nothing about ICI/NVLink/DCN.

Run:
  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
      .venv/bin/python benchmarks/estimate_validation.py
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import re  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from datarax.estimate.cost import estimate_step  # noqa: E402
from datarax.estimate.memory import memory_estimate  # noqa: E402
from datarax.hardware.chips import AxisLink, get_hardware  # noqa: E402
from datarax.parallel.axis_roles import axis_roles, param_specs  # noqa: E402
from datarax.specs.model_specs import MLPSpec, TransformerSpec, model_spec  # noqa: E402

MLP_2 = {"kind": "mlp", "features": [512, 2048, 512], "dtype": "float32"}
MLP_3 = {"kind": "mlp", "features": [256, 1024, 1024, 128], "dtype": "float32"}
TRANSFORMER = {
    "kind": "transformer", "layers": 2, "d_model": 256, "d_ff": 1024, "heads": 8,
    "kv_heads": 4, "vocab": 2048, "seq_len": 128, "dtype": "float32",
}  # fmt: skip
TRANSFORMER_BF16 = {**TRANSFORMER, "dtype": "bfloat16", "mlp": "plain"}

CASES = [
    ({"data": 8}, MLP_2, 256),
    ({"fsdp": 8}, MLP_2, 256),
    ({"tensor": 8}, MLP_2, 256),
    ({"data": 2, "fsdp": 4}, MLP_3, 256),
    ({"data": 2, "tensor": 4}, MLP_3, 256),
    ({"fsdp": 4, "tensor": 2}, MLP_2, 256),
    ({"data": 8}, TRANSFORMER, 16),
    ({"fsdp": 8}, TRANSFORMER, 16),
    ({"tensor": 8}, TRANSFORMER, 8),
    ({"data": 2, "fsdp": 4}, TRANSFORMER_BF16, 16),
    ({"data": 2, "tensor": 4}, TRANSFORMER_BF16, 16),
    ({"fsdp": 4, "tensor": 2}, TRANSFORMER, 16),
    ({"data": 2, "fsdp": 2, "tensor": 2}, TRANSFORMER, 16),
    ({"data": 2, "fsdp": 2, "tensor": 2}, MLP_3, 256),
]

_COLLECTIVE = re.compile(
    r"\b(all-reduce|all-gather|reduce-scatter|collective-permute|all-to-all)(?:-start)?\("
)


def _group_specs(spec, axes):
    roles = axis_roles(list(axes))
    return {g.path: s for g, s, _, _ in param_specs(spec, axes, roles)}


def _param_spec(path: str, specs) -> tuple:
    key = re.sub(r"^layers/\d+/", "layers/*/", path)
    return specs[key] if key in specs else specs[path]


def _rms(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _transformer_loss(spec: TransformerSpec, params, batch):
    tokens, targets = batch["tokens"], batch["targets"]
    b, s = tokens.shape
    hd = spec.head_dim
    x = jnp.take(params["embed/embedding"], tokens, axis=0)
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    for i in range(spec.layers):
        p = {k.split("/", 2)[2]: v for k, v in params.items() if k.startswith(f"layers/{i}/")}
        h = _rms(x, p["attn_norm/scale"])
        q = (h @ p["attn/q"]).reshape(b, s, spec.heads, hd)
        k = (h @ p["attn/k"]).reshape(b, s, spec.kv_heads, hd)
        v = (h @ p["attn/v"]).reshape(b, s, spec.kv_heads, hd)
        rep = spec.heads // spec.kv_heads
        k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(hd).astype(q.dtype)
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        attn = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
        x = x + attn.reshape(b, s, spec.heads * hd) @ p["attn/o"]
        h = _rms(x, p["mlp_norm/scale"])
        if spec.mlp == "gated":
            hidden = jax.nn.silu(h @ p["mlp/gate"]) * (h @ p["mlp/up"])
        else:
            hidden = jax.nn.gelu(h @ p["mlp/up"])
        x = x + hidden @ p["mlp/down"]
    logits = _rms(x, params["final_norm/scale"]) @ params["unembed/kernel"]
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))


def _mlp_loss(spec: MLPSpec, params, batch):
    x = batch["inputs"].astype(spec.dtype)
    n = len(spec.features) - 1
    for i in range(n):
        x = x @ params[f"layers/{i}/kernel"] + params[f"layers/{i}/bias"]
        if i < n - 1:
            x = jax.nn.relu(x)
    return jnp.mean((x.astype(jnp.float32) - batch["targets"]) ** 2)


def compile_case(axes, model, global_batch):
    spec = model_spec(model)
    names = tuple(axes)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(tuple(axes.values())), names)
    specs = _group_specs(spec, axes)
    dtype = jnp.dtype(spec.dtype)
    shardings = {
        path: NamedSharding(mesh, P(*_param_spec(path, specs))) for path in spec.param_shapes()
    }
    params = {
        path: jax.ShapeDtypeStruct(shape, dtype, sharding=shardings[path])
        for path, shape in spec.param_shapes().items()
    }
    roles = axis_roles(list(axes))
    batch_axes = tuple(a for a in names if roles[a] in ("data", "fsdp"))
    row = P(batch_axes if batch_axes else None)
    bsh = NamedSharding(mesh, row)
    if isinstance(spec, TransformerSpec):
        shape = (global_batch, spec.seq_len)
        batch = {
            "tokens": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=bsh),
            "targets": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=bsh),
        }
        loss_fn = _transformer_loss
    else:
        batch = {
            "inputs": jax.ShapeDtypeStruct((global_batch, spec.features[0]), jnp.float32,
                                           sharding=bsh),
            "targets": jax.ShapeDtypeStruct((global_batch, spec.features[-1]), jnp.float32,
                                            sharding=bsh),
        }  # fmt: skip
        loss_fn = _mlp_loss
    optimizer = optax.adam(1e-3)
    opt_shapes = jax.eval_shape(optimizer.init, params)
    opt_shardings = jax.tree.map(
        lambda leaf: leaf.sharding if hasattr(leaf, "sharding") and leaf.ndim else
        NamedSharding(mesh, P()), opt_shapes,
    )  # fmt: skip
    opt_state = jax.tree.map(
        lambda leaf, sh: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sh),
        opt_shapes, opt_shardings,
    )  # fmt: skip

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(spec, p, batch))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    jitted = jax.jit(
        step,
        out_shardings=(shardings, opt_shardings, NamedSharding(mesh, P())),
        donate_argnums=(0, 1),
    )
    start = time.perf_counter()
    compiled = jitted.lower(params, opt_state, batch).compile()
    return spec, compiled, time.perf_counter() - start


def _on_cpu(kinds: set[str]) -> set[str]:
    """XLA's CPU backend emits a reduce-scatter as an all-reduce and a dynamic-slice."""
    return {"all-reduce" if k == "reduce-scatter" else k for k in kinds}


def main() -> int:
    if jax.device_count() < 8:
        print(f"needs 8 devices, have {jax.device_count()}: set XLA_FLAGS as the docstring says")
        return 1
    hw = get_hardware("cpu")
    rows = []
    for axes, model, global_batch in CASES:
        spec, compiled, compile_s = compile_case(axes, model, global_batch)
        mem = compiled.memory_analysis()
        xla_live = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
        est = memory_estimate(spec, axes, global_batch)
        est_live = est["params"] + est["optimizer"] + est["batch"]
        links = [AxisLink(a, n, n, 1, "host", hw.fast_link_bytes_per_s) for a, n in axes.items()]
        predicted = {c["kind"] for c in estimate_step(hw, links, spec, global_batch)["collectives"]}
        found = set(_COLLECTIVE.findall(compiled.as_text()))
        error = (est_live - xla_live) / xla_live
        rows.append(
            {
                "mesh": "x".join(f"{a}={n}" for a, n in axes.items()),
                "model": f"{spec.kind} {spec.dtype}",
                "batch": global_batch,
                "est": est_live,
                "xla": xla_live,
                "error": error,
                "est_temp": est["grads"] + est["activations"],
                "xla_temp": mem.temp_size_in_bytes,
                "predicted": predicted,
                "found": found,
                "compile_s": compile_s,
            }
        )
    print("| mesh | model | batch | estimate live B | XLA arg+out-alias B | error | "
          "estimate grads+acts B | XLA temp B | predicted collectives | HLO collectives | "
          "kinds equal | predicted found (CPU) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mesh']} | {r['model']} | {r['batch']} | {r['est']:,} | {r['xla']:,} | "
            f"{r['error']:+.1%} | {r['est_temp']:,} | {r['xla_temp']:,} | "
            f"{', '.join(sorted(r['predicted'])) or '-'} | {', '.join(sorted(r['found'])) or '-'}"
            f" | {'yes' if r['predicted'] == r['found'] else 'no'}"
            f" | {'yes' if _on_cpu(r['predicted']) <= r['found'] else 'no'} |"
        )
    within = sum(abs(r["error"]) <= 0.10 for r in rows)
    kinds = sum(r["predicted"] == r["found"] for r in rows)
    covered = sum(_on_cpu(r["predicted"]) <= r["found"] for r in rows)
    print(
        f"\nmemory within 10%: {within}/{len(rows)} cases; collective kinds equal: "
        f"{kinds}/{len(rows)}; predicted kinds found (reduce-scatter read as all-reduce): "
        f"{covered}/{len(rows)}; compile {sum(r['compile_s'] for r in rows):.1f} s in all "
        f"(jax {jax.__version__})"
    )
    return 0 if within >= 0.9 * len(rows) else 2


if __name__ == "__main__":
    sys.exit(main())
