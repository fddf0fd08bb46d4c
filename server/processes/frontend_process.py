"""A front-end process (``--frontends N``):
``python -m evenflow.server.processes.frontend_process``, started by the engine's FrontendPool,
settings on stdin (4-byte length, then msgpack).

It serves the gRPC port beside the other front-ends (SO_REUSEPORT, its own listening socket),
decodes and validates inference requests against the model specs the engine sends, hands them
to the engine over ZeroMQ (tensors as raw frames), and encodes the answers; every other call
travels to the engine as bytes and back. It imports neither torch nor the models, and ignores
SIGINT/SIGTERM: the engine drains and stops it, and it exits when the engine's end of its stdin
closes (the engine died)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, cast

import grpc
import msgspec
import zmq

from evenflow.balancer import EvenflowError, ShuttingDown
from evenflow.balancer.stats import CpuParts
from evenflow.proto import evenflow_pb2_grpc
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.server.edge import event_loop
from evenflow.server.edge.grpc_server import PortSettings, ServingPort, tls_files
from evenflow.server.edge.model_names import find_model
from evenflow.server.edge.registration import Forward, Register
from evenflow.server.edge.rest.api import RestApi
from evenflow.server.edge.rest.http_port import HttpPort, HttpSettings
from evenflow.server.edge.rest.page import devices_page
from evenflow.server.edge.security import load_token
from evenflow.server.edge.servicer import EdgeServicer, InferTarget, call_deadline_s
from evenflow.server.edge.status import abort, abort_with, status_from_value
from evenflow.server.observability.logs import configure_logging
from evenflow.server.processes.ipc import arrays, child
from evenflow.server.processes.ipc import frontend_messages as msg
from evenflow.server.processes.ipc.errors import from_wire
from evenflow.server.processes.ipc.frontend_messages import FrontendSettings
from evenflow.server.processes.ipc.loop_socket import LoopSocket
from evenflow.server.processes.pending_calls import PendingCalls

logger = logging.getLogger(__name__)


class EngineLink:
    """This front-end's DEALER socket to the engine, driven by the event loop: requests out,
    answers matched by id in ``calls``."""

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        self._socket = LoopSocket(socket, asyncio.get_running_loop(), self._receive)
        self.calls: PendingCalls[Any] = PendingCalls()
        self.models: dict[str, RemoteModel] = {}
        self.serving = False
        self.synced = asyncio.Event()
        self.on_health: Callable[[bool], None] | None = None
        self.drain = asyncio.Event()
        self.stop = asyncio.Event()

    def send(self, message: msgspec.Struct, frames: list[object] | None = None) -> None:
        parts: list[object] = [msg.encoder.encode(message)]
        if frames:
            parts.extend(frames)
        self._socket.send(parts, arrays.by_reference(frames or ()))

    def close(self) -> None:
        self._socket.close()

    async def call(self, method: str, request: bytes, deadline_s: float
                   ) -> tuple[int, str, bytes]:
        request_id, future = self.calls.add()
        try:
            self.send(msg.Call(request_id, method, deadline_s), [request])
            return await future  # type: ignore[no-any-return]
        finally:
            self.calls.discard(request_id)

    async def sync(self) -> None:
        request_id, future = self.calls.add()
        try:
            self.send(msg.Sync(request_id))
            await future
        finally:
            self.calls.discard(request_id)

    def _receive(self, parts: list[bytes]) -> None:
        header, *frames = parts
        message = msg.to_frontend.decode(header)
        if isinstance(message, msg.Bundle):
            start = 0
            for size in message.parts:
                self._dispatch(msg.to_frontend.decode(frames[start]),
                               frames[start + 1:start + size])
                start += size
        else:
            self._dispatch(message, frames)

    def _dispatch(self, message: msg.ToFrontend, frames: list[bytes]) -> None:
        if isinstance(message, msg.Answer):
            self.calls.resolve(message.id, arrays.unpack(message.arrays, frames))
        elif isinstance(message, msg.Refused):
            self.calls.fail(message.id, from_wire(message.error))
        elif isinstance(message, msg.Reply):
            self.calls.resolve(message.id, (message.code, message.details,
                                            frames[0] if frames else b""))
        elif isinstance(message, msg.Models):
            self.models = {m.name: RemoteModel(m, self) for m in message.models}
            self._health(message.serving)
            self.synced.set()
            self.calls.resolve(message.id, None)  # the Sync it answers, if any
        elif isinstance(message, msg.Health):
            self._health(message.serving)
        elif isinstance(message, msg.Drain):
            self.drain.set()
        elif isinstance(message, msg.Stop):
            self.stop.set()

    def _health(self, serving: bool) -> None:
        self.serving = serving
        if self.on_health is not None:
            self.on_health(serving)


class RemoteModel:
    """A model held by the engine, as the edge servicer sees it."""

    cpu_parts: CpuParts | None = None

    def __init__(self, definition: msg.EdgeModel, link: EngineLink) -> None:
        self.definition = definition
        self._link = link

    async def submit(self, payload: Any, num_samples: int, deadline_s: float, priority: int,
                     shape_key: Hashable = None) -> Any:
        """Validated here against ``definition``: the engine runs it as it is, unless the
        model's specs changed since (the spec version tells)."""
        request_id, future = self._link.calls.add()
        metas: list[arrays.ArrayMeta] = []
        frames: list[object] = []
        arrays.pack(payload, metas, frames)
        try:
            self._link.send(msg.Infer(id=request_id, model=self.definition.name, version="",
                                      num_samples=num_samples, deadline_s=deadline_s,
                                      priority=priority, arrays=metas,
                                      spec_version=self.definition.spec_version,
                                      shape_key=cast("msg.ShapeKey | None", shape_key)),
                            frames)
            return await future
        except asyncio.CancelledError:
            self._link.send(msg.Cancel(request_id))
            raise
        finally:
            self._link.calls.discard(request_id)


