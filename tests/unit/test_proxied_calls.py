"""A forwarded call whose bytes are not the method's protobuf message is the client's error:
INVALID_ARGUMENT, and nothing in the engine's log (any client could fill it)."""

from __future__ import annotations

import logging

import grpc
import pytest

from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.engine.proxied_calls import ProxiedCalls

pytestmark = pytest.mark.timeout(30)

_METADATA = "/inference.GRPCInferenceService/ModelMetadata"


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self) -> None:
        self.called = False

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        self.called = True
        return pb.ModelMetadataResponse(name=request.name)


@pytest.mark.parametrize("request_bytes", [
    b"\xff\xff\xff",  # not protobuf at all
    b"\x0a\x05ab",  # a string field cut short
    b"\x0a\x02\xff\xfe",  # a string field that is not UTF-8
], ids=["garbage", "truncated", "not-utf8"])
async def test_a_malformed_forwarded_request_is_invalid_argument_and_not_logged(
        request_bytes: bytes, caplog: pytest.LogCaptureFixture) -> None:
    servicer = _Servicer()
    calls = ProxiedCalls()
    calls.add(pb_grpc.add_GRPCInferenceServiceServicer_to_server, servicer)
    with caplog.at_level(logging.DEBUG, logger="evenflow.server.engine.proxied_calls"):
        code, details, response = await calls.call(_METADATA, request_bytes, float("inf"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert details == f"the request is not a valid protobuf message for {_METADATA}"
    assert response == b""
    assert not servicer.called
    assert caplog.records == []
