"""JSON array codec: one codec for metrics and training batches, errors naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from app.codecs import json_arrays
from app.codecs.json_arrays import decode_json_arrays, encode_json, loads_body, parse_json_model
from app.core.errors import (
    InvalidJson,
    InvalidTensor,
    RaggedArray,
    ServiceError,
    UnsupportedDatatype,
)
from app.schemas.sessions import StepRequest


@pytest.mark.parametrize(
    ("value", "error", "fragment"),
    [
        ([[1, 2], [3]], RaggedArray, "is not rectangular"),
        (["a", "b"], InvalidTensor, "non-numeric"),
        ({"shape": [2], "datatype": "BF16", "data": [1, 2]}, UnsupportedDatatype, "BF16"),
        ({"shape": [3], "datatype": "FP32", "data": [1, 2]}, InvalidTensor, "data holds 2"),
    ],
    ids=["ragged", "strings", "bf16", "shape-vs-data"],
)
@pytest.mark.parametrize("what", ["metric", "batch field"])
def test_errors_name_the_field_as_the_caller_calls_it(value, error, fragment, what):
    with pytest.raises(error) as info:
        decode_json_arrays(
            {"inputs": value} if not isinstance(value, float) else {"inputs": value}, what=what
        )
    assert f"{what} 'inputs'" in info.value.detail
    assert fragment in info.value.detail


def test_lists_and_tensors_decode_to_numpy():
    out = decode_json_arrays(
        {
            "a": [[1.5, None], [2.0, 3.0]],
            "b": {"shape": [2, 2], "datatype": "INT8", "data": [1, 2, 3, 4]},
            "c": [True, False],
        }
    )
    assert out["a"].dtype == np.float64 and np.isnan(out["a"][0, 1])
    assert out["b"].dtype == np.int8 and out["b"].tolist() == [[1, 2], [3, 4]]
    assert out["c"].dtype == np.bool_


def test_int_tensor_out_of_range_is_refused():
    with pytest.raises(InvalidTensor, match="do not fit INT8"):
        decode_json_arrays({"x": {"shape": [1], "datatype": "INT8", "data": [300]}})


def test_encode_json_writes_null_for_non_finite_and_shortest_decimals():
    encoded = encode_json({"x": np.array([0.65, np.nan, np.inf], np.float32), "h": np.float16(0.1)})
    assert encoded == b'{"x":[0.65,null,null],"h":0.1}'


def test_encode_json_writes_each_kind_of_value_in_a_dict_as_before():
    # Python and numpy scalars pass through unchanged; everything else is still made ready
    # (0-d arrays, float16, byte-swapped arrays, nested dicts and lists).
    value = {
        "reduced": {
            "f64": np.float64(0.5),
            "f32": np.float32(0.65),
            "i64": np.int64(-3),
            "u8": np.uint8(7),
            "b": np.bool_(True),
            "nan": np.float64("nan"),
            "h": np.float16(0.1),
            "zero_d": np.array(2.5, np.float32),
            "swapped": np.array([1.5, 2.5], ">f8"),
            "nested": {"list": [np.float16(0.2), 1, None], "t": (True, "s")},
        },
        "num_devices": 8,
        "ratio": 0.25,
        "name": "x",
        "flag": False,
        "none": None,
    }
    assert encode_json(value) == (
        b'{"reduced":{"f64":0.5,"f32":0.65,"i64":-3,"u8":7,"b":true,"nan":null,"h":0.1,'
        b'"zero_d":2.5,"swapped":[1.5,2.5],"nested":{"list":[0.2,1,null],"t":[true,"s"]}},'
        b'"num_devices":8,"ratio":0.25,"name":"x","flag":false,"none":null}'
    )


def test_loads_body_refuses_empty_and_malformed():
    with pytest.raises(ServiceError) as empty:
        loads_body(b"")
    assert empty.value.code == "validation_error"
    with pytest.raises(InvalidJson):
        loads_body(b"{")
    assert loads_body(b'{"x": NaN}')["x"] != loads_body(b'{"x": NaN}')["x"]  # NaN literal read


def test_parse_json_model_reports_every_field():
    with pytest.raises(ServiceError) as info:
        parse_json_model(b'{"steps": "many", "bogus": 1}', StepRequest)
    fields = {entry["field"] for entry in info.value.extra["errors"]}
    assert {"steps", "bogus"} <= fields
    assert info.value.code == "validation_error"


# ------------------------------------------------------------------ counts before parsing


@pytest.mark.parametrize(
    ("item", "count", "refused"),
    [
        ("1", json_arrays.MAX_JSON_VALUES - 1, False),
        ("1", json_arrays.MAX_JSON_VALUES + 1, True),
        ("[1]", json_arrays.MAX_JSON_CONTAINERS - 2, False),
        ("[1]", json_arrays.MAX_JSON_CONTAINERS + 1, True),
    ],
)
def test_json_bodies_past_the_counts_are_refused_before_parsing(item, count, refused):
    body = ("[" + ",".join([item] * count) + "]").encode()
    if refused:
        with pytest.raises(json_arrays.TooManyJsonValues, match="send large arrays as npz"):
            json_arrays.loads_json(body)
        with pytest.raises(ServiceError) as caught:
            json_arrays.loads_body(body)
        assert caught.value.code == "invalid_json"
    else:
        assert len(json_arrays.loads_json(body)) == count


def test_small_bodies_are_not_counted():
    # Under COUNT_OVER bytes no body can pass the counts: nothing is counted.
    body = b'{"names": "' + b"," * (json_arrays.COUNT_OVER - 20) + b'"}'
    assert json_arrays.loads_json(body)["names"].count(",") == json_arrays.COUNT_OVER - 20
