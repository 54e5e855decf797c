"""The channel's framing, both ends: blocking sockets (the runtime) and asyncio streams
(the HTTP process), over real socket pairs in this process."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

import ml_dtypes
import numpy as np
import pytest

from app.core import channel
from app.core.channel import ArrayError, ChannelError

ROUND_TRIP = {
    "bool": np.array([[True, False, True]]),
    "int8": np.arange(-4, 4, dtype=np.int8).reshape(2, 2, 2),
    "uint8": np.arange(250, 256, dtype=np.uint8),
    "int16": np.array(-3, dtype=np.int16),
    "uint16": np.array([65535], dtype=np.uint16),
    "int32": np.arange(12, dtype=np.int32).reshape(3, 4),
    "uint32": np.array([2**32 - 1], dtype=np.uint32),
    "int64": np.array([-(2**62), 2**62], dtype=np.int64),
    "uint64": np.array([2**64 - 1], dtype=np.uint64),
    "float16": np.array([0.5, -1.25], dtype=np.float16),
    "float32": np.linspace(-1, 1, 24, dtype=np.float32).reshape(2, 3, 4),
    "float64": np.array(np.pi),
    "float64_special": np.array([np.nan, np.inf, -np.inf, -0.0]),
    "complex64": np.array([1 + 2j, -3j], dtype=np.complex64),
    "complex128": np.array([[1e300 + 1j]], dtype=np.complex128),
    "bfloat16": np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16),
    "empty": np.zeros((0,), dtype=np.float32),
    "empty_3d": np.zeros((3, 0, 2), dtype=np.int64),
    "zero_d_bool": np.array(True),
    "numpy_scalar": np.float32(2.5),
    "transposed": np.arange(6, dtype=np.float32).reshape(2, 3).T,
    "big_endian": np.arange(5, dtype=">i4"),
    "strided": np.arange(20, dtype=np.int16)[::3],
}

DISALLOWED = {
    "object": np.array([{"a": 1}, None], dtype=object),
    "unicode": np.array(["text"]),
    "bytes": np.array([b"bytes"]),
    "datetime64": np.array(["2024-01-01"], dtype="datetime64[D]"),
    "structured": np.zeros(2, dtype=[("x", "i4"), ("y", "f4")]),
}


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    yield a, b
    a.close()
    b.close()


def _raw(header: object, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack(">I", len(raw)) + raw + body


def _assert_same(got: dict[str, np.ndarray], sent: dict[str, np.ndarray]) -> None:
    assert list(got) == list(sent)
    for name, value in sent.items():
        value = np.asarray(value)
        assert got[name].shape == value.shape, name
        assert got[name].dtype == value.dtype.newbyteorder("="), name
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_blocking_round_trip_keeps_every_dtype_and_shape(pair):
    a, b = pair
    header = {"id": 7, "command": "x", "payload": {"k": [1, "x", None]}}
    channel.send_message(a, channel.encode_message(header, ROUND_TRIP))
    got_header, arrays = channel.recv_message(b)
    assert {k: got_header[k] for k in header} == header
    assert [s["name"] for s in got_header["arrays"]] == list(ROUND_TRIP)
    _assert_same(arrays, ROUND_TRIP)


def test_asyncio_round_trip_gives_writable_arrays(pair):
    a, b = pair
    big = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    sent = {**ROUND_TRIP, "large": big}

    async def read() -> tuple[dict, dict]:
        reader, writer = await asyncio.open_connection(sock=b)
        parts = channel.encode_message({"id": 1}, sent)
        try:  # the message is larger than the socket buffer: send while reading
            sending = asyncio.create_task(asyncio.to_thread(channel.send_message, a, parts))
            got = await asyncio.wait_for(channel.read_message(reader), 10)
            await sending
            return got
        finally:
            writer.close()

    header, arrays = asyncio.run(read())
    assert header["id"] == 1
    _assert_same(arrays, sent)
    assert all(x.flags.writeable and x.flags.c_contiguous for x in arrays.values())


def test_messages_without_arrays_and_back_to_back(pair):
    a, b = pair
    for i in range(3):
        channel.send_message(a, channel.encode_message({"id": i}))
    channel.send_message(a, channel.encode_message({"id": 3}, {"x": np.arange(3)}))
    for i in range(3):
        assert channel.recv_message(b) == ({"id": i, "arrays": []}, {})
    header, arrays = channel.recv_message(b)
    assert header["id"] == 3 and arrays["x"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("array", list(DISALLOWED.values()), ids=list(DISALLOWED))
def test_disallowed_dtypes_are_refused_when_encoding(array):
    with pytest.raises(ArrayError) as info:
        channel.encode_message({"id": 1}, {"ok": np.ones(2), "bad": array})
    assert info.value.code == "unsupported_dtype"
    assert "'bad'" in str(info.value)


def test_array_names_must_be_strings():
    with pytest.raises(ArrayError) as info:
        channel.encode_message({"id": 1}, {3: np.ones(2)})
    assert info.value.code == "invalid_array"


BAD_SPECS = [
    ({"name": "x", "dtype": "object", "shape": [1], "nbytes": 8}, "unsupported_dtype"),
    ({"name": "x", "dtype": "float32", "shape": [3], "nbytes": 8}, "invalid_array"),
    ({"name": "x", "dtype": "float32", "shape": [-2], "nbytes": 8}, "invalid_array"),
    ({"name": "x", "dtype": "float32", "shape": [True, 2], "nbytes": 8}, "invalid_array"),
    ({"name": "x", "dtype": "float32", "shape": "2", "nbytes": 8}, "invalid_array"),
    ({"dtype": "float32", "shape": [2], "nbytes": 8}, "invalid_array"),
]


@pytest.mark.parametrize(
    ("spec", "code"),
    BAD_SPECS,
    ids=["object", "nbytes-vs-shape", "negative-dim", "bool-dim", "shape-not-list", "no-name"],
)
def test_bad_array_specs_are_array_errors_and_the_stream_stays_in_sync(pair, spec, code):
    a, b = pair
    a.sendall(_raw({"id": 1, "arrays": [spec]}, b"\0" * spec["nbytes"]))
    channel.send_message(a, channel.encode_message({"id": 2}, {"y": np.arange(2)}))
    header, error = channel.recv_message(b)
    assert header["id"] == 1 and isinstance(error, ArrayError) and error.code == code
    header, arrays = channel.recv_message(b)  # the next message is read whole and right
    assert header["id"] == 2 and arrays["y"].tolist() == [0, 1]


def test_repeated_array_name_is_an_array_error():
    spec = {"name": "x", "dtype": "int8", "shape": [1], "nbytes": 1}
    with pytest.raises(ArrayError) as info:
        channel.decode_arrays([spec, spec], b"\1\2")
    assert info.value.code == "invalid_array"


def test_asyncio_reader_raises_array_errors(pair):
    a, b = pair
    spec = {"name": "x", "dtype": "object", "shape": [1], "nbytes": 8}
    a.sendall(_raw({"id": 1, "arrays": [spec]}, b"\0" * 8))

    async def read() -> None:
        reader, writer = await asyncio.open_connection(sock=b)
        try:
            with pytest.raises(ArrayError):
                await asyncio.wait_for(channel.read_message(reader), 10)
        finally:
            writer.close()

    asyncio.run(read())


CORRUPT = {
    "huge-length": struct.pack(">I", channel.MAX_HEADER_BYTES + 1),
    "not-utf8": struct.pack(">I", 2) + b"\xff\xfe",
    "not-json": struct.pack(">I", 3) + b"{x}",
    "json-array": _raw([1, 2]),
    "arrays-not-list": _raw({"arrays": {"x": 1}}),
    "spec-not-object": _raw({"arrays": [1]}),
    "nbytes-missing": _raw({"arrays": [{"name": "x"}]}),
    "nbytes-negative": _raw({"arrays": [{"name": "x", "nbytes": -1}]}),
    "nbytes-bool": _raw({"arrays": [{"name": "x", "nbytes": True}]}),
}


@pytest.mark.parametrize("raw", list(CORRUPT.values()), ids=list(CORRUPT))
def test_corrupt_streams_are_channel_errors(pair, raw):
    a, b = pair
    a.sendall(raw)
    with pytest.raises(ChannelError):
        channel.recv_message(b)


def test_closed_channel_is_eof_even_mid_message(pair):
    a, b = pair
    a.sendall(
        _raw({"id": 1, "arrays": [{"name": "x", "dtype": "int8", "shape": [4], "nbytes": 4}]})
    )
    a.sendall(b"\1\2")  # two of four array bytes
    a.close()
    with pytest.raises(EOFError):
        channel.recv_message(b)
    with pytest.raises(EOFError):  # and on a clean boundary
        channel.recv_message(b)


def test_asyncio_reader_sees_a_closed_channel(pair):
    a, b = pair
    a.sendall(struct.pack(">I", 10) + b"{")
    a.close()

    async def read() -> None:
        reader, writer = await asyncio.open_connection(sock=b)
        try:
            with pytest.raises(asyncio.IncompleteReadError):
                await asyncio.wait_for(channel.read_message(reader), 10)
        finally:
            writer.close()

    asyncio.run(read())
