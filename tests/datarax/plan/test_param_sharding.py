"""Named parameter sharding rules (datarax.plan.param_sharding): the spec each rule gives
each shape, the warnings for what stays replicated, and the unknown rule. JAX-free: the
HTTP process plans with it."""

from __future__ import annotations

import pytest

from datarax.plan.param_sharding import param_partition_spec

RULE_CASES = [
    ("replicate", (16, 64), {"model": 4}, (None, None), None),
    ("model", (16, 64), {"data": 2, "model": 4}, (None, "model"), None),
    ("model", (64,), {"model": 4}, ("model",), None),
    ("model", (16, 6), {"model": 4}, ("model", None), None),
    ("model", (6, 6), {"model": 4}, (None, None), "divisible"),
    ("model", (16, 64), {"data": 8}, (None, None), "no 'model' axis"),
    ("fsdp", (16, 64), {"data": 4, "fsdp": 2}, ("fsdp", None), None),
    ("fsdp", (3, 64), {"fsdp": 2}, (None, "fsdp"), None),
    ("fsdp", (), {"fsdp": 2}, (), None),
]


@pytest.mark.parametrize(
    ("rule", "shape", "axes", "spec", "warning"),
    RULE_CASES,
    ids=[f"{c[0]}-{c[1]}-{'x'.join(c[2])}" for c in RULE_CASES],
)
def test_param_partition_spec(rule, shape, axes, spec, warning):
    got, warn = param_partition_spec(shape, axes, rule, "p")
    assert got == spec
    if warning is None:
        assert warn is None
    else:
        assert warning in warn


def test_unknown_rule_is_value_error():
    with pytest.raises(ValueError, match="unknown param_sharding"):
        param_partition_spec((4, 4), {"model": 2}, "tensor")
