"""The REST tensor codec: tritonclient.http's own request builder and result parser on the
other side (wire compatibility), every datatype both ways, and every refusal's wording."""

from __future__ import annotations

import re
import time
from typing import Any

import ml_dtypes
import msgspec
import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.http._utils import _get_inference_request

from evenflow.balancer import ErrorCode, EvenflowError, InvalidRequest
from evenflow.server.edge.datatypes import WIRE_TYPES
from evenflow.server.edge.rest.tensors import (
    RestRequest,
    decode_inputs,
    encode_response,
    parse_request,
    requested_outputs,
)
from evenflow.server.models.spec import TensorSpec

LIMIT = 1 << 20  # --max-tensor-elements

SAMPLES: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 255, 7], [1, 2, 3]], np.uint8),
    "UINT16": np.array([[0, 65535, 7], [1, 2, 3]], np.uint16),
    "UINT32": np.array([[0, 2**32 - 1, 7], [1, 2, 3]], np.uint32),
    "UINT64": np.array([[0, 2**64 - 1, 7], [1, 2, 3]], np.uint64),
    "INT8": np.array([[-128, 127, 0], [1, -2, 3]], np.int8),
    "INT16": np.array([[-(2**15), 2**15 - 1, 0], [1, -2, 3]], np.int16),
    "INT32": np.array([[-(2**31), 2**31 - 1, 0], [1, -2, 3]], np.int32),
    "INT64": np.array([[-(2**63), 2**63 - 1, 0], [1, -2, 3]], np.int64),
    "FP16": np.array([[0.5, -65504, 1e-3], [6e-8, 1.1, -0.0]], np.float16),
    "BF16": np.array([[0x3F80, 0xC000, 0x0001], [0x7F7F, 0, 0x8000]], np.uint16),
    "FP32": np.array([[1.1, -3.4e38, 1e-45], [0.1, 2.5, -7]], np.float32),
    "FP64": np.array([[1.1, -1.7e308, 5e-324], [0.1, 2.5, -7]], np.float64),
    "BYTES": np.array([[b"ab", "\u00e9t\u00e9".encode(), b""], [b"x", b"yz", b"0"]],
                      dtype=object),
}
assert set(SAMPLES) == set(WIRE_TYPES)


def client_array(datatype: str, array: np.ndarray) -> np.ndarray:
    """The array as tritonclient wants it: BF16 as ml_dtypes.bfloat16 (evenflow's uint16 bits)."""
    return array.view(ml_dtypes.bfloat16) if datatype == "BF16" else array


def bits(datatype: str, array: np.ndarray) -> np.ndarray:
    """Comparable values: BF16 by its bits, whichever dtype carries them."""
    return array.view(np.uint16) if datatype == "BF16" else array


def client_request(arrays: dict[str, tuple[str, np.ndarray, bool]],
                   outputs: dict[str, bool] | None = None, **options: Any
                   ) -> tuple[bytes, int | None]:
    """The body and header length tritonclient.http sends for ``arrays``: name ->
    (datatype, array, as binary)."""
    inputs = []
    for name, (datatype, array, binary) in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(client_array(datatype, array), binary_data=binary)
        inputs.append(tensor)
    requested = None if outputs is None else [
        httpclient.InferRequestedOutput(name, binary_data=binary)
        for name, binary in outputs.items()]
    body, header_length = _get_inference_request(
        inputs, options.get("request_id", ""), requested, 0, False, False,
        options.get("priority", 0), options.get("timeout"), options.get("parameters"))
    return (body if isinstance(body, bytes) else body.encode()), header_length


def client_result(request: RestRequest, specs: list[TensorSpec],
                  arrays: list[np.ndarray]) -> httpclient.InferResult:
    """Our response to ``request``, as tritonclient.http parses it."""
    parts, header_length = encode_response(request, "m", "1", specs,
                                           requested_outputs(request, specs), arrays)
    return httpclient.InferResult.from_response_body(b"".join(parts),
                                                     header_length=header_length)


