"""What a point pushed, canonically: the digest that makes a retry a no-op, and the
signature every part of a multi-source step must share."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
import orjson

from app.services.jobs.decode import PointInput
from app.storage.part_blobs import row_hashes


def point_digests(
    names: Sequence[str],
    columns: Mapping[str, np.ndarray],
    weights: np.ndarray | None,
    ops: Mapping[str, str],
    nan_policy: str,
) -> list[str]:
    """What each point of a batch pushed, canonically, as text: ``"r"`` and 16 hex digits.

    ``columns``: each metric ``[P, ...]`` as the point decoded it (``[P]`` for a number),
    ``weights`` ``[P, n_devices]`` or None. One vectorised 64-bit hash of each point's
    arrays (:func:`app.storage.part_blobs.row_hashes`: bytes, dtypes, shapes), keyed by the
    metric names, the reduce ops and the NaN policy: no call per point. Digests stored
    before 2026-12-01 (32 hex digits) are not comparable; a retry of such a step is
    compared by its reduced values instead (:func:`app.storage.jobs.push`)."""
    order = sorted(names)
    every = {name: ops.get(name, "mean") for name in order}
    key = orjson.dumps([order, sorted(every.items()), nan_policy, weights is not None])
    salt = np.uint64(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little"))
    arrays = [np.asarray(columns[name]) for name in order]
    if weights is not None:
        arrays.append(np.asarray(weights, np.float64))
    count = len(next(iter(columns.values()))) if columns else 1
    hashed = row_hashes(arrays, count) ^ salt
    text = hashed.astype(">u8").tobytes().hex()
    return ["r" + text[i : i + 16] for i in range(0, len(text), 16)]


def point_digest(point: PointInput) -> str:
    """:func:`point_digests` of one point (the same digest as in any batch)."""
    names = list(point.metrics)
    columns = {name: np.asarray(point.metrics[name])[None, ...] for name in names}
    weights = None if point.weights is None else np.asarray(point.weights, np.float64)[None, :]
    return point_digests(names, columns, weights, point.reduce, point.nan_policy)[0]


def part_signature(
    metrics: Mapping[str, np.ndarray | np.generic], reduce: Mapping[str, str], nan_policy: str
) -> str:
    """A part's metric names, per-device shapes (None: a 0-d value) and options, as JSON
    text: what every part of a step must share (422 ``part_mismatch`` otherwise)."""
    shapes = {k: (None if v.ndim == 0 else list(v.shape[1:])) for k, v in metrics.items()}
    ops = {name: reduce.get(name, "mean") for name in metrics}
    return orjson.dumps(
        {"metrics": shapes, "reduce": ops, "nan_policy": nan_policy},
        option=orjson.OPT_SORT_KEYS,
    ).decode()
