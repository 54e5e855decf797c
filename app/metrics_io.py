"""Metric arrays in and out of HTTP: JSON lists, OIP-v2 tensors and npz bodies <-> numpy.

Everything here is plain numpy and runs in the HTTP process; nothing touches JAX devices.

Inputs:
  - nested JSON lists: numbers and booleans; ``null`` and the ``NaN``/``Infinity``
    literals read as non-finite floats; strings, objects and ragged nesting are refused;
  - OIP tensors ``{"shape", "datatype", "data"}`` with datatypes BOOL, UINT8..UINT64,
    INT8..INT64, FP16, FP32, FP64 (BF16 and BYTES are ``unsupported_datatype``); integer
    and boolean tensors must hold exactly representable values;
  - npz bodies, loaded with ``allow_pickle=False`` after checking the archive's
    decompressed size against the body limit (a small zip may inflate enormously).

Every metric needs a leading device axis (rank >= 1).

Outputs: ``to_jsonable`` turns reduced values into JSON-ready Python values; non-finite
floats become ``null`` (JSON has no NaN), float16/float32 values are written with the
shortest decimal that reads back as the same value (``0.65``, not ``0.6499999761581421``).
"""

from __future__ import annotations

import io
import math
import zipfile
from collections.abc import Mapping
from typing import Any

import numpy as np

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
    arrays: dict[str, np.ndarray] = {}
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


def _shortest_floats(array: np.ndarray) -> np.ndarray:
    """float16/32 -> float64 holding the shortest decimal of each value (``0.65``)."""
    flat = array.reshape(-1)
    return np.array([float(str(v)) for v in flat], dtype=np.float64).reshape(array.shape)


def to_jsonable(value: Any) -> Any:
    """A reduced value (numpy scalar/array or Python value) -> JSON-ready Python value.

    0-d -> scalar; arrays -> nested lists; non-finite floats -> None.
    """
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    array = np.asarray(value)
    if array.dtype.kind == "c":
        raise TypeError("complex values have no JSON form")
    if array.dtype.kind != "f":
        return array.tolist()
    if array.dtype.itemsize < 8:
        array = _shortest_floats(array)
    finite = np.isfinite(array)
    if finite.all():
        return array.tolist()
    out = array.astype(object)
    out[~finite] = None
    return out.tolist()


def metrics_to_json(values: Mapping[str, Any]) -> dict[str, Any]:
    """name -> reduced value, JSON-ready."""
    return {str(name): to_jsonable(value) for name, value in values.items()}
