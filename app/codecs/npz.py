"""npz bodies in and out: ``np.savez`` archives <-> numpy, never unpickling anything.

Used by the HTTP process for metrics and training batches alike.

In: member names must be printable and unique (``invalid_npz``); the archive's
decompressed size is checked against the body limit first (a small zip may inflate
enormously); shapes numpy cannot hold are refused (``check_array_shape``:
``invalid_tensor``; claims past the body stay 413 or ``invalid_npz``); dtypes are bool,
integers up to 64 bits and float16/32/64 (``unsupported_datatype``: no float128, whose
values JSON answers cannot hold). An uncompressed archive (``np.savez``) is read in
place, its arrays read-only views into the body; anything else goes through ``np.load``
with ``allow_pickle=False``, which owns the error messages.

Out: ``encode_npz`` (:mod:`datarax.npz`, shared with the client) writes the stored
archive ``np.savez`` writes, assembled directly (see its docstring and
docs/ARCHITECTURE.md for why it is kept by hand).
"""

from __future__ import annotations

import functools
import io
import math
import struct
import zipfile
from typing import Any

import numpy as np
from isal.isal_zlib import crc32  # zlib's CRC-32, about 6x faster (8 ms -> 1.3 ms for 32 MB)

from app.codecs.json_arrays import MAX_ARRAY_DIMS, check_array_shape
from app.core.errors import InvalidNpz, PayloadTooLarge, UnsupportedDatatype
from datarax.npz import encode_npz

__all__ = ["encode_npz", "load_npz"]


def load_npz(body: bytes, *, max_bytes: int) -> dict[str, np.ndarray]:
    """Reads an ``np.savez`` / ``np.savez_compressed`` body without unpickling anything.

    Args:
      body: the raw request body.
      max_bytes: the largest total decompressed size accepted.

    Returns:
      name -> array, including ``_weights`` when present.

    Raises:
      InvalidNpz: not a zip archive, a member that is not a ``.npy`` array, an object
        (pickled) array, a corrupt member, or no arrays at all.
      PayloadTooLarge: the arrays decompress to more than ``max_bytes``.
      UnsupportedDatatype: a dtype other than bool, integers and floats.
    """
    if not body:
        raise InvalidNpz("the body is empty; send the bytes np.savez writes")
    try:
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as err:
        raise InvalidNpz(
            f"the body is not an npz archive ({err}); write it with numpy.savez(buffer, "
            "loss=..., step=...)"
        ) from None
    _check_member_names(members)
    inflated = sum(member.file_size for member in members)
    if inflated > max_bytes:
        raise PayloadTooLarge(
            f"the npz arrays decompress to {inflated} bytes, above the limit of {max_bytes} bytes"
        )
    arrays = _stored_arrays(body, members)
    if arrays is None:
        _check_claimed_sizes(body, members, max_bytes)
        arrays = _np_load(body)
    if not arrays:
        raise InvalidNpz("the npz holds no arrays; send at least one metric")
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray):
            # NpzFile hands back the raw bytes of a member that is not a .npy file.
            raise InvalidNpz(f"npz member {name!r} is not a .npy array; write it with np.savez")
        if array.dtype.kind not in "biuf" or array.dtype.itemsize > 8:
            raise UnsupportedDatatype(
                f"npz array {name!r} has dtype {array.dtype}; send bool, integer (up to 64 "
                "bits) or float16/32/64 arrays (convert bfloat16 to float32, float128 to "
                "float64)"
            )
    return arrays


def _check_member_names(members: list[zipfile.ZipInfo]) -> None:
    """Refuses member names that would not name the array they hold.

    ``zipfile`` cuts a name at its first NUL (``a\x00b.npy`` would be read as ``a``),
    and two members may carry the same name (the second would silently replace the
    first); names with other control characters cannot be shown in an answer or a log
    line as sent. All are ``invalid_npz``.
    """
    seen: set[str] = set()
    for member in members:
        raw = member.orig_filename
        if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in raw):
            raise InvalidNpz(
                f"npz member name {raw!r} holds a NUL or control character; name each "
                "array with printable characters (np.savez(buffer, loss=...))"
            )
        if member.filename in seen:
            raise InvalidNpz(
                f"npz member {member.filename!r} appears twice; each array needs its own name"
            )
        seen.add(member.filename)


_ZIP_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name length, extra length
_NPY_HEADER_BYTES = 16384  # above numpy's own limit on .npy header size (10,000)


def _npy_header_size(data: memoryview) -> int:
    """Bytes of the ``.npy`` header at the start of ``data`` (magic, version, length and
    the header text), as far as ``data`` holds them."""
    if len(data) >= 12 and data[6] == 2:  # version 2.0: a 4-byte length
        return min(len(data), 12 + int.from_bytes(data[8:12], "little"))
    if len(data) >= 10:
        return min(len(data), 10 + int.from_bytes(data[8:10], "little"))
    return len(data)


