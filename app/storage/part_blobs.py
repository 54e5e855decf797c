"""Stored multi-source parts: the compact array format of ``job_segments.arrays`` and the
per-row content hashes that make a retried part a no-op.

A segment holds one source's parts of many steps, stacked: each metric ``[P, n_devices,
...]`` (and ``_weights`` ``[P, n_devices]``), written as :func:`encode_part` bytes.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Mapping, Sequence

import numpy as np
import orjson

from app.codecs.npz import load_npz

_PART_MAGIC = b"DRXP1\0"
"""Parts stored since 2026-12-01: magic, u32 header length, JSON header ``[[name, dtype,
shape], ...]``, then each array's C-order bytes. Older rows hold npz (``PK``...), still
read."""


def _part_header(names: Sequence[str], arrays: Sequence[np.ndarray]) -> bytes:
    header = orjson.dumps(
        [[n, a.dtype.str, list(a.shape)] for n, a in zip(names, arrays, strict=True)]
    )
    return _PART_MAGIC + len(header).to_bytes(4, "little") + header


def encode_part(arrays: Mapping[str, np.ndarray | np.generic]) -> bytes:
    """One part's arrays -> the stored bytes (compact: no per-array archive entries)."""
    values = [np.asarray(v) for v in arrays.values()]  # tobytes(): C order, 0-d kept
    return b"".join([_part_header(list(arrays), values), *(v.tobytes() for v in values)])


_CACHED_HEADER_BYTES = 4096
"""Part headers up to this size have their layout cached (1,024 of them: 4 MiB at most);
larger ones (up to 1,000 metrics with 250-character names) are parsed at each read."""


def _layout(header: bytes) -> tuple[tuple[str, np.dtype, tuple[int, ...], int, int], ...]:
    if len(header) <= _CACHED_HEADER_BYTES:
        return _layout_cached(header)
    return _parse_layout(header)


def _parse_layout(header: bytes) -> tuple[tuple[str, np.dtype, tuple[int, ...], int, int], ...]:
    out = []
    offset = len(_PART_MAGIC) + 4 + len(header)
    for name, dtype, shape in orjson.loads(header):
        kind = np.dtype(dtype)
        count = math.prod(shape)
        out.append((name, kind, tuple(shape), offset, count))
        offset += count * kind.itemsize
    return tuple(out)


_layout_cached = functools.lru_cache(maxsize=1024)(_parse_layout)


def decode_part(blob: bytes) -> dict[str, np.ndarray]:
    """Stored part bytes (compact, or npz from before) -> name -> array (read-only views)."""
    if not blob.startswith(_PART_MAGIC):
        return load_npz(blob, max_bytes=2**40)
    start = len(_PART_MAGIC)
    size = int.from_bytes(blob[start : start + 4], "little")
    out = {}
    for name, dtype, shape, offset, count in _layout(blob[start + 4 : start + 4 + size]):
        out[name] = np.frombuffer(blob, dtype, count, offset).reshape(shape)
    return out


_HASH_SEED = 0x6A09E667F3BCC908  # any fixed value: the hashes are stored, so never change it
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)  # splitmix64's finaliser constants
_MIX_2 = np.uint64(0x94D049BB133111EB)


_GAMMA = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment


_CACHED_KEY_WORDS = 1 << 17
"""Word keys kept for reuse: the first 131,072 positions (1 MiB), one array for every row
length (the keys of ``n`` words are the first ``n`` of any longer run). Rows longer than
that get the rest computed for the call and dropped after it, so memory never grows with
the lengths clients send (an lru_cache per length held 30-60 MB per new length)."""

_KEY_PREFIX: np.ndarray = np.zeros(0, dtype=np.uint64)


def _keys_of(start: int, stop: int) -> np.ndarray:
    counter = np.arange(start + 1, stop + 1, dtype=np.uint64) * _GAMMA + np.uint64(_HASH_SEED)
    return _mix_in_place(counter)


def _word_keys(words: int) -> np.ndarray:
    """One fixed 64-bit key per word position (so equal words at other positions differ):
    splitmix64's sequence from a fixed seed, plain arithmetic (the hashes are stored, so
    they must not depend on a random generator's version). Read-only."""
    global _KEY_PREFIX
    prefix = _KEY_PREFIX
    if words > len(prefix) and len(prefix) < _CACHED_KEY_WORDS:
        grown = min(_CACHED_KEY_WORDS, max(words, 2 * len(prefix), 1024))
        prefix = _keys_of(0, grown)
        prefix.flags.writeable = False
        _KEY_PREFIX = prefix  # one assignment: threads see the old prefix or the new one
    if words <= len(prefix):
        return prefix[:words]
    keys = np.concatenate([prefix, _keys_of(len(prefix), words)])
    keys.flags.writeable = False
    return keys


def row_hashes(columns: Sequence[np.ndarray], count: int | None = None) -> np.ndarray:
    """A 64-bit content hash of each row of ``columns`` (arrays with the same first axis,
    ``[P, ...]``): its bytes, dtypes and shapes. Vectorised (numpy, no call per row, no
    copy of the rows): every 64-bit word of a row is keyed by its position and mixed with
    splitmix64's finaliser, and the mixed words (and one per column for its dtype and row
    shape) are summed modulo 2**64. Equal rows hash equal; rows that differ
    in one word never collide (the mix is a bijection), in more about 2**-64 of the time.
    Not cryptographic: it tells a retry from a different part, not an attacker."""
    if not columns:  # rows of nothing (a point without metrics): all alike
        return np.zeros(count or 0, dtype=np.uint64)
    count = columns[0].shape[0]
    total = np.zeros(count, dtype=np.uint64)
    position = 0
    for column in columns:
        # The column's dtype and row shape, as one mixed word added to every row.
        head = f"{column.dtype.str}{list(column.shape[1:])}".encode()
        total += _mix(np.frombuffer(hashlib.blake2b(head, digest_size=8).digest(), "<u8"))
        raw = np.ascontiguousarray(column).view(np.uint8).reshape(count, -1)
        if raw.shape[1] % 8:
            pad = np.zeros((count, -raw.shape[1] % 8), np.uint8)
            raw = np.concatenate([raw, pad], axis=1)
        words = raw.view("<u8")  # [count, n]: no copy for 8-byte items
        keys = _word_keys(position + words.shape[1])[position:]
        total += _mix_in_place(words ^ keys).sum(axis=1, dtype=np.uint64)
        position += words.shape[1]
    return total


def _mix_in_place(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise, overwriting ``x`` (uint64), with one scratch
    array: no new array per step (``row_hashes`` mixes every word of a batch)."""
    scratch = np.right_shift(x, np.uint64(30))
    x ^= scratch
    x *= _MIX_1
    np.right_shift(x, np.uint64(27), out=scratch)
    x ^= scratch
    x *= _MIX_2
    np.right_shift(x, np.uint64(31), out=scratch)
    x ^= scratch
    return x


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, element-wise (a bijection of 64-bit words), on a copy."""
    return _mix_in_place(np.array(x, dtype=np.uint64))
