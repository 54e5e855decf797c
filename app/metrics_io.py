"""Metric arrays in and out of HTTP: JSON lists, OIP-v2 tensors and npz bodies <-> numpy.

Everything here is plain numpy and runs in the HTTP process; nothing touches JAX devices.

Inputs:
  - nested JSON lists: numbers and booleans; ``null`` and the ``NaN``/``Infinity``
    literals read as non-finite floats; strings, objects and ragged nesting are refused;
  - OIP tensors ``{"shape", "datatype", "data"}`` with datatypes BOOL, UINT8..UINT64,
    INT8..INT64, FP16, FP32, FP64 (BF16 and BYTES are ``unsupported_datatype``); integer
    and boolean tensors must hold exactly representable values;
  - npz bodies, loaded with ``allow_pickle=False`` after checking the archive's
    decompressed size against the body limit (a small zip may inflate enormously). An
    uncompressed archive (``np.savez``) is read in place: its arrays are read-only views
    into the body, not copies.

Every metric needs a leading device axis (rank >= 1).

Outputs: ``encode_json`` writes reduced values (numpy arrays and scalars included) as
JSON bytes with orjson, in C: non-finite floats become ``null`` (JSON has no NaN),
float16/float32 values are written with the shortest decimal that reads back as the same
value (``0.65``, not ``0.6499999761581421``). ``to_jsonable`` gives the same values as
Python objects.

Speed: ``loads_json`` parses with orjson and falls back to the standard library only for
what orjson refuses (``NaN``/``Infinity`` literals, integers beyond 64 bits, other
encodings, and malformed JSON, so error messages stay the standard library's).
``plain_metrics_fields`` recognises the common request shape (lists of numbers, OIP
tensors, plain options) so it skips pydantic; anything else goes through the models.
"""

from __future__ import annotations

import functools
import io
import json
import math
import struct
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from isal.isal_zlib import crc32  # zlib's CRC-32, about 6x faster (8 ms -> 1.3 ms for 32 MB)

from app.errors import (
    InvalidNpz,
    InvalidParameter,
    InvalidTensor,
    PayloadTooLarge,
    RaggedArray,
    UnsupportedDatatype,
)

OIP_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
}

WEIGHTS_ARRAY = "_weights"
"""Name of the weights array inside an npz body."""


# ---------------------------------------------------------------------------- JSON in


def loads_json(body: bytes) -> Any:
    """Parses a JSON body: orjson, else the standard library (same result, or its error).

    Raises:
      json.JSONDecodeError, UnicodeDecodeError: as ``json.loads`` does.
    """
    try:
        return orjson.loads(body)  # orjson itself refuses unpaired surrogates
    except orjson.JSONDecodeError:
        # NaN/Infinity literals, integers beyond 64 bits, UTF-16/32 bodies, lone
        # surrogates, or malformed JSON: the standard library parses or explains it.
        data = json.loads(body)
    # A lone surrogate (\ud800) parses but is not text: no answer, JSON or npz, could
    # name it. Refused here, as malformed JSON, instead of failing when answering.
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        raise json.JSONDecodeError(
            f"a string holds an unpaired surrogate ({err.reason})", err.object, err.start
        ) from None
    return data


_REDUCE_MEMBERS = frozenset({"metrics", "reduce", "weights", "nan_policy"})
_JOB_MEMBERS = _REDUCE_MEMBERS | {"step"}
_TENSOR_FIELDS = frozenset({"shape", "datatype", "data"})


def _plain_number(value: Any) -> bool:
    # bool is an int subclass; ints are limited to what float64 conversion handles alike
    # in pydantic and numpy.
    kind = type(value)
    return kind is float or (kind is int and -(2**63) <= value < 2**64)


def _plain_tensor(value: Any) -> bool:
    """An OIP tensor object exactly as ``Tensor`` takes it (a list metric needs no check:
    ``list[Any]``, its contents are checked while decoding)."""
    if type(value) is not dict or value.keys() != _TENSOR_FIELDS:
        return False
    shape = value["shape"]
    return (
        type(shape) is list
        and all(type(n) is int and n >= 0 for n in shape)
        and type(value["datatype"]) is str
        and type(value["data"]) is list
    )


