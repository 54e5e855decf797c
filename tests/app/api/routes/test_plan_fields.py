"""Every field of every plan body says what it changes (issue 56, item 1; DESIGN v1.4,
"Every input is used or refused").

The request models of ``POST /v1/meshes`` (:mod:`app.schemas.meshes`: the live, abstract,
hardware and MaxText bodies) and every model nested in them are walked field by field;
:data:`EFFECTS` says, for each, what happens when it changes:

- :class:`Moves`: from a base body, the change moves the answer members named (dotted
  paths into the plan's JSON): the field is used;
- :class:`Unlocks`: a body refused with the field at its default is a plan with it
  changed;
- :class:`Refused`: any value but the default is 422 with the code named, and the default
  means the same as leaving the field out: a field that would change nothing;
- :class:`OneValue`: the field takes one value only (a discriminator's, or a named
  model's ``kind``), the same as leaving it out; any other is refused.

A field the walk finds that :data:`EFFECTS` does not list fails the first test: a new
field needs its entry (used, or refused), so none is silently ignored.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from app.schemas.meshes import PlanBody
from tests.helpers import assert_problem


def _arms(hint: Any) -> list[type[BaseModel]]:
    """The classes of a (tagged, annotated) union, in order."""
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return [hint]
    return [arm for arg in typing.get_args(hint) for arm in _arms(arg)]


BODIES = tuple(_arms(PlanBody))
"""Every mode's body of ``POST /v1/meshes``, read from the union the route takes."""

# big enough that the activations sit in HBM (a tiny step's fit in VMEM)
TR = {"kind": "transformer", "layers": 4, "d_model": 1024, "d_ff": 4096, "heads": 8,
      "kv_heads": 8, "vocab": 32000, "seq_len": 2048}  # fmt: skip
MOE = {**TR, "num_experts": 4, "experts_per_token": 2}
MLA = {**TR, "attention_type": "mla", "q_lora_rank": 256, "kv_lora_rank": 256,
       "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": 64}  # fmt: skip
HW = {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"fsdp": -1},
      "batch_shape": [8, 2048], "model": TR}  # fmt: skip
GPU = {**HW, "hardware": "h100-sxm", "topology": None, "hosts": 1, "batch_shape": [16, 2048]}
NAMED = {**HW, "model": {"name": "llama2-7b"}}
STAGES = {**HW, "ici": {"stage": 2, "fsdp": 2}, "batch_shape": [16, 2048],
          "pipeline": {"microbatches": 2}}  # fmt: skip
CONTEXT = {**HW, "ici": {"context": 2, "fsdp": 2}, "context_parallel": {"strategy": "ring"}}
MLP_HW = {**HW, "model": {"kind": "mlp", "features": [64, 256, 8]}, "batch_shape": [8, 64]}
ABSTRACT = {"axes": {"data": -1, "model": 2}, "num_devices": 8, "batch_shape": [16, 64],
            "model": {"kind": "mlp", "features": [64, 256, 8]}}  # fmt: skip
LIVE = {k: v for k, v in ABSTRACT.items() if k != "num_devices"}
MAXTEXT = {"hardware": "tpu-v5e", "topology": "2x2",
           "maxtext": {"ici_fsdp_parallelism": -1, "model_name": "llama2-7b",
                       "per_device_batch_size": 1, "max_target_length": 128}}  # fmt: skip

SERVE = {"hardware": "tpu-v5e", "topology": "2x2", "ici": {"tensor": -1},
         "model": {"name": "llama2-7b"},
         "serving": {"input_tokens": 1024, "output_tokens": 128}}  # fmt: skip

STEP = "step_estimate.step_s"
TPOT = "serving_estimate.tpot_s"
MEMORY = "memory_per_device.total"
PARAMS = "params"


@dataclass(frozen=True)
class Moves:
    """From ``base``, ``change`` (members replaced; ``model`` members merged into the
    base's model) moves every answer member of ``moves``."""

    base: dict[str, Any]
    change: dict[str, Any]
    moves: tuple[str, ...]
    model: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Refused:
    """Any value but the default changes nothing, and is refused with ``code``."""

    base: dict[str, Any]
    change: dict[str, Any]
    code: str
    default: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Warns:
    """Accepted because the contract fixes it, and changes nothing: ``change`` leaves the
    answer as ``base`` gives it but for a ``warnings`` entry holding ``says``."""

    base: dict[str, Any]
    change: dict[str, Any]
    says: str