def json_body(header: dict[str, Any], *binary: bytes) -> tuple[bytes, int | None]:
    encoded = msgspec.json.encode(header)
    return encoded + b"".join(binary), len(encoded) if binary else None


def decode(header: dict[str, Any], specs: list[TensorSpec], *binary: bytes,
           max_elements: int = LIMIT) -> tuple[list[np.ndarray], int]:
    return decode_inputs(parse_request(*json_body(header, *binary)), specs, max_elements)


def fp32(name: str = "x", **fields: Any) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": [1, 2], **fields}


X = [TensorSpec("x", "FP32", (-1, 2))]


@pytest.mark.parametrize("datatype", sorted(WIRE_TYPES))
def test_binary_round_trip_through_tritonclient(datatype: str) -> None:
    specs = [TensorSpec("t", datatype, (-1, 3))]
    sample = SAMPLES[datatype]
    body, header_length = client_request({"t": (datatype, sample, True)}, {"t": True})
    assert header_length is not None
    request = parse_request(body, header_length)
    arrays, batch = decode_inputs(request, specs, LIMIT)
    assert batch == 2
    assert arrays[0].tolist() == sample.tolist()
    if datatype != "BYTES":  # a view of the body, not a copy
        assert arrays[0].dtype == WIRE_TYPES[datatype].numpy_dtype
        assert np.shares_memory(arrays[0], np.frombuffer(body, np.uint8))
    result = client_result(request, specs, arrays)
    assert result.get_output("t")["parameters"]["binary_data_size"] > 0
    np.testing.assert_array_equal(bits(datatype, result.as_numpy("t")), sample)


@pytest.mark.parametrize("datatype", sorted(set(WIRE_TYPES) - {"BF16"}))
def test_json_round_trip_through_tritonclient(datatype: str) -> None:
    specs = [TensorSpec("t", datatype, (-1, 3))]
    sample = SAMPLES[datatype]
    body, header_length = client_request({"t": (datatype, sample, False)}, {"t": False})
    assert header_length is None
    request = parse_request(body, header_length)
    arrays, _ = decode_inputs(request, specs, LIMIT)
    assert arrays[0].dtype == WIRE_TYPES[datatype].numpy_dtype
    assert arrays[0].tolist() == sample.tolist()
    parts, response_header_length = encode_response(request, "m", "1", specs, [0], arrays)
    assert response_header_length is None and len(parts) == 1
    result = httpclient.InferResult.from_response_body(parts[0])
    assert "parameters" not in result.get_output("t")
    returned = result.as_numpy("t")
    if datatype == "BYTES":  # tritonclient hands JSON strings back as str
        returned = np.vectorize(str.encode, otypes=[object])(returned)
    np.testing.assert_array_equal(returned, sample)


@given(st.sampled_from(sorted(set(WIRE_TYPES) - {"BYTES", "BF16"})), st.booleans(),
       st.booleans(), st.data())
@settings(max_examples=60, deadline=None)
def test_generated_numeric_round_trips(datatype: str, binary_in: bool, binary_out: bool,
                                       data: st.DataObject) -> None:
    dtype = WIRE_TYPES[datatype].numpy_dtype
    elements = hnp.from_dtype(dtype, allow_nan=False, allow_infinity=False) \
        if dtype.kind == "f" else hnp.from_dtype(dtype)
    array = data.draw(hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1,
                                                         max_side=4), elements=elements))
    specs = [TensorSpec("t", datatype, (-1, *array.shape[1:]))]
    body, header_length = client_request({"t": (datatype, array, binary_in)},
                                         {"t": binary_out})
    request = parse_request(body, header_length)
    arrays, batch = decode_inputs(request, specs, LIMIT)
    assert batch == array.shape[0]
    np.testing.assert_array_equal(arrays[0], array)
    np.testing.assert_array_equal(client_result(request, specs, arrays).as_numpy("t"), array)


