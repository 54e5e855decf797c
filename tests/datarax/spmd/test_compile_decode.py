"""The serving program compiled for a TPU topology through libtpu (no TPU attached): one
KV-cached decode step's XLA memory against the serving estimate's weights + KV cache
(issue 57, item 5). Tiny models, so each compile takes about a second."""

from __future__ import annotations

import numpy as np
import pytest
from jax.sharding import Mesh

from datarax.errors import PlanError
from datarax.estimate.serving_memory import ServingOptions, serving_capacity, serving_layout
from datarax.hardware.chips import get_hardware
from datarax.specs.model_specs import model_spec
from datarax.spmd.compile_decode import compile_decode_step
from datarax.spmd.compile_step import tpu_topology_devices
from tests.datarax.spmd.test_compile_step import _require_libtpu

TINY = {"kind": "transformer", "layers": 2, "d_model": 256, "d_ff": 512, "heads": 8,
        "kv_heads": 4, "vocab": 1024, "seq_len": 128}  # fmt: skip
TINY_MLA = {**TINY, "attention_type": "mla", "kv_heads": 8, "q_lora_rank": 0,
            "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32,
            "v_head_dim": 32}  # fmt: skip
TINY_MOE = {**TINY, "num_experts": 4, "experts_per_token": 2, "moe_d_ff": 256}


def _mesh(axes):
    _require_libtpu()
    devices = tpu_topology_devices("tpu-v5e", "2x2")
    return Mesh(np.array(devices).reshape(*axes.values()), tuple(axes))


@pytest.mark.parametrize("model", [TINY, TINY_MOE, TINY_MLA], ids=["gqa", "moe", "mla"])
def test_decode_step_memory_is_the_serving_estimate(model):
    axes = {"data": 2, "tensor": 2}
    roles = {a: a for a in axes}
    mesh = _mesh(axes)
    spec = model_spec(model)
    options = ServingOptions(input_tokens=384, output_tokens=128, max_batch=16)
    layout = serving_layout(spec, axes, roles)
    capacity = serving_capacity(spec, get_hardware("tpu-v5e"), layout, options)
    assert capacity.batch == 16
    xla = compile_decode_step(spec, mesh, roles, 16, options.sequence_tokens)
    memory = xla.memory
    assert xla.weights_bytes == capacity.memory.weights
    # XLA's arguments: the weights, the donated cache (in the layout XLA picks, TPU's
    # tiles included) and the tokens; the estimate's weights + KV cache within 1%
    estimate = capacity.memory.weights + capacity.memory.kv_cache
    assert abs(estimate - memory["argument_bytes"]) <= 0.01 * memory["argument_bytes"]
    assert memory["alias_bytes"] >= xla.cache_bytes  # the new cache is the old one
    # the cache is updated in place: no second copy of it among the temporaries
    assert memory["temp_bytes"] < xla.cache_bytes / 2


def test_quantized_weights_are_refused_with_the_reason():
    mesh = _mesh({"tensor": 4})
    with pytest.raises(PlanError, match="quantized matmul") as error:
        compile_decode_step(model_spec(TINY), mesh, {"tensor": "tensor"}, 1, 16,
                            weight_dtype="int8")  # fmt: skip
    assert error.value.code == "compile_target_unavailable"