@dataclass(frozen=True)
class Unlocks:
    """``base`` is refused with ``code``; ``change`` makes it a plan."""

    base: dict[str, Any]
    change: dict[str, Any]
    code: str


@dataclass(frozen=True)
class OneValue:
    """The one value the field takes (the same as leaving it out, where it may be left
    out); ``other`` is refused with ``validation_error``."""

    base: dict[str, Any]
    value: dict[str, Any]
    other: dict[str, Any]
    model: bool = False


def _m(base: dict[str, Any], moves: tuple[str, ...] | str, **fields: Any) -> Moves:
    """A model field that moves ``moves`` from ``base``."""
    return Moves(base, {}, (moves,) if isinstance(moves, str) else moves, fields)


EFFECTS: dict[str, Moves | Refused | Unlocks | OneValue] = {
    # ---------------------------------------------------------------- live plans
    "LivePlanBody.axes": Moves(
        LIVE, {"axes": {"data": -1, "model": 4}}, ("axes", "batch.shard_shape")
    ),
    "LivePlanBody.batch_shape": Moves(LIVE, {"batch_shape": [32, 64]}, ("batch.shape",)),
    "LivePlanBody.batch_axes": Moves(LIVE, {"batch_axes": ["model"]}, ("batch.spec",)),
    "LivePlanBody.model": Moves(LIVE, {"model": None}, (PARAMS, MEMORY)),
    "LivePlanBody.param_sharding": Moves(LIVE, {"param_sharding": "model"}, (PARAMS, MEMORY)),
    "LivePlanBody.optimizer": Moves(LIVE, {"optimizer": "sgd"}, ("memory_per_device.optimizer",)),
    "LivePlanBody.name": Moves(LIVE, {"name": "x"}, ("name",)),
    # ---------------------------------------------------------------- abstract plans
    "AbstractPlanBody.axes": Moves(ABSTRACT, {"axes": {"data": 2, "model": -1}}, ("axes",)),
    "AbstractPlanBody.num_devices": Moves(ABSTRACT, {"num_devices": 4}, ("total_devices",)),
    "AbstractPlanBody.platform": Moves(ABSTRACT, {"platform": "tpu"}, ("platform",)),
    "AbstractPlanBody.batch_shape": Moves(ABSTRACT, {"batch_shape": [32, 64]}, ("batch.shape",)),
    "AbstractPlanBody.batch_axes": Moves(ABSTRACT, {"batch_axes": []}, ("batch.spec",)),
    "AbstractPlanBody.model": Moves(ABSTRACT, {"model": None}, (PARAMS,)),
    "AbstractPlanBody.param_sharding": Moves(ABSTRACT, {"param_sharding": "model"}, (MEMORY,)),
    "AbstractPlanBody.optimizer": Moves(ABSTRACT, {"optimizer": "sgd"}, (MEMORY,)),
    "AbstractPlanBody.name": Moves(ABSTRACT, {"name": "x"}, ("name",)),
    # ---------------------------------------------------------------- hardware plans
    "HardwarePlanBody.hardware": Moves(HW, {"hardware": "tpu-v6e"}, ("hardware", STEP)),
    "HardwarePlanBody.topology": Moves(HW, {"topology": "2x4"}, ("topology", STEP)),
    "HardwarePlanBody.slices": Moves(
        HW, {"slices": 2, "dcn": {"fsdp": -1}}, ("slices", "axes", STEP)
    ),
    "HardwarePlanBody.hosts": Moves(GPU, {"hosts": 2, "dcn": {"fsdp": -1}}, ("hosts", STEP)),
    "HardwarePlanBody.ici": Moves(HW, {"ici": {"data": -1}}, ("axes", MEMORY)),
    "HardwarePlanBody.dcn": Moves(
        {**HW, "slices": 2, "ici": {"data": 1, "fsdp": -1}, "dcn": {"data": 2}},
        {"dcn": {"data": 1, "fsdp": 2}},
        ("axes_detail", STEP),
    ),
    # a layout that splits the chips' physical axes is refused unless this allows it
    "HardwarePlanBody.allow_split_physical_axes": Unlocks(
        {**HW, "topology": "4x4", "ici": {"fsdp": 2, "tensor": 8}},
        {"allow_split_physical_axes": True},
        "physical_axes_split_required",
    ),
    "HardwarePlanBody.batch_shape": Moves(HW, {"batch_shape": [16, 2048]}, (STEP, "batch.shape")),
    "HardwarePlanBody.batch_axes": Moves(
        {**HW, "ici": {"data": 2, "fsdp": 2}}, {"batch_axes": ["data"]}, ("batch.spec",)
    ),
    "HardwarePlanBody.model": Moves(HW, {"model": MOE}, (STEP, MEMORY, "total_params")),
    "HardwarePlanBody.optimizer": Moves(HW, {"optimizer": "sgd"}, ("memory_per_device.optimizer",)),
    "HardwarePlanBody.name": Moves(HW, {"name": "x"}, ("name",)),
    "HardwarePlanBody.pipeline": Moves(
        STAGES, {"pipeline": {"microbatches": 4}}, ("step_estimate.pipeline", STEP)
    ),
    "HardwarePlanBody.context_parallel": Moves(
        CONTEXT, {"context_parallel": {"strategy": "all_gather"}}, ("step_estimate.collectives",)
    ),
    "HardwarePlanBody.calibration": Moves(
        GPU, {"calibration": "published-gpu-pytorch"}, ("step_estimate.calibration", STEP)
    ),
    # ---------------------------------------------------------------- MaxText's keys
    "MaxTextPlanBody.hardware": Moves(MAXTEXT, {"hardware": "tpu-v6e"}, ("hardware", STEP)),
    "MaxTextPlanBody.topology": Moves(MAXTEXT, {"topology": "2x4"}, ("topology", "axes")),
    "MaxTextPlanBody.slices": Moves(MAXTEXT, {"slices": 2}, ("slices", "axes")),
    "MaxTextPlanBody.hosts": Moves(
        {**MAXTEXT, "hardware": "h100-sxm", "topology": None, "hosts": 1}, {"hosts": 2}, ("hosts",)
    ),
    "MaxTextPlanBody.maxtext": Moves(
        MAXTEXT,
        {"maxtext": {**MAXTEXT["maxtext"], "remat_policy": "minimal"}},
        ("model.remat", STEP, MEMORY),
    ),
    "MaxTextPlanBody.optimizer": Moves(
        MAXTEXT, {"optimizer": "sgd"}, ("memory_per_device.optimizer",)
    ),
    "MaxTextPlanBody.name": Moves(MAXTEXT, {"name": "x"}, ("name",)),
    "MaxTextPlanBody.calibration": Moves(
        {**MAXTEXT, "hardware": "h100-sxm", "topology": None, "hosts": 1},
        {"calibration": "published-gpu-pytorch"},
        ("step_estimate.calibration", STEP),
    ),
    # ---------------------------------------------------------------- the MLP
    "MlpModel.kind": OneValue(MLP_HW, {"kind": "mlp"}, {"kind": "cnn"}, model=True),
    "MlpModel.features": Moves(
        ABSTRACT, {"model": {"kind": "mlp", "features": [64, 512, 8]}}, (PARAMS, MEMORY)
    ),
    "MlpModel.param_sharding": Moves(
        ABSTRACT, {"model": {**ABSTRACT["model"], "param_sharding": "model"}}, (PARAMS, MEMORY)
    ),
    "MlpModel.optimizer": Moves(
        ABSTRACT, {"model": {**ABSTRACT["model"], "optimizer": "sgd"}}, (MEMORY,)
    ),
    "MlpModel.dtype": _m(MLP_HW, (MEMORY, STEP), dtype="float32"),
    "MlpModel.remat": _m(MLP_HW, (STEP,), remat="full"),
    "MlpModel.loss": _m(MLP_HW, ("memory_per_device.batch",), loss="cross_entropy"),
    # ---------------------------------------------------------------- pipeline, context
    "PipelineSpec.microbatches": Moves(
        STAGES, {"pipeline": {"microbatches": 4}}, ("step_estimate.pipeline.microbatches", STEP)
    ),
    "PipelineSpec.layers_per_stage": Moves(
        STAGES,
        {"pipeline": {"microbatches": 2, "layers_per_stage": 1, "schedule": "circular"}},
        ("step_estimate.pipeline.repeats", STEP),
    ),
    "PipelineSpec.schedule": Moves(
        {**STAGES, "pipeline": {"microbatches": 8}},
        {"pipeline": {"microbatches": 8, "schedule": "1f1b"}},
        ("step_estimate.pipeline.schedule", "memory_per_device.activations"),
    ),
    "ContextParallelSpec.strategy": Moves(
        CONTEXT, {"context_parallel": {"strategy": "all_gather"}}, ("step_estimate.collectives",)
    ),
    "ContextParallelSpec.load_balance": Moves(
        CONTEXT, {"context_parallel": {"strategy": "ring", "load_balance": False}}, (STEP,)
    ),
    # ---------------------------------------------------------------- the optimizer object
    "OptimizerSpec.name": Moves(HW, {"optimizer": {"name": "sgd"}}, (MEMORY,)),
    "OptimizerSpec.shard_over_data": Moves(
        {**HW, "ici": {"data": 2, "fsdp": 2}},
        {"optimizer": {"name": "adam", "shard_over_data": True}},
        ("memory_per_device.optimizer", "shard_over_data"),
    ),
    # sessions read the learning rate; no plan does. The optimizer takes one form
    # everywhere (DESIGN v1.2), so plans accept it and say it changes nothing.
    "OptimizerSpec.learning_rate": Warns(
        HW, {"optimizer": {"name": "adam", "learning_rate": 0.1}}, "optimizer.learning_rate"
    ),
}