def plain_metrics_fields(data: Any, *, options: bool, step: bool) -> dict[str, Any] | None:
    """The fields of a metrics request in its common form, or None to use the models.

    Accepts only what ``MetricsReduceRequest`` (``options``), ``JobMetricsRequest``
    (``options`` and ``step``) or ``MetricsCollectRequest`` (neither: other members are
    ignored) accept *unchanged*: ``metrics`` maps names to lists or exact OIP tensor
    objects, ``reduce`` maps names to strings, ``weights`` is a list of numbers or null,
    ``nan_policy`` a string, ``step`` an int >= 0. Anything else (a missing or extra
    member, a coercible string, a bool weight) returns None, and the pydantic model then
    gives the answer and its exact error.

    Args:
      data: the parsed JSON body.
      options: accept ``reduce``, ``weights`` and ``nan_policy`` (extra members forbidden).
      step: require ``step``.

    Returns:
      ``{"metrics", "reduce", "weights", "nan_policy", "step"}`` with the defaults filled
      in, or None.
    """
    if type(data) is not dict:
        return None
    metrics = data.get("metrics")
    if type(metrics) is not dict:
        return None
    for value in metrics.values():
        if type(value) is not list and not _plain_tensor(value):
            return None
    fields: dict[str, Any] = {
        "metrics": metrics,
        "reduce": {},
        "weights": None,
        "nan_policy": "propagate",
        "step": None,
    }
    if not options:
        return fields
    if not data.keys() <= (_JOB_MEMBERS if step else _REDUCE_MEMBERS):
        return None
    reduce = data.get("reduce", {})
    if type(reduce) is not dict or not all(type(op) is str for op in reduce.values()):
        return None
    weights = data.get("weights")
    if weights is not None and (
        type(weights) is not list or not all(_plain_number(w) for w in weights)
    ):
        return None
    nan_policy = data.get("nan_policy", "propagate")
    if type(nan_policy) is not str:
        return None
    if step:
        value = data.get("step")
        if type(value) is not int or value < 0:
            return None
        fields["step"] = value
    fields.update(reduce=reduce, weights=weights, nan_policy=nan_policy)
    return fields


def _numeric_from_json(name: str, value: Any) -> np.ndarray:
    """Nested JSON list -> bool/int/float array; None -> NaN."""
    try:
        array = np.asarray(value)
    except ValueError as err:
        raise RaggedArray(
            f"metric {name!r} is not rectangular ({err}); every device must send the same "
            "shape, e.g. [[1, 2], [3, 4]] for [n_devices, 2]"
        ) from None
    if array.dtype.kind in "biuf":
        return array
    if array.dtype.kind == "O":
        flat = array.reshape(-1)
        if all(v is None or (isinstance(v, int | float) and not isinstance(v, str)) for v in flat):
            try:
                return np.array(array, dtype=np.float64)
            except (OverflowError, ValueError, TypeError) as err:
                raise InvalidTensor(f"metric {name!r}: {err}") from None
        bad = next(v for v in flat if not (v is None or isinstance(v, int | float)))
        raise InvalidTensor(
            f"metric {name!r} holds {type(bad).__name__} value {bad!r}; only numbers, "
            "booleans and null (NaN) are allowed"
        )
    raise InvalidTensor(
        f"metric {name!r} holds non-numeric values (numpy dtype {array.dtype}); only "
        "numbers, booleans and null (NaN) are allowed"
    )


def _from_list(name: str, value: list[Any]) -> np.ndarray:
    array = _numeric_from_json(name, value)
    if array.ndim == 0:
        raise InvalidTensor(f"metric {name!r} is a scalar; send [n_devices, ...] values")
    return array


