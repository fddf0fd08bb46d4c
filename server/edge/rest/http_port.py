"""One HTTP/1.1 port on the running event loop, beside grpc.aio: uvicorn's httptools protocol
serving an ASGI application, with the limits a public port needs.

uvicorn parses (llhttp through httptools), keeps connections alive, answers pipelined requests
in order and writes responses; ``uvicorn.Server`` is not used, since it takes over the
process's signals and the loop's life, which belong to evenflow. What is added here:

- a request-head deadline: from the connection's start (or a request's first byte) to the end
  of its head, at most ``head_timeout_s``; then 408 and the connection is closed, so a client
  sending a byte a second holds nothing for long;
- a head-size limit (431), which httptools does not have;
- a connection cap: past ``max_connections`` open connections (or requests in flight) a request
  is answered 503 at once (uvicorn's ``limit_concurrency``);
- TLS from evenflow's files, SO_REUSEPORT where front-end processes share the port;
- ``close``: the listener closes, idle connections close, what is being answered is finished
  (up to a limit), then what is left is cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import msgspec
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from evenflow.server.edge.port_errors import PortUnavailable
from evenflow.server.edge.security import TlsFiles

logger = logging.getLogger(__name__)

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

HEAD_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 64 * 1024
MAX_CONNECTIONS = 4096
KEEP_ALIVE_S = 75  # idle keep-alive: longer than the usual client pool's (60 s)
CLOSE_S = 5.0  # how long ``close`` waits for responses being written


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Attributes:
    host, port: where to listen; port 0 picks a free one (not with ``shared``).
    shared: other processes listen on the same port (SO_REUSEPORT).
    tls: serve HTTPS with these files (client certificates required where they name a CA).
    head_timeout_s, max_head_bytes: the request-head deadline and size limit.
    max_connections: open connections (or requests in flight) beyond which a request hears
        503 and its connection is closed.
    keep_alive_s: how long an idle keep-alive connection stays open.
    flag: the option that chooses this port, for the error when it is taken.
    """

    host: str
    port: int
    shared: bool = False
    tls: TlsFiles | None = None
    head_timeout_s: float = HEAD_TIMEOUT_S
    max_head_bytes: int = MAX_HEAD_BYTES
    max_connections: int = MAX_CONNECTIONS
    keep_alive_s: int = KEEP_ALIVE_S
    flag: str = "--http-port"


class _State(ServerState):
    """uvicorn's per-server state (connections, tasks, default headers), and an event set
    whenever the last connection closes."""

    def __init__(self) -> None:
        super().__init__()
        self.all_closed = asyncio.Event()


class _Protocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size limit on each request head."""

    head_timeout_s = HEAD_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = self._wire_head_bytes = 0
        self._in_head = True  # between a message's end (or the connection's start) and a head's
        self._bad_request: bytes | None = None  # a parse error behind requests still answered
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)
        if not self.connections and isinstance(self.server_state, _State):
            self.server_state.all_closed.set()

    def data_received(self, data: bytes) -> None:
        # Bytes read since the last message ended: a head still incomplete after this many is
        # too large (checked after parsing: the read that ends a head may carry a large body;
        # a whole head within one read is checked in ``on_headers_complete``).
        if self._in_head:
            self._wire_head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._wire_head_bytes > self.max_head_bytes:
            self._refuse(431, b"request head too large")

    def on_url(self, url: bytes) -> None:
        self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._wire_head_bytes = 0

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        if self._head_bytes > self.max_head_bytes:  # a whole head in one packet
            self._refuse(431, b"request head too large")
            return
        cap = self.max_connections
        if len(self.connections) <= cap and len(self.tasks) < cap:
            super().on_headers_complete()
            return
        app, self.app = self.app, _over_capacity  # read by uvicorn for this request only
        try:
            super().on_headers_complete()
        finally:
            self.app = app

    def send_400_response(self, msg: str) -> None:
        """Bytes that are not HTTP: 400 and close, once the requests before them (in flight,
        or pipelined behind) have had their answers."""
        message = msg.encode("ascii", "replace")
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and cycle.more_body:
            self._refuse(400, message)  # the request being read is the bad one
            return
        if self._answering():
            self._bad_request = message
            self.transport.pause_reading()  # the parser is dead: nothing more to read
            return
        self._refuse(400, message)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._bad_request is not None and not self._answering():
            self._refuse(400, self._bad_request)

    def _answering(self) -> bool:
        return bool(self.pipeline) or (self.cycle is not None
                                       and not self.cycle.response_complete)

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            return  # answering a request (a pipelined one waits): not idle in a head
        self._refuse(408, b"request head not received in time")

    def _refuse(self, status: int, message: bytes) -> None:
        """Answer ``status`` with a JSON error and close: the connection is not reusable."""
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        body = msgspec.json.encode({"error": message.decode("ascii", "replace")})
        head = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS[status])]
        head.extend(b"%s: %s\r\n" % pair for pair in self.server_state.default_headers)
        self.transport.write(b"".join(head) + b"content-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                             % (len(body), body))
        self.transport.close()


_REASONS = {400: b"Bad Request", 408: b"Request Timeout",
            431: b"Request Header Fields Too Large"}


async def _over_capacity(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The answer past the connection cap: 503 at once, and the connection closed."""
    body = b'{"error":"the server has too many open connections; try again later"}'
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"), (b"retry-after", b"1")]})
    await send({"type": "http.response.body", "body": body})