def _serve(**fields: Any) -> dict[str, Any]:
    return {"serving": {**SERVE["serving"], **fields}}


EFFECTS.update(
    {
        # ------------------------------------------------------------ serving plans
        "ServingPlanBody.hardware": Moves(SERVE, {"hardware": "tpu-v6e"}, ("hardware", TPOT)),
        "ServingPlanBody.topology": Moves(SERVE, {"topology": "2x4"}, ("axes", TPOT)),
        "ServingPlanBody.slices": Moves(
            {**SERVE, "ici": {"data": 1, "tensor": -1}},
            {"slices": 2, "dcn": {"data": 2}},
            ("serving_estimate.replicas",),
        ),
        "ServingPlanBody.hosts": Moves(
            {
                **SERVE,
                "hardware": "h100-sxm",
                "topology": None,
                "hosts": 1,
                "ici": {"data": 1, "tensor": -1},
            },
            {"hosts": 2, "dcn": {"data": 2}},
            ("serving_estimate.replicas",),
        ),  # fmt: skip
        "ServingPlanBody.ici": Moves(
            SERVE, {"ici": {"data": 2, "tensor": -1}}, ("serving_estimate.replicas", TPOT)
        ),
        "ServingPlanBody.dcn": Moves(
            {**SERVE, "slices": 2, "ici": {"data": 1, "tensor": -1}, "dcn": {"data": 2}},
            {"dcn": {"data": 1, "tensor": 2}},
            ("serving_estimate.replicas", "axes_detail"),
        ),
        "ServingPlanBody.allow_split_physical_axes": Unlocks(
            {**SERVE, "topology": "4x4", "ici": {"data": 2, "tensor": 8}},
            {"allow_split_physical_axes": True},
            "physical_axes_split_required",
        ),
        "ServingPlanBody.model": Moves(
            SERVE, {"model": {"name": "llama3.1-8b"}}, ("serving_estimate.weights_bytes", TPOT)
        ),
        "ServingPlanBody.serving": Moves(SERVE, _serve(output_tokens=256), (TPOT,)),
        "ServingPlanBody.name": Moves(SERVE, {"name": "x"}, ("name",)),
        "ServingPlanBody.calibration": Moves(
            SERVE, {"calibration": "published-tpu-jetstream"}, ("serving_estimate.calibration",)
        ),
        "ServingSpec.input_tokens": Moves(
            SERVE, _serve(input_tokens=2048), ("serving_estimate.ttft_s",)
        ),
        "ServingSpec.output_tokens": Moves(
            SERVE, _serve(output_tokens=256), ("serving_estimate.requests_per_s",)
        ),
        "ServingSpec.max_batch": Moves(SERVE, _serve(max_batch=8), ("serving_estimate.batch",)),
        "ServingSpec.concurrency": Moves(SERVE, _serve(concurrency=4), ("serving_estimate.batch",)),
        "ServingSpec.max_model_len": Moves(
            SERVE, _serve(max_model_len=131_072), ("memory_per_device.fits",)
        ),
        "ServingSpec.weight_dtype": Moves(
            SERVE, _serve(weight_dtype="int8"), ("serving_estimate.weights_bytes",)
        ),
        "ServingSpec.kv_dtype": Moves(
            SERVE, _serve(kv_dtype="int8"), ("serving_estimate.kv_bytes_per_token",)
        ),
        "ServingSpec.memory_fraction": Moves(
            SERVE, _serve(memory_fraction=0.5), ("serving_estimate.kv_capacity_tokens",)
        ),
        "ServingSpec.engine": Moves(
            SERVE, _serve(engine="jetstream"), ("serving_estimate.engine",)
        ),
    }
)

