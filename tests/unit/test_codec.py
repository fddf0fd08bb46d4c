import struct

import numpy as np
import pytest

from evenflow.balancer import EvenflowError, InvalidRequest
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.server.edge.codec import decode_inputs, encode_response, requested_outputs
from evenflow.server.models.spec import TensorSpec

X = [TensorSpec("x", "FP32", (-1, 4))]
LIMIT = 1 << 20  # --max-tensor-elements
Tensor = pb.ModelInferRequest.InferInputTensor


def raw_request(array: np.ndarray, name: str = "x", datatype: str = "FP32",
                shape: tuple[int, ...] | None = None) -> pb.ModelInferRequest:
    return pb.ModelInferRequest(
        model_name="m", inputs=[Tensor(name=name, datatype=datatype,
                                       shape=array.shape if shape is None else shape)],
        raw_input_contents=[array.tobytes()])


def test_raw_fp32_round_trip() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    arrays, batch = decode_inputs(raw_request(x), X, LIMIT)
    assert batch == 2
    np.testing.assert_array_equal(arrays[0], x)


def test_typed_contents() -> None:
    request = pb.ModelInferRequest(inputs=[Tensor(
        name="x", datatype="FP32", shape=[1, 4],
        contents=pb.InferTensorContents(fp32_contents=[1, 2, 3, 4]))])
    arrays, batch = decode_inputs(request, X, LIMIT)
    assert batch == 1
    assert arrays[0].dtype == np.float32
    np.testing.assert_array_equal(arrays[0], [[1, 2, 3, 4]])


@pytest.mark.parametrize(("request_", "message"), [
    (raw_request(np.zeros((1, 4), np.float64), datatype="FP64"), "datatype FP64; expected FP32"),
    (raw_request(np.zeros((1, 4), np.float32), name="z"), "unexpected input 'z'"),
    (pb.ModelInferRequest(), "missing input 'x'"),
    (raw_request(np.zeros((1, 2, 2), np.float32)), "rank 3"),
    (raw_request(np.zeros((1, 5), np.float32)), "expected [-1, 4]"),
    (raw_request(np.zeros((1, 3), np.float32), shape=(1, 4)), "has 12 bytes"),
    (raw_request(np.zeros((0, 4), np.float32)), "batch dimension 0"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 4])]),
     "carries no data"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 4],
                                         contents=pb.InferTensorContents(fp32_contents=[1]))]),
     "has 1 elements"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 4],
                                         contents=pb.InferTensorContents(
                                             fp32_contents=[1, 2, 3, 4]))],
                          raw_input_contents=[bytes(16)]),
     "both raw_input_contents and typed contents"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 4])] * 2,
                          raw_input_contents=[bytes(16)] * 2), "given twice"),
    (pb.ModelInferRequest(inputs=[Tensor(name="x", datatype="FP32", shape=[1, 4])],
                          raw_input_contents=[bytes(16)] * 2), "2 entries for 1 inputs"),
])
def test_invalid_requests_name_the_tensor_and_expectation(request_: pb.ModelInferRequest,
                                                          message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        decode_inputs(request_, X, LIMIT)
    assert message in str(info.value)


def test_inputs_must_share_the_batch_dimension() -> None:
    specs = [TensorSpec("a", "INT32", (-1, 2)), TensorSpec("b", "INT32", (-1, 2))]
    request = pb.ModelInferRequest(
        inputs=[Tensor(name="a", datatype="INT32", shape=[1, 2]),
                Tensor(name="b", datatype="INT32", shape=[2, 2])],
        raw_input_contents=[bytes(8), bytes(16)])
    with pytest.raises(InvalidRequest, match="share the batch"):
        decode_inputs(request, specs, LIMIT)


@pytest.mark.parametrize(("datatype", "dtype"), [
    ("BOOL", np.bool_), ("UINT8", np.uint8), ("INT8", np.int8), ("INT32", np.int32),
    ("INT64", np.int64), ("FP16", np.float16), ("FP64", np.float64), ("BF16", np.uint16)])
def test_raw_datatypes(datatype: str, dtype: type) -> None:
    spec = [TensorSpec("x", datatype, (-1, 3))]
    array = np.array([[1, 0, 1]], dtype=dtype)
    decoded, _ = decode_inputs(raw_request(array, datatype=datatype), spec, LIMIT)
    np.testing.assert_array_equal(decoded[0], array)


def test_bytes_elements_are_counted() -> None:
    spec = [TensorSpec("s", "BYTES", (-1, 2))]
    raw = b"".join(struct.pack("<I", len(v)) + v for v in (b"ab", b"c"))
    request = pb.ModelInferRequest(inputs=[Tensor(name="s", datatype="BYTES", shape=[1, 2])],
                                   raw_input_contents=[raw])
    decoded, _ = decode_inputs(request, spec, LIMIT)
    assert decoded[0].tolist() == [[b"ab", b"c"]]
    request.inputs[0].shape[:] = [1, 3]
    with pytest.raises(InvalidRequest, match="holds 2 BYTES elements"):
        decode_inputs(request, [TensorSpec("s", "BYTES", (-1, 3))], LIMIT)


def test_requested_outputs_and_encoding() -> None:
    specs = [TensorSpec("y", "FP32", (-1, 2)), TensorSpec("z", "INT64", (-1, 1))]
    request = pb.ModelInferRequest(model_name="m", id="r1", outputs=[
        pb.ModelInferRequest.InferRequestedOutputTensor(name="z")])
    chosen = requested_outputs(request, specs)
    assert chosen == [1]
    response = encode_response(request, specs, chosen,
                               [np.zeros((1, 2), np.float32), np.array([[7]], np.int64)])
    assert response.id == "r1"
    assert [o.name for o in response.outputs] == ["z"]
    assert np.frombuffer(response.raw_output_contents[0], np.int64).tolist() == [7]
    request.outputs.add(name="nope")
    with pytest.raises(InvalidRequest, match="unknown requested output 'nope'"):
        requested_outputs(request, specs)


def test_raw_outputs_are_sent_in_their_declared_dtype() -> None:
    """argmax gives torch int64 under an INT32 spec: raw_output_contents must hold INT32's
    4 bytes an element, as the datatype label says."""
    specs = [TensorSpec("y", "INT32", (-1, 3)), TensorSpec("z", "FP16", (-1, 3))]
    wide = np.arange(6, dtype=np.int64).reshape(2, 3)
    halves = np.full((2, 3), 0.5, np.float32)
    response = encode_response(pb.ModelInferRequest(model_name="m"), specs, [0, 1],
                               [wide, halves])
    assert [o.datatype for o in response.outputs] == ["INT32", "FP16"]
    y, z = response.raw_output_contents
    assert len(y) == 4 * wide.size and np.frombuffer(y, "<i4").tolist() == list(range(6))
    assert len(z) == 2 * halves.size and set(np.frombuffer(z, "<f2").tolist()) == {0.5}
    with pytest.raises(EvenflowError, match="outside"):
        encode_response(pb.ModelInferRequest(), specs, [0], [wide * 2**40, halves])
