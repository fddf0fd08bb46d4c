"""One gRPC port, assembled and served the same way in the single server process and in each
front-end process (``--frontends N``).

``build_server`` makes the grpc.aio server (message size limits, SO_REUSEPORT where several
processes share the port, the bearer-token interceptor), puts the services on it (the edge's
inference service, the others served here or forwarded, health and reflection) and binds the
port (TLS or not). ``ServingPort`` runs it through its life::

    start -> serving (health follows ``update_health``) -> drain -> [models closed] -> close

``drain``: new inference calls hear UNAVAILABLE and health turns NOT_SERVING, what was admitted
is still answered. ``close``, once every admitted call has its answer: a quiet period (up to
``ANSWER_S``) for gRPC to send the answers the handlers already have, then the port is closed
by hand (see ``closing``) so that no call reaches gRPC's stop, and gRPC's stop follows; then a
wait (up to ``ANSWER_S``) until grpc.aio's own tasks for the calls it served have ended (see
``call_tasks``). Imports neither torch nor anything of the engine."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2

from evenflow.proto import grpc_service_pb2
from evenflow.server.edge.call_tasks import CallTasks, calls_ended, grpc_call_tasks
from evenflow.server.edge.closing import close_port
from evenflow.server.edge.port_errors import PortUnavailable
from evenflow.server.edge.registration import (
    Forward,
    Register,
    add_inference_service,
    add_service,
    add_support_services,
)
from evenflow.server.edge.security import TlsFiles, TokenInterceptor
from evenflow.server.edge.servicer import EdgeServicer

logger = logging.getLogger(__name__)

# Once the models are closed, how long the edge waits for gRPC to send the answers the
# handlers already have, then how long gRPC's stop waits for calls still running, and then
# how long the edge waits for grpc.aio's tasks of the calls it served to end.
ANSWER_S = 5.0

INFERENCE_SERVICE = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
# The health entries that follow the models: the server as a whole, and inference.
_HEALTH_ENTRIES = ("", INFERENCE_SERVICE)


@dataclass(frozen=True, slots=True)
class PortSettings:
    """Attributes:
    host, port: where to listen; port 0 picks a free one (not with ``shared``).
    max_message_bytes: the largest request and response message.
    shared: other processes listen on the same port (SO_REUSEPORT); the port must be bound
        exactly as asked, it was reserved for them.
    tls: serve over TLS with these files; None: plaintext.
    token: require ``authorization: Bearer TOKEN`` on the RPC groups in ``auth_groups``.
    """

    host: str
    port: int
    max_message_bytes: int
    shared: bool = False
    tls: TlsFiles | None = None
    token: str | None = None
    auth_groups: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def tls_files(cert: Path | str | None, key: Path | str | None,
              client_ca: Path | str | None) -> TlsFiles | None:
    """The TLS files when a certificate and its key are both named, else None (plaintext)."""
    if not cert or not key:
        return None
    return TlsFiles(Path(cert), Path(key), Path(client_ca) if client_ca else None)


def build_server(settings: PortSettings, *, edge: EdgeServicer,
                 health_servicer: health.aio.HealthServicer,
                 services: Sequence[tuple[Register, object]] = (),
                 forward: Forward | None = None) -> tuple[grpc.aio.Server, int]:
    """A grpc.aio server serving ``edge``'s inference service, each ``(register, servicer)``
    in ``services``, health and reflection, bound to ``settings``' port; returns it (not yet
    started) and the bound port. With ``forward``, every method but those the edge answers
    itself is served by ``forward(method path)``. Raises PortUnavailable when the port is
    taken."""
    options = [("grpc.max_receive_message_length", settings.max_message_bytes),
               ("grpc.max_send_message_length", settings.max_message_bytes),
               ("grpc.so_reuseport", int(settings.shared))]
    interceptors = ([TokenInterceptor(settings.token, settings.auth_groups)]
                    if settings.token else [])
    server = grpc.aio.server(options=options, interceptors=interceptors)
    names = [add_inference_service(edge, server, forward)]
    names.extend(add_service(register, servicer, server, forward)
                 for register, servicer in services)
    add_support_services(server, health_servicer, [*names, HEALTH_SERVICE])
    tls = settings.tls
    try:
        port = (server.add_secure_port(settings.address, tls.server_credentials()) if tls
                else server.add_insecure_port(settings.address))
    except RuntimeError as exc:  # grpcio's "Failed to bind": the port is taken
        raise PortUnavailable("gRPC", settings.address, "--port", "in use") from exc
    if port == 0:
        raise PortUnavailable("gRPC", settings.address, "--port", "in use")
    if settings.shared and port != settings.port:  # the port the engine reserved, exactly
        raise PortUnavailable("gRPC", settings.address, "--port",
                              f"shared, but bound as {port}, not as reserved")
    return server, port


class ServingPort:
    """The serving lifecycle of one edge servicer's gRPC port (see the module docstring).

    ``health_servicer`` exists from construction, so health can follow the models before the
    port opens; a port never started (the engine of ``--frontends N``, whose front-ends serve
    the port) still drains its edge and closes as a no-op. ``call_tasks`` finds grpc.aio's
    tasks of the calls being served (see ``call_tasks``)."""

    def __init__(self, *, edge: EdgeServicer, name: str = "server",
                 call_tasks: CallTasks = grpc_call_tasks) -> None:
        self.edge = edge
        self._call_tasks = call_tasks
        self.health_servicer = health.aio.HealthServicer()
        self.port = 0
        self._name = name  # in log lines
        self._server: grpc.aio.Server | None = None
        self._health_updates: set[asyncio.Task[None]] = set()

    async def start(self, settings: PortSettings, *,
                    services: Sequence[tuple[Register, object]] = (),
                    forward: Forward | None = None) -> int:
        """Build the server (see ``build_server``) and start serving; returns the port."""
        server, port = build_server(settings, edge=self.edge,
                                    health_servicer=self.health_servicer, services=services,
                                    forward=forward)
        await server.start()
        self._server, self.port = server, port
        return port

    async def set_health(self, serving: bool) -> None:
        """Health SERVING or NOT_SERVING, at once."""
        status = (health_pb2.HealthCheckResponse.SERVING if serving
                  else health_pb2.HealthCheckResponse.NOT_SERVING)
        for service in _HEALTH_ENTRIES:
            await self.health_servicer.set(service, status)

    def update_health(self, serving: bool) -> None:
        """Health SERVING or NOT_SERVING, soon (for callers outside a coroutine); ignored once
        draining, when health is NOT_SERVING for good."""
        if self.edge.draining:
            return
        task = asyncio.create_task(self.set_health(serving), name=f"{self._name}:health")
        self._health_updates.add(task)
        task.add_done_callback(self._health_updates.discard)

    async def drain(self) -> None:
        """New inference calls hear UNAVAILABLE and health is NOT_SERVING; what was admitted
        is still answered."""
        self.edge.drain()
        # Updates already on their way land first; graceful shutdown then overrides them all.
        await asyncio.gather(*self._health_updates)
        await self.health_servicer.enter_graceful_shutdown()

    async def close(self, on_unanswered: Callable[[], None] | None = None) -> None:
        """Once every admitted call has its answer: wait (up to ``ANSWER_S``) for gRPC to send
        them, calling ``on_unanswered`` when some are still unsent; then close the port, stop
        gRPC and wait (up to ``ANSWER_S``) for its tasks of the calls it served to end, so
        that none is left for the process's exit to cancel. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        unsent = await self.edge.answered(ANSWER_S)
        if unsent:
            logger.warning("%s: %d calls not answered within %.1f s; closing the port",
                           self._name, unsent, ANSWER_S)
            if on_unanswered is not None:
                on_unanswered()
        # Once the answers are on the wire, no call may reach gRPC's stop: clients still
        # sending hear UNAVAILABLE from their closed connection instead of CANCELLED.
        closed = close_port(self.port)
        logger.info("%s: port %d closed: %d listeners, %d client connections", self._name,
                    self.port, closed.listeners, closed.connections)
        await server.stop(ANSWER_S)
        left = await calls_ended(ANSWER_S, self._call_tasks)
        if left:
            logger.warning("%s: %d gRPC call tasks still running %.1f s after the stop",
                           self._name, left, ANSWER_S)