# The transformer's fields, on a transformer and on a named model (whose fields override
# the entry's): each moves the step estimate or the memory from a base where it applies.
_TRANSFORMER_FIELDS: dict[str, Moves | OneValue] = {
    "layers": _m(HW, (STEP, "total_params"), layers=2),
    "d_model": _m(HW, (STEP, "total_params"), d_model=512),
    "d_ff": _m(HW, (STEP, "total_params"), d_ff=2048),
    "heads": _m(HW, (STEP, MEMORY), heads=16),
    "kv_heads": _m(HW, ("total_params",), kv_heads=2),
    "vocab": _m(HW, ("total_params",), vocab=2048),
    "seq_len": Moves(HW, {"batch_shape": [8, 1024]}, (STEP, "model.seq_len"), {"seq_len": 1024}),
    "mlp": _m(HW, ("total_params",), mlp="plain"),
    "dtype": _m(HW, (STEP, "memory_per_device.activations"), dtype="float32"),
    "param_dtype": _m(HW, ("memory_per_device.params",), param_dtype="float32"),
    # hardware plans price MaxText's program, whose remat_policy none rematerializes as
    # full does (datarax.estimate.memory.maxtext_program_context): a policy that saves
    "remat": _m(HW, ("memory_per_device.activations", STEP), remat="minimal"),
    "remat_custom": Moves(
        {**HW, "model": {**TR, "remat": "custom"}},
        {},
        ("memory_per_device.activations",),
        {"remat_custom": {"mlpwi_0": "device", "mlpwi_1": "device"}},
    ),
    "head_dim": _m(HW, ("total_params",), head_dim=32),
    "tied_embeddings": _m(HW, ("total_params",), tied_embeddings=True),
    "attention": _m(HW, (STEP, "memory_per_device.temporaries"), attention="dot"),
    "vocab_tiling": _m(HW, ("memory_per_device.temporaries",), vocab_tiling=4),
    "num_experts": _m({**HW, "model": MOE}, ("total_params",), num_experts=8),
    "experts_per_token": _m({**HW, "model": MOE}, ("active_params", STEP), experts_per_token=1),
    "shared_experts": _m({**HW, "model": MOE}, ("active_params",), shared_experts=1),
    "moe_d_ff": _m({**HW, "model": MOE}, ("total_params",), moe_d_ff=512),
    "first_dense_layers": _m({**HW, "model": MOE}, ("total_params",), first_dense_layers=1),
    "moe_every": _m({**HW, "model": MOE}, ("total_params",), moe_every=2),
    # the dense kernel pads each expert to its capacity (with the dropless sparse kernel
    # the factor is not priced: see the report of issue 56)
    "capacity_factor": Moves(
        {**HW, "model": {**MOE, "moe_kernel": "dense", "capacity_factor": 1.0}},
        {},
        (STEP,),
        {"capacity_factor": 2.0},
    ),
    "moe_kernel": Moves(
        {**HW, "model": {**MOE, "capacity_factor": 1.0}}, {}, (STEP,), {"moe_kernel": "dense"}
    ),
    "attention_type": Moves(
        HW,
        {},
        ("total_params", STEP),
        {k: v for k, v in MLA.items() if k not in TR},
    ),
    "q_lora_rank": _m({**HW, "model": MLA}, ("total_params",), q_lora_rank=0),
    "kv_lora_rank": _m({**HW, "model": MLA}, ("total_params",), kv_lora_rank=128),
    "qk_nope_head_dim": _m({**HW, "model": MLA}, ("total_params", STEP), qk_nope_head_dim=128),
    "qk_rope_head_dim": _m({**HW, "model": MLA}, ("total_params", STEP), qk_rope_head_dim=64),
    "v_head_dim": _m({**HW, "model": MLA}, ("total_params", STEP), v_head_dim=128),
}


