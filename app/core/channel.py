"""Framing of the local channel between the HTTP process and the runtime process.

One message is::

    [4-byte big-endian header length][UTF-8 JSON header][array bytes, concatenated]

The header lists the arrays that follow as ``{"name", "dtype", "shape", "nbytes"}`` in
order; their bytes are C-ordered, native byte order (both ends run on one host). Requests
are ``{"id", "command", "payload", "arrays"}``; replies are ``{"id", "ok": true, "result",
"arrays"}`` or ``{"id", "ok": false, "error": ServiceError.to_reply()}`` (see
:mod:`app.core.errors`: ``{"status", "code", "title", "detail", "extra"}``).

Nothing is ever unpickled: headers are JSON and array dtypes must be in
:data:`ALLOWED_DTYPES` (bool, integers, floats, complex; never ``object``). Both ends use
this module, the runtime process with blocking sockets (:func:`recv_message`,
:func:`send_message`), the HTTP process with asyncio streams (:func:`read_message`).
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

try:  # bfloat16 and friends: a numpy dtype only once ml_dtypes (a jax dependency) is imported
    import ml_dtypes as _ml_dtypes  # noqa: F401

    _EXTRA_DTYPES: tuple[str, ...] = ("bfloat16",)
except ImportError:  # pragma: no cover - ml_dtypes ships with jax
    _EXTRA_DTYPES = ()

ALLOWED_DTYPES: frozenset[str] = frozenset(
    (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
        *_EXTRA_DTYPES,
    )
)
"""dtype names (``np.dtype(name).name``) that may cross the channel."""

MAX_HEADER_BYTES = 1 << 30
"""A larger header length means a corrupt stream, not a big request."""

_LENGTH = struct.Struct(">I")

Arrays = dict[str, np.ndarray]


class ChannelError(Exception):
    """The stream is corrupt (bad length, bad JSON, bad array list): it cannot be resynced."""


class ArrayError(ValueError):
    """An array that may not cross the channel; the stream itself is still in sync.

    Attributes:
      code: ``unsupported_dtype`` or ``invalid_array``.
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


# ------------------------------------------------------------------------------ encoding


def _as_sendable(name: str, value: Any) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype.name not in ALLOWED_DTYPES:
        raise ArrayError(
            "unsupported_dtype",
            f"array {name!r} has dtype {array.dtype!s}, which cannot be sent; "
            f"allowed: {', '.join(sorted(ALLOWED_DTYPES))}",
        )
    if array.dtype.byteorder not in "=|":
        array = array.astype(array.dtype.newbyteorder("="))
    # not np.ascontiguousarray: it turns 0-d arrays into 1-d ones
    return array if array.flags.c_contiguous else array.copy(order="C")


def encode_message(header: Mapping[str, Any], arrays: Mapping[str, Any] | None = None) -> list:
    """Frames one message.

    Args:
      header: JSON-able mapping; its ``arrays`` entry is filled in here.
      arrays: name -> array-like (numpy or jax arrays), any shape including 0-d and empty.

    Returns:
      Buffers to write in order: the length prefix plus header, then one per non-empty array.

    Raises:
      ArrayError: an array whose dtype is not in :data:`ALLOWED_DTYPES`.
      TypeError, ValueError: the header is not JSON-able.
    """
    specs, buffers = [], []
    for name, value in (arrays or {}).items():
        if not isinstance(name, str):
            raise ArrayError("invalid_array", f"array names must be strings, got {name!r}")
        array = _as_sendable(name, value)
        specs.append(
            {
                "name": name,
                "dtype": array.dtype.name,
                "shape": list(array.shape),
                "nbytes": array.nbytes,
            }
        )
        if array.nbytes:
            buffers.append(memoryview(array.reshape(-1).view(np.uint8)))
    raw = json.dumps({**header, "arrays": specs}, separators=(",", ":")).encode()
    if len(raw) > MAX_HEADER_BYTES:
        raise ValueError(f"message header of {len(raw)} bytes exceeds {MAX_HEADER_BYTES}")
    return [_LENGTH.pack(len(raw)) + raw, *buffers]


# ------------------------------------------------------------------------------ decoding


