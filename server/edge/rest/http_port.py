"""One HTTP/1.1 port on the running event loop, beside grpc.aio: uvicorn's httptools protocol
serving an ASGI application, with the limits a public port needs.

uvicorn parses (llhttp through httptools), keeps connections alive, answers pipelined requests
in order and writes responses; ``uvicorn.Server`` is not used, since it takes over the
process's signals and the loop's life, which belong to evenflow. What is added here:

- a request-head deadline: from the connection's start (or a request's first byte) to the end
  of its head, at most ``head_timeout_s``; then 408 and the connection is closed, so a client
  sending a byte a second holds nothing for long;
- a request-body deadline, its mirror: from the end of the head to the end of the body, at
  most ``body_timeout_s``; then 408 and close. Either deadline that passes while earlier
  pipelined requests are still being answered (when uvicorn may not be reading) starts again
  once they are;
- a head-size limit (431), which httptools does not have;
- refusals (400, 408, 431) written after the answers to the requests before them, never
  into the middle of one;
- a connection cap: past ``max_connections`` open connections (or requests in flight) a request
  is answered 503 at once (uvicorn's ``limit_concurrency``);
- TLS from evenflow's files, SO_REUSEPORT where front-end processes share the port;
- ``close``: the listener closes, idle connections close, what is being answered is finished
  (up to a limit), then what is left is cut (aborted: its unsent bytes are dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import msgspec
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from evenflow.server.edge.port_errors import PortUnavailable
from evenflow.server.edge.rest.replies import MAY_RESEND_HEADER
from evenflow.server.edge.security import TlsFiles

logger = logging.getLogger(__name__)

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]

HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0  # 64 MiB, the default body limit, at a little over 1 MiB/s
MAX_HEAD_BYTES = 64 * 1024
MAX_CONNECTIONS = 4096
KEEP_ALIVE_S = 75  # idle keep-alive: longer than the usual client pool's (60 s)
CLOSE_S = 5.0  # how long ``close`` waits for responses being written
_ABORTED_S = 1.0  # how long it waits for the connections it cut to be gone


@dataclass(frozen=True, slots=True)
class HttpSettings:
    """Attributes:
    host, port: where to listen; port 0 picks a free one (not with ``shared``).
    shared: other processes listen on the same port (SO_REUSEPORT).
    tls: serve HTTPS with these files (client certificates required where they name a CA).
    head_timeout_s, max_head_bytes: the request-head deadline and size limit.
    body_timeout_s: the request-body deadline, from the end of its head.
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
    body_timeout_s: float = BODY_TIMEOUT_S
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
    """uvicorn's httptools protocol with deadlines on each request's head and body, a size
    limit on its head, and refusals (400, 408, 431) written only once the answers due before
    them are: a pipelined bad request never cuts off the response being written."""

    head_timeout_s = HEAD_TIMEOUT_S
    body_timeout_s = BODY_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES
    max_connections = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._input_timer: asyncio.TimerHandle | None = None  # the head's or body's deadline
        # The deadline passed while earlier requests were being answered: uvicorn may not have
        # been reading (a pipelined request waits unread), so a new one starts once they are.
        self._late = False
        self._head_bytes = self._wire_head_bytes = 0
        self._in_head = True  # between a message's end (or the connection's start) and a head's
        self._reading: RequestResponseCycle | None = None  # the request whose body is read
        self._running: RequestResponseCycle | None = None  # the request being answered
        self._refusing = False  # a request was refused: nothing after it is parsed
        self._refusal: tuple[int, bytes] | None = None  # written once earlier answers are
        super().connection_made(transport)
        self._arm_input_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_input_timer()
        super().connection_lost(exc)
        if not self.connections and isinstance(self.server_state, _State):
            self.server_state.all_closed.set()

    def data_received(self, data: bytes) -> None:
        if self._refusing:
            return  # read (so a client's close is seen), not parsed
        # Bytes read since the last message ended: a head still incomplete after this many is
        # too large (checked after parsing: the read that ends a head may carry a large body;
        # a whole head within one read is checked in ``on_headers_complete``).
        if self._in_head:
            self._wire_head_bytes += len(data)
        super().data_received(data)
        if self._in_head and not self._refusing and self._wire_head_bytes > self.max_head_bytes:
            self._refuse_in_turn(431, b"request head too large")

    # The parser's callbacks. After a refusal the rest of what was read in the same call is
    # still parsed; ignored, so none of it reaches a request (the refused one has no cycle).

    def on_message_begin(self) -> None:
        if self._refusing:
            return
        super().on_message_begin()
        self._head_bytes = 0
        if self._input_timer is None and not self._late:
            self._arm_input_timer()

    def on_url(self, url: bytes) -> None:
        if self._refusing:
            return
        self._head_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refusing:
            return
        self._head_bytes += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._refusing:
            return
        self._in_head = False
        self._cancel_input_timer()
        self._late = False
        if self._head_bytes > self.max_head_bytes:  # a whole head in one packet
            self._refuse_in_turn(431, b"request head too large")
            return
        queued = len(self.pipeline)
        cap = self.max_connections
        if len(self.connections) <= cap and len(self.tasks) < cap:
            super().on_headers_complete()
        else:
            app, self.app = self.app, _over_capacity  # read by uvicorn for this request only
            try:
                super().on_headers_complete()
            finally:
                self.app = app
        if len(self.pipeline) == queued:  # not queued behind an answer: started
            self._running = self.cycle
        self._reading = self.cycle
        self._arm_input_timer()  # the body's (a bodiless request's ends at once, cancelling it)

    def on_body(self, body: bytes) -> None:
        if not self._refusing:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refusing:
            return
        super().on_message_complete()
        self._cancel_input_timer()
        self._late = False
        self._reading = None
        self._in_head = True
        self._wire_head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        """Bytes that are not HTTP: 400 and close, once the requests before them have had
        their answers (the request whose body they are in, if any, is not answered)."""
        self._refuse_in_turn(400, msg.encode("ascii", "replace"))

    def on_response_complete(self) -> None:
        waiting = self.pipeline[-1][0] if self.pipeline else None  # uvicorn starts it next
        super().on_response_complete()
        if waiting is not None and (not self.pipeline or self.pipeline[-1][0] is not waiting):
            self._running = waiting
        if self._answers_before():
            return
        if self._refusal is not None:
            self._refuse(*self._refusal)
        elif self._late and not self.transport.is_closing():
            self._late = False
            self._arm_input_timer()

    def _answers_before(self) -> bool:
        """Whether responses are due on this connection before the request being read (in
        its head, or in its body) could be refused: an answer being written, or requests
        queued to be answered, other than the request being read itself."""
        running, reading = self._running, self._reading
        if running is not None and not running.response_complete \
                and (running is not reading or running.response_started):
            return True
        return any(cycle is not reading for cycle, _ in self.pipeline)

    def _arm_input_timer(self) -> None:
        timeout_s = self.head_timeout_s if self._in_head else self.body_timeout_s
        self._input_timer = self.loop.call_later(timeout_s, self._input_timed_out)

    def _cancel_input_timer(self) -> None:
        if self._input_timer is not None:
            self._input_timer.cancel()
            self._input_timer = None

    def _input_timed_out(self) -> None:
        self._input_timer = None
        if self._answers_before():
            self._late = True
            return
        reading = self._reading
        if reading is None:
            self._refuse_in_turn(408, b"request head not received in time")
        elif not reading.response_started:
            self._refuse_in_turn(408, b"request body not received in time")
        else:  # answered before its body came (a 404, say): the rest of it is not waited for
            self._refusing = True
            self.transport.close()

    def _refuse_in_turn(self, status: int, message: bytes) -> None:
        """Refuse the request being read with ``status``, and close: at once, or once the
        answers due before it are written. Nothing after it is parsed, and it is not
        answered itself (taken out of the queue, if it waits there)."""
        self._refusing = True
        self._cancel_input_timer()
        reading = self._reading
        if reading is not None:
            self.pipeline = deque(entry for entry in self.pipeline if entry[0] is not reading)
        if self._answers_before():
            self._refusal = (status, message)
            return
        self._refuse(status, message)

    def _refuse(self, status: int, message: bytes) -> None:
        """Answer ``status`` with a JSON error and close: the connection is not reusable. A
        request whose application runs (reading its body) hears that its client went away."""
        self._refusing = True
        self._refusal = None
        self._cancel_input_timer()
        self._unset_keepalive_if_required()
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
        (b"connection", b"close"), (b"retry-after", b"1"), MAY_RESEND_HEADER]})
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
            "head_timeout_s": settings.head_timeout_s, "body_timeout_s": settings.body_timeout_s,
            "max_head_bytes": settings.max_head_bytes,
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
        to ``timeout_s``), then cut what is left. Idempotent."""
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
                logger.warning("%s: cutting %d connections still answering", self._name,
                               len(left))
                for connection in left:
                    # abort, not close: close would wait for a client that does not read to
                    # take the response still buffered, and keep the connection open as long.
                    connection.transport.abort()
                # Each abort's connection_lost runs on the next loop turn: waited for, so none
                # is open when this returns (bounded, should a transport never call it).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._state.all_closed.wait(), _ABORTED_S)
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
