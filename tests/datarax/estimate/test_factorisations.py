"""The recommendation's search space: ordered factorisations, listed and counted."""

from __future__ import annotations

import math

import pytest

from datarax.errors import PlanError
from datarax.estimate.factorisations import (
    count_factorisations,
    factorisations,
    factorisations_with,
    fixed_sizes,
    search_space,
)


@pytest.mark.parametrize(("n", "parts"), [(1, 3), (12, 2), (256, 3), (360, 4), (97, 2)])
def test_the_count_is_the_length_of_the_list(n, parts):
    listed = factorisations(n, parts)
    assert count_factorisations(n, parts) == len(listed) == len(set(listed))
    assert all(math.prod(f) == n for f in listed)


def test_fixed_sizes_pin_axes_and_are_checked():
    names = ["data", "fsdp", "tensor"]
    assert factorisations_with(16, names, {"tensor": 4}) == [
        (1, 4, 4), (2, 2, 4), (4, 1, 4)]  # fmt: skip
    assert search_space(16, 2, names, {"tensor": 4}, {"fsdp": 1, "tensor": 1}) == 3 * 1
    with pytest.raises(PlanError) as caught:
        fixed_sizes(names, 16, {"tensor": 3}, "ici")
    assert caught.value.code == "axes_product_mismatch"
    with pytest.raises(PlanError) as caught:
        fixed_sizes(names, 16, {"model": 2}, "ici")
    assert caught.value.code == "invalid_axis_name"