class HttpPort:
    """Serves ``app`` on one port (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, name: str = "http") -> None:
        self._app = app
        self._name = name  # in log lines
        self._state = _State()
        self._server: asyncio.Server | None = None
        self._clock: asyncio.Task[None] | None = None
        self.port = 0

    async def start(self, settings: HttpSettings) -> int:
        """Listen; returns the bound port. Raises PortUnavailable when the port is taken."""
        config = uvicorn.Config(self._app, http=_Protocol, ws="none", lifespan="off",
                                interface="asgi3", log_config=None, access_log=False,
                                proxy_headers=False, server_header=False, date_header=False,
                                timeout_keep_alive=settings.keep_alive_s)
        config.load()
        protocol = type("Protocol", (_Protocol,), {
            "head_timeout_s": settings.head_timeout_s, "max_head_bytes": settings.max_head_bytes,
            "max_connections": settings.max_connections})
        state = self._state
        self._tick_date()
        self._clock = asyncio.create_task(self._keep_date(), name=f"{self._name}:date")

        def make_protocol() -> asyncio.Protocol:
            return protocol(config=config, server_state=state, app_state={})

        sock = _listening_socket(settings)
        try:
            self._server = await asyncio.get_running_loop().create_server(
                make_protocol, sock=sock, backlog=2048,
                ssl=settings.tls.ssl_context() if settings.tls is not None else None,
                ssl_handshake_timeout=settings.head_timeout_s if settings.tls else None)
        except BaseException:
            sock.close()
            await self._stop_clock()
            raise
        self.port = sock.getsockname()[1]
        return self.port

    @property
    def connections(self) -> int:
        return len(self._state.connections)

    def _tick_date(self) -> None:
        # One Date header a second for every response, as uvicorn's own server loop does.
        self._state.default_headers = [(b"date", formatdate(usegmt=True).encode())]

    async def _keep_date(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._tick_date()

    async def _stop_clock(self) -> None:
        clock, self._clock = self._clock, None
        if clock is not None:
            clock.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await clock

    async def close(self, timeout_s: float = CLOSE_S) -> None:
        """Stop listening, close idle connections, let responses being written finish (up
        to ``timeout_s``), then close what is left. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            for connection in list(self._state.connections):
                connection.shutdown()  # idle: closed now; busy: closed after its response
            if self._state.connections:
                self._state.all_closed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._state.all_closed.wait(), timeout_s)
            left = list(self._state.connections)
            if left:
                logger.warning("%s: closing %d connections still answering", self._name,
                               len(left))
            for connection in left:
                connection.transport.close()
            for task in list(self._state.tasks):
                task.cancel()
            await asyncio.gather(*self._state.tasks, return_exceptions=True)
            await server.wait_closed()
        await self._stop_clock()


def _listening_socket(settings: HttpSettings) -> socket.socket:
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if settings.shared:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind((settings.host, settings.port))
        except OSError as exc:
            raise PortUnavailable("HTTP", f"{settings.host}:{settings.port}", settings.flag,
                                  exc.strerror or str(exc)) from exc
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock
