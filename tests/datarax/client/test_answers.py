"""The client's answer types: every public method says what it returns, and each answer's
keys are the service's response model's fields, so the two cannot drift apart."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from pydantic import BaseModel

from app.schemas import (
    calibrations,
    devices,
    hardware,
    jobs,
    launch,
    meshes,
    metrics,
    sessions,
)
from datarax.client import AsyncClient, Client, answers
from datarax.client._clients import _Operation
from datarax.client._core import Call

MAX_ANY = 3
"""Public client methods that may still return ``Any`` (issue 37)."""


def _return_type(cls: type, name: str) -> Any:
    """The answer type of ``cls.name``: an operation's ``Call[T]`` gives ``T`` (the sync
    client returns it, the async client an awaitable of it), a plain method its return
    annotation."""
    member = inspect.getattr_static(cls, name)
    if isinstance(member, _Operation):
        built = get_type_hints(member.build)["return"]
        assert get_origin(built) is Call, f"{name} builds {built}, not a Call[T]"
        return get_args(built)[0]
    return get_type_hints(member)["return"]


def _public_methods(cls: type) -> list[str]:
    def is_method(member: object) -> bool:
        return isinstance(member, _Operation) or inspect.isfunction(member)

    return [
        name
        for name in dir(cls)
        if not name.startswith("_") and is_method(inspect.getattr_static(cls, name))
    ]


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_at_most_three_public_methods_return_any(cls: type) -> None:
    names = _public_methods(cls)
    assert len(names) == 32  # 29 operations, pusher, iter_job_metrics, close/aclose
    loose = [name for name in names if _return_type(cls, name) is Any]
    assert len(loose) <= MAX_ANY, loose


def test_every_operation_answers_a_type_of_answers() -> None:
    # The operations answer the types of datarax.client.answers (or None: 204).
    known = {getattr(answers, name) for name in answers.__all__}
    for name in _public_methods(Client):
        member = inspect.getattr_static(Client, name)
        if not isinstance(member, _Operation):
            continue
        answer = _return_type(Client, name)
        if answer is type(None):  # 204: no content
            assert name.startswith("delete_"), name
            continue
        parts = (
            set(get_args(answer))
            if get_origin(answer) in (typing.Union, types.UnionType)
            else {answer}
        )
        assert any(part in known for part in parts), f"{name} answers {answer}"


def test_iter_job_metrics_yields_history_points() -> None:
    for cls in (Client, AsyncClient):
        produced = _return_type(cls, "iter_job_metrics")
        assert get_args(produced) == (answers.HistoryPoint,)


_ESTIMATE_MEMORY = {
    "grads", "activations", "temporaries", "vmem", "layout_copies", "hbm_bytes",
    "usable_hbm_bytes", "host_offload_bytes", "host_memory_bytes", "fits",
}  # fmt: skip
_HARDWARE_PLAN = {
    "hardware", "topology", "slices", "hosts", "ici", "dcn", "axes_detail", "step_estimate",
    "model", "context_parallel", "shard_over_data",
}  # fmt: skip
_ENV_TARGET = {
    "process_model", "num_processes", "coordinator_address", "rule", "processes",
    "process_list_limit",
}  # fmt: skip

# (answer type, the service's response model, members the service adds beyond the model:
# DESIGN.md's hardware-plan members, the estimate's memory, the env target's members)
PAIRS: list[tuple[Any, type[BaseModel], set[str]]] = [
    (answers.Readiness, devices.Readiness, set()),
    (answers.Device, devices.DeviceOut, set()),
    (answers.MemoryBudget, devices.MemoryBudget, set()),
    (answers.Devices, devices.DevicesResponse, set()),
    (answers.NamedModel, hardware.NamedModelEntry, set()),
    (answers.NamedModelList, hardware.NamedModelList, set()),
    (answers.HardwareEntry, hardware.HardwareEntry, set()),
    (answers.HardwareList, hardware.HardwareList, set()),
    (answers.Shard, meshes.Shard, {"slice", "host", "physical", "core"}),
    (answers.BatchLayout, meshes.BatchLayout, set()),
    (answers.ParamLayout, meshes.ParamLayout, set()),
    (answers.MemoryPerDevice, meshes.MemoryPerDevice, _ESTIMATE_MEMORY),
    (answers.AxisDetail, hardware.AxisDetail, set()),
    (answers.Collective, hardware.Collective, set()),
    (answers.StepBreakdown, hardware.StepBreakdown, set()),
    (answers.StepEstimate, hardware.StepEstimate, set()),
    (answers.PipelineEstimate, hardware.PipelineEstimate, set()),
    (answers.MeshPlan, meshes.MeshPlan, _HARDWARE_PLAN),
    (answers.MeshPlanList, meshes.MeshPlanList, set()),
    (answers.Candidate, hardware.Candidate, set()),
    (answers.Recommendations, hardware.Recommendations, set()),
    (answers.LaunchConfig, launch.LaunchConfig, _ENV_TARGET),
    (answers.ReduceAnswer, metrics.ReduceResponse, set()),
    (answers.DeviceMetrics, metrics.DeviceMetrics, set()),
    (answers.CollectAnswer, metrics.CollectResponse, set()),
    (answers.PushResult, jobs.JobPointCreated, set()),
    (answers.BatchResult, jobs.JobBatchResult, set()),
    (answers.HistoryPoint, jobs.JobPointOut, set()),
    (answers.MetricSpread, jobs.MetricSpread, set()),
    (answers.History, jobs.JobHistory, set()),
    (answers.JobSummary, jobs.JobSummary, set()),
    (answers.JobFidelity, jobs.JobFidelity, set()),
    (answers.CalibrationProfile, calibrations.CalibrationProfileEntry, set()),
    (answers.JobList, jobs.JobList, set()),
    (answers.SessionOptimizer, sessions.SessionOptimizer, set()),
    (answers.Session, sessions.SessionOut, set()),
    (answers.StepTiming, sessions.StepTiming, set()),
    (answers.StepAnswer, sessions.StepResponse, set()),
]


@pytest.mark.parametrize(("answer", "model", "extra"), PAIRS, ids=[a.__name__ for a, _, _ in PAIRS])
def test_answer_keys_are_the_response_models_fields(
    answer: Any, model: type[BaseModel], extra: set[str]
) -> None:
    keys = set(answer.__required_keys__) | set(answer.__optional_keys__)
    assert keys == set(model.model_fields) | extra
    # A field the model requires is always sent: the answer type requires it too. A
    # member the service adds beyond the model is sent only sometimes.
    required = {name for name, field in model.model_fields.items() if field.is_required()}
    assert required <= answer.__required_keys__
    assert not extra & answer.__required_keys__


def test_every_answer_type_is_checked() -> None:
    checked = {answer for answer, _, _ in PAIRS}
    typed = {getattr(answers, name) for name in answers.__all__}
    # Answers without a response model of their own: checked below.
    unchecked = {answers.ModelSpec, answers.Bucket, answers.BucketMetric, answers.MetricValue}
    assert typed - unchecked == checked


def test_model_spec_keys_are_the_request_models_fields() -> None:
    # A stored plan or session echoes its model as it was requested (MLP, transformer or
    # named), a session its MLP.
    fields: set[str] = set()
    for model in (meshes.MlpModel, hardware.TransformerModel, hardware.NamedModel):
        fields |= set(model.model_fields)
    assert set(answers.ModelSpec.__optional_keys__) == fields
    assert set(sessions.SessionModel.model_fields) <= fields


def test_buckets_are_the_documented_example() -> None:
    # JobHistory types buckets as dicts; its example (the contract's) names their members.
    extra: Any = jobs.JobHistory.model_config["json_schema_extra"]
    example = extra["examples"][1]
    bucket = example["buckets"][0]
    assert set(bucket) == set(answers.Bucket.__required_keys__)
    assert set(bucket["metrics"]["loss"]) == set(answers.BucketMetric.__required_keys__)
    assert set(example["points"][0]) <= set(answers.HistoryPoint.__annotations__)
