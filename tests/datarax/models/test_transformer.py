"""The transformer of datarax.models: its numerics on the 8 simulated CPU devices.

The compile checks lower this very model (datarax.spmd.compile_step); here each
option of the spec is checked against the plain program it must equal: ``flash`` (the
CPU blockwise kernel) against ``dot``, vocabulary tiling against one tile, every remat
policy against none, and the dtypes of parameters, gradients and Adam moments under mixed
precision. Real arrays, real compiles; the mesh is fsdp 4 x tensor 2 so the activation
constraints and the grouped heads split over devices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh

from datarax.models import (
    ActivationLayout,
    Transformer,
    synthetic_tokens,
    transformer_loss,
    transformer_loss_fn,
)
from datarax.models.transformer import transformer_forward
from datarax.specs.model_specs import REMAT_POLICIES, model_spec
from datarax.spmd.train_step import spmd_train_step
from tests.datarax.support import data_mesh

SMALL = {"kind": "transformer", "layers": 2, "d_model": 64, "d_ff": 128, "heads": 4,
         "kv_heads": 2, "vocab": 96, "seq_len": 32, "dtype": "float32"}  # fmt: skip


@pytest.fixture(scope="module")
def layout(eight_devices):
    mesh = Mesh(np.array(eight_devices).reshape(4, 2), ("fsdp", "tensor"))
    return ActivationLayout(mesh, ("fsdp",), ("tensor",))


@pytest.fixture(scope="module")
def params():
    return Transformer(SMALL, rngs=nnx.Rngs(0)).param_arrays()


@pytest.fixture(scope="module")
def batch():
    return {k: jnp.asarray(v) for k, v in synthetic_tokens(SMALL, 8, 0, 0).items()}


def _loss_and_grads(model, params, batch, layout=None):
    loss = transformer_loss_fn(model_spec(model), layout)
    return jax.jit(jax.value_and_grad(loss))(params, batch)


def _assert_same(a, b, rtol=1e-5, atol=1e-6):
    (loss_a, grads_a), (loss_b, grads_b) = a, b
    np.testing.assert_allclose(loss_a, loss_b, rtol=rtol, atol=atol)
    assert sorted(grads_a) == sorted(grads_b)
    for path in grads_a:
        np.testing.assert_allclose(grads_a[path], grads_b[path], rtol=rtol, atol=atol, err_msg=path)


@pytest.fixture(scope="module")
def reference(params, batch, layout):
    """``dot`` attention, one vocabulary tile, no remat: the plain program."""
    return _loss_and_grads({**SMALL, "attention": "dot"}, params, batch, layout)


def test_flash_fallback_equals_dot_attention(params, batch, layout, reference):
    _assert_same(_loss_and_grads({**SMALL, "attention": "flash"}, params, batch, layout), reference)


def _sub_jaxprs(value):
    if hasattr(value, "eqns"):
        yield value
    elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
        yield value.jaxpr
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _sub_jaxprs(item)


def _eqns(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs in its equations' params."""
    for eqn in jaxpr.eqns:
        yield eqn
        for value in eqn.params.values():
            for sub in _sub_jaxprs(value):
                yield from _eqns(sub)


@pytest.mark.parametrize(("attention", "holds_scores"), [("dot", True), ("flash", False)])
def test_only_dot_attention_holds_the_whole_sequences_scores(attention, holds_scores):
    # 1024 tokens: the blockwise kernel's key blocks (512) are shorter than the sequence
    model = {**SMALL, "seq_len": 1024, "attention": attention}
    params = Transformer(model, rngs=nnx.Rngs(0)).param_arrays()
    batch = synthetic_tokens(model, 1, 0, 0)
    loss = transformer_loss_fn(model_spec(model))
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss))(params, batch).jaxpr
    shapes = [tuple(getattr(v.aval, "shape", ())) for e in _eqns(jaxpr) for v in e.outvars]
    square = [shape for shape in shapes if shape[-2:] == (1024, 1024)]
    assert bool(square) is holds_scores, square[:3]


def test_vocab_tiling_equals_one_tile(params, batch, layout, reference):
    tiled = _loss_and_grads({**SMALL, "attention": "dot", "vocab_tiling": 4}, params, batch, layout)
    _assert_same(tiled, reference)


def test_vocab_tiling_must_divide_the_sequence(params, batch):
    with pytest.raises(ValueError, match="vocab_tiling 5 does not divide seq_len 32"):
        _loss_and_grads({**SMALL, "vocab_tiling": 5}, params, batch)


