"""Arrays in JSON bodies and JSON answers: nested lists and OIP-v2 tensors <-> numpy.

Plain numpy, used by the HTTP process for metrics and training batches alike; nothing
touches JAX devices. Every error names the field it is about (``metric 'loss'``,
``batch field 'inputs'``): the caller says what its arrays are.

Inputs:
  - nested JSON lists: numbers and booleans; ``null`` and the ``NaN``/``Infinity``
    literals read as non-finite floats; strings, objects and ragged nesting are refused;
  - OIP tensors ``{"shape", "datatype", "data"}`` with datatypes BOOL, UINT8..UINT64,
    INT8..INT64, FP16, FP32, FP64 (BF16 and BYTES are ``unsupported_datatype``); integer
    and boolean tensors must hold exactly representable values (UINT64 up to 2**64 - 1);
    shapes are checked by :func:`check_array_shape` (at most 64 dimensions, a size numpy
    can hold, an empty array's other sizes at most :data:`MAX_EMPTY_EXTENT`) before any
    array is built, so no claimed shape reaches numpy unchecked (``invalid_tensor``).

Outputs: ``encode_json`` writes values (numpy arrays and scalars included) as JSON bytes
with orjson, in C: non-finite floats become ``null`` (JSON has no NaN), float16/float32
values are written with the shortest decimal that reads back as the same value (``0.65``,
not ``0.6499999761581421``).

Speed: ``loads_json`` parses with orjson and falls back to the standard library only for
what orjson refuses (``NaN``/``Infinity`` literals, integers beyond 64 bits, other
encodings, and malformed JSON, so error messages stay the standard library's).
"""

from __future__ import annotations

import functools
import json
import math
import typing
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson
from pydantic import BaseModel, ValidationError

