"""A minimal HTTP/1.1 endpoint on the event loop that serves ``GET /metrics``.

One request per connection (``Connection: close``), which is all a Prometheus scrape needs. The
page is rendered on the loop, so it reads the balancers' state consistently and never from
another thread: prometheus_client's own HTTP server would run the collectors on its threads,
while the replicas mutate their counters on the loop, and it holds a thread per connection with
no deadline for the request head. Here a client gets ``head_timeout_s`` to send its request
head and at most ``max_connections`` are open at once (more get 503 at once). Each
connection's handler task is owned here and cancelled on ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable

from evenflow.server.edge.security import token_matches

logger = logging.getLogger(__name__)

_MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 64


class MetricsEndpoint:
    """Serves ``render()`` (exposition text) at ``/metrics`` on ``host:port``."""

    def __init__(self, render: Callable[[], bytes], content_type: str, *,
                 head_timeout_s: float = HEAD_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS,
                 ssl_context: ssl.SSLContext | None = None, token: str | None = None) -> None:
        self._render = render
        self._ssl = ssl_context
        self._token = token
        self._head_timeout_s = head_timeout_s
        self._max_connections = max_connections
        self._content_type = content_type
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (``port`` 0 picks a free one)."""
        self._server = await asyncio.start_server(self._accept, host, port,
                                                  limit=_MAX_HEAD_BYTES, ssl=self._ssl,
                                                  ssl_handshake_timeout=self._head_timeout_s
                                                  if self._ssl is not None else None)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if len(self._connections) > self._max_connections:
                await _respond(writer, 503, b"too many connections\n")
                return
            await self._serve_one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to answer
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _serve_one(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"),
                                          self._head_timeout_s)
        except asyncio.LimitOverrunError:
            await _respond(writer, 431, b"request header too large\n")
            return
        except TimeoutError:
            await _respond(writer, 408, b"request timeout\n")
            return
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _respond(writer, 400, b"bad request\n")
            return
        method, target, _ = parts
        if self._token is not None and not token_matches(_header(head, b"authorization"),
                                                         self._token):
            await _respond(writer, 401, b"missing or wrong bearer token\n",
                           extra="WWW-Authenticate: Bearer\r\n")
            return
        path = target.split("?", 1)[0]
        if path != "/metrics":
            await _respond(writer, 404, b"not found; metrics are at /metrics\n")
            return
        if method not in ("GET", "HEAD"):
            await _respond(writer, 405, b"method not allowed\n", extra="Allow: GET, HEAD\r\n")
            return
        try:
            body = self._render()
        except Exception:
            logger.exception("rendering metrics failed")
            await _respond(writer, 500, b"rendering metrics failed\n")
            return
        await _respond(writer, 200, body, content_type=self._content_type,
                       head_only=method == "HEAD")


def _header(head: bytes, name: bytes) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout",
            431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


async def _respond(writer: asyncio.StreamWriter, status: int, payload: bytes, *,
                   content_type: str = "text/plain; charset=utf-8", extra: str = "",
                   head_only: bool = False) -> None:
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n{extra}\r\n")
    writer.write(head.encode("latin-1") + (b"" if head_only else payload))
    await writer.drain()
