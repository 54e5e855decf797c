"""Model specs (datarax.specs.model_specs): fields beside a name, the checks and their
codes, MaxText's remat placements; MLP and transformer parameter counts."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.specs.model_specs import (
    MAXTEXT_REMAT,
    REMAT_TENSORS,
    MLPSpec,
    TransformerSpec,
    model_spec,
)
from tests.datarax.estimate.test_named_models import OFFLOADED_8B


def test_fields_beside_a_name_override_the_entry():
    spec = model_spec({"name": "llama2-7b", "seq_len": 2048, "remat": "full"})
    assert (spec.seq_len, spec.remat, spec.d_model) == (2048, "full", 4096)
    assert spec.to_json()["name"] == "llama2-7b"
    # the resolved spec round-trips: a plan stores it and a compile check takes it back
    assert model_spec(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("model", "code", "says"),
    [
        ({"name": "llama9"}, "unknown_model", "GET /v1/models"),
        ({"name": "llama2-7b", "remat": "most"}, "invalid_model", "minimal"),
        ({"name": "llama2-7b", "remat_custom": {"context": "offload"}}, "invalid_model", "custom"),
        (
            {"name": "llama2-7b", "remat": "custom", "remat_custom": {"ctx": "offload"}},
            "invalid_model",
            "decoder_layer_input",
        ),
        (
            {"name": "llama2-7b", "remat": "custom", "remat_custom": {"context": "disk"}},
            "invalid_model",
            "offload",
        ),
        ({"name": "llama2-7b", "vocab_tiling": 0}, "invalid_model", "vocab_tiling"),
        ({"name": "llama2-7b", "vocab_tiling": 3}, "invalid_model", "divide seq_len"),
        ({"name": "llama2-7b", "attention": "ring"}, "invalid_model", "flash"),
        ({"name": "llama2-7b", "param_dtype": "int8"}, "invalid_model", "float32"),
    ],
    ids=["name", "remat", "custom-without-custom", "tensor", "place", "tiling", "tiling-3",
         "attention",
         "param-dtype"],
)  # fmt: skip
def test_bad_model_fields_carry_codes(model, code, says):
    with pytest.raises(PlanError) as err:
        model_spec(model)
    assert err.value.code == code
    assert says in err.value.message


def test_remat_places_follow_maxtext():
    assert model_spec({"name": "llama2-7b"}).remat_places() is None  # no checkpoint at all
    full = model_spec({"name": "llama2-7b", "remat": "full"}).remat_places()
    assert {n for n, w in full.items() if w != "remat"} == {"decoder_layer_input"}
    kept = model_spec({"name": "llama2-7b", "remat": "save_dot_except_mlp"}).remat_places()
    assert {n for n, w in kept.items() if w == "device"} == {
        "decoder_layer_input", "query_proj", "key_proj", "value_proj", "qkv_proj", "out_proj",
    }  # fmt: skip
    off = model_spec({"name": "llama2-7b", "remat": "qkv_proj_offloaded"}).remat_places()
    assert {n for n, w in off.items() if w == "offload"} == {"query_proj", "key_proj", "value_proj"}
    custom = model_spec(OFFLOADED_8B).remat_places()
    assert custom["decoder_layer_input"] == "offload" and custom["mlpwi_0"] == "remat"
    assert set(custom) == set(REMAT_TENSORS)
    assert {"none", "minimal", "full", "custom"} <= set(MAXTEXT_REMAT)


def test_mlp_spec_counts_its_parameters_and_tokens():
    spec = model_spec({"kind": "mlp", "features": [8, 32, 4]})
    assert isinstance(spec, MLPSpec) and spec.kind == "mlp" and spec.tokens_per_example == 1
    assert spec.matmul_params() == 8 * 32 + 32 + 32 * 4 + 4  # kernels and biases
    assert [g.shape for g in spec.params()] == [(8, 32), (32,), (32, 4), (4,)]
    assert model_spec(spec.to_json()) == spec


def test_transformer_spec_defaults_and_token_count():
    spec = model_spec({"kind": "transformer", "layers": 2, "d_model": 64, "d_ff": 256,
                       "heads": 4, "kv_heads": 2, "vocab": 100, "seq_len": 16})  # fmt: skip
    assert isinstance(spec, TransformerSpec) and spec.head_dim == 16
    assert spec.tokens_per_example == 16 and spec.dtype == "bfloat16"
    assert spec.batch_shape(8) == [8, 16]
