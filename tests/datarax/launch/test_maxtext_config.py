"""MaxText's facts at the pinned commit (datarax.launch.maxtext_config): its named models
against ours, its command-line values, and its mesh-axis key stems."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.launch.maxtext_config import (
    MAXTEXT_MESH_AXES,
    MAXTEXT_MODELS,
    MESH_AXIS_STEM,
    ORDER_KEYS,
    format_value,
    parse_maxtext_args,
    parse_value,
)
from datarax.specs.named_models import MODELS, named_model


def test_every_named_model_has_maxtext_figures():
    assert set(MAXTEXT_MODELS) == set(MODELS)
    for name, entry in MAXTEXT_MODELS.items():
        ours = named_model(name)
        pairs = entry.get("layers_per_decoder_layer", 1)
        assert entry["base_num_decoder_layers"] * pairs == ours["layers"], name
        assert entry["base_emb_dim"] == ours["d_model"] and entry["vocab_size"] == ours["vocab"]
        assert entry["logits_via_embedding"] == ours["tied_embeddings"], name


def test_parse_maxtext_args():
    parsed = parse_maxtext_args(["a=1", "b=0.5", "c=true", "d=[x,y]", "e=bf16", "f=''", "g=1e-5"])
    assert parsed == {"a": 1, "b": 0.5, "c": True, "d": ["x", "y"], "e": "bf16", "f": "",
                      "g": 1e-5}  # fmt: skip
    with pytest.raises(PlanError) as error:
        parse_maxtext_args(["novalue"])
    assert error.value.code == "invalid_maxtext_config"


def test_each_mesh_axis_reads_its_key_stem():
    # create_device_mesh's ici_map: stage reads ici_pipeline_parallelism, the rest their name
    assert MESH_AXIS_STEM["stage"] == "pipeline"
    assert all(MESH_AXIS_STEM[a] == a for a in MAXTEXT_MESH_AXES if a != "stage")
    assert list(ORDER_KEYS["mesh_axes"]) == list(MAXTEXT_MESH_AXES)


@pytest.mark.parametrize(
    ("value", "text"),
    [(True, "true"), (2.0, "2"), (0.5, "0.5"), (["silu", "linear"], "[silu,linear]"), (7, "7")],
    ids=["bool", "whole-float", "float", "list", "int"],
)
def test_values_format_as_maxtexts_command_line_reads_them_back(value, text):
    assert format_value(value) == text
    assert parse_value(text) == value
