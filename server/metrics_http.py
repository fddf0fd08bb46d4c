"""A minimal HTTP/1.1 endpoint on the event loop that serves ``GET /metrics``.

One request per connection (``Connection: close``), which is all a Prometheus scrape needs. The
page is rendered on the loop, so it reads the balancers' state consistently and never from
another thread. Each connection's handler task is owned here and cancelled on ``close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

_MAX_HEAD_BYTES = 8192
_READ_TIMEOUT_S = 5.0


class MetricsEndpoint:
    """Serves ``render()`` (exposition text) at ``/metrics`` on ``host:port``."""

    def __init__(self, render: Callable[[], str], content_type: str) -> None:
        self._render = render
        self._content_type = content_type
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (``port`` 0 picks a free one)."""
        self._server = await asyncio.start_server(self._accept, host, port,
                                                  limit=_MAX_HEAD_BYTES)
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
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
        except asyncio.LimitOverrunError:
            await _respond(writer, 431, "request header too large\n")
            return
        except TimeoutError:
            await _respond(writer, 408, "request timeout\n")
            return
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await _respond(writer, 400, "bad request\n")
            return
        method, target, _ = parts
        path = target.split("?", 1)[0]
        if path != "/metrics":
            await _respond(writer, 404, "not found; metrics are at /metrics\n")
            return
        if method not in ("GET", "HEAD"):
            await _respond(writer, 405, "method not allowed\n", extra="Allow: GET, HEAD\r\n")
            return
        try:
            body = self._render()
        except Exception:
            logger.exception("rendering metrics failed")
            await _respond(writer, 500, "rendering metrics failed\n")
            return
        await _respond(writer, 200, body, content_type=self._content_type,
                       head_only=method == "HEAD")


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large",
            500: "Internal Server Error"}


async def _respond(writer: asyncio.StreamWriter, status: int, body: str, *,
                   content_type: str = "text/plain; charset=utf-8", extra: str = "",
                   head_only: bool = False) -> None:
    payload = body.encode("utf-8")
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n{extra}\r\n")
    writer.write(head.encode("latin-1") + (b"" if head_only else payload))
    await writer.drain()