def test_mixed_json_and_binary_inputs_and_outputs() -> None:
    specs = [TensorSpec("a", "INT32", (-1, 2)), TensorSpec("b", "FP32", (-1, 2)),
             TensorSpec("c", "BYTES", (-1, 1)), TensorSpec("d", "BF16", (-1, 1))]
    a = np.array([[1, 2], [3, 4]], np.int32)
    b = np.array([[0.5, 1.5], [2.5, 3.5]], np.float32)
    c = np.array([[b"one"], [b"\xff\x00"]], dtype=object)
    d = np.array([[0x3F80], [0x4000]], np.uint16)
    # Inputs sent out of spec order: binary sections follow the inputs as sent.
    body, header_length = client_request(
        {"c": ("BYTES", c, True), "a": ("INT32", a, False), "d": ("BF16", d, True),
         "b": ("FP32", b, True)},
        {"b": False, "c": True, "a": False, "d": True})
    request = parse_request(body, header_length)
    arrays, batch = decode_inputs(request, specs, LIMIT)
    assert batch == 2
    for got, want in zip(arrays, (a, b, c, d), strict=True):
        assert got.tolist() == want.tolist()
    result = client_result(request, specs, arrays)
    assert [o["name"] for o in result.get_response()["outputs"]] == ["b", "c", "a", "d"]
    assert "data" in result.get_output("a") and "data" in result.get_output("b")
    np.testing.assert_array_equal(result.as_numpy("a"), a)
    np.testing.assert_array_equal(result.as_numpy("b"), b)
    np.testing.assert_array_equal(result.as_numpy("c"), c)
    np.testing.assert_array_equal(result.as_numpy("d").view(np.uint16), d)


def test_outputs_default_to_the_request_level_binary_data_output() -> None:
    specs = [TensorSpec("y", "FP32", (-1, 1)), TensorSpec("z", "INT64", (-1, 1))]
    outputs = [np.array([[1.5]], np.float32), np.array([[7]], np.int64)]
    header = {"id": "r1", "parameters": {"binary_data_output": True},
              "inputs": [fp32(data=[1, 2])],
              "outputs": [{"name": "y"}, {"name": "z", "parameters": {"binary_data": False}}]}
    request = parse_request(*json_body(header))
    assert request.binary_output and request.id == "r1"
    parts, header_length = encode_response(request, "m", "3", specs, [0, 1], outputs)
    response = msgspec.json.decode(parts[0])
    assert response == {"model_name": "m", "model_version": "3", "id": "r1", "outputs": [
        {"name": "y", "datatype": "FP32", "shape": [1, 1],
         "parameters": {"binary_data_size": 4}},
        {"name": "z", "datatype": "INT64", "shape": [1, 1], "data": [7]}]}
    assert header_length == len(parts[0])
    assert b"".join(parts[1:]) == outputs[0].tobytes()
    # tritonclient asks for every output in binary when it names none.
    body, length = client_request({"x": ("FP32", np.zeros((1, 2), np.float32), False)})
    implicit = parse_request(body, length)
    assert implicit.binary_output and implicit.id is None
    implicit_parts, _ = encode_response(implicit, "m", "1", specs, [0, 1], outputs)
    assert "id" not in msgspec.json.decode(implicit_parts[0])
    assert requested_outputs(implicit, specs) == [0, 1]


def test_binary_outputs_are_the_arrays_bytes_row_major() -> None:
    spec = [TensorSpec("y", "INT32", (-1, 3))]
    transposed = np.arange(6, dtype=np.int32).reshape(3, 2).T  # not C-contiguous
    request = parse_request(*json_body({"inputs": [], "parameters": {"binary_data_output": True}}))
    parts, _ = encode_response(request, "m", "1", spec, [0], [transposed])
    assert bytes(parts[1]) == np.ascontiguousarray(transposed).tobytes()
    contiguous = np.arange(6, dtype=np.int32).reshape(2, 3)
    parts, _ = encode_response(request, "m", "1", spec, [0], [contiguous])
    assert np.shares_memory(np.frombuffer(parts[1], np.int32), contiguous)  # not copied


def test_request_parameters() -> None:
    body, length = client_request({"x": ("FP32", np.zeros((1, 2), np.float32), True)},
                                  {"x": True}, request_id="7", priority=2, timeout=2_500_000)
    request = parse_request(body, length)
    assert (request.id, request.priority, request.timeout_s) == ("7", 2, 2.5)
    assert not request.binary_output
    plain = parse_request(*json_body({"inputs": [fp32(data=[1, 2])]}))
    assert (plain.priority, plain.timeout_s) == (0, None)