def header_length(prefix: bytes | bytearray) -> int:
    (length,) = _LENGTH.unpack(prefix)
    if length > MAX_HEADER_BYTES:
        raise ChannelError(f"header length {length} exceeds {MAX_HEADER_BYTES}: corrupt stream")
    return length


def decode_header(raw: bytes | bytearray) -> tuple[dict[str, Any], int]:
    """Parses a header; returns it and the number of array bytes that follow it."""
    try:
        header = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise ChannelError(f"header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ChannelError(f"header must be a JSON object, got {type(header).__name__}")
    specs = header.setdefault("arrays", [])
    if not isinstance(specs, list) or not all(isinstance(s, dict) for s in specs):
        raise ChannelError("header 'arrays' must be a list of objects")
    total = 0
    for spec in specs:
        nbytes = spec.get("nbytes")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ChannelError(f"array spec {spec!r} needs a non-negative integer 'nbytes'")
        total += nbytes
    return header, total


def decode_arrays(specs: list[dict[str, Any]], body: bytearray | bytes) -> Arrays:
    """Turns the array bytes of a message into arrays (views of ``body``, no copy).

    Raises:
      ArrayError: a disallowed dtype, a bad shape or name, or ``nbytes`` that does not
        match ``shape`` and ``dtype``. The stream stays in sync: ``body`` was read whole.
    """
    arrays: Arrays = {}
    offset = 0
    for spec in specs:
        name, dtype_name, shape, nbytes = (
            spec.get(k) for k in ("name", "dtype", "shape", "nbytes")
        )
        if not isinstance(name, str) or name in arrays:
            raise ArrayError("invalid_array", f"array name {name!r} is missing or repeated")
        if dtype_name not in ALLOWED_DTYPES:
            raise ArrayError(
                "unsupported_dtype",
                f"array {name!r} has dtype {dtype_name!r}, which is not allowed",
            )
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise ArrayError("invalid_array", f"array {name!r} has a bad shape {shape!r}")
        dtype = np.dtype(dtype_name)
        count = math.prod(shape)
        if count * dtype.itemsize != nbytes:
            raise ArrayError(
                "invalid_array",
                f"array {name!r}: {nbytes} bytes do not hold shape {shape} of {dtype_name}",
            )
        # Only now is nbytes known to be a count (a missing one fails the check above).
        start, offset = offset, offset + count * dtype.itemsize
        arrays[name] = np.frombuffer(body, dtype=dtype, count=count, offset=start).reshape(
            tuple(shape)
        )
    return arrays


# -------------------------------------------------------------- blocking socket (runtime side)


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        chunk = sock.recv_into(view[got:], n - got)
        if chunk == 0:
            raise EOFError(f"channel closed after {got} of {n} bytes")
        got += chunk
    return buffer


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], Arrays | ArrayError]:
    """Reads one message from a blocking socket.

    Returns:
      The header and its arrays, or the header and the :class:`ArrayError` that its
      arrays raised (the message was consumed whole, so the caller can reply and go on).

    Raises:
      EOFError: the other end closed the channel.
      ChannelError: the stream is corrupt.
    """
    header, total = decode_header(_recv_exactly(sock, header_length(_recv_exactly(sock, 4))))
    body = _recv_exactly(sock, total)
    try:
        return header, decode_arrays(header["arrays"], body)
    except ArrayError as exc:
        return header, exc


def send_message(sock: socket.socket, parts: list) -> None:
    for part in parts:
        sock.sendall(part)


# ---------------------------------------------------------------- asyncio streams (HTTP side)


async def read_message(reader: asyncio.StreamReader) -> tuple[dict[str, Any], Arrays]:
    """Reads one message from an asyncio stream; arrays are writable.

    Raises:
      asyncio.IncompleteReadError: the other end closed the channel.
      ChannelError: the stream is corrupt.
      ArrayError: the arrays of an otherwise well-framed message are not acceptable.
    """
    length = header_length(await reader.readexactly(4))
    header, total = decode_header(await reader.readexactly(length))
    body = bytearray(await reader.readexactly(total)) if total else bytearray()
    return header, decode_arrays(header["arrays"], body)