OFFLOADING = {"decoder_layer_input": "offload", "query_proj": "offload", "key_proj": "offload",
              "value_proj": "device", "out_proj": "offload", "mlpwi_0": "device"}  # fmt: skip
REMATS = [{"remat": r} for r in REMAT_POLICIES if r not in ("none", "custom")] + [
    {"remat": "custom", "remat_custom": OFFLOADING}
]


@pytest.mark.parametrize("remat", REMATS, ids=lambda r: r["remat"])
def test_each_remat_policy_gives_the_losses_and_grads_of_none(
    params, batch, layout, reference, remat
):
    got = _loss_and_grads({**SMALL, "attention": "dot", **remat}, params, batch, layout)
    _assert_same(got, reference)


def test_offloading_policies_move_the_named_tensors_to_host_memory(params, batch):
    def grad_jaxpr(model):
        grad = jax.grad(transformer_loss_fn(model_spec(model)))
        return str(jax.make_jaxpr(grad)(params, batch))

    text = grad_jaxpr({**SMALL, "remat": "custom", "remat_custom": OFFLOADING})
    # the layer input [B, S, d] and the query/key projections [B, S, heads, hd] and
    # [B, S, kv_heads, hd] are put in host memory for the backward pass; on TPU XLA
    # reports them as host_temp_size_in_bytes (tests/datarax/spmd/test_compile_step.py)
    assert "MemorySpace.Host" in text
    for shape in ("f32<host>[8,32,64]", "f32<host>[8,32,4,16]", "f32<host>[8,32,2,16]"):
        assert shape in text, shape
    assert "MemorySpace.Host" not in grad_jaxpr({**SMALL, "remat": "minimal"})


def test_float32_compute_runs_every_matmul_at_highest_precision(params, batch):
    loss = transformer_loss_fn(model_spec({**SMALL, "attention": "dot"}))
    jaxpr = jax.make_jaxpr(loss)(params, batch).jaxpr

    found = [e.params["precision"] for e in _eqns(jaxpr) if e.primitive.name == "dot_general"]
    assert found and all(
        p is not None and all(x == jax.lax.Precision.HIGHEST for x in p) for p in found
    ), found


def test_mixed_precision_keeps_params_grads_and_moments_in_param_dtype(batch):
    model = Transformer({**SMALL, "dtype": "bfloat16", "param_dtype": "float32"}, rngs=nnx.Rngs(0))
    params = model.param_arrays()
    assert {a.dtype for a in params.values()} == {jnp.dtype(jnp.float32)}
    # activations in bfloat16, logits returned in float32
    logits = model(batch["inputs"])
    assert logits.shape == (8, 32, 96) and logits.dtype == jnp.float32
    grads = nnx.grad(transformer_loss)(model, batch)
    assert {leaf.dtype for leaf in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}
    optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
    moments = [
        leaf
        for leaf in jax.tree.leaves(nnx.state(optimizer, nnx.OptState))
        if getattr(leaf, "ndim", 0) > 0
    ]
    assert moments and {m.dtype for m in moments} == {jnp.dtype(jnp.float32)}
    bf16 = Transformer({**SMALL, "dtype": "bfloat16"}, rngs=nnx.Rngs(0))
    moments = jax.tree.leaves(nnx.state(nnx.Optimizer(bf16, optax.adam(1e-3), wrt=nnx.Param)))
    assert {m.dtype for m in moments if getattr(m, "ndim", 0) > 0} == {jnp.dtype(jnp.bfloat16)}