def _named(case: Moves | OneValue) -> Moves | OneValue:
    """A transformer field's case on the named model (its base's model fields as
    overrides of llama2-7b, a batch of 128-token sequences)."""
    assert isinstance(case, Moves)
    model = {"name": "llama2-7b", **{k: v for k, v in case.base["model"].items() if k != "kind"}}
    return Moves({**case.base, "model": model}, case.change, case.moves, case.model)


EFFECTS.update({f"TransformerModel.{name}": case for name, case in _TRANSFORMER_FIELDS.items()})
EFFECTS.update({f"NamedModel.{name}": _named(case) for name, case in _TRANSFORMER_FIELDS.items()})
EFFECTS["TransformerModel.kind"] = OneValue(HW, {"kind": "transformer"}, {"kind": "x"}, True)
EFFECTS["NamedModel.kind"] = OneValue(NAMED, {"kind": "transformer"}, {"kind": "mlp"}, True)
EFFECTS["NamedModel.name"] = _m(NAMED, ("total_params", STEP), name="llama3.1-8b")


# ------------------------------------------------------------------------- the walk


def _models_in(hint: Any) -> list[type[BaseModel]]:
    """The pydantic models a field's annotation holds (through unions, Annotated, list
    and dict)."""
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        return [hint]
    return [model for arg in typing.get_args(hint) for model in _models_in(arg)]