@pytest.mark.parametrize(("shape", "data"), [
    ([2, 2], [1, 2, 3, 4]),
    ([2, 2], [[1, 2], [3, 4]]),
])
def test_flat_and_nested_json(shape: list[int], data: list[Any]) -> None:
    spec = [TensorSpec("x", "FP32", (-1, 2))]
    arrays, _ = decode({"inputs": [fp32(shape=shape, data=data)]}, spec)
    assert arrays[0].tolist() == [[1, 2], [3, 4]]


def test_nested_json_of_rank_three() -> None:
    spec = [TensorSpec("x", "INT8", (-1, 2, -1))]
    data = [[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]]
    arrays, batch = decode({"inputs": [{"name": "x", "datatype": "INT8", "shape": [2, 2, 3],
                                        "data": data}]}, spec)
    assert batch == 2 and arrays[0].tolist() == data
    spaced = b'{"inputs": [{"name": "x", "datatype": "INT8", "shape": [1, 2, 1],' \
             b' "data": [ \n\t[ [1], [2] ] ]}]}'
    assert decode_inputs(parse_request(spaced, None), spec, LIMIT)[0][0].tolist() == [[[1], [2]]]


@pytest.mark.parametrize(("datatype", "value", "message"), [
    ("UINT8", 300, "Expected `int` <= 255 - at `$[1]`"),
    ("UINT8", -1, "Expected `int` >= 0"),
    ("INT32", 1.5, "Expected `int`, got `float`"),
    ("INT32", True, "Expected `int`, got `bool`"),
    ("INT64", 2**63, "Expected `int` <= 9223372036854775807"),
    ("UINT64", 2**64, "a value is over 18446744073709551615"),
    ("UINT64", -1, "Expected `int` >= 0"),
    ("FP32", "1", "Expected `float`, got `str`"),
    ("FP32", 1e39, "Expected `float` <"),
    ("FP16", 70000, "Expected `float` <"),
    ("FP16", 65520, "Expected `float` <"),
    ("FP64", None, "Expected `float`, got `null`"),
    ("BOOL", 1, "Expected `bool`, got `int`"),
    ("BYTES", 5, "Expected `str`, got `int`"),
])
def test_json_values_must_fit_the_datatype(datatype: str, value: Any, message: str) -> None:
    spec = [TensorSpec("x", datatype, (-1, 2))]
    first = {"BOOL": True, "BYTES": "a"}.get(datatype, 0)
    with pytest.raises(InvalidRequest) as info:
        decode({"inputs": [{"name": "x", "datatype": datatype, "shape": [1, 2],
                            "data": [first, value]}]}, spec)
    assert f"input 'x' data does not fit {datatype} [1, 2]: " in str(info.value)
    assert message in str(info.value)


def test_fp16_limit_is_where_rounding_reaches_infinity() -> None:
    spec = [TensorSpec("x", "FP16", (-1, 2))]
    arrays, _ = decode({"inputs": [{"name": "x", "datatype": "FP16", "shape": [1, 2],
                                    "data": [65519.9, -65519.9]}]}, spec)
    assert arrays[0].tolist() == [[65504.0, -65504.0]]


def binary_input(name: str, size: int, shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": name, "datatype": "FP32", "shape": shape or [1, 2],
            "parameters": {"binary_data_size": size}}


