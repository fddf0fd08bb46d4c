"""How evenflow's gRPC services are put on a grpc.aio server: the inference service with its
hot methods registered by path and the tolerant deserializer, every other service through
generic handlers only, served here or forwarded (a front-end process hands every call but
inference to the engine), and health and reflection beside them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc

from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.edge.decoding import tolerant_deserializer
from evenflow.server.edge.servicer import EdgeServicer

# A generated ``add_*Servicer_to_server`` function, and what serves a forwarded method.
Register = Callable[[Any, Any], None]
Forward = Callable[[str], grpc.RpcMethodHandler]

# The only methods registered with grpc by path; every other is served through generic
# handlers. grpc.aio's server keeps one pending call per registered method and waits on all of
# them (``asyncio.wait``) for every call it accepts: with every method of every service
# registered (~25), that wait was 8 % of the loop's time at concurrency 64 (py-spy).
HOT_METHODS = ("ModelInfer", "ModelStreamInfer")
# What a front-end process answers itself; it forwards every other call to the engine.
LOCAL_METHODS = ("ModelInfer", "ModelStreamInfer", "ServerLive", "ServerReady", "ServerMetadata")


def add_inference_service(servicer: EdgeServicer, server: grpc.aio.Server,
                          forward: Forward | None = None) -> str:
    """The generated registration, with ModelInfer and ModelStreamInfer swapped for handlers
    that use the tolerant deserializer (the generated code registers every method by path,
    which takes precedence over any generic handler added next to it). With ``forward``,
    every method but ``LOCAL_METHODS`` is served by ``forward(method path)`` instead.
    Returns the service's full name."""
    captured = _CapturedRegistration()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, captured)
    parse = tolerant_deserializer(pb.ModelInferRequest)
    handlers = dict(captured.handlers)
    if forward is not None:
        for method in handlers:
            if method not in LOCAL_METHODS:
                handlers[method] = forward(f"/{captured.service}/{method}")
    handlers["ModelInfer"] = grpc.unary_unary_rpc_method_handler(
        servicer.ModelInfer, request_deserializer=parse,
        response_serializer=pb.ModelInferResponse.SerializeToString)
    handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
        servicer.ModelStreamInfer, request_deserializer=parse,
        response_serializer=pb.ModelStreamInferResponse.SerializeToString)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(captured.service, handlers),))
    server.add_registered_method_handlers(captured.service,
                                          {method: handlers[method] for method in HOT_METHODS})
    return captured.service


def add_service(register: Register, servicer: object, server: grpc.aio.Server,
                forward: Forward | None = None) -> str:
    """Register a generated service through generic handlers only: ``servicer``'s methods, or
    with ``forward`` every method as ``forward(method path)``. Returns its full name."""
    captured = _CapturedRegistration()
    register(servicer, captured)
    handlers = captured.handlers if forward is None else {
        method: forward(f"/{captured.service}/{method}") for method in captured.handlers}
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(captured.service, handlers),))
    return captured.service


def add_support_services(server: grpc.aio.Server, health_servicer: health.aio.HealthServicer,
                         services: Sequence[str]) -> None:
    """Health and reflection (listing ``services`` and itself), served generically."""
    cold = GenericOnly(server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, cold)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
        reflection.aio.ReflectionServicer([*services, reflection.SERVICE_NAME]), cold)


class GenericOnly:
    """A server as the generated ``add_*_to_server`` functions see it: their methods are served
    through generic handlers only, never registered by path (see ``HOT_METHODS``)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        pass  # the generic handler added just before serves these methods


class _CapturedRegistration:
    """Stands in for a server to read what the generated code registers."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # the same methods come again through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        self.service, self.handlers = service, handlers