class RemoteModels:
    def __init__(self, link: EngineLink) -> None:
        self._link = link

    def get(self, name: str, version: str = "") -> InferTarget:
        return find_model(self._link.models, name, version)

    def __contains__(self, name: str) -> bool:
        return name in self._link.models


class FrontendServicer(EdgeServicer):
    def __init__(self, *, link: EngineLink, identity: str, **kwargs: Any) -> None:
        super().__init__(models=RemoteModels(link), **kwargs)
        self._link = link
        self._identity = identity

    async def _missing_model(self, name: str, version: str) -> InferTarget:
        await self._link.sync()  # loaded a moment ago, through another front-end?
        return self._models.get(name, version)

    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        context.set_trailing_metadata((("evenflow-process", self._identity),))
        return pb.ServerLiveResponse(live=True)

    @property
    def serving(self) -> bool:
        return self.ready and self._link.serving


def forward_to_engine(link: EngineLink, edge: EdgeServicer) -> Forward:
    """What serves each method the front-end does not answer itself: the request's bytes go
    to the engine with the call's deadline, and its reply's status or bytes come back."""
    def forward(path: str) -> grpc.RpcMethodHandler:
        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            if not edge.draining:  # taken: answered before the port closes
                edge.track(context)
            try:
                code, details, response = await link.call(path, request,
                                                          call_deadline_s(context))
            except EvenflowError as exc:  # the engine is gone
                await abort_with(context, exc)
            if code:
                await abort(context, status_from_value(code), details)
            return response  # type: ignore[no-any-return]
        return grpc.unary_unary_rpc_method_handler(handle)
    return forward


def _connect(settings: FrontendSettings) -> zmq.Socket[bytes]:
    dealer: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.ROUTING_ID, f"fe{settings.index}-{os.getpid()}".encode())
    dealer.setsockopt(zmq.LINGER, 0)
    # Unbounded queues, as LoopSocket wants; set before connect, which creates the pipe.
    dealer.setsockopt(zmq.SNDHWM, 0)
    dealer.setsockopt(zmq.RCVHWM, 0)
    dealer.connect(settings.engine_address)
    return dealer


