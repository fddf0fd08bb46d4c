"""The one gRPC port assembly (build_server) and its serving lifecycle (ServingPort), on a real
grpc.aio server on loopback, with an edge servicer over a hand-written model directory."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Hashable
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from evenflow.balancer import ModelNotFound
from evenflow.balancer.stats import CpuParts
from evenflow.proto import evenflow_pb2, evenflow_pb2_grpc
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.edge.grpc_server import (
    HEALTH_SERVICE,
    INFERENCE_SERVICE,
    PortSettings,
    ServingPort,
    build_server,
)
from evenflow.server.edge.servicer import EdgeServicer, InferTarget
from evenflow.server.models.spec import Padding, TensorSpec

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Specs:
    inputs = (TensorSpec("x", "FP32", (-1, 2)),)
    outputs = (TensorSpec("y", "FP32", (-1, 2)),)
    padding: Padding | None = None
    variable_shapes = False


class GatedModel:
    """Answers each request with its own inputs once ``release`` is set; counts submissions."""

    definition = _Specs()
    cpu_parts: CpuParts | None = None

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.submitted = asyncio.Event()

    async def submit(self, payload: Any, num_samples: int, deadline_s: float, priority: int,
                     shape_key: Hashable = None) -> Any:
        self.submitted.set()
        await self.release.wait()
        return payload


class OneModel:
    def __init__(self, model: GatedModel) -> None:
        self._model = model

    def get(self, name: str, version: str = "") -> InferTarget:
        if name != "m":
            raise ModelNotFound(f"unknown model {name!r}")
        return self._model

    def __contains__(self, name: str) -> bool:
        return name == "m"


class Failures:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, model: str, code: str) -> None:
        self.seen.append((model, code))


def _edge(model: GatedModel, failures: Failures) -> EdgeServicer:
    return EdgeServicer(models=OneModel(model), server_name="evenflow", server_version="test",
                        max_tensor_elements=1 << 20, on_failure=failures)


def _request() -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name="x", datatype="FP32", shape=[1, 2])
    return pb.ModelInferRequest(model_name="m", inputs=[tensor], raw_input_contents=[
        np.ones((1, 2), np.float32).tobytes()])


async def _health(channel: grpc.aio.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return int(response.status)


async def test_a_port_serves_inference_health_and_reflection_then_drains_and_closes() -> None:
    model, failures = GatedModel(), Failures()
    port = ServingPort(edge=_edge(model, failures), name="test")
    bound = await port.start(PortSettings("127.0.0.1", 0, 1 << 20))
    assert bound == port.port != 0
    await port.set_health(serving=True)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{bound}")
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert await _health(channel, INFERENCE_SERVICE) == SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        listed = [r async for r in reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]))]
        names = {s.name for s in listed[0].list_services_response.service}
        assert {INFERENCE_SERVICE, HEALTH_SERVICE} <= names

        admitted = asyncio.ensure_future(stub.ModelInfer(_request(), timeout=10))
        await model.submitted.wait()
        await port.drain()
        assert await _health(channel, INFERENCE_SERVICE) == NOT_SERVING
        assert await _health(channel, "") == NOT_SERVING
        port.update_health(serving=True)  # ignored: draining is for good
        assert await _health(channel, "") == NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ModelInfer(_request(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert failures.seen == [("m", "UNAVAILABLE")]  # counted once, where it was failed

        model.release.set()  # the admitted call is still answered
        response = await admitted
        assert response.outputs[0].name == "y"
        await port.close()
        await port.close()  # idempotent
    finally:
        await channel.close()
    if sys.platform.startswith("linux"):
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", bound), timeout=5).close()


async def test_services_are_served_here_or_forwarded() -> None:
    forwarded: list[str] = []

    def forward(path: str) -> grpc.RpcMethodHandler:
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            forwarded.append(path)
            return evenflow_pb2.GetStatsResponse().SerializeToString()
        return grpc.unary_unary_rpc_method_handler(handle)

    port = ServingPort(edge=_edge(GatedModel(), Failures()))
    bound = await port.start(
        PortSettings("127.0.0.1", 0, 1 << 20),
        services=[(evenflow_pb2_grpc.add_EvenflowStatsServicer_to_server,
                   evenflow_pb2_grpc.EvenflowStatsServicer())],
        forward=forward)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{bound}")
    try:
        await evenflow_pb2_grpc.EvenflowStatsStub(channel).GetStats(evenflow_pb2.GetStatsRequest(),
                                                                 timeout=5)
        live = await pb_grpc.GRPCInferenceServiceStub(channel).ServerLive(
            pb.ServerLiveRequest(), timeout=5)  # the edge's own
        await pb_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
            pb.ModelMetadataRequest(name="m"), timeout=5)  # the engine's: forwarded
        assert live.live
        assert forwarded == ["/evenflow.v1.EvenflowStats/GetStats",
                             f"/{INFERENCE_SERVICE}/ModelMetadata"]
    finally:
        await channel.close()
        await port.drain()
        await port.close()


async def test_a_shared_port_must_be_bound_as_reserved() -> None:
    edge = _edge(GatedModel(), Failures())
    with pytest.raises(OSError, match="not as reserved"):
        build_server(PortSettings("127.0.0.1", 0, 1 << 20, shared=True), edge=edge,
                     health_servicer=ServingPort(edge=edge).health_servicer)


async def test_a_port_never_started_drains_and_closes_as_a_no_op() -> None:
    port = ServingPort(edge=_edge(GatedModel(), Failures()))
    await port.drain()
    await port.close()
    assert port.edge.draining and not port.edge.ready
