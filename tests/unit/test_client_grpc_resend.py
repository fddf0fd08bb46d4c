"""What the SDK sends again over gRPC, where UNAVAILABLE means three things: a call that never
left the client (no server answered the connection: sent again), evenflow's own refusal
(marked with ``proto/metadata.MAY_RESEND``: sent again), and a connection lost mid-call or an
unmarked server refusal (Triton's), after which the request may have run: raised at once."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator

import grpc
import numpy as np
import pytest

from evenflow.balancer import ShuttingDown
from evenflow.client import AsyncClient, Client, ServerUnavailableError
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.edge.status import abort_with

X = np.arange(4, dtype=np.float32)


class Refusing(pb_grpc.GRPCInferenceServiceServicer):
    """Counts each ModelInfer, then: ``"marked"``, refuses it as evenflow's server does;
    ``"unmarked"``, refuses it as a server without the mark does; ``"hold"``, keeps it until
    the server stops (the connection is lost mid-call)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.deliveries = 0
        self.reads = 0
        self.received = asyncio.Event()

    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        self.reads += 1
        await context.abort(grpc.StatusCode.UNAVAILABLE, "not ready")
        raise AssertionError("unreachable")

    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        self.deliveries += 1
        self.received.set()
        if self.mode == "marked":
            await abort_with(context, ShuttingDown("the server is shutting down",
                                                   not_run=True))
        if self.mode == "unmarked":
            await context.abort(grpc.StatusCode.UNAVAILABLE, "not ready")
        await asyncio.Event().wait()  # held: answered by the server's stop
        raise AssertionError("unreachable")


@dataclasses.dataclass
class Served:
    servicer: Refusing
    server: grpc.aio.Server
    address: str


@pytest.fixture
async def served(request: pytest.FixtureRequest) -> AsyncIterator[Served]:
    servicer = Refusing(request.param)
    server = grpc.aio.server()
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield Served(servicer, server, f"127.0.0.1:{port}")
    await server.stop(0)


@pytest.mark.parametrize("served", ["marked"], indirect=True)
async def test_evenflows_own_unavailable_is_sent_again(served: Served) -> None:
    async with AsyncClient(served.address, retry_backoff_s=0.0) as client:
        with pytest.raises(ServerUnavailableError, match="shutting down"):
            await client.infer("m", {"x": X}, timeout_s=5.0)
    assert served.servicer.deliveries == 3  # the first call and both retries


@pytest.mark.parametrize("served", ["unmarked"], indirect=True)
async def test_an_unmarked_unavailable_answer_is_not_sent_again(served: Served) -> None:
    async with AsyncClient(served.address, retry_backoff_s=0.0) as client:
        with pytest.raises(ServerUnavailableError, match="not ready"):
            await client.infer("m", {"x": X}, timeout_s=5.0)
        # A read runs nothing: any UNAVAILABLE is sent again.
        with pytest.raises(ServerUnavailableError, match="not ready"):
            await client.server_live(timeout_s=5.0)
    assert served.servicer.deliveries == 1
    assert served.servicer.reads == 3


@pytest.mark.parametrize("served", ["hold"], indirect=True)
async def test_an_infer_lost_mid_call_is_not_sent_again(served: Served) -> None:
    backoffs: list[float] = []

    async def backoff(wait_s: float) -> None:  # a resend would back off first
        backoffs.append(wait_s)

    async with AsyncClient(served.address, retry_backoff_s=0.0) as client:
        client._retries = dataclasses.replace(client._retries, asleep=backoff)
        call = asyncio.create_task(client.infer("m", {"x": X}, timeout_s=5.0))
        await served.servicer.received.wait()
        await served.server.stop(0)  # the connection goes with the call on it
        with pytest.raises(ServerUnavailableError) as lost:
            await call
    assert backoffs == [] and served.servicer.deliveries == 1
    assert "failed to connect" not in lost.value.details  # the lost call's own error


def test_a_call_that_never_connected_is_sent_again() -> None:
    with socket.socket() as sock:  # a port bound and never listened on: refused
        sock.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{sock.getsockname()[1]}"
        backoffs: list[float] = []
        with Client(address) as client:
            client._retries = dataclasses.replace(client._retries, sleep=backoffs.append)
            with pytest.raises(ServerUnavailableError, match="failed to connect"):
                client.infer("m", {"x": X}, timeout_s=5.0)
    assert backoffs == [0.05, 0.1]  # both retries taken
