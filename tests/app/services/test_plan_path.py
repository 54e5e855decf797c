"""One path per hardware plan: each fact of a plan is worked out once per request.

Every library function on the path is wrapped with a recorder at every module that
binds its name (the service's imports and the library's own), then one plan is made:
over HTTP (a hardware plan with a named model), and through the service functions (a
pipelined plan, a plan without a model, a MaxText body). The recorder counts the calls
and keeps their inputs and results, so a test says not only how often each ran but on
what: the context the estimate prices is the one ``mesh_context`` built, the spec it
holds is the one ``model_spec`` built.

One function may run twice on a plan with a model, and the tests pin both calls:
``check_kinds_apply``, before the layout on the axes whose size the request gives (so the
planner's own refusals do not hide an expert axis on a dense model), and inside
``mesh_context`` only when the layout sized more axes (a ``-1``); on the same axes the
context takes them as checked (``checked_axes``) and runs it once. ``model_spec`` runs
once: the context takes the spec the service built.

``check_named_kinds`` runs once per axis: before the layout on the sized axes, after it
only on the axes the layout sized (none: no second call).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.schemas.meshes import HardwarePlanBody, MaxTextPlanBody, MeshPlanRequest
from app.services import hardware as hardware_service
from datarax.parallel.context import MeshContext
from datarax.specs.model_specs import MLPSpec, TransformerSpec

# name -> the module that defines it (its home); every module binding the same object
# is patched too.
ON_THE_PATH = {
    "model_spec": "datarax.specs.model_specs",
    "axis_roles": "datarax.parallel.axis_roles",
    "role_sizes": "datarax.parallel.axis_roles",
    "param_specs": "datarax.parallel.axis_roles",
    "check_kinds_apply": "datarax.parallel.axis_roles",
    "check_named_kinds": "datarax.parallel.axis_roles",
    "batch_axes": "datarax.parallel.axis_roles",
    "mesh_context": "datarax.parallel.context",
    "estimate_step": "datarax.estimate.cost",
    "parallel_options": "app.services.hardware",
    "cluster_devices": "app.services.hardware",
}

MODEL_PATH = (
    "mesh_context", "estimate_step", "role_sizes", "param_specs", "axis_roles", "batch_axes"
)  # fmt: skip


@dataclass
class Call:
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    result: Any = None


@dataclass
class Recorder:
    calls: dict[str, list[Call]] = field(default_factory=dict)

    def count(self) -> dict[str, int]:
        return {name: len(self.calls.get(name, [])) for name in ON_THE_PATH}

    def of(self, name: str) -> list[Call]:
        return self.calls.get(name, [])

    def wrap(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            call = Call(args, kwargs)
            self.calls.setdefault(name, []).append(call)
            call.result = function(*args, **kwargs)
            return call.result

        return recorded


@pytest.fixture
def path(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    """Every function of :data:`ON_THE_PATH` recorded wherever a module binds it."""
    recorder = Recorder()
    for name, home in ON_THE_PATH.items():
        original = getattr(sys.modules[home], name)
        bound = [
            module
            for module_name, module in list(sys.modules.items())
            if module is not None
            and module_name.partition(".")[0] in ("app", "datarax")
            # the module's own dict: no lazy facade's __getattr__ is woken
            and vars(module).get(name) is original
        ]
        assert sys.modules[home] in bound
        wrapped = recorder.wrap(name, original)
        for module in bound:
            monkeypatch.setattr(module, name, wrapped)
    yield recorder


def _render(body: dict[str, Any]) -> dict[str, Any]:
    parsed = MeshPlanRequest.model_validate(body).root
    assert isinstance(parsed, HardwarePlanBody | MaxTextPlanBody)
    plan = hardware_service.hardware_plan(parsed)
    return json.loads(
        hardware_service.render_hardware_plan(plan, plan_id="m_path", created_at="t").body
    )


def _the_one(recorder: Recorder, name: str) -> Call:
    (call,) = recorder.of(name)
    return call


def _check_model_path(recorder: Recorder, plan: dict[str, Any], model: dict[str, Any]) -> None:
    """The context is built once and everything after it reads it."""
    ctx = _the_one(recorder, "mesh_context").result
    assert isinstance(ctx, MeshContext)
    estimate = _the_one(recorder, "estimate_step")
    assert estimate.kwargs["context"] is ctx
    # the options read once are the ones the context holds
    assert ctx.options is _the_one(recorder, "parallel_options").result
    # one spec: built from the request's model, the context's as it is
    built = _the_one(recorder, "model_spec")
    assert built.args == (model,) and isinstance(built.result, MLPSpec | TransformerSpec)
    assert built.result is ctx.model
    # the kinds against the model: the request's sized axes before the layout, and the
    # layout's axes in the context only where the layout sized more (a -1)
    calls = recorder.of("check_kinds_apply")
    assert all(call.args[0] is ctx.model for call in calls)
    assert set(calls[0].args[1]) <= set(plan["axes"])
    if len(calls) == 2:
        assert dict(calls[1].args[1]) == plan["axes"] == dict(ctx.axes) != dict(calls[0].args[1])
    # the roles, sizes and shardings: the context's, not worked out again
    assert _the_one(recorder, "axis_roles").result == ctx.roles
    assert _the_one(recorder, "role_sizes").result == ctx.sizes
    assert [p["path"] for p in plan["params"]] == [g.path for g, _, _, _ in ctx.specs]
    # the answer from the typed results, once: the model beside the estimate, not in it
    assert plan["model"] == ctx.model.to_json() and "model" not in plan["step_estimate"]
    assert plan["step_estimate"] == estimate.result.to_json()


def _check_named_kinds_once_per_axis(recorder: Recorder, plan: dict[str, Any]) -> None:
    checked = [dict(call.args[0]) for call in recorder.of("check_named_kinds")]
    seen = [axis for axes in checked for axis in axes]
    assert len(seen) == len(set(seen)) and set(seen) == set(plan["axes"]), checked
    for axes in checked:
        assert all(plan["axes"][a] == n for a, n in axes.items()), checked


def test_a_hardware_plan_with_a_model_works_out_each_fact_once(api, path):
    body = {
        "hardware": "tpu-v5e", "topology": "4x4", "ici": {"fsdp": -1, "tensor": 4},
        "batch_shape": [32, 1024], "model": {"name": "llama3.1-8b"},
    }  # fmt: skip
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, response.text
    plan = response.json()
    assert plan["axes"] == {"fsdp": 4, "tensor": 4}
    assert path.count() == {
        "model_spec": 1,
        "axis_roles": 1,
        "role_sizes": 1,
        "param_specs": 1,
        "check_kinds_apply": 2,  # the request's axes before the layout, the -1 sized after
        "check_named_kinds": 2,  # tensor before the layout, fsdp (a -1) after it
        "batch_axes": 1,
        "mesh_context": 1,
        "estimate_step": 1,
        "parallel_options": 1,
        "cluster_devices": 1,
    }
    # the sequence length is batch_shape[1] (DESIGN v1.4)
    _check_model_path(path, plan, {"name": "llama3.1-8b", "seq_len": 1024})
    _check_named_kinds_once_per_axis(path, plan)
    assert [dict(c.args[0]) for c in path.of("check_named_kinds")] == [{"tensor": 4}, {"fsdp": 4}]
    before, _ = path.of("check_kinds_apply")
    assert dict(before.args[1]) == {"tensor": 4}
    # the batch splits over the axes the context's roles name
    ctx = _the_one(path, "mesh_context").result
    assert _the_one(path, "batch_axes").args == (ctx.axes, ctx.roles)
    assert plan["batch"]["spec"] == ["fsdp", None]


def test_a_pipelined_plan_works_out_its_pipeline_once(path):
    body = {
        "hardware": "h100-sxm", "hosts": 64, "ici": {"stage": 1, "fsdp": 8},
        "dcn": {"stage": 8, "fsdp": 8}, "batch_shape": [256, 8192],
        "model": {"name": "llama3.1-70b", "remat": "full"},
        "pipeline": {"microbatches": 4, "schedule": "1f1b"},
    }  # fmt: skip
    plan = _render(body)
    counts = path.count()
    assert {name: counts[name] for name in MODEL_PATH} == dict.fromkeys(MODEL_PATH, 1)
    # no -1: every axis is checked by name before the layout, and only then
    assert (counts["check_named_kinds"], counts["parallel_options"]) == (1, 1)
    assert (counts["model_spec"], counts["check_kinds_apply"]) == (1, 1)
    _check_model_path(path, plan, {"name": "llama3.1-70b", "remat": "full", "seq_len": 8192})
    _check_named_kinds_once_per_axis(path, plan)
    ctx = _the_one(path, "mesh_context").result
    assert ctx.pipeline is not None and ctx.layer_shards == 8
    assert plan["step_estimate"]["pipeline"] == ctx.pipeline.to_json()
    assert plan["pipeline"] == {"microbatches": 4, "layers_per_stage": None, "schedule": "1f1b"}
    # the same axes before the layout and in the context: checked once
    assert dict(_the_one(path, "check_kinds_apply").args[1]) == {"stage": 8, "fsdp": 64}


@pytest.mark.parametrize(
    ("ici", "named"),
    [({"data": 4, "fsdp": 4}, [{"data": 4, "fsdp": 4}]),
     ({"data": -1, "fsdp": 4}, [{"fsdp": 4}, {"data": 4}])],
    ids=["sized", "auto-axis"],
)  # fmt: skip
def test_a_plan_without_a_model_builds_no_context(path, ici, named):
    plan = _render({"hardware": "tpu-v5e", "topology": "4x4", "ici": ici, "batch_shape": [64, 128]})
    assert plan["axes"] == {"data": 4, "fsdp": 4} and "step_estimate" not in plan
    counts = path.count()
    assert counts == {
        **dict.fromkeys(ON_THE_PATH, 0),
        "check_named_kinds": len(named),
        "parallel_options": 1,
        "cluster_devices": 1,
    }
    assert [dict(c.args[0]) for c in path.of("check_named_kinds")] == named
    _check_named_kinds_once_per_axis(path, plan)


def test_a_maxtext_body_goes_down_the_same_path(path):
    body = {
        "hardware": "tpu-v5e", "topology": "4x4",
        "maxtext": {"ici_fsdp_parallelism": -1, "model_name": "llama2-7b",
                    "per_device_batch_size": 1, "max_target_length": 256},
    }  # fmt: skip
    plan = _render(body)
    counts = path.count()
    once = [name for name in MODEL_PATH if name != "batch_axes"]
    assert {name: counts[name] for name in once} == dict.fromkeys(once, 1)
    assert counts["parallel_options"] == counts["cluster_devices"] == 1
    assert counts["batch_axes"] == 0  # MaxText's keys name the batch axes
    ctx = _the_one(path, "mesh_context").result
    assert _the_one(path, "estimate_step").kwargs["context"] is ctx
    assert plan["model"] == ctx.model.to_json() and "model" not in plan["step_estimate"]