def _port_settings(settings: FrontendSettings) -> PortSettings:
    token = load_token(Path(settings.auth_token_file) if settings.auth_token_file else None)
    return PortSettings(settings.host, settings.port, settings.max_message_bytes, shared=True,
                        tls=tls_files(settings.tls_cert, settings.tls_key,
                                      settings.tls_client_ca),
                        token=token, auth_groups=settings.auth_groups)


async def _start_http(settings: FrontendSettings, link: EngineLink,
                      edge: EdgeServicer) -> HttpPort | None:
    """The REST API on the HTTP port the engine reserved, beside the other front-ends';
    every call but inference goes to the engine as the gRPC method it mirrors."""
    if settings.http_port is None:
        return None
    grpc_settings = _port_settings(settings)
    http = HttpPort(RestApi(edge=edge, control=link, max_body_bytes=settings.max_message_bytes,
                            max_tensor_elements=settings.max_tensor_elements,
                            token=grpc_settings.token, auth_groups=settings.auth_groups,
                            page=devices_page()),
                    name=f"frontend {settings.index} http")
    await http.start(HttpSettings(settings.host, settings.http_port, shared=True,
                                  tls=grpc_settings.tls))
    return http


async def _until_synced(link: EngineLink, engine_gone: asyncio.Event) -> bool:
    """True once the engine has sent the models, False if it is gone first."""
    await event_loop.first_set(link.synced, engine_gone)
    return link.synced.is_set()


async def _serve(settings: FrontendSettings) -> None:
    identity = f"frontend {settings.index} pid {os.getpid()}"
    engine_gone = child.watch_parent(asyncio.get_running_loop())
    link = EngineLink(_connect(settings))
    edge = FrontendServicer(link=link, identity=identity, server_name="evenflow",
                            server_version=settings.server_version,
                            max_tensor_elements=settings.max_tensor_elements,
                            on_failure=lambda model, code: link.send(msg.Failed(model, code)))
    port = ServingPort(edge=edge, name=identity)
    link.on_health = port.update_health
    link.send(msg.Hello(settings.index, os.getpid(), listening=False))
    # The engine knows this front-end, and it knows the models; or the engine died first,
    # and no one would ever stop this process.
    if not await _until_synced(link, engine_gone):
        logger.error("%s: the engine is gone before it answered; exiting", identity)
        link.close()
        return
    # Every call but inference is the engine's: the stubs' base classes only name them.
    services: list[tuple[Register, object]] = [
        (evenflow_pb2_grpc.add_EvenflowStatsServicer_to_server,
         evenflow_pb2_grpc.EvenflowStatsServicer())]
    if settings.admin:
        services.append((evenflow_pb2_grpc.add_EvenflowAdminServicer_to_server,
                         evenflow_pb2_grpc.EvenflowAdminServicer()))
    await port.start(_port_settings(settings), services=services,
                     forward=forward_to_engine(link, edge))
    http = await _start_http(settings, link, edge)
    edge.ready = True
    link.send(msg.Hello(settings.index, os.getpid(), listening=True))
    gc.collect()
    gc.freeze()

    drain = asyncio.create_task(link.drain.wait())
    stop = asyncio.create_task(link.stop.wait())
    gone = asyncio.create_task(engine_gone.wait())
    await asyncio.wait({drain, stop, gone}, return_when=asyncio.FIRST_COMPLETED)
    await port.drain()  # new inference calls hear UNAVAILABLE
    await asyncio.wait({stop, gone}, return_when=asyncio.FIRST_COMPLETED)
    if gone.done():
        logger.error("%s: the engine is gone; exiting", identity)
        link.calls.fail_all(ShuttingDown("the server's engine process is gone"))
    # The engine sent Stop after the answer to every request it admitted from here; forwarded
    # calls still get theirs while it waits for this process to exit.
    await port.close(on_unanswered=lambda: link.calls.fail_all(
        ShuttingDown("the server is shutting down; send to another replica")))
    if http is not None:
        await http.close()
    tasks = (drain, stop, gone)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    link.close()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    settings = child.read_settings(FrontendSettings)
    configure_logging(settings.log_level, settings.log_format)
    sys.setswitchinterval(settings.gil_switch_interval_s)
    event_loop.run(_serve(settings))


if __name__ == "__main__":
    main()