from app.core.errors import (
    InvalidJson,
    InvalidTensor,
    RaggedArray,
    UnsupportedDatatype,
    validation_error,
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


MAX_INT_DIGITS = 20
"""Digits of a JSON integer at most (a sign aside): 64-bit integers (steps go to
2**63 - 1) fit, a longer one is refused as malformed JSON (422 ``invalid_json``) at the
first one, before Python converts it (past 4,300 digits the conversion raised, a 500;
below, thousands of long ones kept the parser busy for seconds)."""


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(
            f"an integer of {len(text.lstrip('-'))} digits; integers take at most "
            f"{MAX_INT_DIGITS} (write a float, e.g. 1e30, for a larger number)"
        )
    return int(text)


MAX_JSON_VALUES = 1 << 21
"""Values a JSON body may hold (2,097,152; counted as its commas, before parsing)."""
MAX_JSON_CONTAINERS = 1 << 19
"""Arrays and objects a JSON body may hold (524,288; counted as its ``[`` and ``{``)."""
COUNT_OVER = 1 << 20
"""Bodies up to this many bytes cannot pass either count and are not counted."""


class TooManyJsonValues(ValueError):
    """A JSON body past :data:`MAX_JSON_VALUES` or :data:`MAX_JSON_CONTAINERS`, refused
    before it is parsed.

    Parsing is one C call (orjson) that holds the GIL, and so does the garbage collector
    over what it made: a 64 MiB body of 33M nested lists held every thread, the event
    loop's too, for 17-60 s, whichever thread parsed it. Counted in bytes first (about
    10 ms for 64 MiB, ``bytes.count`` in C), a body with more values than a JSON client
    should send is refused at once; large arrays go as npz, which is read in place.
    """


def check_json_counts(body: bytes) -> None:
    """Raises :class:`TooManyJsonValues` for a body past the counts (commas in strings
    count too: a body near the bound may be refused a little early)."""
    if len(body) <= COUNT_OVER:
        return
    values = body.count(b",") + 1
    containers = body.count(b"[") + body.count(b"{")
    if values > MAX_JSON_VALUES or containers > MAX_JSON_CONTAINERS:
        raise TooManyJsonValues(
            f"the body holds about {values:,} values in {containers:,} arrays and objects; "
            f"a JSON body takes at most {MAX_JSON_VALUES:,} values and "
            f"{MAX_JSON_CONTAINERS:,} arrays and objects (parsing more holds the service "
            "for seconds): send large arrays as npz (Content-Type: application/x-npz), or "
            "split the body"
        )


def loads_json(body: bytes) -> Any:
    """Parses a JSON body: orjson, else the standard library (same result, or its error).

    Raises:
      TooManyJsonValues: past :data:`MAX_JSON_VALUES` or :data:`MAX_JSON_CONTAINERS`.
      json.JSONDecodeError, UnicodeDecodeError: as ``json.loads`` does (an integer of
      more than :data:`MAX_INT_DIGITS` digits included).
    """
    check_json_counts(body)
    try:
        return orjson.loads(body)  # orjson itself refuses unpaired surrogates
    except orjson.JSONDecodeError as err:
        if str(err).startswith("depth limit exceeded"):
            raise _too_deep() from None
        # NaN/Infinity literals, integers beyond 64 bits, UTF-16/32 bodies, lone
        # surrogates, or malformed JSON: the standard library parses or explains it.
    # The standard library recurses once per level: a deep body (orjson's limit is 1024
    # levels, Python's recursion limit about 1000) must be refused, never crash.
    try:
        data = json.loads(body, parse_int=_bounded_int)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as err:
        if isinstance(err, json.JSONDecodeError):
            raise
        raise json.JSONDecodeError(str(err), "", 0) from None
    # A lone surrogate (\ud800) parses but is not text: no answer, JSON or npz, could
    # name it. Refused here, as malformed JSON, instead of failing when answering.
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as err:
        raise json.JSONDecodeError(
            f"a string holds an unpaired surrogate ({err.reason})", err.object, err.start
        ) from None
    except RecursionError:
        raise _too_deep() from None
    return data


MAX_ARRAY_DIMS = 64
"""numpy's limit on dimensions (``np.ndarray.ndim``): nested lists deeper are refused."""


MAX_EMPTY_EXTENT = 2**20
"""Largest product of the non-zero dimensions of an array that holds no values (a zero
dimension somewhere). Such an array costs nothing to send (``{"shape": [1, 2**40, 0],
"data": []}``) but its answers do: reducing ``[1, 2**40, 0]`` answers ``2**40`` empty
lists. 2**20 empty lists is a 3 MB answer; an array that holds values is bounded by the
body it came in instead."""

_MAX_BYTES = 2**63 - 1  # numpy refuses arrays whose size in bytes passes intp


def check_array_shape(what: str, name: str, shape: Any, itemsize: int) -> None:
    """Refuses a shape numpy cannot hold or whose answer is out of proportion to its data.

    Shared by JSON tensors and npz members: at most :data:`MAX_ARRAY_DIMS` dimensions
    (numpy's limit), sizes of 0 or more whose product (zeros counted as 1, times the item
    size) stays within numpy's ``intp``, and for an array with no values (a zero size) a
    product of the other sizes of at most :data:`MAX_EMPTY_EXTENT`.

    Args:
      what: what the array is, for the message (``metric``, ``npz array``).
      name: its name.
      shape: the claimed shape (a sequence of ints).
      itemsize: bytes per element of its dtype.

    Raises:
      InvalidTensor: with the rule it breaks and the shape received (abridged).
    """
    dims = len(shape)
    if dims > MAX_ARRAY_DIMS:
        raise InvalidTensor(
            f"{what} {name!r} has {dims} dimensions; arrays have at most {MAX_ARRAY_DIMS}"
        )
    extent = 1
    empty = False
    for size in shape:
        if size < 0:
            raise InvalidTensor(f"{what} {name!r} has a negative size in shape {_brief(shape)}")
        if size == 0:
            empty = True
            continue
        extent *= size
        if extent * max(itemsize, 1) > _MAX_BYTES:
            raise InvalidTensor(
                f"{what} {name!r} has shape {_brief(shape)}, larger than any array can be "
                f"(its sizes multiply past 2**63 bytes)"
            )
    if empty and extent > MAX_EMPTY_EXTENT:
        raise InvalidTensor(
            f"{what} {name!r} has shape {_brief(shape)}: it holds no values, but its other "
            f"sizes multiply to {extent}, above {MAX_EMPTY_EXTENT}; send the values, or a "
            "smaller empty shape"
        )


def _brief(shape: Any) -> str:
    """A shape for a message: in full up to 8 sizes, else its start, end and length."""
    shape = list(shape)
    if len(shape) <= 8:
        return str(shape)
    return f"[{', '.join(map(str, shape[:3]))}, ..., {shape[-1]}] ({len(shape)} sizes)"


def _too_deep() -> json.JSONDecodeError:
    return json.JSONDecodeError(
        f"nesting is deeper than this service parses; arrays have at most {MAX_ARRAY_DIMS} "
        "dimensions, so nothing valid nests deeper than a few hundred levels",
        "",
        0,
    )


def loads_body(body: bytes) -> Any:
    """A request body as parsed JSON.

    Raises:
      ServiceError: ``validation_error`` for an empty body, ``invalid_json`` for one that
        does not parse.
    """
    if not body:
        raise validation_error([{"loc": ("body",), "msg": "Field required", "type": "missing"}])
    try:
        return loads_json(body)
    except TooManyJsonValues as err:
        raise InvalidJson(str(err)) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InvalidJson(
            f"request body is not valid JSON ({err}); send a JSON object with "
            "Content-Type: application/json"
        ) from None


def validate_model[M: BaseModel](data: Any, model: type[M]) -> M:
    """``model.model_validate(data)``; errors as the 422 FastAPI's own body models give."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        errors = [
            {**entry, "loc": ("body", *entry.get("loc", ()))}
            for entry in err.errors(include_url=False)
        ]
        raise validation_error(errors, schema_fields(model)) from None


@functools.cache
def schema_fields(model: type[BaseModel]) -> frozenset[str]:
    """Every field name of ``model`` and of the models its fields hold (through unions,
    lists and mappings): what a mistyped field of its body is matched against."""
    names: set[str] = set()
    seen: set[type] = set()

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp in seen:
                return
            seen.add(tp)
            for name, info in tp.model_fields.items():
                names.add(info.alias or name)
                walk(info.annotation)
            return
        for arg in typing.get_args(tp):
            walk(arg)

    walk(model)
    return frozenset(names)


def parse_json_model[M: BaseModel](body: bytes, model: type[M]) -> M:
    """A JSON request body validated by ``model`` (for routes that read the body themselves)."""
    return validate_model(loads_body(body), model)


def _numeric_from_json(name: str, value: Any, what: str) -> np.ndarray:
    """Nested JSON list -> bool/int/float array; None -> NaN."""
    try:
        array = np.asarray(value)
    except ValueError as err:
        if f"dimension of {MAX_ARRAY_DIMS}" in str(err):
            raise InvalidTensor(
                f"{what} {name!r} nests deeper than {MAX_ARRAY_DIMS} levels; arrays have "
                f"at most {MAX_ARRAY_DIMS} dimensions"
            ) from None
        raise RaggedArray(
            f"{what} {name!r} is not rectangular ({err}); every device must send the same "
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
                raise InvalidTensor(f"{what} {name!r}: {err}") from None
        bad = next(v for v in flat if not (v is None or isinstance(v, int | float)))
        raise InvalidTensor(
            f"{what} {name!r} holds {type(bad).__name__} value {bad!r}; only numbers, "
            "booleans and null (NaN) are allowed"
        )
    raise InvalidTensor(
        f"{what} {name!r} holds non-numeric values (numpy dtype {array.dtype}); only "
        "numbers, booleans and null (NaN) are allowed"
    )


def _from_list(name: str, value: list[Any], what: str) -> np.ndarray:
    array = _numeric_from_json(name, value, what)
    if array.ndim == 0:
        raise InvalidTensor(f"{what} {name!r} is a scalar; send [n_devices, ...] values")
    return array


def _from_tensor(
    name: str, shape: list[int], datatype: str, data: list[Any], what: str
) -> np.ndarray:
    datatype_upper = str(datatype).upper()
    dtype = OIP_DTYPES.get(datatype_upper)
    if dtype is None:
        raise UnsupportedDatatype(
            f"{what} {name!r} has datatype {datatype!r}; supported: {', '.join(OIP_DTYPES)}"
            + (" (convert BF16 to FP32 before sending)" if datatype_upper == "BF16" else "")
        )
    if len(shape) == 0:
        raise InvalidTensor(
            f"{what} {name!r} has shape []; metrics need a leading device axis, "
            "e.g. shape [n_devices]"
        )
    check_array_shape(what, name, shape, dtype.itemsize)
    raw = _numeric_from_json(name, data, what).reshape(-1)
    if dtype.kind in "iu" and raw.dtype.kind == "f":
        raw = _exact_integers(data, raw)
    expected = math.prod(shape)
    if raw.size != expected:
        raise InvalidTensor(
            f"{what} {name!r} has shape {shape} ({expected} values) but data holds "
            f"{raw.size} values; data is the row-major flattening of the tensor"
        )
    kind = dtype.kind
    if kind == "b":
        if raw.dtype.kind != "b" and raw.size:
            raise InvalidTensor(f"{what} {name!r} is BOOL but data holds non-boolean values")
    elif kind in "iu":
        if raw.dtype.kind not in "biuO" and raw.size:
            raise InvalidTensor(
                f"{what} {name!r} is {datatype_upper} but data holds non-integer values "
                f"(numpy dtype {raw.dtype}); send integers or use FP32/FP64"
            )
        if raw.size and raw.dtype.kind in "iuO":
            info = np.iinfo(dtype)
            low, high = int(raw.min()), int(raw.max())
            if low < info.min or high > info.max:
                raise InvalidTensor(
                    f"{what} {name!r}: values {low}..{high} do not fit {datatype_upper} "
                    f"({info.min}..{info.max})"
                )
    with np.errstate(over="ignore"):
        return raw.astype(dtype).reshape(shape)


def _exact_integers(data: Any, raw: np.ndarray) -> np.ndarray:
    """The values of an integer tensor that numpy read as float64 because some of them
    pass int64 (``[2**64 - 1, 1]`` for UINT64): as exact Python ints, when every value is
    one, so UINT64 tensors keep their full range. Otherwise ``raw`` unchanged (the caller
    refuses its non-integer values)."""
    flat = np.array(data, dtype=object).reshape(-1)
    if not all(type(v) is int for v in flat):
        return raw
    return flat  # object array of ints: the caller range-checks, then converts exactly


def decode_json_arrays(arrays: Mapping[str, Any], *, what: str = "metric") -> dict[str, np.ndarray]:
    """Validated request arrays (lists or tensor models/dicts) -> name -> numpy array.

    Args:
      arrays: name -> nested list or OIP tensor (a dict or a model with those fields).
      what: what the arrays are, for error messages (``metric``, ``batch field``).

    Raises:
      RaggedArray, InvalidTensor, UnsupportedDatatype.
    """
    out: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        if isinstance(value, list):
            out[name] = _from_list(name, value, what)
            continue
        fields = value if isinstance(value, Mapping) else value.model_dump()
        out[name] = _from_tensor(name, fields["shape"], fields["datatype"], fields["data"], what)
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
# What _json_ready hands back unchanged: those, and the Python scalars (an answer's
# counts), checked first so a reduce answer's values take one set lookup each.
_AS_THEY_ARE = _ORJSON_SCALARS | {int, float, str, bool, type(None)}


def _json_ready(value: Any) -> Any:
    """What orjson writes as intended: float16 as its own shortest decimal, native byte
    order, 0-d arrays as scalars; containers walked."""
    if type(value) in _AS_THEY_ARE:
        return value
    if type(value) is dict:  # its scalars without a call each (an answer's common case)
        return {k: v if type(v) in _AS_THEY_ARE else _json_ready(v) for k, v in value.items()}
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
