"""numpy/torch <-> KServe v2 gRPC messages (protobuf), for the gRPC transports."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import grpc
import numpy as np

from evenflow.client._tensors import from_wire, to_wire
from evenflow.client._types import Inputs, ModelMetadata, StreamResult, TensorInfo
from evenflow.client.errors import error_for
from evenflow.proto import grpc_service_pb2 as pb


def build_request(model: str, inputs: Inputs, outputs: Sequence[str] | None,
                  request_id: str | None, model_version: str = "",
                  priority: int | None = None) -> pb.ModelInferRequest:
    wire = [to_wire(name, value) for name, value in inputs.items()]
    request = pb.ModelInferRequest(
        model_name=model, model_version=model_version,
        id=request_id if request_id is not None else uuid.uuid4().hex,
        inputs=[pb.ModelInferRequest.InferInputTensor(name=t.name, datatype=t.datatype,
                                                      shape=t.shape) for t in wire],
        raw_input_contents=[bytes(t.data) for t in wire],
        outputs=[pb.ModelInferRequest.InferRequestedOutputTensor(name=n) for n in outputs or ()])
    if priority is not None:  # Triton's convention: 1 is the most urgent level, 0 the default
        request.parameters["priority"].int64_param = priority
    return request


def parse_response(response: pb.ModelInferResponse) -> dict[str, np.ndarray]:
    """Output name -> array. Arrays are read-only views of the response bytes."""
    return {tensor.name: from_wire(raw, tensor.datatype, tensor.shape, tensor.name)
            for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True)}


def parse_stream_response(response: pb.ModelStreamInferResponse) -> StreamResult:
    request_id = response.infer_response.id
    if response.error_message:
        code, details = _stream_status(response.error_message)
        return StreamResult(request_id, None, error_for(code, details))
    return StreamResult(request_id, parse_response(response.infer_response), None)


# A stream response has no status of its own: evenflow's server prefixes its error_message with
# the status name (server/edge/status.py, stream_error_message); other servers (Triton) send the
# bare message, whose own ": " must not be mistaken for one.
_STREAM_STATUSES = {code.name: code for code in grpc.StatusCode if code is not grpc.StatusCode.OK}


def _stream_status(message: str) -> tuple[grpc.StatusCode, str]:
    name, _, details = message.partition(": ")
    if name in _STREAM_STATUSES:
        return _STREAM_STATUSES[name], details or message
    return grpc.StatusCode.UNKNOWN, message


def parse_metadata(response: pb.ModelMetadataResponse) -> ModelMetadata:
    def infos(tensors: Any) -> tuple[TensorInfo, ...]:
        return tuple(TensorInfo(t.name, t.datatype, tuple(t.shape)) for t in tensors)

    return ModelMetadata(response.name, tuple(response.versions), response.platform,
                         infos(response.inputs), infos(response.outputs))
