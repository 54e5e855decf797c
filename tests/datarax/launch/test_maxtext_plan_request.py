"""MaxText's keys to a POST /v1/meshes body (datarax.launch.maxtext_plan_request): what is
refused and named, what is ignored and noted. Round trips through MaxText's own device mesh
are in test_launch_maxtext.py."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.launch.maxtext_plan_request import plan_request_from_maxtext
from tests.datarax.launch.test_maxtext import _layout

REFUSALS = [
    ("ulysses", {"ici_context_usp_ulysses_parallelism": 2}, "invalid_parallelism",
     "ici_context_usp_ulysses"),
    ("cp-strategy", {"ici_context_parallelism": 4, "context_parallel_strategy": "usp"},
     "invalid_parallelism", "context_parallel_strategy"),
    ("moe-override", {"model_name": "mixtral-8x7b", "num_experts": 4},
     "invalid_maxtext_config", "override_model_config"),
    ("attention-type", {"base_emb_dim": 1024, "attention_type": "local_sliding"},
     "invalid_maxtext_config", "attention_type"),
    ("moe-count", {"base_emb_dim": 1024, "num_experts": 0}, "invalid_maxtext_config",
     "num_experts"),
    ("diloco", {"dcn_diloco_parallelism": 2}, "invalid_parallelism", "dcn_diloco"),
    ("typo", {"ici_fdsp_parallelism": 4}, "invalid_maxtext_config", "ici_fdsp"),
    ("bad-size", {"ici_tensor_parallelism": 0}, "invalid_maxtext_config", "ici_tensor"),
    ("custom-mesh", {"custom_mesh": "hybrid_ring_64x4"}, "invalid_maxtext_config", "custom_mesh"),
    ("slices", {"num_slices": 4}, "invalid_maxtext_config", "num_slices"),
    ("model-name", {"model_name": "qwen3-8b"}, "invalid_maxtext_config", "qwen3-8b"),
    ("override", {"model_name": "llama2-7b", "base_emb_dim": 1024}, "invalid_maxtext_config",
     "override_model_config"),
    ("mlp", {"base_emb_dim": 1024, "mlp_activations": ["silu", "silu"]},
     "invalid_maxtext_config", "mlp_activations"),
    ("attention", {"base_emb_dim": 1024, "attention": "paged"}, "invalid_maxtext_config",
     "attention"),
    ("remat", {"base_emb_dim": 1024, "remat_policy": "everything"}, "invalid_maxtext_config",
     "remat_policy"),
    ("batch", {"per_device_batch_size": 0.1}, "invalid_maxtext_config", "per_device_batch_size"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "code", "named"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS]
)
def test_refusals_name_the_key(keys, code, named):
    with pytest.raises(PlanError) as error:
        plan_request_from_maxtext(keys, hardware="tpu-v5e", topology="4x4", slices=2)
    assert error.value.code == code and named in error.value.message


def test_pipeline_context_and_zero1_keys_are_read():
    notes: list[str] = []
    body = plan_request_from_maxtext(
        {"ici_pipeline_parallelism": 2, "ici_context_parallelism": 2, "ici_fsdp_parallelism": 4,
         "num_pipeline_microbatches": 4, "context_parallel_strategy": "ring",
         "shard_optimizer_over_data": True, "opt_type": "adamw"},
        hardware="tpu-v5e", topology="4x4", notes=notes,
    )  # fmt: skip
    assert body["ici"]["stage"] == 2 and body["ici"]["context"] == 2
    # MaxText's pipeline is circular, one layer a pass unless told otherwise
    assert body["pipeline"] == {"schedule": "circular", "layers_per_stage": 1, "microbatches": 4}
    assert body["context_parallel"] == {"strategy": "ring", "load_balance": True}
    assert body["optimizer"] == {"name": "adamw", "shard_over_data": True}
    # without their axes the keys are noted, not read as anything else
    notes = []
    body = plan_request_from_maxtext(
        {"num_pipeline_microbatches": 4, "context_parallel_strategy": "ring"},
        hardware="tpu-v5e", topology="4x4", notes=notes,
    )  # fmt: skip
    assert "pipeline" not in body and "context_parallel" not in body
    assert any("no pipeline stages" in n for n in notes)
    assert any("no context axis" in n for n in notes)


def test_unknown_keys_are_ignored_and_noted():
    notes: list[str] = []
    body = plan_request_from_maxtext(
        {"steps": 10, "run_name": "x", "ici_sequence_parallelism": 2, "dcn_data_parallelism": 4},
        hardware="tpu-v5e",
        topology="2x2",
        notes=notes,
    )
    assert body["slices"] == 4 and "model" not in body and "batch_shape" not in body
    assert any("'run_name'" in n and "'steps'" in n for n in notes)
    assert any("ici_sequence_parallelism" in n for n in notes)
    assert _layout(body).axes["data"] == 4 and _layout(body).axes["fsdp"] == 4
