"""Axis roles (datarax.parallel.axis_roles): roles by name or given, the parameter
shardings they give, and the batch split over data x fsdp."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.parallel.axis_roles import (
    AXIS_ROLES,
    axis_roles,
    check_tensor_split,
    param_specs,
    role_axes,
    role_sizes,
    tokens_per_device,
)
from datarax.specs.model_specs import model_spec

MLP = model_spec({"kind": "mlp", "features": [16, 64, 16]})
TRANSFORMER = model_spec({"kind": "transformer", "layers": 2, "d_model": 64, "d_ff": 256,
                          "heads": 4, "kv_heads": 4, "vocab": 128, "seq_len": 32})  # fmt: skip


def test_roles_follow_names_or_what_is_given():
    assert axis_roles(["batch", "fsdp", "model"]) == {
        "batch": "data", "fsdp": "fsdp", "model": "tensor",
    }  # fmt: skip
    assert axis_roles(["x", "y"], {"x": "data", "y": "tensor"}) == {"x": "data", "y": "tensor"}
    assert set(AXIS_ROLES) == {"data", "fsdp", "tensor", "expert", "stage", "context", "sequence"}


@pytest.mark.parametrize(
    ("names", "roles", "says"),
    [(["x"], None, "'x' is not a parallelism kind"), (["data"], {"data": "pipe"}, "'pipe'"),
     (["data"], {"other": "data"}, "does not have")],
    ids=["nameless", "unknown-role", "extra-axis"],
)  # fmt: skip
def test_unknown_roles_are_refused(names, roles, says):
    with pytest.raises(PlanError) as caught:
        axis_roles(names, roles)
    assert caught.value.code == "unknown_axis_role" and says in caught.value.message


def test_sizes_and_axes_by_role():
    axes = {"data": 2, "fsdp": 4, "tensor": 1, "replica": 3}
    roles = axis_roles(list(axes))
    assert role_sizes(axes, roles) == {
        "data": 6, "fsdp": 4, "tensor": 1, "expert": 1, "stage": 1, "context": 1, "sequence": 1,
    }  # fmt: skip
    assert role_axes(axes, roles, "data") == ("data", "replica")
    assert role_axes(axes, roles, "tensor") == ()  # size-1 axes split nothing


def test_param_specs_split_tensor_dim_then_fsdp():
    axes = {"fsdp": 2, "tensor": 4}
    specs = {g.path: (spec, shard, split) for g, spec, shard, split in
             param_specs(MLP, axes, axis_roles(list(axes)))}  # fmt: skip
    # the first (col) kernel splits its output over tensor and its input over fsdp
    assert specs["layers/0/kernel"] == (("fsdp", "tensor"), (8, 16), True)
    # the second (row) kernel splits its input over tensor
    assert specs["layers/1/kernel"][0][0] == "tensor"


def test_batch_and_tensor_checks_carry_codes():
    assert tokens_per_device(TRANSFORMER, 8, 4) == 2 * 32
    with pytest.raises(PlanError) as caught:
        tokens_per_device(TRANSFORMER, 6, 4)
    assert caught.value.code == "batch_not_divisible" and "use 4 or 8" in caught.value.message
    with pytest.raises(PlanError) as caught:
        check_tensor_split(TRANSFORMER, 3)
    assert caught.value.code == "tensor_not_divisible"
    check_tensor_split(TRANSFORMER, 4)
    check_tensor_split(MLP, 3)  # an MLP's tensor split is checked per parameter instead
