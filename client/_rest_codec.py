"""numpy/torch <-> the KServe v2 HTTP/REST API with Triton's binary tensor data extension, for
the HTTP transports.

A request is a JSON header followed by every input's raw bytes (``binary_data_size`` on each
input, ``Inference-Header-Content-Length`` saying where the JSON ends), and asks for every
output as binary too (``binary_data`` per requested output, ``binary_data_output`` when it
names none). An answer decodes the same way; outputs a server sent as JSON ``data`` are read
too (BF16 only comes as binary)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import grpc
import msgspec
import numpy as np

from evenflow.client._tensors import WireTensor, from_wire, numpy_dtype, to_wire
from evenflow.client._types import Inputs, ModelMetadata, TensorInfo
from evenflow.client.errors import (
    InferenceServerError,
    error_for,
    from_http_error,
    malformed_response,
)

HEADER_LENGTH = "Inference-Header-Content-Length"
STATUS_HEADER = "evenflow-status"  # the gRPC status name an error answer stands for
LIVE_PATH = "/v2/health/live"
READY_PATH = "/v2/health/ready"


def model_path(model: str, version: str = "") -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}" if version else path


def infer_path(model: str, version: str = "") -> str:
    return model_path(model, version) + "/infer"


def ready_path(model: str, version: str = "") -> str:
    return model_path(model, version) + "/ready"


@dataclass(frozen=True, slots=True)
class RestRequest:
    """An infer request's body and the headers that say how to read it."""

    body: bytes
    headers: dict[str, str]


def encode_request(tensors: Sequence[WireTensor], outputs: Sequence[str] | None,
                   request_id: str | None, *, priority: int | None = None,
                   timeout_s: float | None = None) -> RestRequest:
    """Inputs already in wire form (the load generator builds them once) as a request;
    ``request_id`` None sends a fresh id, "" none.
    ``timeout_s`` travels as Triton's ``timeout`` parameter (microseconds), the server's
    deadline for the request as gRPC's ``grpc-timeout`` is."""
    parameters: dict[str, Any] = {}
    header: dict[str, Any] = {}
    request_id = uuid.uuid4().hex if request_id is None else request_id
    if request_id:  # "" sends none, as tritonclient
        header["id"] = request_id
    header["inputs"] = [{"name": t.name, "shape": list(t.shape), "datatype": t.datatype,
                         "parameters": {"binary_data_size": len(t.data)}} for t in tensors]
    if outputs:
        header["outputs"] = [{"name": name, "parameters": {"binary_data": True}}
                             for name in outputs]
    else:
        parameters["binary_data_output"] = True
    if priority is not None:
        parameters["priority"] = priority
    if timeout_s is not None:
        parameters["timeout"] = max(1, round(timeout_s * 1e6))
    if parameters:
        header["parameters"] = parameters
    encoded = msgspec.json.encode(header)
    return RestRequest(b"".join([encoded, *(t.data for t in tensors)]),
                       {HEADER_LENGTH: str(len(encoded)),
                        "Content-Type": "application/octet-stream"})


def build_request(inputs: Inputs, outputs: Sequence[str] | None, request_id: str | None, *,
                  priority: int | None = None, timeout_s: float | None = None) -> RestRequest:
    return encode_request([to_wire(name, value) for name, value in inputs.items()], outputs,
                          request_id, priority=priority, timeout_s=timeout_s)


class _Tensor(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] = {}
    data: list[Any] | None = None


class _InferResponse(msgspec.Struct):
    outputs: list[_Tensor] = []


class _TensorInfo(msgspec.Struct):
    name: str
    datatype: str
    shape: list[int]


class _Metadata(msgspec.Struct):
    name: str
    versions: list[str] = []
    platform: str = ""
    inputs: list[_TensorInfo] = []
    outputs: list[_TensorInfo] = []


class _Error(msgspec.Struct):
    error: str


def _decode(data: bytes | memoryview, kind: type[Any], what: str) -> Any:
    try:
        return msgspec.json.decode(data, type=kind)
    except msgspec.DecodeError as exc:
        raise malformed_response(f"{what}: {exc}") from None


def parse_response(body: bytes, header_length: str | None) -> dict[str, np.ndarray]:
    """Output name -> array; binary outputs are read-only views of ``body`` (no copy)."""
    view = memoryview(body)
    if header_length is None:
        json_end = len(view)
    elif not header_length.isdigit() or int(header_length) > len(view):
        raise malformed_response(f"{HEADER_LENGTH} {header_length!r} for a body of "
                                 f"{len(view)} bytes")
    else:
        json_end = int(header_length)
    response: _InferResponse = _decode(view[:json_end], _InferResponse, "infer response")
    offset = json_end
    result = {}
    for tensor in response.outputs:
        size = tensor.parameters.get("binary_data_size")
        if size is None:
            result[tensor.name] = _from_json(tensor)
            continue
        if not isinstance(size, int) or size < 0 or offset + size > len(view):
            raise malformed_response(f"output {tensor.name!r}: binary_data_size {size!r} "
                                     f"runs past the body ({len(view) - offset} bytes left)")
        result[tensor.name] = from_wire(view[offset:offset + size], tensor.datatype,
                                        tensor.shape, tensor.name)
        offset += size
    return result


def _from_json(tensor: _Tensor) -> np.ndarray:
    if tensor.data is None:
        raise malformed_response(f"output {tensor.name!r} has neither data nor binary data")
    if tensor.datatype == "BF16":
        raise malformed_response(f"output {tensor.name!r}: BF16 only comes as binary data")
    shape = tuple(tensor.shape)
    flat = np.asarray(tensor.data, dtype=object).reshape(-1)
    if flat.size != math.prod(shape):
        raise malformed_response(f"output {tensor.name!r} has {flat.size} elements in data; "
                                 f"its shape {list(shape)} needs {math.prod(shape)}")
    if tensor.datatype == "BYTES":
        items = np.empty(flat.size, dtype=object)
        items[:] = [item.encode() if isinstance(item, str) else bytes(item) for item in flat]
        return items.reshape(shape)
    try:
        return flat.astype(numpy_dtype(tensor.datatype)).reshape(shape)
    except TypeError as exc:
        raise TypeError(f"output {tensor.name!r}: {exc}") from None


def parse_metadata(body: bytes) -> ModelMetadata:
    metadata: _Metadata = _decode(body, _Metadata, "model metadata")

    def infos(tensors: list[_TensorInfo]) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)) for t in tensors)

    return ModelMetadata(metadata.name, tuple(metadata.versions), metadata.platform,
                         infos(metadata.inputs), infos(metadata.outputs))


def error_of(status: int, body: bytes, reason: str = "",
             status_name: str | None = None) -> InferenceServerError:
    """An HTTP error answer as the exception the gRPC path raises for the same failure: the
    message from the JSON ``{"error": "..."}`` body, else the body's text or the reason. An
    evenflow server names the gRPC status in ``evenflow-status`` (``status_name``); from
    another server the status is told from the HTTP status and the message."""
    try:
        message = msgspec.json.decode(body, type=_Error).error
    except msgspec.DecodeError:
        message = body.decode(errors="replace").strip() or reason or f"HTTP {status}"
    code = grpc.StatusCode.__members__.get(status_name) if status_name else None
    if code is not None:
        return error_for(code, message, status)
    return from_http_error(status, message)
