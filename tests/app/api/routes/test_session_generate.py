"""A transformer session generates tokens on the host's devices (issue 57, item 5): the
runtime runs the library's KV-cached decode step with the session's parameters, and the
tokens are the greedy ones the full forward picks."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from datarax.models.transformer import Transformer, transformer_forward
from tests.helpers import api, assert_problem  # noqa: F401 (the fixture)

TINY = {"kind": "transformer", "layers": 2, "d_model": 32, "d_ff": 64, "heads": 4,
        "kv_heads": 2, "vocab": 50, "seq_len": 16, "param_dtype": "float32",
        "dtype": "float32", "attention": "dot"}  # fmt: skip


def _session(api, model, seed=3):  # noqa: F811
    mesh = api.post("/v1/meshes", json={"axes": {"data": -1}}).json()
    body = {"model": model, "optimizer": "adam", "seed": seed}
    response = api.post(f"/v1/meshes/{mesh['id']}/sessions", json=body)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def _greedy(prompt, steps, seed):
    """The same model built from the same seed, one full forward per token."""
    from flax import nnx  # noqa: PLC0415

    model = Transformer(TINY, rngs=nnx.Rngs(seed))
    params = model.param_arrays()
    seq = jnp.asarray(prompt, jnp.int32)
    for _ in range(steps):
        logits = transformer_forward(model.spec, params, seq)[:, -1]
        seq = jnp.concatenate([seq, jnp.argmax(logits, -1).astype(jnp.int32)[:, None]], 1)
    return np.asarray(seq[:, len(prompt[0]) :]).tolist()


def test_a_transformer_session_generates_the_greedy_tokens(api):  # noqa: F811
    sid = _session(api, TINY)
    prompt = [[1, 2, 3, 4], [7, 7, 8, 9]]
    answer = api.post(f"/v1/sessions/{sid}/generate", json={"prompt": prompt, "steps": 4})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["id"] == sid
    assert body["tokens"] == _greedy(prompt, 4, 3)


def test_generate_refusals(api):  # noqa: F811
    sid = _session(api, TINY)
    url = f"/v1/sessions/{sid}/generate"
    assert_problem(api.post(url, json={"prompt": [[1, 2], [3]]}), 422, "validation_error")
    problem = assert_problem(api.post(url, json={"prompt": [[1, 50]]}), 422, "validation_error")
    assert "vocab 50" in problem["detail"] or "vocab 50" in str(problem)
    assert_problem(api.post(url, json={"prompt": [[1]], "steps": 65}), 422, "validation_error")
    mesh = api.post("/v1/meshes", json={"axes": {"data": -1}}).json()
    body = {"model": {"kind": "mlp", "features": [4, 8, 2]}, "loss": "mse"}
    mlp = api.post(f"/v1/meshes/{mesh['id']}/sessions", json=body)
    assert mlp.status_code == 201, mlp.text
    problem = assert_problem(
        api.post(f"/v1/sessions/{mlp.json()['id']}/generate", json={"prompt": [[1]]}),
        422,
        "validation_error",
    )
    assert "transformer" in str(problem)
    assert_problem(api.post("/v1/sessions/s_nope/generate", json={"prompt": [[1]]}), 404,
                   "session_not_found")  # fmt: skip