@pytest.mark.parametrize(("header", "binary", "message"), [
    # the JSON itself
    (b"{", None, "the inference request is not valid JSON: "),
    (b"[]", None, "does not fit the protocol: Expected `object`, got `array`"),
    ({"inputs": {}}, None, "Expected `array`, got `object` - at `$.inputs`"),
    ({"inputs": [{"datatype": "FP32", "shape": [1, 2]}]}, None,
     "missing required field `name` - at `$.inputs[0]`"),
    ({"inputs": [fp32(shape="3")]}, None, "Expected `array`, got `str` - at `$.inputs[0].shape`"),
    ({"inputs": [fp32(shape=[True, 2])]}, None, "got `bool` - at `$.inputs[0].shape[0]`"),
    ({"inputs": [fp32(shape=[-1, 2])]}, None, "Expected `int` >= 0 - at `$.inputs[0].shape[0]`"),
    ({"inputs": [fp32(shape=[2**63, 2])]}, None,
     "Expected `int` <= 9223372036854775807 - at `$.inputs[0].shape[0]`"),
    ({"inputs": [fp32(shape=[1.0, 2])]}, None, "got `float` - at `$.inputs[0].shape[0]`"),
    ({"inputs": [fp32(datatype=3)]}, None, "got `int` - at `$.inputs[0].datatype`"),
    ({"inputs": [], "id": 5}, None, "Expected `str | null`, got `int` - at `$.id`"),
    ({"inputs": [], "ouputs": []}, None, "unknown field `ouputs`"),
    ({"inputs": [], "outputs": [{"name": "y", "shape": [1]}]}, None,
     "unknown field `shape` - at `$.outputs[0]`"),
    (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": '
     + b"[" * 100_000 + b"]" * 100_000 + b"}]}", None, "nested too deeply"),
    # the binary section
    ({"inputs": [binary_input("x", 8)]}, b"1234",
     "binary_data_size of input 'x' (8 bytes) runs past the binary section (4 bytes left)"),
    ({"inputs": [binary_input("x", 8)]}, None,
     "binary_data_size of input 'x' (8 bytes) runs past the binary section (0 bytes left)"),
    ({"inputs": [binary_input("x", 8)]}, bytes(11),
     "3 bytes of binary data follow the inputs' declared sizes"),
    ({"inputs": [fp32(data=[1, 2])]}, bytes(2),
     "2 bytes of binary data follow the inputs' declared sizes"),
    ({"inputs": [fp32(parameters={"binary_data_size": "8"})]}, bytes(8),
     "input 'x': binary_data_size must be an integer >= 0, not '8'"),
    ({"inputs": [fp32(parameters={"binary_data_size": -8})]}, bytes(8),
     "binary_data_size must be an integer >= 0, not '-8'"),
    # request and output parameters
    ({"inputs": [], "parameters": {"sequence_id": 3}}, None,
     "unsupported request parameters ['sequence_id']; evenflow acts on ['priority', 'timeout']"),
    ({"inputs": [], "parameters": {"priority": "high"}}, None,
     "parameter 'priority' must be an integer, not str"),
    ({"inputs": [], "parameters": {"priority": True}}, None,
     "parameter 'priority' must be an integer, not bool"),
    ({"inputs": [], "parameters": {"timeout": 1.5}}, None,
     "parameter 'timeout' must be an integer, not float"),
    ({"inputs": [], "parameters": {"timeout": -1}}, None,
     "parameter 'timeout' must be >= 0, not -1"),
    ({"inputs": [], "parameters": {"binary_data_output": 1}}, None,
     "parameter 'binary_data_output' must be a boolean, not int"),
    ({"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": "yes"}}]}, None,
     "requested output 'y': binary_data must be a boolean, not str"),
])
def test_refused_on_parsing(header: dict[str, Any] | bytes, binary: bytes | None,
                            message: str) -> None:
    if isinstance(header, bytes):
        body, length = header + (binary or b""), len(header) if binary is not None else None
    else:
        body, length = json_body(header, *([binary] if binary is not None else []))
    with pytest.raises(InvalidRequest) as info:
        parse_request(body, length)
    assert message in str(info.value)


def test_header_length_past_the_body() -> None:
    body, _ = json_body({"inputs": []})
    with pytest.raises(InvalidRequest, match=f"Inference-Header-Content-Length is 999; the body "
                                             f"has {len(body)} bytes"):
        parse_request(body, 999)
    with pytest.raises(InvalidRequest, match="Inference-Header-Content-Length is -1"):
        parse_request(body, -1)