def _from_tensor(name: str, shape: list[int], datatype: str, data: list[Any]) -> np.ndarray:
    datatype_upper = str(datatype).upper()
    dtype = OIP_DTYPES.get(datatype_upper)
    if dtype is None:
        raise UnsupportedDatatype(
            f"metric {name!r} has datatype {datatype!r}; supported: {', '.join(OIP_DTYPES)}"
            + (" (convert BF16 to FP32 before sending)" if datatype_upper == "BF16" else "")
        )
    if len(shape) == 0:
        raise InvalidTensor(
            f"metric {name!r} has shape []; metrics need a leading device axis, "
            "e.g. shape [n_devices]"
        )
    raw = _numeric_from_json(name, data).reshape(-1)
    expected = math.prod(shape)
    if raw.size != expected:
        raise InvalidTensor(
            f"metric {name!r} has shape {shape} ({expected} values) but data holds "
            f"{raw.size} values; data is the row-major flattening of the tensor"
        )
    kind = dtype.kind
    if kind == "b":
        if raw.dtype.kind != "b" and raw.size:
            raise InvalidTensor(f"metric {name!r} is BOOL but data holds non-boolean values")
    elif kind in "iu":
        if raw.dtype.kind not in "biu" and raw.size:
            raise InvalidTensor(
                f"metric {name!r} is {datatype_upper} but data holds non-integer values "
                f"(numpy dtype {raw.dtype}); send integers or use FP32/FP64"
            )
        if raw.size and raw.dtype.kind in "iu":
            info = np.iinfo(dtype)
            low, high = int(raw.min()), int(raw.max())
            if low < info.min or high > info.max:
                raise InvalidTensor(
                    f"metric {name!r}: values {low}..{high} do not fit {datatype_upper} "
                    f"({info.min}..{info.max})"
                )
    with np.errstate(over="ignore"):
        return raw.astype(dtype).reshape(shape)