def walk_fields() -> list[str]:
    """``Class.field`` for every field of every plan body and of the models nested in
    them, each class once."""
    seen: list[type[BaseModel]] = []
    todo: list[type[BaseModel]] = list(BODIES)
    while todo:
        cls = todo.pop(0)
        if cls in seen:
            continue
        seen.append(cls)
        for info in cls.model_fields.values():
            todo.extend(_models_in(info.annotation))
    return [f"{cls.__name__}.{name}" for cls in seen for name in cls.model_fields]


FIELDS = walk_fields()


def test_every_field_of_every_plan_body_says_what_it_changes():
    assert set(FIELDS) == set(EFFECTS), (
        f"fields without an entry: {sorted(set(FIELDS) - set(EFFECTS))}; "
        f"entries of no field: {sorted(set(EFFECTS) - set(FIELDS))}"
    )


def _at(answer: Any, path: str) -> Any:
    for key in path.split("."):
        answer = answer.get(key) if isinstance(answer, dict) else None
    return answer


def _body(base: dict[str, Any], change: dict[str, Any], model: dict[str, Any]) -> dict:
    body = {**base, **change}
    if model:
        body["model"] = {**body["model"], **model}
    return {k: v for k, v in body.items() if v is not None}


def _post(api, body: dict[str, Any]) -> dict[str, Any]:
    response = api.post("/v1/meshes", json=body)
    assert response.status_code == 201, (body, response.text)
    return response.json()


@pytest.mark.parametrize("name", sorted(EFFECTS))
def test_each_field_changes_what_its_entry_says(api, name):
    case = EFFECTS[name]
    if isinstance(case, Moves):
        before = _post(api, _body(case.base, {}, {}))
        after = _post(api, _body(case.base, case.change, case.model))
        still = [path for path in case.moves if _at(before, path) == _at(after, path)]
        assert not still, f"{name}: {still} did not move ({[_at(after, p) for p in still]})"
        return
    if isinstance(case, Unlocks):
        assert_problem(api.post("/v1/meshes", json=case.base), 422, case.code)
        _post(api, {**case.base, **case.change})
        return
    if isinstance(case, Refused):
        problem = assert_problem(
            api.post("/v1/meshes", json={**case.base, **case.change}), 422, case.code
        )
        assert "change nothing" in problem["detail"], problem["detail"]
        same = _post(api, {**case.base, **case.default})
        plain = _post(api, case.base)
        assert same["step_estimate"] == plain["step_estimate"], name
        return
    if isinstance(case, Warns):
        plain = _post(api, case.base)
        said = _post(api, {**case.base, **case.change})
        assert said["step_estimate"] == plain["step_estimate"], name
        assert said["memory_per_device"] == plain["memory_per_device"], name
        new = [w for w in said["warnings"] if w not in plain["warnings"]]
        assert len(new) == 1 and case.says in new[0], (name, new)
        return
    model = case.value if case.model else {}
    same = _post(api, _body(case.base, {} if case.model else case.value, model))
    plain = _post(api, case.base)
    assert same["step_estimate"] == plain["step_estimate"], name
    other = _body(case.base, {} if case.model else case.other, case.other if case.model else {})
    assert api.post("/v1/meshes", json=other).status_code == 422, name
