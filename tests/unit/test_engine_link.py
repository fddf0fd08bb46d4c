"""A front-end's link to the engine (EngineLink, RemoteModel), against a test ROUTER standing in
for the engine: what an Infer carries, answers matched by id (Bundles too), a cancelled call
tells the engine and leaves nothing pending, a gone engine fails every waiter, and a call the
front-end forwards gets the engine's answer or status."""

from __future__ import annotations

import asyncio
import math
import time
import uuid

import grpc
import numpy as np
import pytest
import zmq
import zmq.asyncio

from evenflow.balancer import InvalidRequest, ShuttingDown
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.config.server_config import ServerConfig
from evenflow.server.edge.grpc_server import INFERENCE_SERVICE, PortSettings, ServingPort
from evenflow.server.models.spec import TensorSpec
from evenflow.server.processes import frontend_process
from evenflow.server.processes.frontend_process import (
    EngineLink,
    FrontendServicer,
    forward_to_engine,
)
from evenflow.server.processes.ipc import arrays, child
from evenflow.server.processes.ipc import frontend_messages as msg
from evenflow.server.processes.ipc.errors import to_wire

pytestmark = pytest.mark.timeout(30)

SPECS = [TensorSpec("x", "FP32", (-1, -1))]


class FakeEngine:
    """A ROUTER that reads what the front-end sends and answers it."""

    def __init__(self) -> None:
        self.address = f"ipc://@evenflow-test-{uuid.uuid4().hex}"
        self.socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(self.address)
        self.identity = b""

    async def receive(self) -> tuple[msg.ToEngine, list[bytes]]:
        self.identity, header, *frames = await self.socket.recv_multipart()
        return msg.to_engine.decode(header), frames

    async def send(self, *messages: tuple[msg.ToFrontend, list[bytes]]) -> None:
        """One message, or several in a Bundle."""
        if len(messages) == 1:
            message, frames = messages[0]
            await self.socket.send_multipart([self.identity, msg.encoder.encode(message),
                                              *frames])
            return
        parts: list[bytes] = []
        for message, frames in messages:
            parts += [msg.encoder.encode(message), *frames]
        bundle = msg.Bundle([1 + len(frames) for _, frames in messages])
        await self.socket.send_multipart([self.identity, msg.encoder.encode(bundle), *parts])


async def _linked() -> tuple[FakeEngine, EngineLink]:
    engine = FakeEngine()
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(engine.address)
    link = EngineLink(dealer)
    link.send(msg.Hello(0, 1, listening=False))
    hello, _ = await engine.receive()
    assert isinstance(hello, msg.Hello)
    await engine.send((msg.Models([msg.EdgeModel("m", 3, SPECS, SPECS)], serving=True), []))
    await link.synced.wait()
    return engine, link


async def test_infers_carry_what_was_validated_and_answers_find_their_callers() -> None:
    engine, link = await _linked()
    try:
        model = link.models["m"]
        first = asyncio.ensure_future(model.submit([np.ones((1, 2), np.float32)], 1, math.inf,
                                                   0, shape_key=((2,),)))
        second = asyncio.ensure_future(model.submit([np.ones((1, 4), np.float32)], 1,
                                                    math.inf, 0, shape_key=((4,),)))
        sent = [await engine.receive() for _ in range(2)]
        infers = [m for m, _ in sent if isinstance(m, msg.Infer)]
        assert [(i.spec_version, i.shape_key) for i in infers] == [(3, ((2,),)), (3, ((4,),))]
        metas: list[arrays.ArrayMeta] = []
        frames: list[object] = []
        arrays.pack([np.full((1, 2), 7, np.float32)], metas, frames)
        await engine.send(  # in one Bundle, the second answered first
            (msg.Refused(infers[1].id, to_wire(InvalidRequest("reloaded"))), []),
            (msg.Answer(infers[0].id, metas), [bytes(f) for f in frames]))  # type: ignore[call-overload]
        (answer,) = await first
        np.testing.assert_array_equal(answer, np.full((1, 2), 7, np.float32))
        with pytest.raises(InvalidRequest, match="reloaded"):
            await second
        assert len(link.calls) == 0
    finally:
        link.close()
        engine.socket.close()


async def test_a_cancelled_request_tells_the_engine_and_leaves_nothing_pending() -> None:
    engine, link = await _linked()
    try:
        waiting = asyncio.ensure_future(link.models["m"].submit(
            [np.ones((1, 2), np.float32)], 1, math.inf, 0, shape_key=((2,),)))
        infer, _ = await engine.receive()
        assert isinstance(infer, msg.Infer)
        waiting.cancel()
        cancel, _ = await engine.receive()
        assert cancel == msg.Cancel(infer.id)
        assert waiting.cancelled() and len(link.calls) == 0
    finally:
        link.close()
        engine.socket.close()


async def test_a_gone_engine_fails_every_waiter() -> None:
    engine, link = await _linked()
    try:
        calls = [asyncio.ensure_future(link.call("/s/m", b"", math.inf)),
                 asyncio.ensure_future(link.sync())]
        for _ in calls:
            await engine.receive()
        link.calls.fail_all(ShuttingDown("the engine is gone"))
        for call in calls:
            with pytest.raises(ShuttingDown):
                await call
        assert len(link.calls) == 0
    finally:
        link.close()
        engine.socket.close()


async def test_a_forwarded_call_carries_its_deadline_and_gets_the_engines_answer() -> None:
    engine, link = await _linked()
    edge = FrontendServicer(link=link, identity="frontend 0", server_name="evenflow",
                            server_version="test", max_tensor_elements=1 << 20,
                            on_failure=lambda model, code: None)
    port = ServingPort(edge=edge)
    bound = await port.start(PortSettings("127.0.0.1", 0, 1 << 20),
                             forward=forward_to_engine(link, edge))
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{bound}")
    try:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        before_s = time.monotonic()
        answered = asyncio.ensure_future(stub.ModelMetadata(pb.ModelMetadataRequest(name="m"),
                                                            timeout=20))
        call, frames = await engine.receive()
        assert isinstance(call, msg.Call) and call.method == f"/{INFERENCE_SERVICE}/ModelMetadata"
        # 20 s from the call, give or take: gRPC rounds the timeout it sends up to a coarser
        # unit (a 20 s timeout arrived as 20.1 s once).
        assert before_s + 19 < call.deadline_s <= time.monotonic() + 21
        assert pb.ModelMetadataRequest.FromString(frames[0]).name == "m"
        await engine.send((msg.Reply(call.id, 0), [
            pb.ModelMetadataResponse(name="m", platform="pytorch").SerializeToString()]))
        assert (await answered).platform == "pytorch"

        refused = asyncio.ensure_future(stub.ModelMetadata(pb.ModelMetadataRequest(name="x")))
        call, _ = await engine.receive()
        assert isinstance(call, msg.Call) and call.deadline_s == math.inf  # no deadline
        await engine.send((msg.Reply(call.id, grpc.StatusCode.NOT_FOUND.value[0], "no x"), []))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await refused
        assert (error.value.code(), error.value.details()) == (grpc.StatusCode.NOT_FOUND, "no x")
    finally:
        await channel.close()
        await port.drain()
        await port.close()
        link.close()
        engine.socket.close()


async def test_a_frontend_whose_engine_dies_before_it_answers_exits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    engine = FakeEngine()
    gone = asyncio.Event()  # stands in for the engine's end of stdin closing
    monkeypatch.setattr(child, "watch_parent", lambda loop: gone)
    settings = msg.FrontendSettings.from_config(ServerConfig(port=0), index=0,
                                                engine_address=engine.address, port=0,
                                                server_version="test")
    serving = asyncio.create_task(frontend_process._serve(settings))
    try:
        hello, _ = await asyncio.wait_for(engine.receive(), 5)
        assert isinstance(hello, msg.Hello) and not hello.listening
        gone.set()  # no Models ever comes: the engine died while the front-end started
        await asyncio.wait_for(serving, 5)  # it exits; it does not wait for ever
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        engine.socket.close()
