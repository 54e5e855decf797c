"""The registry of parallelism kinds: one home for every kind, names that cannot be
mistaken for one another, refusals that name the kinds."""

from __future__ import annotations

import pytest

from datarax.errors import PlanError
from datarax.launch.maxtext_config import AXIS_BY_ROLE, BATCH_AXES, MAXTEXT_MESH_AXES
from datarax.parallel.axis_roles import AXIS_ROLES, axis_roles, role_sizes
from datarax.parallel.kinds import KINDS, PRICED_KINDS, check_priced, kind_of_axis, kinds_by_alias


def test_every_name_claims_one_kind():
    names = [name for kind in KINDS.values() for name in kind.names()]
    assert len(names) == len(set(names))  # no name is two kinds
    assert set(kinds_by_alias()) == set(names)
    assert AXIS_ROLES == PRICED_KINDS == (
        "data", "fsdp", "tensor", "expert", "stage", "context", "sequence",
    )  # fmt: skip


def test_maxtext_axes_are_each_one_kind():
    axes = [axis for kind in KINDS.values() for axis in kind.maxtext_axes]
    assert sorted(axes) == sorted(MAXTEXT_MESH_AXES)
    # every MaxText axis named as an axis of ours takes the kind that lists it
    for kind in KINDS.values():
        for axis in kind.maxtext_axes:
            assert kind_of_axis(axis) is kind, axis
        assert AXIS_BY_ROLE[kind.name] == kind.maxtext_axes[0]
    # MaxText's activation_batch rule: data, fsdp, fsdp_transpose, expert
    assert BATCH_AXES == ["data", "fsdp", "fsdp_transpose", "expert"]


@pytest.mark.parametrize(
    ("name", "kind"),
    [("batch", "data"), ("replica", "data"), ("fsdp_transpose", "fsdp"), ("model", "tensor"),
     ("expert", "expert"), ("stage", "stage"), ("context_usp_ulysses", "ulysses"),
     ("context", "context"), ("context_autoregressive", "autoregressive"),
     ("tensor_sequence", "sequence")],
)  # fmt: skip
def test_aliases(name, kind):
    assert kind_of_axis(name).name == kind
    assert axis_roles([name]) == {name: kind}


def test_unknown_name_suggests_the_nearest_and_lists_kinds():
    with pytest.raises(PlanError) as caught:
        kind_of_axis("tensr")
    assert caught.value.code == "unknown_axis_role"
    assert "did you mean 'tensor'" in caught.value.message
    for name in KINDS:
        assert name in caught.value.message
    with pytest.raises(PlanError, match="role 'pipe' of axis 'x'"):
        kind_of_axis("x", "pipe")


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in PRICED_KINDS])
def test_unpriced_kinds_over_one_are_refused(kind):
    axes = {"fsdp": 8, "x": 4}
    roles = {"fsdp": "fsdp", "x": kind}
    with pytest.raises(PlanError) as caught:
        check_priced(axes, roles)
    assert caught.value.code == "invalid_parallelism" and f"{kind} parallelism" in str(caught.value)
    with pytest.raises(PlanError, match="invalid_parallelism|not price"):
        role_sizes(axes, roles)
    # size 1 is no parallelism: nothing to price
    assert role_sizes({"fsdp": 8, "x": 1}, roles) == {
        "data": 1,
        "fsdp": 8,
        "tensor": 1,
        "expert": 1,
        "stage": 1,
        "context": 1,
        "sequence": 1,
    }


def test_priced_kinds_carry_what_the_estimates_read():
    data, fsdp, tensor, expert, stage, context, sequence = (KINDS[k] for k in PRICED_KINDS)
    assert data.splits_batch and fsdp.splits_batch and not tensor.splits_batch
    assert expert.splits_batch  # as fsdp, in MaxText's rules
    assert (data.param_split, fsdp.param_split, tensor.param_split, expert.param_split) == (
        "none",
        "first_divisible",
        "tensor_dim",
        "expert_dim",
    )
    # stages split the layers; a context axis the sequence, its weights as fsdp (MaxText's
    # embed rule lists context beside fsdp)
    assert stage.param_split == "layer_dim" and not stage.splits_batch
    assert context.splits_sequence and not context.splits_batch
    assert context.param_split == "first_divisible"
    # sequence parallelism: the weights as tensor, the residual stream along the sequence
    assert sequence.param_split == "tensor_dim" and sequence.splits_stream
    assert not (sequence.splits_batch or sequence.splits_sequence)
    # every priced kind carries its collectives; the kinds with memory of their own, theirs
    assert all(KINDS[k].traffic is not None for k in PRICED_KINDS)
    assert [k for k in PRICED_KINDS if KINDS[k].memory is not None] == ["stage", "context"]
    assert all(kind.traffic is None for kind in KINDS.values() if not kind.priced)
    # the library's program builds every priced kind but sequence (stages as gpipe and
    # circular pipelines, context as all_gather); compile checks refuse the others
    built = [k for k, kind in KINDS.items() if kind.compiled]
    assert built == ["data", "fsdp", "tensor", "expert", "stage", "context"]
    for kind in KINDS.values():
        assert kind.summary
