"""The Prometheus endpoint (``GET /metrics`` on ``--metrics-port``) as an ASGI application on
the same HTTP stack as the REST API (``edge.rest.http_port``), with its head deadline,
connection cap, TLS and bearer token.

The page is rendered on the event loop, so it reads the balancers' state consistently and never
from another thread: prometheus_client's own HTTP server would run the collectors on its
threads while the replicas mutate their counters on the loop."""

from __future__ import annotations

import logging
from collections.abc import Callable

from evenflow.server.edge.rest.replies import (
    ASGIMessage,
    Receive,
    Reply,
    Send,
    error_reply,
    send_reply,
)
from evenflow.server.edge.security import token_matches

logger = logging.getLogger(__name__)


class MetricsApp:
    """Serves ``render()`` (exposition text of ``content_type``) at ``/metrics``."""

    def __init__(self, render: Callable[[], bytes], content_type: str, *,
                 token: str | None = None) -> None:
        self._render = render
        self._content_type = content_type.encode()
        self._token = token

    async def __call__(self, scope: ASGIMessage, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = dict(scope["headers"])
        method = scope["method"]
        await send_reply(send, self._reply(method, scope["path"], headers), headers,
                         head_only=method == "HEAD")

    def _reply(self, method: str, path: str, headers: dict[bytes, bytes]) -> Reply:
        if self._token is not None:
            header = headers.get(b"authorization")
            if header is None or not token_matches(header.decode("latin-1"), self._token):
                return error_reply(401, "missing or wrong bearer token",
                                   [(b"www-authenticate", b"Bearer")])
        if path != "/metrics":
            return error_reply(404, "not found; metrics are at /metrics")
        if method not in ("GET", "HEAD"):
            return error_reply(405, "method not allowed", [(b"allow", b"GET, HEAD")])
        try:
            body = self._render()
        except Exception:
            logger.exception("rendering metrics failed")
            return error_reply(500, "rendering metrics failed")
        return Reply(200, [body], self._content_type)
