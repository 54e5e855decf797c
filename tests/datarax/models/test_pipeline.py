"""Pipeline stages in the real program (issue 38, section 3) on the 8 simulated CPU
devices: a transformer whose layers run as stages over a stage axis, GPipe and circular,
gives the loss and the gradients of the same model run layer after layer (its layers in
the stored order the pipeline keeps), with the hand-offs as collective-permutes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from datarax.models import ActivationLayout, Transformer, synthetic_tokens, transformer_loss_fn
from datarax.models.pipeline import StagePlan, stored_layer_order
from datarax.specs.model_specs import model_spec

DENSE = {"kind": "transformer", "layers": 8, "d_model": 32, "d_ff": 64, "heads": 4,
         "kv_heads": 2, "vocab": 61, "seq_len": 16, "dtype": "float32"}  # fmt: skip


def test_stored_layer_order_puts_each_pass_of_a_stage_together():
    # 2 stages, 2 passes, 2 layers a stage: stage 0 holds model layers 0, 1 (pass 0) and
    # 4, 5 (pass 1); stage 1 holds 2, 3 and 6, 7
    np.testing.assert_array_equal(stored_layer_order(8, 2, 2), [0, 1, 4, 5, 2, 3, 6, 7])
    np.testing.assert_array_equal(stored_layer_order(8, 4, 1), np.arange(8))


@pytest.mark.parametrize(
    ("stages", "microbatches", "repeats", "names"),
    [
        (4, 2, 1, ("data", "stage")),
        (4, 4, 2, ("data", "stage")),
        (2, 2, 2, ("fsdp", "stage", "tensor")),
    ],
    ids=["gpipe-4x2", "circular-4x4x2", "circular-fsdp-tensor"],
)
def test_a_pipeline_equals_the_layers_one_after_another(
    eight_devices, stages, microbatches, repeats, names
):
    spec = model_spec(DENSE)
    params = Transformer(spec, rngs=nnx.Rngs(0)).param_arrays()
    batch = {k: jnp.asarray(v) for k, v in synthetic_tokens(spec, 4, 0, 0).items()}
    # the pipeline reads the stacked layers in its stored order
    order = stored_layer_order(spec.layers, stages, repeats)
    stored = {k: (v[order] if k.startswith("layers/") else v) for k, v in params.items()}
    reference_loss, reference = jax.jit(jax.value_and_grad(transformer_loss_fn(spec)))(
        params, batch
    )
    shape = (8 // stages, stages) if len(names) == 2 else (2, 2, 2)
    mesh = Mesh(np.array(eight_devices).reshape(shape), names)
    batch_axes = tuple(a for a in names if a in ("data", "fsdp"))
    tensor = tuple(a for a in names if a == "tensor")
    plan = StagePlan(("stage",), stages, microbatches, repeats)
    layout = ActivationLayout(mesh, batch_axes, tensor, pipeline=plan)
    placed = {
        k: jax.device_put(v, NamedSharding(mesh, P("stage") if k.startswith("layers/") else P()))
        for k, v in stored.items()
    }
    step = jax.jit(jax.value_and_grad(transformer_loss_fn(spec, layout)))
    loss, grads = step(placed, batch)
    np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)
    for path, grad in reference.items():
        want = grad[order] if path.startswith("layers/") else grad
        np.testing.assert_allclose(grads[path], want, rtol=2e-4, atol=2e-5, err_msg=path)
    assert "collective-permute" in step.lower(placed, batch).compile().as_text()


MOE = {**DENSE, "num_experts": 4, "experts_per_token": 2, "moe_d_ff": 32}


def _unit_order(spec, stages, repeats):
    """The stored order of a mixture-of-experts model's stacks: units (``moe_every - 1``
    dense layers and one MoE layer) in the pipeline's stored order."""
    units = stored_layer_order(spec.moe_layers, stages, repeats)
    every = spec.moe_every
    dense = np.concatenate([np.arange(u * (every - 1), (u + 1) * (every - 1)) for u in units])
    return {"moe_layers/": units, "dense_layers/": dense.astype(int)}


@pytest.mark.parametrize(
    ("extra", "stages", "microbatches", "repeats"),
    [
        ({}, 4, 2, 1),
        ({"moe_kernel": "dense", "capacity_factor": 2.0}, 2, 2, 2),
        ({"moe_every": 2}, 2, 2, 1),
        ({"first_dense_layers": 2, "moe_every": 3}, 2, 2, 1),
    ],
    ids=["dropless-4-stages", "capacity-circular", "interleaved", "first-dense"],
)
def test_a_mixture_of_experts_pipeline_equals_its_layers_in_order(
    eight_devices, extra, stages, microbatches, repeats
):
    # issue 38: a mixture-of-experts model's units (its dense layers between two MoE
    # layers, then the MoE layer) run as stages; the dense layers before the first unit
    # run outside the stages
    spec = model_spec({**MOE, **extra})
    params = Transformer(spec, rngs=nnx.Rngs(0)).param_arrays()
    batch = {k: jnp.asarray(v) for k, v in synthetic_tokens(spec, 16, 0, 0).items()}
    reference_loss, reference = jax.jit(jax.value_and_grad(transformer_loss_fn(spec)))(
        params, batch
    )
    orders = _unit_order(spec, stages, repeats) if spec.first_dense_layers == 0 else {}

    def stored(path, value):
        return next((value[o] for stem, o in orders.items() if path.startswith(stem)), value)

    mesh = Mesh(np.array(eight_devices).reshape(8 // stages, stages), ("data", "stage"))
    plan = StagePlan(("stage",), stages, microbatches, repeats)
    layout = ActivationLayout(mesh, ("data",), pipeline=plan)
    placed = {k: stored(k, v) for k, v in params.items()}
    step = jax.jit(jax.value_and_grad(transformer_loss_fn(spec, layout)))
    loss, grads = step(placed, batch)
    np.testing.assert_allclose(loss, reference_loss, rtol=1e-5)
    for path, grad in reference.items():
        np.testing.assert_allclose(
            grads[path], stored(path, grad), rtol=2e-4, atol=2e-5, err_msg=path
        )
    assert "collective-permute" in step.lower(placed, batch).compile().as_text()
