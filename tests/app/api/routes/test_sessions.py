"""Training sessions over HTTP: correctness across meshes, layouts, ordering, refusals,
timeouts and runtime restarts, against a real runtime process."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from app.main import create_app
from tests.helpers import (
    TestClient,
    assert_problem,
    make_settings,
    npz_bytes,
    wait_ready,
)

FEATURES = [16, 64, 8]
SYNTH = {"seed": 5, "batch_size": 32}


def _plan(api, axes, **extra):
    r = api.post("/v1/meshes", json={"axes": axes, **extra})
    assert r.status_code == 201, r.text
    return r.json()


def _session(api, axes, plan_extra=None, **spec):
    plan = _plan(api, axes, **(plan_extra or {}))
    body = {
        "model": {"kind": "mlp", "features": FEATURES},
        "optimizer": {"name": "adam", "learning_rate": 0.01},
        "loss": "mse",
        "seed": 0,
        **spec,
    }
    r = api.post(f"/v1/meshes/{plan['id']}/sessions", json=body)
    assert r.status_code == 201, r.text
    assert r.headers["location"] == f"/v1/sessions/{r.json()['id']}"
    return plan, r.json()


def _steps(api, sid, steps=3, **body):
    r = api.post(f"/v1/sessions/{sid}/steps", json={"steps": steps, **body})
    assert r.status_code == 200, r.text
    return r.json()


MESHES = [
    ({"data": 8}, {}, {}),
    ({"data": 2, "model": 4}, {}, {"param_sharding": "model"}),
    (
        {"data": 4, "fsdp": 2},
        {"batch_shape": [32, 16], "batch_axes": ["data", "fsdp"]},
        {"param_sharding": "fsdp"},
    ),
    ({"data": 8}, {}, {"strategy": "collective"}),
]


def test_same_losses_on_every_mesh_and_strategy(api):
    _, ref_session = _session(api, {"data": 1})
    ref = _steps(api, ref_session["id"], 4, synthetic=SYNTH)
    assert ref["losses"][-1] < ref["losses"][0]
    for axes, plan_extra, spec in MESHES:
        _, session = _session(api, axes, plan_extra, **spec)
        got = _steps(api, session["id"], 4, synthetic=SYNTH)
        np.testing.assert_allclose(
            got["losses"], ref["losses"], rtol=2e-4, err_msg=f"{axes} {spec}"
        )
        assert got["step"] == 4


def test_layouts_are_real_and_match_the_plan(api):
    plan, session = _session(
        api,
        {"data": 2, "model": 4},
        {"model": {"kind": "mlp", "features": FEATURES}, "param_sharding": "model"},
        param_sharding="model",
    )
    predicted = {p["path"]: p for p in plan["params"]}
    real = {p["path"]: p for p in session["params"]}
    assert predicted.keys() == real.keys()
    for path, entry in real.items():
        for key in ("shape", "spec", "shard_shape", "bytes_per_device"):
            assert entry[key] == predicted[path][key], (path, key)
    assert real["layers/0/kernel"]["spec"] == [None, "model"]
    assert real["layers/0/kernel"]["shard_shape"] == [16, 16]
    got = api.get(f"/v1/sessions/{session['id']}").json()
    assert got["params"] == session["params"] and got["step"] == 0


def test_second_call_hits_the_compile_cache(api):
    _, session = _session(api, {"data": 8})
    _steps(api, session["id"], 2, synthetic=SYNTH)
    second = _steps(api, session["id"], 2, synthetic=SYNTH)
    assert second["timing"]["cache_hit"] is True
    assert second["timing"]["compile_s"] == 0.0 and second["timing"]["run_s"] > 0
    assert second["examples_per_s"] > 0
    state = api.get(f"/v1/sessions/{session['id']}").json()
    assert state["step"] == 4 and state["last_loss"] == pytest.approx(second["losses"][-1])


def test_compiled_steps_land_in_the_persistent_cache(api):
    """JAX's persistent compilation cache lives under the data directory."""
    _, session = _session(api, {"data": 4})
    _steps(api, session["id"], 1, synthetic=SYNTH)
    cache = api.app.state.settings.data_dir / "jax-cache"
    assert any(p.name.startswith("jit_program") for p in cache.iterdir()), list(cache.iterdir())


