"""Ordered factorisations of a device count over mesh axes, counted in closed form or
listed: the search space of :mod:`datarax.estimate.recommend`. Plain integers.

Example:
  >>> factorisations(4, 2), count_factorisations(16, 6)
  ([(1, 4), (2, 2), (4, 1)], 126)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from datarax.errors import PlanError

__all__ = [
    "WORK_UNIT_GROUPS",
    "SearchSpaceTooLarge",
    "budget_limit",
    "count_factorisations",
    "count_with",
    "factorisations",
    "factorisations_with",
    "fixed_sizes",
    "search_space",
]


def _prime_exponents(n: int) -> list[int]:
    exponents = []
    p = 2
    while p * p <= n:
        e = 0
        while n % p == 0:
            n //= p
            e += 1
        if e:
            exponents.append(e)
        p += 1 if p == 2 else 2
    if n > 1:
        exponents.append(1)
    return exponents


def count_factorisations(n: int, parts: int) -> int:
    """``len(factorisations(n, parts))`` without listing them.

    Each prime ``p`` with ``p**e`` in ``n`` spreads its ``e`` copies over the ``parts``
    slots on its own ("stars and bars": ``C(e + parts - 1, parts - 1)`` ways), so the
    count is the product over primes. ``parts == 0`` counts the empty tuple when
    ``n == 1``.

    >>> count_factorisations(4, 2), count_factorisations(16, 6), count_factorisations(1, 0)
    (3, 126, 1)
    """
    if parts == 0:
        return 1 if n == 1 else 0
    return math.prod(math.comb(e + parts - 1, parts - 1) for e in _prime_exponents(n))


def fixed_sizes(
    names: Sequence[str], n: int, fixed: Mapping[str, int] | None, what: str
) -> dict[str, int]:
    """``fixed`` checked against the axes and the devices it splits."""
    fixed = dict(fixed or {})
    for name, size in fixed.items():
        if name not in names:
            raise PlanError(
                "invalid_axis_name",
                f"fixed_{what} names {name!r}, which is not one of the axes {list(names)}",
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise PlanError(
                "invalid_axis_size",
                f"fixed_{what}[{name!r}] is {size!r}; give an integer >= 1",
            )
    product = math.prod(fixed.values())
    if n % product or (len(fixed) == len(names) and product != n):
        verb = "equal" if len(fixed) == len(names) else "divide"
        unit = "devices of one slice or domain" if what == "ici" else "slices or domains"
        raise PlanError(
            "axes_product_mismatch",
            f"fixed_{what} {fixed} multiplies to {product}, which does not {verb} the {n} {unit}",
        )
    return fixed


def count_with(n: int, names: Sequence[str], fixed: Mapping[str, int]) -> int:
    return count_factorisations(n // math.prod(fixed.values()), len(names) - len(fixed))


def factorisations_with(
    n: int, names: Sequence[str], fixed: Mapping[str, int]
) -> list[tuple[int, ...]]:
    """Every ordered factorisation of ``n`` over ``names`` whose ``fixed`` axes have the
    fixed sizes, in the order of :func:`factorisations` over the free axes."""
    free = [i for i, name in enumerate(names) if name not in fixed]
    if not free:
        return [tuple(fixed[name] for name in names)]
    out = []
    for sizes in factorisations(n // math.prod(fixed.values()), len(free)):
        full = [fixed.get(name, 0) for name in names]
        for i, size in zip(free, sizes, strict=True):
            full[i] = size
        out.append(tuple(full))
    return out


def search_space(
    n_ici: int,
    n_dcn: int,
    names: Sequence[str],
    fixed_ici: Mapping[str, int] | None = None,
    fixed_dcn: Mapping[str, int] | None = None,
) -> int:
    """Candidates a recommendation prices: ICI factorisations x DCN factorisations.

    >>> search_space(16, 64, ["data", "fsdp", "tensor", "batch", "replica", "model"])
    58212
    """
    return count_with(n_ici, names, dict(fixed_ici or {})) * count_with(
        n_dcn, names, dict(fixed_dcn or {})
    )


def factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered tuple of ``parts`` positive ints whose product is ``n``.

    >>> factorisations(4, 2)
    [(1, 4), (2, 2), (4, 1)]
    """
    if parts == 1:
        return [(n,)]
    out = []
    for first in range(1, n + 1):
        if n % first == 0:
            out += [(first, *rest) for rest in factorisations(n // first, parts - 1)]
    return out


WORK_UNIT_GROUPS = 16
"""A recommendation's budget (``DATARAX_MAX_SEARCH_SPACE``) counts units of work, one unit
being the pricing of one candidate of a model with at most this many parameter groups (a
dense or mixture-of-experts transformer has 10 to 16). Pricing a candidate walks every
parameter group once per axis and prices the layers in closed form, so its work grows with
the groups (an MLP has two a layer, DeepSeek-V3 31) and not with the layers: measured on
the 2-core dev box, 0.25 ms for 12 groups, 0.9 ms for 31, 3.8 ms for 128."""


def budget_limit(max_units: int, groups: int) -> int:
    """The candidates of a model of ``groups`` parameter groups that ``max_units`` units of
    work price: each costs ``max(1, groups / WORK_UNIT_GROUPS)`` units.

    Example:
      >>> budget_limit(20_000, 12), budget_limit(20_000, 31), budget_limit(20_000, 128)
      (20000, 10322, 2500)
    """
    return max_units * WORK_UNIT_GROUPS // max(WORK_UNIT_GROUPS, groups)


class SearchSpaceTooLarge(PlanError):
    """A recommendation whose search space passes the limit, refused before it starts.

    Attributes:
      count: candidates (ordered ``(ici, dcn)`` factorisations) the request would price.
      limit: the most allowed for this model (:func:`budget_limit`).
      suggestions: changes to the request that shrink the space, each ``{"change",
        "request": {member: value}, "search_space": n}``, smallest change first.
      groups: the model's parameter groups (what one candidate's work grows with).
    """

    def __init__(self, count: int, limit: int, suggestions: list[dict[str, Any]], groups: int = 0):
        shrink = "; ".join(f"{s['change']}: {s['search_space']}" for s in suggestions)
        cost = ""
        if groups > WORK_UNIT_GROUPS:
            cost = (
                f"; a candidate of this model ({groups} parameter groups) costs "
                f"{groups / WORK_UNIT_GROUPS:.3g} units of work, a usual transformer's 1"
            )
        super().__init__(
            "search_space_too_large",
            f"the request spans {count} (ici, dcn) candidates; at most {limit} are searched "
            f"(DATARAX_MAX_SEARCH_SPACE{cost}). Shrink it: {shrink or 'fewer devices'}",
        )
        self.count = count
        self.limit = limit
        self.suggestions = suggestions
        self.groups = groups

    def __reduce__(
        self,
    ) -> tuple[type[SearchSpaceTooLarge], tuple[int, int, list[dict[str, Any]], int]]:
        return (type(self), (self.count, self.limit, self.suggestions, self.groups))
