"""Ordered factorisations of a device count over mesh axes, counted in closed form or
listed: the search space of :mod:`datarax.estimate.recommend`. Plain integers.

Example:
  >>> factorisations(4, 2), count_factorisations(16, 6)
  ([(1, 4), (2, 2), (4, 1)], 126)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from datarax.errors import PlanError

__all__ = [
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