@functools.lru_cache(maxsize=512)
def _npy_header(raw: bytes) -> tuple[tuple[int, ...], bool, np.dtype, int] | None:
    """``(shape, fortran_order, dtype, data offset)`` of a ``.npy`` header, or None.
    Cached (512 headers of at most ``_NPY_HEADER_BYTES``: 8 MiB at most): a client sends
    the same few headers again and again, and numpy parses each with
    ``ast.literal_eval`` (~40 us)."""
    header = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(header)
        if version == (1, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(header)
        elif version == (2, 0):
            shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(header)
        else:
            return None
    except ValueError:
        return None
    return shape, fortran_order, dtype, header.tell()


def _stored_arrays(body: bytes, members: list[zipfile.ZipInfo]) -> dict[str, Any] | None:
    """Zero-copy arrays of an uncompressed npz (what ``np.savez`` writes), or None.

    Every member must be a stored (not deflated), unencrypted ``.npy`` file whose CRC
    matches and whose header is a plain numeric array; the arrays are then read-only views
    into ``body``, with no copy and no allocation. Anything else returns None and is read
    by ``np.load``, which owns every error message.
    """
    view = memoryview(body)
    arrays: dict[str, Any] = {}
    for member in members:
        name = member.filename
        if (
            member.compress_type != zipfile.ZIP_STORED
            or member.flag_bits & 0x1
            or not name.endswith(".npy")
            or member.compress_size != member.file_size
        ):
            return None
        try:
            signature, name_size, extra_size = _ZIP_LOCAL_HEADER.unpack_from(
                body, member.header_offset
            )
        except struct.error:
            return None
        start = member.header_offset + _ZIP_LOCAL_HEADER.size + name_size + extra_size
        data = view[start : start + member.file_size]
        if signature != b"PK\x03\x04" or len(data) != member.file_size:
            return None
        if crc32(data) != member.CRC:
            return None
        size = _npy_header_size(data)
        if size > _NPY_HEADER_BYTES:  # np.load says what is wrong; the cache stays small
            return None
        parsed = _npy_header(bytes(data[:size]))
        if parsed is None:
            return None
        shape, fortran_order, dtype, offset = parsed
        _check_npz_shape(name, shape, dtype)
        count = math.prod(shape)
        if dtype.hasobject or offset + count * dtype.itemsize != member.file_size:
            return None
        flat = np.frombuffer(body, dtype=dtype, count=count, offset=start + offset)
        # Fortran order as np.lib.format.read_array reads it.
        arrays[name[:-4]] = (
            flat.reshape(shape[::-1]).transpose() if fortran_order else flat.reshape(shape)
        )
    return arrays


def _check_npz_shape(filename: str, shape: tuple[int, ...], dtype: np.dtype) -> None:
    """:func:`check_array_shape` for the claims the size checks cannot refuse: more than
    64 dimensions, and empty arrays (zero bytes claimed, whatever the other sizes). A
    non-empty claim beyond the body stays 413 ``payload_too_large`` or ``invalid_npz``
    (:func:`_check_claimed_sizes`)."""
    if len(shape) > MAX_ARRAY_DIMS or 0 in shape:
        check_array_shape("npz array", filename.removesuffix(".npy"), shape, dtype.itemsize)


def _check_claimed_sizes(body: bytes, members: list[zipfile.ZipInfo], max_bytes: int) -> None:
    """Refuses an archive whose ``.npy`` headers claim more than it can hold, before
    ``np.load`` allocates what they claim (a 100-byte member may claim shape (2**40,)).

    Raises:
      PayloadTooLarge: the claimed arrays add up to more than ``max_bytes``.
      InvalidNpz: a member claims more data than it holds.
    """
    claimed_total = 0
    with zipfile.ZipFile(io.BytesIO(body)) as archive:
        for member in members:
            if not member.filename.endswith(".npy"):
                continue  # np.load hands it back as bytes; load_npz refuses it
            try:
                with archive.open(member) as stream:
                    header = io.BytesIO(stream.read(_NPY_HEADER_BYTES))
                version = np.lib.format.read_magic(header)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _, dtype = read_header(header, max_header_size=_NPY_HEADER_BYTES)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError):
                continue  # np.load explains what is wrong with this member
            if dtype.hasobject:
                continue  # refused by np.load (allow_pickle=False) with its own message
            _check_npz_shape(member.filename, shape, dtype)
            claimed = math.prod(shape) * dtype.itemsize
            claimed_total += claimed
            if claimed_total > max_bytes:
                raise PayloadTooLarge(
                    f"npz member {member.filename!r} claims shape {tuple(shape)} of {dtype} "
                    f"({claimed} bytes); the arrays would exceed the limit of {max_bytes} "
                    "bytes (DATARAX_MAX_BODY_MB)"
                )
            if claimed > member.file_size:
                raise InvalidNpz(
                    f"npz member {member.filename!r} claims shape {tuple(shape)} of {dtype} "
                    f"({claimed} bytes) but holds {member.file_size} bytes"
                )


def _np_load(body: bytes) -> dict[str, Any]:
    """Every member through ``np.load`` (compressed archives, odd members, errors)."""
    arrays: dict[str, Any] = {}
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            for name in npz.files:
                arrays[name] = npz[name]
    except ValueError as err:
        if "pickle" in str(err).lower() or "object" in str(err).lower():
            raise InvalidNpz(
                f"the npz holds an object array, which would need pickle ({err}); send "
                "numeric arrays only"
            ) from None
        raise InvalidNpz(f"the npz could not be read ({err})") from None
    except (OSError, EOFError, KeyError, zipfile.BadZipFile, TypeError) as err:
        raise InvalidNpz(f"the npz could not be read ({type(err).__name__}: {err})") from None
    return arrays