def test_header_length_counts_the_json_only() -> None:
    header = msgspec.json.encode({"inputs": [binary_input("x", 8)]})
    data = np.array([[1, 2]], np.float32).tobytes()
    with pytest.raises(InvalidRequest, match="not valid JSON"):  # JSON and binary read as one
        parse_request(header + data, None)
    with pytest.raises(InvalidRequest, match="not valid JSON"):  # the header cut short
        parse_request(header + data, len(header) - 1)
    assert decode_inputs(parse_request(memoryview(header + data), len(header)), X,
                         LIMIT)[0][0].tolist() == [[1, 2]]


TWO = [TensorSpec("x", "FP32", (-1, 2)), TensorSpec("z", "FP32", (-1, 2))]


@pytest.mark.parametrize(("inputs", "binary", "specs", "message"), [
    ([fp32(datatype="FP64", data=[1, 2])], b"", X, "input 'x' has datatype FP64; expected FP32"),
    ([fp32(datatype="", data=[1, 2])], b"", X, "has datatype (empty); expected FP32"),
    ([fp32(data=[1, 2], parameters={"shared_memory_region": "r"})], b"", X,
     "input 'x': tensor parameters ['shared_memory_region'] are not supported (no shared memory)"),
    ([fp32()], b"", X, "input 'x' carries no data"),
    ([{**binary_input("x", 8), "data": [1, 2]}], bytes(8), X,
     "input 'x' has both binary data (binary_data_size) and JSON data; send one or the other"),
    ([fp32(shape=[1, 3], data=[1, 2, 3])], b"", X, "expected [-1, 2] (-1: any size >= 1)"),
    ([fp32(shape=[1, 2, 1], data=[1, 2])], b"", X, "(rank 3); expected [-1, 2] (rank 2)"),
    ([fp32(shape=[0, 2], data=[])], b"", X, "input 'x' has batch dimension 0; expected >= 1"),
    ([fp32(data=[1, 2, 3])], b"", X, "input 'x' data has 3 elements; shape [1, 2] needs 2"),
    ([fp32(data=1)], b"", X, "Expected `array`, got `int`"),
    ([fp32(data=None)], b"", X, "Expected `array`, got `null`"),
    ([fp32(shape=[2, 2], data=[[1, 2], [3]])], b"", X,
     "input 'x' data is ragged: a list at depth 1 has 1 elements; shape [2, 2] needs 2 there"),
    ([fp32(shape=[2, 2], data=[[1, 2]])], b"", X,
     "data is ragged: a list at depth 0 has 1 elements; shape [2, 2] needs 2 there"),
    ([fp32(shape=[2, 2], data=[[1, 2], 3])], b"", X, "Expected `array`, got `int` - at `$[1]`"),
    ([fp32(shape=[1, 2], data=[[[1], [2]]])], b"", X, "Expected `float`, got `array`"),
    ([binary_input("x", 4)], bytes(4), X,
     "input 'x' raw data has 4 bytes; shape [1, 2] of FP32 needs 8"),
    ([{"name": "x", "datatype": "BF16", "shape": [1, 2], "data": [1, 2]}], b"",
     [TensorSpec("x", "BF16", (-1, 2))],
     "input 'x': BF16 data can only be sent as binary data (binary_data_size), not in JSON"),
    ([{"name": "s", "datatype": "BYTES", "shape": [1, 2],
       "parameters": {"binary_data_size": 6}}], b"\x01\x00\x00\x00a\x05",
     [TensorSpec("s", "BYTES", (-1, 2))], "input 's': truncated BYTES length prefix"),
    ([{"name": "s", "datatype": "BYTES", "shape": [1, 2],
       "parameters": {"binary_data_size": 5}}], b"\x01\x00\x00\x00a",
     [TensorSpec("s", "BYTES", (-1, 2))], "raw data holds 1 BYTES elements; shape [1, 2] needs 2"),
    ([fp32(name="q", data=[1, 2])], b"", X, "unexpected input 'q'; model expects ['x']"),
    ([fp32(data=[1, 2])], b"", TWO, "missing input 'z'; model expects ['x', 'z']"),
    ([fp32(data=[1, 2]), fp32(data=[1, 2])], b"", TWO, "input 'x' given twice"),
    ([fp32(data=[1, 2]), fp32(name="z", shape=[2, 2], data=[1, 2, 3, 4])], b"", TWO,
     "input 'z' has batch 2, other inputs have 1; all inputs must share the batch dimension"),
])
def test_refused_on_decoding(inputs: list[dict[str, Any]], binary: bytes,
                             specs: list[TensorSpec], message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode({"inputs": inputs}, specs, *([binary] if binary else []))
    assert message in str(info.value)


def test_sizes_are_checked_before_allocating() -> None:
    huge = [10**6, 10**6]  # 10**12 elements, 4 TB of FP32
    start_s = time.perf_counter()
    with pytest.raises(InvalidRequest, match="has 1000000000000 elements; the server's limit is"):
        decode({"inputs": [binary_input("x", 4, huge)]}, [TensorSpec("x", "FP32", (-1, -1))],
               bytes(4))
    # Even under a limit that allows it, the data sent is counted before anything is made.
    with pytest.raises(InvalidRequest,
                       match=r"raw data has 4 bytes; shape .* needs 4000000000000"):
        decode({"inputs": [binary_input("x", 4, huge)]}, [TensorSpec("x", "FP32", (-1, -1))],
               bytes(4), max_elements=10**13)
    with pytest.raises(InvalidRequest, match=r"data has 1 elements; shape .* needs 10000000"):
        decode({"inputs": [fp32(shape=huge, data=[1])]}, [TensorSpec("x", "FP32", (-1, -1))],
               max_elements=10**13)
    with pytest.raises(InvalidRequest, match="ragged: a list at depth 0 has 1 elements"):
        decode({"inputs": [fp32(shape=huge, data=[[1]])]}, [TensorSpec("x", "FP32", (-1, -1))],
               max_elements=10**13)
    assert time.perf_counter() - start_s < 1.0


SPECS = [TensorSpec("y", "FP32", (-1, 2)), TensorSpec("z", "INT64", (-1, 1))]


@pytest.mark.parametrize(("outputs", "message"), [
    ([{"name": "nope"}], "unknown requested output 'nope'; model has ['y', 'z']"),
    ([{"name": "y", "parameters": {"classification": 3}}],
     "requested output 'y': parameters ['classification'] are not supported"),
    ([{"name": "y"}, {"name": "y"}], "output 'y' requested twice"),
])
def test_requested_outputs_refused(outputs: list[dict[str, Any]], message: str) -> None:
    request = parse_request(*json_body({"inputs": [], "outputs": outputs}))
    with pytest.raises(InvalidRequest) as info:
        requested_outputs(request, SPECS)
    assert message in str(info.value)


def test_requested_outputs_in_the_order_named() -> None:
    request = parse_request(*json_body({"inputs": [], "outputs": [
        {"name": "z"}, {"name": "y", "parameters": {"binary_data": True}}]}))
    assert requested_outputs(request, SPECS) == [1, 0]


@pytest.mark.parametrize(("spec", "array", "message"), [
    (TensorSpec("y", "BF16", (-1, 1)), np.array([[0x3F80]], np.uint16),
     "BF16 output 'y' can only be sent as binary data; request it with binary_data"),
    (TensorSpec("y", "BYTES", (-1, 1)), np.array([[b"\xff"]], dtype=object),
     "BYTES output 'y' holds an element that is not UTF-8, which JSON cannot carry; "
     "request it with binary_data"),
    (TensorSpec("y", "FP32", (-1, 2)), np.array([[1, np.nan]], np.float32),
     "FP32 output 'y' holds NaN or infinity, which JSON cannot carry"),
    (TensorSpec("y", "FP16", (-1, 1)), np.array([[np.inf]], np.float16),
     "FP16 output 'y' holds NaN or infinity"),
])
def test_outputs_json_cannot_carry(spec: TensorSpec, array: np.ndarray, message: str) -> None:
    request = parse_request(*json_body({"inputs": []}))
    with pytest.raises(InvalidRequest) as info:
        encode_response(request, "m", "1", [spec], [0], [array])
    assert message in str(info.value)
    binary = parse_request(*json_body({"inputs": [], "outputs": [
        {"name": "y", "parameters": {"binary_data": True}}]}))
    parts, _ = encode_response(binary, "m", "1", [spec], [0], [array])
    assert len(parts) == 2  # as binary data it goes


@given(st.lists(st.binary(max_size=8), min_size=1, max_size=6), st.booleans())
@settings(max_examples=40, deadline=None)
def test_generated_bytes_round_trips(elements: list[bytes], binary: bool) -> None:
    if not binary:  # JSON carries text only
        elements = [element.decode("utf-8", "replace").encode() for element in elements]
    array = np.array(elements, dtype=object).reshape(1, -1)
    specs = [TensorSpec("s", "BYTES", (-1, -1))]
    body, header_length = client_request({"s": ("BYTES", array, binary)}, {"s": binary})
    request = parse_request(body, header_length)
    arrays, _ = decode_inputs(request, specs, LIMIT)
    assert arrays[0].tolist() == array.tolist()
    returned = client_result(request, specs, arrays).as_numpy("s")
    if not binary:
        returned = np.vectorize(str.encode, otypes=[object])(returned)
    assert returned.tolist() == array.tolist()


def test_bytes_outputs_that_are_not_bytes_go_as_their_str() -> None:
    spec = [TensorSpec("s", "BYTES", (-1, 2))]
    array = np.array([["caf\u00e9", 7]], dtype=object)
    request = parse_request(*json_body({"inputs": []}))
    parts, _ = encode_response(request, "m", "1", spec, [0], [array])
    assert msgspec.json.decode(parts[0])["outputs"][0]["data"] == ["caf\u00e9", "7"]


def test_a_long_unknown_field_is_quoted_in_part() -> None:
    with pytest.raises(InvalidRequest) as info:
        parse_request(*json_body({"inputs": [], "x" * 100_000: 1}))
    assert "unknown field `xxx" in str(info.value) and len(str(info.value)) < 400


def test_an_output_in_a_wider_dtype_goes_out_in_its_declared_one() -> None:
    """argmax gives torch int64 under an INT32 spec: the bytes must be INT32's, or tritonclient
    cannot reshape them."""
    specs = [TensorSpec("t", "INT32", (-1, 3))]
    body, header_length = client_request({"t": ("INT32", SAMPLES["INT32"], True)}, {"t": True})
    request = parse_request(body, header_length)
    wide = np.arange(6, dtype=np.int64).reshape(2, 3)
    result = client_result(request, specs, [wide])
    assert result.get_output("t")["parameters"]["binary_data_size"] == 4 * wide.size
    returned = result.as_numpy("t")
    assert returned.dtype == np.int32 and returned.tolist() == wide.tolist()
    as_json = parse_request(*client_request({"t": ("INT32", SAMPLES["INT32"], False)},
                                            {"t": False}))
    (header,), _ = encode_response(as_json, "m", "1", specs, [0], [wide])
    assert msgspec.json.decode(header)["outputs"][0]["data"] == list(range(6))


@pytest.mark.parametrize(("datatype", "array", "words"), [
    ("INT32", np.array([[2**31, 0, 0]], np.int64), "outside [-2147483648, 2147483647]"),
    ("UINT8", np.array([[-1, 0, 0]], np.int64), "outside [0, 255]"),
    ("INT32", np.array([[1.5, 0, 0]], np.float32), "returned float32 values"),
    ("BOOL", np.array([[2, 0, 1]], np.uint8), "outside [0, 1]"),
])
def test_an_output_its_declared_dtype_cannot_carry_is_an_internal_error(
        datatype: str, array: np.ndarray, words: str) -> None:
    specs = [TensorSpec("t", datatype, (-1, 3))]
    request = parse_request(b'{"inputs": []}', None)
    with pytest.raises(EvenflowError, match=re.escape(words)) as info:
        encode_response(request, "m", "1", specs, [0], [array])
    assert info.value.code is ErrorCode.INTERNAL