def test_a_user_trains_it_with_nnx_optimizer_under_a_mesh():
    mesh = data_mesh()
    model_dict = {**SMALL, "attention": "flash", "remat": "full", "vocab_tiling": 2}
    model = Transformer(model_dict, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    losses = []
    with jax.set_mesh(mesh):
        for step in range(15):
            batch = jax.device_put(synthetic_tokens(model_dict, 16, 0, step), sharding)
            losses.append(float(spmd_train_step(model, optimizer, transformer_loss, batch)))
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses


def test_synthetic_tokens_are_next_token_pairs_and_deterministic():
    a = synthetic_tokens(SMALL, 4, seed=3, step=1)
    b = synthetic_tokens(SMALL, 4, seed=3, step=1)
    assert a["inputs"].shape == a["targets"].shape == (4, 32)
    assert a["inputs"].dtype == np.int32 and a["targets"].dtype == np.int32
    np.testing.assert_array_equal(a["inputs"][:, 1:], a["targets"][:, :-1])
    np.testing.assert_array_equal(a["inputs"], b["inputs"])


def test_refusals_name_the_value():
    with pytest.raises(ValueError, match="needs a transformer model, got kind 'mlp'"):
        Transformer({"kind": "mlp", "features": [4, 4]}, rngs=nnx.Rngs(0))
    params = Transformer(SMALL, rngs=nnx.Rngs(0)).param_arrays()
    del params["final_norm/scale"]
    batch = synthetic_tokens(SMALL, 2, 0, 0)
    with pytest.raises(ValueError, match=r"missing \['final_norm/scale'\]"):
        transformer_loss_fn(model_spec(SMALL))(params, batch)
    with pytest.raises(ValueError, match="not axes of the mesh"):
        ActivationLayout(Mesh(np.array(jax.devices()[:1]), ("data",)), ("fsdp",))


MLA = {**SMALL, "kv_heads": 4, "attention_type": "mla", "q_lora_rank": 24, "kv_lora_rank": 16,
       "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12}  # fmt: skip


@pytest.mark.parametrize("q_lora_rank", [24, 0], ids=["q-lora", "q-whole"])
def test_mla_attention_is_attention_over_its_latent_projections(q_lora_rank):
    # issue 38: MLA in the real program. Its step equals the same model written out by
    # hand as plain multi-head attention: per-head keys [k_nope | the shared k_rope] and
    # values up-projected from the normed latent, queries through the q bottleneck
    spec = model_spec({**MLA, "q_lora_rank": q_lora_rank, "layers": 1, "attention": "dot"})
    p = Transformer(spec, rngs=nnx.Rngs(3)).param_arrays()
    tokens = jnp.asarray(synthetic_tokens(spec, 2, 0, 0)["inputs"])

    def norm(x, scale):
        return x / np.sqrt(np.mean(x**2, axis=-1, keepdims=True) + 1e-6) * scale

    w = {k.removeprefix("layers/*/"): np.asarray(v, np.float64)[0]
         for k, v in p.items() if k.startswith("layers/")}  # fmt: skip
    x = np.asarray(p["embed/embedding"], np.float64)[np.asarray(tokens)]
    y = norm(x, w["attn_norm/scale"])
    h, nope, rope, vd = 4, 8, 4, 12
    q = norm(y @ w["attn/wq_a"], w["attn/q_norm/scale"]) @ w["attn/wq_b"] if q_lora_rank else (
        y @ w["attn/q"])  # fmt: skip
    q = q.reshape(2, 32, h, nope + rope)
    latent = y @ w["attn/wkv_a"]
    kv = (norm(latent[..., :16], w["attn/kv_norm/scale"]) @ w["attn/wkv_b"]).reshape(
        2, 32, h, nope + vd
    )
    k = np.concatenate([kv[..., :nope], np.repeat(latent[:, :, None, 16:], h, axis=2)], -1)
    scores = np.einsum("bshd,bthd->bhst", q, k) / np.sqrt(nope + rope)
    scores = np.where(np.tril(np.ones((32, 32), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = np.einsum("bhst,bthd->bshd", probs, kv[..., nope:]).reshape(2, 32, h * vd)
    x = x + ctx @ w["attn/o"]
    y = norm(x, w["mlp_norm/scale"])
    gate, up = y @ w["mlp/gate"], y @ w["mlp/up"]
    x = x + (gate / (1 + np.exp(-gate)) * up) @ w["mlp/down"]
    logits = norm(x, np.asarray(p["final_norm/scale"])) @ np.asarray(p["unembed/kernel"])
    np.testing.assert_allclose(transformer_forward(spec, p, tokens), logits, rtol=2e-4, atol=2e-4)


def test_mla_flash_equals_dot_and_splits_over_fsdp_and_tensor(layout):
    # MLA's values are narrower than its keys: the blockwise kernel and the sharded
    # program take them as they are
    params = Transformer(MLA, rngs=nnx.Rngs(0)).param_arrays()
    batch = {k: jnp.asarray(v) for k, v in synthetic_tokens(MLA, 8, 0, 0).items()}
    dot = _loss_and_grads({**MLA, "attention": "dot"}, params, batch)
    _assert_same(_loss_and_grads({**MLA, "attention": "flash"}, params, batch), dot, 2e-4, 2e-5)
    _assert_same(_loss_and_grads(MLA, params, batch, layout), dot, 2e-4, 2e-5)
