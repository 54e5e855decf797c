"""KV-cached inference (datarax.models.decode) against the training forward, on the 8
simulated CPU devices.

Each decode step's logits must equal the full forward's logits of the same position
(the forward run over the prompt plus the tokens decoded so far), for dense, grouped-query,
mixture-of-experts and MLA models, unsharded and sharded over replica x tensor axes; the
cache holds the heads the serving estimate prices.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import Mesh

from datarax.estimate.serving_memory import ServingLayout, kv_bytes_per_token
from datarax.models.decode import (
    DecodeLayout,
    cache_shapes,
    decode_step,
    generate,
    init_cache,
    prefill,
)
from datarax.models.transformer import Transformer, transformer_forward
from datarax.specs.model_specs import model_spec

BASE = {"kind": "transformer", "layers": 2, "d_model": 32, "d_ff": 64, "heads": 4,
        "kv_heads": 4, "vocab": 64, "seq_len": 16, "dtype": "float32",
        "attention": "dot"}  # fmt: skip
MODELS = {
    "dense": BASE,
    "gqa": {**BASE, "kv_heads": 2},
    "moe": {**BASE, "layers": 3, "kv_heads": 2, "num_experts": 4, "experts_per_token": 2,
            "moe_d_ff": 32, "first_dense_layers": 1, "shared_experts": 1},
    "mla": {**BASE, "attention_type": "mla", "q_lora_rank": 16, "kv_lora_rank": 8,
            "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8},
}  # fmt: skip
PROMPT, STEPS = 5, 3


@pytest.fixture(scope="module")
def replica_tensor(eight_devices):
    mesh = Mesh(np.array(eight_devices).reshape(2, 4), ("data", "tensor"))
    return DecodeLayout(mesh, ("data",), ("tensor",))


def _setup(name):
    spec = model_spec(MODELS[name])
    params = Transformer(spec, rngs=nnx.Rngs(1)).param_arrays()
    tokens = jax.random.randint(jax.random.key(2), (2, PROMPT + STEPS), 0, spec.vocab)
    return spec, params, tokens


def _decoded_logits(spec, params, tokens, layout=None):
    """The prefill's last logits, then each decode step's (teacher-forced on ``tokens``)."""
    run_prefill = jax.jit(lambda p, t: prefill(spec, p, t, max_len=PROMPT + STEPS, layout=layout))
    step = jax.jit(lambda p, c, tok, pos: decode_step(spec, p, c, tok, pos, layout=layout))
    logits, cache = run_prefill(params, tokens[:, :PROMPT])
    out = [logits]
    for i in range(PROMPT, PROMPT + STEPS - 1):
        logits, cache = step(params, cache, tokens[:, i], i)
        out.append(logits)
    return jnp.stack(out, axis=1), cache


@pytest.mark.parametrize("name", list(MODELS))
def test_decoding_with_the_cache_equals_the_full_forward(name):
    spec, params, tokens = _setup(name)
    full = transformer_forward(spec, params, tokens[:, : PROMPT + STEPS - 1])
    decoded, _ = _decoded_logits(spec, params, tokens)
    np.testing.assert_allclose(decoded, full[:, PROMPT - 1 :], rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("name", list(MODELS))
def test_sharded_over_replica_and_tensor_axes(name, replica_tensor):
    spec, params, tokens = _setup(name)
    full = transformer_forward(spec, params, tokens[:, : PROMPT + STEPS - 1])
    decoded, cache = _decoded_logits(spec, params, tokens, replica_tensor)
    np.testing.assert_allclose(decoded, full[:, PROMPT - 1 :], rtol=2e-4, atol=2e-4)
    # the cache a device holds: the batch over data, heads over tensor (kv heads copied
    # where they are fewer than the tensor devices; MLA's latent whole), what the serving
    # estimate prices per token
    per_device = sum(v.addressable_shards[0].data.nbytes for v in cache.values())
    tokens_per_device = 1 * (PROMPT + STEPS)  # two sequences over two replicas
    # float32 here: twice the bfloat16 estimate's bytes
    want = kv_bytes_per_token(spec, ServingLayout(tensor=4), "bfloat16") * 2 * tokens_per_device
    assert per_device == want


def test_generate_is_greedy_over_the_full_forward():
    spec, params, tokens = _setup("gqa")
    prompt = tokens[:, :PROMPT]
    out = generate(spec, params, prompt, STEPS)
    assert out.shape == (2, STEPS) and out.dtype == jnp.int32
    seq = prompt
    for _ in range(STEPS):  # greedy, one full forward per token
        nxt = jnp.argmax(transformer_forward(spec, params, seq)[:, -1], axis=-1).astype(jnp.int32)
        seq = jnp.concatenate([seq, nxt[:, None]], axis=1)
    np.testing.assert_array_equal(out, seq[:, PROMPT:])


def test_cache_shapes_and_refusals():
    spec = model_spec(MODELS["gqa"])
    assert cache_shapes(spec, 3, 10) == {"layers/k": (2, 3, 2, 10, 8), "layers/v": (2, 3, 2, 10, 8)}
    # two kv heads over four tensor devices: four copies, one a device (vLLM's layout)
    assert cache_shapes(spec, 3, 10, tensor=4)["layers/k"] == (2, 3, 4, 10, 8)
    mla = cache_shapes(model_spec(MODELS["mla"]), 1, 10)
    assert mla == {"layers/latent": (2, 1, 10, 8), "layers/rope": (2, 1, 10, 4)}
    assert init_cache(spec, 1, 4)["layers/k"].dtype == jnp.float32
    params = Transformer(spec, rngs=nnx.Rngs(0)).param_arrays()
    with pytest.raises(ValueError, match="max_len"):
        prefill(spec, params, jnp.zeros((1, 9), jnp.int32), max_len=8)
    with pytest.raises(ValueError, match="steps"):
        generate(spec, params, jnp.zeros((1, 2), jnp.int32), 0)
