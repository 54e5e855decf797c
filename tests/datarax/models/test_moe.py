"""The mixture-of-experts layers of datarax.models (issue 38, section 3) on the 8 simulated
CPU devices: both kernels equal a per-token loop of the same experts, the capacity kernel
drops what passes its capacity, the layers run in MaxText's order, and a model with an
expert axis trains.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.models import ActivationLayout, Transformer, synthetic_tokens, transformer_loss_fn
from datarax.models.moe import moe_block
from datarax.models.transformer import _Compute
from datarax.specs.model_specs import model_spec

MOE = {"kind": "transformer", "layers": 3, "d_model": 32, "d_ff": 64, "heads": 4,
       "kv_heads": 2, "vocab": 61, "seq_len": 16, "dtype": "float32", "num_experts": 4,
       "experts_per_token": 2, "moe_d_ff": 48, "shared_experts": 1,
       "first_dense_layers": 1}  # fmt: skip


def _block_inputs(spec_fields):
    spec = model_spec(spec_fields)
    params = Transformer(spec, rngs=nnx.Rngs(1)).param_arrays()
    layer = {k: v[0] for k, v in params.items() if k.startswith("moe_layers/")}
    y = jax.random.normal(jax.random.key(2), (2, spec.seq_len, spec.d_model), jnp.float32)
    return spec, layer, y


def _loop_reference(spec, p, y):
    """Each token through its top-k experts one at a time, weights renormalised."""
    out = np.zeros(y.shape, np.float64)
    router = np.asarray(p["moe_layers/*/moe/router"], np.float64)
    w = {n: np.asarray(p[f"moe_layers/*/moe/experts/{n}"], np.float64)
         for n in ("wi_0", "wi_1", "wo")}  # fmt: skip
    x = np.asarray(y, np.float64)
    for b in range(x.shape[0]):
        for s in range(x.shape[1]):
            logits = x[b, s] @ router
            top = np.argsort(-logits)[: spec.experts_per_token]
            gates = np.exp(logits[top] - logits[top].max())
            gates /= gates.sum()
            for e, g in zip(top, gates, strict=True):
                gate, up = x[b, s] @ w["wi_0"][e], x[b, s] @ w["wi_1"][e]
                hidden = gate / (1 + np.exp(-gate)) * up
                out[b, s] += g * (hidden @ w["wo"][e])
    shared = {n: np.asarray(p[f"moe_layers/*/moe/shared/{n}"], np.float64)
              for n in ("gate", "up", "down")}  # fmt: skip
    gate, up = x @ shared["gate"], x @ shared["up"]
    return out + (gate / (1 + np.exp(-gate)) * up) @ shared["down"]


@pytest.mark.parametrize(
    "kernel", [{"moe_kernel": "sparse"}, {"moe_kernel": "dense", "capacity_factor": 4.0}],
    ids=["sparse", "dense-ample-capacity"],
)  # fmt: skip
def test_both_kernels_equal_a_per_token_loop(kernel):
    spec, layer, y = _block_inputs({**MOE, **kernel})
    got = moe_block(_Compute(spec, None), y, layer, "moe_layers/*")
    np.testing.assert_allclose(got, _loop_reference(spec, layer, y), rtol=2e-4, atol=2e-5)


def test_the_capacity_kernel_drops_what_passes_its_capacity():
    spec, layer, y = _block_inputs({**MOE, "moe_kernel": "dense", "capacity_factor": 0.25})
    dropped = moe_block(_Compute(spec, None), y, layer, "moe_layers/*")
    full = _loop_reference(spec, layer, y)
    # capacity ceil(16 * 2 / 4) * 0.25 = 2 slots an expert a sequence: most copies dropped,
    # and the first token of each sequence (first in every queue) keeps both of its experts
    assert not np.allclose(dropped, full, atol=1e-3)
    np.testing.assert_allclose(dropped[:, 0], full[:, 0], rtol=2e-4, atol=2e-5)


def test_layers_run_in_maxtexts_order_and_every_parameter_learns():
    # 1 dense layer, then blocks of (1 dense, 1 MoE), then one dense layer left over
    fields = {**MOE, "layers": 6, "first_dense_layers": 1, "moe_every": 2}
    spec = model_spec(fields)
    assert [spec.is_moe_layer(i) for i in range(6)] == [False, False, True, False, True, False]
    params = Transformer(spec, rngs=nnx.Rngs(0)).param_arrays()
    batch = {k: jnp.asarray(v) for k, v in synthetic_tokens(spec, 4, 0, 0).items()}
    loss, grads = jax.jit(jax.value_and_grad(transformer_loss_fn(spec)))(params, batch)
    assert np.isfinite(loss)
    for path, grad in grads.items():  # every stacked layer of every group is used
        per_layer = np.abs(np.asarray(grad)).reshape(grad.shape[0], -1).sum(axis=1)
        if "*" in path:
            assert (per_layer > 0).all(), path


@pytest.mark.parametrize("kernel", ["sparse", "dense"])
def test_a_model_with_an_expert_axis_trains(eight_devices, kernel):
    mesh = Mesh(np.array(eight_devices).reshape(2, 4), ("data", "expert"))
    layout = ActivationLayout(mesh, ("data", "expert"), (), ("expert",))
    fields = {**MOE, "moe_kernel": kernel, "capacity_factor": 1.5 if kernel == "dense" else None}
    spec = model_spec({k: v for k, v in fields.items() if v is not None})
    model = Transformer(spec, rngs=nnx.Rngs(0), constrain=layout)
    params = model.param_arrays()
    # the routed experts split over the expert axis, as the plan lays them out
    expert_sharding = NamedSharding(mesh, P(None, "expert"))
    params = {k: jax.device_put(v, expert_sharding if "/experts/" in k else
                                NamedSharding(mesh, P())) for k, v in params.items()}  # fmt: skip
    loss_fn = transformer_loss_fn(spec, layout)
    opt = optax.adam(1e-2)
    state = opt.init(params)
    batch_sharding = NamedSharding(mesh, P(("data", "expert")))

    @jax.jit
    def step(params, state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(25):
        batch = {k: jax.device_put(v, batch_sharding)
                 for k, v in synthetic_tokens(spec, 16, 0, i).items()}  # fmt: skip
        params, state, loss = step(params, state, batch)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses
    assert params["moe_layers/*/moe/experts/wi_0"].sharding.spec == P(None, "expert")


@pytest.mark.parametrize(
    ("names", "fsdp"),
    [(("data", "expert"), ()), (("fsdp", "expert"), ("fsdp",)), (("data", "fsdp"), ("fsdp",))],
    ids=["data-expert", "fsdp-expert", "fsdp-no-expert"],
)  # fmt: skip
def test_the_expert_parallel_kernel_equals_the_plain_program(eight_devices, names, fsdp):
    # the dropless kernel under shard_map (all-to-all dispatch and return over an expert
    # axis, the experts' kernels gathered over fsdp inside) gives the loss and the
    # gradients of the same model on one device
    spec = model_spec(MOE)
    params = Transformer(spec, rngs=nnx.Rngs(0)).param_arrays()
    batch = {k: jnp.asarray(v) for k, v in synthetic_tokens(spec, 16, 0, 0).items()}
    reference = jax.jit(jax.value_and_grad(transformer_loss_fn(spec)))(params, batch)
    mesh = Mesh(np.array(eight_devices).reshape(2, 4), names)
    experts = tuple(a for a in names if a == "expert")
    layout = ActivationLayout(mesh, names, (), experts, fsdp)
    step = jax.jit(jax.value_and_grad(transformer_loss_fn(spec, layout)))
    loss, grads = step(params, batch)
    np.testing.assert_allclose(loss, reference[0], rtol=1e-5)
    for path, grad in reference[1].items():
        np.testing.assert_allclose(grads[path], grad, rtol=2e-4, atol=2e-5, err_msg=path)
    # tokens reach their experts' devices by all-to-all, where there is an expert axis
    assert ("all_to_all" in step.lower(params, batch).as_text()) == bool(experts)