def decode_json_metrics(metrics: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Validated request metrics (lists or tensor models/dicts) -> name -> numpy array.

    Raises:
      RaggedArray, InvalidTensor, UnsupportedDatatype.
    """
    out: dict[str, np.ndarray] = {}
    for name, value in metrics.items():
        if isinstance(value, list):
            out[name] = _from_list(name, value)
            continue
        fields = value if isinstance(value, Mapping) else value.model_dump()
        out[name] = _from_tensor(name, fields["shape"], fields["datatype"], fields["data"])
    return out


def decode_weights(weights: Any) -> np.ndarray | None:
    """Request weights -> float64 array (validation of values is the library's)."""
    if weights is None:
        return None
    return np.asarray(weights, dtype=np.float64)


# ----------------------------------------------------------------------------- npz in


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
    inflated = sum(member.file_size for member in members)
    if inflated > max_bytes:
        raise PayloadTooLarge(
            f"the npz arrays decompress to {inflated} bytes, above the limit of {max_bytes} bytes"
        )
    arrays = _stored_arrays(body, members)
    if arrays is None:
        arrays = _np_load(body)
    if not arrays:
        raise InvalidNpz("the npz holds no arrays; send at least one metric")
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray):
            # NpzFile hands back the raw bytes of a member that is not a .npy file.
            raise InvalidNpz(f"npz member {name!r} is not a .npy array; write it with np.savez")
        if array.dtype.kind not in "biuf":
            raise UnsupportedDatatype(
                f"npz array {name!r} has dtype {array.dtype}; send bool, integer or float "
                "arrays (convert bfloat16 to float32)"
            )
    return arrays


_ZIP_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature ... name length, extra length
_NPY_HEADER_BYTES = 16384  # above numpy's own limit on .npy header size (10,000)


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
        header = io.BytesIO(data[:_NPY_HEADER_BYTES])
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
        count = math.prod(shape)
        offset = header.tell()
        if dtype.hasobject or offset + count * dtype.itemsize != member.file_size:
            return None
        flat = np.frombuffer(body, dtype=dtype, count=count, offset=start + offset)
        # Fortran order as np.lib.format.read_array reads it.
        arrays[name[:-4]] = (
            flat.reshape(shape[::-1]).transpose() if fortran_order else flat.reshape(shape)
        )
    return arrays


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


def split_npz_metrics(
    arrays: Mapping[str, np.ndarray],
) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
    """Separates the ``_weights`` array from the metrics and checks ranks."""
    metrics = {k: v for k, v in arrays.items() if k != WEIGHTS_ARRAY}
    for name, array in metrics.items():
        if array.ndim == 0:
            raise InvalidTensor(
                f"npz array {name!r} is a scalar; metrics need a leading device axis"
            )
    return metrics, arrays.get(WEIGHTS_ARRAY)


# --------------------------------------------------------------------------- query in


def parse_reduce_query(text: str | None) -> dict[str, str]:
    """``"loss:mean,step:max"`` -> ``{"loss": "mean", "step": "max"}``.

    Raises:
      InvalidParameter: an entry without ``name:op``, or a name given twice.
    """
    if not text:
        return {}
    out: dict[str, str] = {}
    for entry in text.split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, op = entry.rpartition(":")
        if not sep or not name or not op:
            raise InvalidParameter(
                ["query", "reduce"],
                f"entry {entry!r} is not name:op; write e.g. reduce=loss:mean,step:max",
            )
        if name in out:
            raise InvalidParameter(["query", "reduce"], f"metric {name!r} is listed twice")
        out[name] = op
    return out


# ---------------------------------------------------------------------------- JSON out

_ORJSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


@functools.cache
def _float16_decimals() -> np.ndarray:
    """float64 holding the shortest decimal of every float16 bit pattern (65,536 values)."""
    every = np.arange(2**16, dtype=np.uint16).view(np.float16)
    return np.array([float(str(v)) for v in every], dtype=np.float64)


def _float16_to_decimal(array: np.ndarray) -> np.ndarray:
    """float16 -> float64 holding the shortest float16 decimal (``0.1``, not 0.0999755859375)."""
    if array.size <= 64:
        flat = [float(str(v)) for v in array.reshape(-1)]
        return np.array(flat, dtype=np.float64).reshape(array.shape)
    return _float16_decimals()[array.astype(np.float16).view(np.uint16)]


# numpy scalar types orjson writes as they are (float16 needs its decimal, see below).
_ORJSON_SCALARS = frozenset(
    {np.float64, np.float32, np.int64, np.int32, np.int16, np.int8}
    | {np.uint64, np.uint32, np.uint16, np.uint8, np.bool_}
)


def _json_ready(value: Any) -> Any:
    """What orjson writes as intended: float16 as its own shortest decimal, native byte
    order, 0-d arrays as scalars; containers walked."""
    if type(value) in _ORJSON_SCALARS:
        return value
    if type(value) is dict:
        return {key: _json_ready(v) for key, v in value.items()}
    if isinstance(value, np.generic):  # numpy scalars are always in native byte order
        kind = value.dtype.kind
        if kind not in "biuf":
            raise TypeError(f"values of dtype {value.dtype} have no JSON form")
        return float(str(value)) if value.dtype == np.float16 else value
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"values of dtype {value.dtype} have no JSON form")
        if value.ndim == 0:
            return _json_ready(value[()])
        if value.dtype == np.float16:
            return _float16_to_decimal(value)
        if not value.dtype.isnative:
            return value.astype(value.dtype.newbyteorder("="))
        return value
    if isinstance(value, dict):
        return {key: _json_ready(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value


def _orjson_default(value: Any) -> Any:
    # orjson hands over what it cannot write natively: arrays that are not C-contiguous.
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return np.ascontiguousarray(value)
    raise TypeError(f"{type(value).__name__} has no JSON form")


def encode_json(value: Any) -> bytes:
    """JSON bytes of ``value``: dicts, lists, Python and numpy scalars, numpy arrays.

    Arrays become nested lists and 0-d arrays scalars; non-finite floats are ``null``;
    float16/float32 values are written with their own shortest decimal.

    Raises:
      TypeError: complex values, or objects with no JSON form.
    """
    return orjson.dumps(_json_ready(value), default=_orjson_default, option=_ORJSON_OPTIONS)


def to_jsonable(value: Any) -> Any:
    """A reduced value (numpy scalar/array or Python value) -> JSON-ready Python value.

    0-d -> scalar; arrays -> nested lists; non-finite floats -> None; float16/float32 ->
    the float64 of their shortest decimal (``0.65``). Exactly what ``encode_json`` sends.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return orjson.loads(encode_json(value))


def metrics_to_json(values: Mapping[str, Any]) -> dict[str, Any]:
    """name -> reduced value, JSON-ready."""
    return {str(name): to_jsonable(value) for name, value in values.items()}


# ----------------------------------------------------------------------------- npz out

NUM_DEVICES_ARRAY = "_num_devices"
"""The npz answer's extra member: the device count (the JSON answer's ``num_devices``)."""

_ZIP_LOCAL = struct.Struct("<IHHHHHIIIHH")
_ZIP_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_ZIP_END = struct.Struct("<IHHHHIIH")
_ZIP_LIMIT = 0xFFFF_FFFF  # past this a member or offset needs ZIP64 (_zip64_npz)
_ZIP_MAX_MEMBERS = 0xFFFF
_ZIP_MAX_NAME = 0xFFFF
_ZIP_UTF8 = 0x800  # general purpose flag bit 11: the name is UTF-8 (APPNOTE 4.4.4)
_ZIP_DOS_DATE = (1980 - 1980) << 9 | 1 << 5 | 1  # 1980-01-01, as zipfile writes a zero date


def _npy_parts(value: Any) -> tuple[bytes, memoryview]:
    """The ``.npy`` header and the raw data of one value (C order, no copy when possible)."""
    array = np.asarray(value)  # not ascontiguousarray: it turns 0-d into 1-d
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    if array.dtype.hasobject:
        raise TypeError(f"values of dtype {array.dtype} have no npz form")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, np.lib.format.header_data_from_array_1_0(array))
    return header.getvalue(), memoryview(array.reshape(-1)).cast("B")


def encode_npz(arrays: Mapping[str, Any]) -> bytes:
    """An uncompressed npz archive of ``arrays`` (numpy values; scalars become 0-d arrays).

    The archive ``np.savez`` writes (``np.load`` reads it, ``allow_pickle=False``),
    assembled directly: one CRC pass (ISA-L) and one copy of each array into the answer,
    where ``np.savez`` through ``zipfile`` takes about 8 ms for one 4 MB array. Non-ASCII
    names carry the UTF-8 flag, as ``zipfile`` sets it. Archives past the classic ZIP
    limits (a member or offset past 4 GiB, more than 65,535 members, a name longer than
    65,535 bytes) are written by ``zipfile`` with ZIP64, as ``np.savez`` does.

    Raises:
      TypeError: an object (pickle-only) value.
    """
    members = [(str(name), *_npy_parts(value)) for name, value in arrays.items()]
    if len(members) > _ZIP_MAX_MEMBERS:
        return _zip64_npz(members)
    parts: list[Any] = []
    central: list[bytes] = []
    offset = 0
    for name, header, data in members:
        filename = f"{name}.npy".encode()
        size = len(header) + data.nbytes
        end = offset + _ZIP_LOCAL.size + len(filename) + size
        if len(filename) > _ZIP_MAX_NAME or size >= _ZIP_LIMIT or end >= _ZIP_LIMIT:
            return _zip64_npz(members)
        crc = crc32(data, crc32(header))
        flags = 0 if name.isascii() else _ZIP_UTF8
        # version 20, stored, time 0, date 1980-01-01
        fields = (20, flags, 0, 0, _ZIP_DOS_DATE, crc, size, size, len(filename))
        parts += [_ZIP_LOCAL.pack(0x04034B50, *fields, 0), filename, header, data]
        central.append(
            _ZIP_CENTRAL.pack(0x02014B50, 20, *fields, 0, 0, 0, 0, 0o600 << 16, offset) + filename
        )
        offset = end
    directory = b"".join(central)
    end_record = _ZIP_END.pack(
        0x06054B50, 0, 0, len(central), len(central), len(directory), offset, 0
    )
    return b"".join([*parts, directory, end_record])


def _zip64_npz(members: list[tuple[str, bytes, memoryview]]) -> bytes:
    """The same archive through ``zipfile`` with ZIP64 (what ``np.savez`` does)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, header, data in members:
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                member.write(header)
                member.write(data)
    return buffer.getvalue()
