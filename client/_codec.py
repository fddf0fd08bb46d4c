"""numpy/torch <-> KServe v2 messages, shared by the sync and asyncio clients."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from evenflow.client.errors import error_for
from evenflow.proto import grpc_service_pb2 as pb

_DATATYPE_OF = {
    np.dtype("bool"): "BOOL", np.dtype("uint8"): "UINT8", np.dtype("uint16"): "UINT16",
    np.dtype("uint32"): "UINT32", np.dtype("uint64"): "UINT64", np.dtype("int8"): "INT8",
    np.dtype("int16"): "INT16", np.dtype("int32"): "INT32", np.dtype("int64"): "INT64",
    np.dtype("float16"): "FP16", np.dtype("float32"): "FP32", np.dtype("float64"): "FP64",
}
_NUMPY_OF = {name: dtype for dtype, name in _DATATYPE_OF.items()} | {"BF16": np.dtype("uint16")}

Inputs = Mapping[str, Any]
"""Input name -> numpy array or torch tensor (batch dimension first)."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


def numpy_dtype(datatype: str) -> np.dtype:
    """The numpy dtype that carries a KServe v2 datatype on the wire (BF16: uint16 bits)."""
    dtype = _NUMPY_OF.get(datatype)
    if dtype is None:
        raise TypeError(f"no numpy dtype for datatype {datatype!r}")
    return dtype


def _to_wire(value: Any) -> tuple[np.ndarray, str]:
    if not isinstance(value, np.ndarray) and hasattr(value, "detach"):  # a torch tensor
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            import torch

            return tensor.contiguous().view(torch.int16).numpy().view(np.uint16), "BF16"
        value = tensor.numpy()
    array = np.ascontiguousarray(value)
    if array.dtype.byteorder == ">":  # the wire is little-endian
        array = array.astype(array.dtype.newbyteorder("<"))
    datatype = _DATATYPE_OF.get(array.dtype)
    if datatype is None:
        raise TypeError(f"unsupported input dtype {array.dtype}")
    return array, datatype


def build_request(model: str, inputs: Inputs, outputs: Sequence[str] | None,
                  request_id: str | None, model_version: str = "",
                  priority: int | None = None) -> pb.ModelInferRequest:
    tensors = []
    raw = []
    for name, value in inputs.items():
        array, datatype = _to_wire(value)
        tensors.append(pb.ModelInferRequest.InferInputTensor(
            name=name, datatype=datatype, shape=array.shape))
        raw.append(array.tobytes())
    request = pb.ModelInferRequest(
        model_name=model, model_version=model_version,
        id=request_id if request_id is not None else uuid.uuid4().hex,
        inputs=tensors, raw_input_contents=raw,
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in outputs or ()])
    if priority is not None:  # Triton's convention: 1 is the most urgent level, 0 the default
        request.parameters["priority"].int64_param = priority
    return request


def parse_response(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """Output name -> array. Arrays are read-only views of the response bytes."""
    result = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        try:
            dtype = numpy_dtype(tensor.datatype)
        except TypeError as exc:
            raise TypeError(f"output {tensor.name!r}: {exc}") from None
        result[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.shape))
    return result


def parse_stream_response(response: pb.ModelStreamInferResponse) -> StreamResult:
    request_id = response.infer_response.id
    if response.error_message:
        code_name, _, details = response.error_message.partition(": ")
        code = getattr(grpc.StatusCode, code_name, grpc.StatusCode.UNKNOWN)
        return StreamResult(request_id, None, error_for(code, details or response.error_message))
    return StreamResult(request_id, parse_response(response.infer_response), None)


@dataclass(frozen=True, slots=True)
class StreamResult:
    """One streamed answer: ``outputs`` on success, ``error`` on failure (the stream goes on)."""

    request_id: str
    outputs: dict[str, np.ndarray] | None
    error: Exception | None


def parse_metadata(response: pb.ModelMetadataResponse) -> ModelMetadata:
    def infos(tensors: Any) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)) for t in tensors)

    return ModelMetadata(response.name, tuple(response.versions), response.platform,
                         infos(response.inputs), infos(response.outputs))


@dataclass(frozen=True, slots=True)
class ChannelOptions:
    """Channel settings. ``max_message_bytes`` bounds both directions."""

    max_message_bytes: int = 64 * 1024 * 1024
    keepalive_time_s: float | None = None

    def grpc_options(self) -> list[tuple[str, int]]:
        options = [("grpc.max_receive_message_length", self.max_message_bytes),
                   ("grpc.max_send_message_length", self.max_message_bytes)]
        if self.keepalive_time_s is not None:
            options.append(("grpc.keepalive_time_ms", round(self.keepalive_time_s * 1000)))
        return options