def test_concurrent_calls_add_up(api):
    _, session = _session(api, {"data": 8})
    calls, k = 4, 3
    results = []

    def call():
        r = api.post(f"/v1/sessions/{session['id']}/steps", json={"steps": k, "synthetic": SYNTH})
        results.append(r)

    threads = [threading.Thread(target=call) for _ in range(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [r.status_code for r in results] == [200] * calls
    assert sorted(r.json()["step"] for r in results) == [k * (i + 1) for i in range(calls)]
    assert api.get(f"/v1/sessions/{session['id']}").json()["step"] == calls * k


def test_given_batch_json_and_npz(api):
    _, session = _session(api, {"data": 8}, loss="cross_entropy")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, FEATURES[0])).astype(np.float32)
    y = rng.integers(0, FEATURES[-1], 16).astype(np.int32)
    first = _steps(api, session["id"], 3, batch={"inputs": x.tolist(), "targets": y.tolist()})
    r = api.post(
        f"/v1/sessions/{session['id']}/steps?steps=2",
        content=npz_bytes(inputs=x, targets=y),
        headers={"content-type": "application/x-npz"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["step"] == 5 and r.json()["losses"][-1] < first["losses"][0]


def _bad_batch(features_in=FEATURES[0], rows=16, targets=True):
    batch = {"inputs": np.zeros((rows, features_in)).tolist()}
    if targets:
        batch["targets"] = np.zeros((rows, FEATURES[-1])).tolist()
    return {"steps": 1, "batch": batch}


BAD_STEPS = [
    ("wrong-features", _bad_batch(features_in=5), 422, "batch_shape_mismatch"),
    ("missing-targets", _bad_batch(targets=False), 422, "missing_targets"),
    ("indivisible", _bad_batch(rows=12), 422, "batch_not_divisible"),
    (
        "synthetic-indivisible",
        {"steps": 1, "synthetic": {"batch_size": 10}},
        422,
        "batch_not_divisible",
    ),
    ("steps-zero", {"steps": 0, "synthetic": SYNTH}, 422, "validation_error"),
    ("steps-too-many", {"steps": 10_001, "synthetic": SYNTH}, 422, "validation_error"),
    ("both-batches", {**_bad_batch(), "synthetic": SYNTH}, 422, "validation_error"),
    ("no-batch", {"steps": 1}, 422, "validation_error"),
    ("unknown-field", {"steps": 1, "synthetic": SYNTH, "lr": 3}, 422, "validation_error"),
]


@pytest.mark.parametrize(
    ("body", "status", "code"), [c[1:] for c in BAD_STEPS], ids=[c[0] for c in BAD_STEPS]
)
def test_refused_steps_change_nothing(api, body, status, code):
    _, session = _session(api, {"data": 8})
    _steps(api, session["id"], 1, synthetic=SYNTH)
    assert_problem(api.post(f"/v1/sessions/{session['id']}/steps", json=body), status, code)
    assert api.get(f"/v1/sessions/{session['id']}").json()["step"] == 1


def test_session_errors(api):
    abstract = _plan(api, {"data": 8}, num_devices=8)
    body = {"model": {"kind": "mlp", "features": FEATURES}}
    assert_problem(
        api.post(f"/v1/meshes/{abstract['id']}/sessions", json=body), 409, "plan_not_live"
    )
    assert_problem(api.post("/v1/meshes/m_nope/sessions", json=body), 404, "mesh_not_found")
    live = _plan(api, {"data": 2, "model": 4})
    assert_problem(
        api.post(
            f"/v1/meshes/{live['id']}/sessions",
            json={**body, "strategy": "collective", "param_sharding": "model"},
        ),
        422,
        "invalid_strategy",
    )
    assert_problem(
        api.post(
            f"/v1/meshes/{live['id']}/sessions", json={"model": {"kind": "cnn", "features": [1, 2]}}
        ),
        422,
        "validation_error",
    )
    assert_problem(api.get("/v1/sessions/s_nope"), 404, "session_not_found")
    assert_problem(
        api.post("/v1/sessions/s_nope/steps", json={"steps": 1, "synthetic": SYNTH}),
        404,
        "session_not_found",
    )
    assert_problem(
        api.post(
            f"/v1/meshes/{live['id']}/sessions",
            content=b"x=1",
            headers={"content-type": "text/plain"},
        ),
        415,
        "unsupported_media_type",
    )


def test_delete_session(api):
    _, session = _session(api, {"data": 8})
    assert api.delete(f"/v1/sessions/{session['id']}").status_code == 204
    assert_problem(api.get(f"/v1/sessions/{session['id']}"), 404, "session_not_found")
    assert_problem(api.delete(f"/v1/sessions/{session['id']}"), 404, "session_not_found")


def test_zz_runtime_restart_loses_sessions_with_410(api):
    """Parameters live in the runtime: after it restarts, the session answers 410."""
    _, session = _session(api, {"data": 8})
    _steps(api, session["id"], 1, synthetic=SYNTH)
    pid = api.get("/health/ready").json()["runtime_pid"]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while api.get("/health/ready").json().get("runtime_pid") == pid:
        assert time.monotonic() < deadline, "runtime kill not noticed"
        time.sleep(0.1)
    wait_ready(api)
    assert_problem(
        api.post(f"/v1/sessions/{session['id']}/steps", json={"steps": 1, "synthetic": SYNTH}),
        410,
        "session_lost",
    )
    assert_problem(api.get(f"/v1/sessions/{session['id']}"), 410, "session_lost")


def test_step_timeout_is_504_and_runtime_comes_back(tmp_path):
    settings = make_settings(tmp_path, step_timeout_s=0.5)
    with TestClient(create_app(settings)) as client:
        wait_ready(client)
        pid = client.get("/health/ready").json()["runtime_pid"]
        plan = client.post("/v1/meshes", json={"axes": {"data": 8}}).json()
        session = client.post(
            f"/v1/meshes/{plan['id']}/sessions",
            json={"model": {"kind": "mlp", "features": [512, 2048, 2048, 16]}},
        )
        assert session.status_code == 201, session.text
        r = client.post(
            f"/v1/sessions/{session.json()['id']}/steps",
            json={"steps": 1000, "synthetic": {"batch_size": 256}},
        )
        assert_problem(r, 504, "step_timeout")
        wait_ready(client)
        assert client.get("/health/ready").json()["runtime_pid"] != pid


def test_sessions_and_steps_beyond_memory_are_refused_before_anything_runs(api):
    # Both requests are valid by schema; without admission the first got the runtime
    # killed by the kernel (schemathesis found it), losing every session.
    restarts = api.get("/health/ready").json()["runtime_restarts"]
    plan = _plan(api, {"data": 8})
    huge = {"model": {"kind": "mlp", "features": [65536, 65536]}, "optimizer": {"name": "sgd"}}
    response = api.post(f"/v1/meshes/{plan['id']}/sessions", json=huge)
    assert_problem(response, 422, "insufficient_memory")
    assert "host memory" in response.json()["detail"]

    _, session = _session(api, {"data": 8})
    before = _steps(api, session["id"], 1, synthetic=SYNTH)
    # 1,048,576 rows x 64 hidden units: 1,048,576 x (2 x 88 + 24) floats ~ 0.8 GiB is
    # fine; 65,536 hidden units would need ~550 GiB of activations.
    wide_plan, wide = _session(api, {"data": 8}, model={"kind": "mlp", "features": [16, 65536, 8]})
    step = {"steps": 1, "synthetic": {"seed": 0, "batch_size": 1_048_576}}
    response = api.post(f"/v1/sessions/{wide['id']}/steps", json=step)
    assert_problem(response, 422, "insufficient_memory")
    assert api.get(f"/v1/sessions/{wide['id']}").json()["step"] == 0
    # The runtime is still the same one: earlier sessions keep training.
    after = _steps(api, session["id"], 1, synthetic=SYNTH)
    assert after["step"] == before["step"] + 1
    assert api.get("/health/ready").json()["runtime_restarts"] == restarts


def test_devices_report_the_memory_budget(api):
    budget = api.get("/v1/devices").json()["memory_budget"]
    assert budget["device"] is None  # CPU only
    assert 0 < budget["host"] < os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def test_a_session_takes_the_optimizer_as_a_bare_name(api):
    mesh = api.post("/v1/meshes", json={"axes": {"data": -1}}).json()
    response = api.post(
        f"/v1/meshes/{mesh['id']}/sessions",
        json={"model": {"kind": "mlp", "features": [4, 8, 2]}, "optimizer": "sgd"},
    )
    assert response.status_code == 201, response.text
    assert response.json()["optimizer"]["name"] == "sgd"
    api.delete(f"/v1/sessions/{response.json()['id']}")


TINY_TRANSFORMER = {"kind": "transformer", "layers": 2, "d_model": 32, "d_ff": 64,
                    "heads": 4, "kv_heads": 2, "vocab": 50, "seq_len": 16,
                    "param_dtype": "float32", "dtype": "float32"}  # fmt: skip


def test_a_session_trains_the_transformer(api):
    mesh = api.post("/v1/meshes", json={"axes": {"data": -1}}).json()
    path = f"/v1/meshes/{mesh['id']}/sessions"
    body = {"model": TINY_TRANSFORMER, "optimizer": {"name": "adam", "learning_rate": 0.01}}
    response = api.post(path, json=body)
    assert response.status_code == 201, response.text
    session = response.json()
    assert session["model"]["attention"] == "flash" and session["loss"] == "next_token"
    params = {p["path"] for p in session["params"]}
    assert any("attn" in p for p in params), params
    steps = api.post(
        f"/v1/sessions/{session['id']}/steps", json={"steps": 20, "synthetic": {"batch_size": 16}}
    )
    assert steps.status_code == 200, steps.text
    losses = steps.json()["losses"]
    assert len(losses) == 20 and losses[-1] < losses[0]  # the successor table is learnable
    tokens = [[i % 50 for i in range(16)]] * 8
    explicit = api.post(
        f"/v1/sessions/{session['id']}/steps",
        json={"steps": 1, "batch": {"inputs": tokens, "targets": tokens}},
    )
    assert explicit.status_code == 200, explicit.text
    bad = api.post(
        f"/v1/sessions/{session['id']}/steps",
        json={"steps": 1, "batch": {"inputs": [[99] * 16] * 8, "targets": tokens}},
    )
    assert_problem(bad, 422, "invalid_inputs")
    refused = api.post(path, json={**body, "param_sharding": "fsdp"})
    assert_problem(refused, 422, "invalid_strategy")
    api.delete(f"/v1/sessions/{session['id']}")


@pytest.mark.parametrize(
    ("axes", "model", "says"),
    [
        ({"data": 2, "expert": 4}, TINY_TRANSFORMER, "needs a mixture-of-experts model"),
        ({"expert": 8}, {**TINY_TRANSFORMER, "num_experts": 3, "experts_per_token": 1,
                         "moe_d_ff": 32}, "do not divide the model's 3 experts"),
        ({"data": 1, "context": 8}, {**TINY_TRANSFORMER, "seq_len": 24}, "context"),
        ({"stage": 8}, TINY_TRANSFORMER, "stage"),
        ({"data": 2, "sequence": 4}, TINY_TRANSFORMER, "sequence parallelism"),
        ({"data": 2, "expert": 4}, {"kind": "mlp", "features": FEATURES},
         "needs a mixture-of-experts model"),
    ],
    ids=["expert-on-dense", "experts-not-divided", "context-not-dividing", "stages-over-2-layers",
         "sequence-not-built", "expert-on-mlp"],
)  # fmt: skip
def test_a_session_refuses_what_a_plan_of_it_refuses(api, axes, model, says):
    # issue 58 (9): sessions take the kinds' checks of plans, before anything is placed
    mesh = _plan(api, axes)
    response = api.post(f"/v1/meshes/{mesh['id']}/sessions", json={"model": model})
    assert_problem(response, 422, "invalid_parallelism")
    assert says in response.json()["detail"], response.json()["detail"]
    assert api.get("/v1/sessions").json()["items"] == [] or all(
        item["mesh_id"] != mesh["id"] for item in api.get("/v1/sessions").json()["items"]
    )


def test_a_session_trains_a_mixture_of_experts_transformer_over_an_expert_axis(api):
    # issue 38: a small MoE transformer, its dispatched tokens over the expert axis
    mesh = api.post(
        "/v1/meshes", json={"axes": {"data": 2, "expert": 4}, "batch_axes": ["data", "expert"]}
    ).json()
    moe = {**TINY_TRANSFORMER, "num_experts": 4, "experts_per_token": 2, "moe_d_ff": 32}
    body = {"model": moe, "optimizer": {"name": "adam", "learning_rate": 0.01}}
    response = api.post(f"/v1/meshes/{mesh['id']}/sessions", json=body)
    assert response.status_code == 201, response.text
    session = response.json()
    params = {p["path"] for p in session["params"]}
    assert any("experts" in p for p in params), params
    steps = api.post(
        f"/v1/sessions/{session['id']}/steps", json={"steps": 20, "synthetic": {"batch_size": 16}}
    )
    assert steps.status_code == 200, steps.text
    losses = steps.json()["losses"]
    assert len(losses) == 20 and losses[-1] < 0.8 * losses[0], losses
    api.delete(f"/v1/sessions/{session['id']}")


def test_deleting_a_session_cancels_its_queued_steps(api):
    # issue 41: the delete answers without waiting behind the session's queued calls;
    # those answer 404 at once, having run nothing; a step already running finishes
    _, session = _session(api, {"data": 8}, model={"kind": "mlp", "features": [256, 1024, 256]})
    sid = session["id"]
    results: list = []
    started = threading.Event()

    def call():
        started.set()
        # 100 steps (seconds) outlast the 0.5 s below many times over; the runtime finishes
        # the running call after the delete, and the next test waits behind what is left
        body = {"steps": 100, "synthetic": {"seed": 1, "batch_size": 256}}
        results.append(api.post(f"/v1/sessions/{sid}/steps", json=body))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait(10)
    time.sleep(0.5)  # the first call runs, the others wait behind it
    assert api.delete(f"/v1/sessions/{sid}").status_code == 204
    for t in threads:
        t.join(timeout=300)
    # the delete did not wait behind the queued calls (100 steps each): at most the one
    # already running finished its steps, the others answered 404 having run nothing
    assert len(results) == 4, [r.status_code for r in results]
    assert sum(r.status_code == 200 for r in results) <= 1, [r.text[:200] for r in results]
    waited = [r for r in results if "was deleted while this call waited" in r.text]
    assert len(waited) >= 2, [r.text for r in results]
    for r in waited:
        assert_problem(r, 404, "session_not_found")
    assert_problem(api.get(f"/v1/sessions/{sid}"), 404, "session_not_found")


def test_deleting_a_mesh_ends_its_sessions(api):
    # issue 41: a deleted plan's sessions are deleted with it (their steps cancelled)
    plan, session = _session(api, {"data": 8})
    _, other = _session(api, {"data": 8})
    assert api.delete(f"/v1/meshes/{plan['id']}").status_code == 204
    assert_problem(api.get(f"/v1/sessions/{session['id']}"), 404, "session_not_found")
    assert_problem(api.post(f"/v1/sessions/{session['id']}/steps", json={"steps": 1}), 404,
                   "session_not_found")  # fmt: skip
    assert _steps(api, other["id"], 1, synthetic=SYNTH)["step"] == 1  # another plan's goes on
