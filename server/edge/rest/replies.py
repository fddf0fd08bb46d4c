"""An HTTP answer and how it is written to an ASGI server: JSON errors as ``{"error": ...}``,
bodies compressed where the client accepts it, large bodies written as their parts uncopied.
Shared by the KServe REST API and the metrics port."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from evenflow.proto import metadata
from evenflow.server.edge.rest import compression

ASGIMessage = dict[str, Any]
Receive = Callable[[], Awaitable[ASGIMessage]]
Send = Callable[[ASGIMessage], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON = b"application/json"
# Responses up to this size go out as one write; larger ones as their parts, uncopied.
_JOIN_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: list[bytes | memoryview]
    content_type: bytes = JSON
    headers: tuple[tuple[bytes, bytes], ...] = ()


EMPTY = Reply(200, [])


class HttpError(Exception):
    """An answer other than 200, with a JSON ``{"error": ...}`` body."""

    def __init__(self, status: int, message: str, headers: Headers | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or []

    def reply(self) -> Reply:
        return error_reply(self.status, self.message, self.headers)


def json_reply(value: Any, status: int = 200) -> Reply:
    return Reply(status, [msgspec.json.encode(value)])


def error_reply(status: int, message: str, headers: Headers | None = None) -> Reply:
    return Reply(status, [msgspec.json.encode({"error": message})],
                 headers=tuple(headers or ()))


STATUS_HEADER = b"evenflow-status"
# On a 503 for a request the server did not run: a client may send it again (as gRPC's trailing
# metadata of the same name, ``proto/metadata.py``).
MAY_RESEND_HEADER = (metadata.MAY_RESEND.encode(), b"1")


def status_header(code_name: str) -> tuple[bytes, bytes]:
    """The gRPC status name the error stands for, beside Triton's HTTP status: a client tells
    a refusal by admission (RESOURCE_EXHAUSTED) from a server that is going away (UNAVAILABLE),
    both 503, without reading the message."""
    return STATUS_HEADER, code_name.encode()


async def send_reply(send: Send, reply: Reply, request_headers: Mapping[bytes, bytes], *,
                     head_only: bool = False) -> None:
    """Write ``reply``; a 200's body is compressed as the request's Accept-Encoding allows."""
    parts = reply.body
    headers = [(b"content-type", reply.content_type), *reply.headers]
    if parts and reply.status == 200:
        accepted = request_headers.get(b"accept-encoding")
        encoding = compression.choose_encoding(
            accepted.decode("latin-1") if accepted is not None else None)
        if encoding is not None:
            parts = compression.encode_body(parts, encoding)
            headers.append((b"content-encoding", encoding.encode()))
    length = sum(len(part) for part in parts)
    headers.append((b"content-length", str(length).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    if head_only or length <= _JOIN_BYTES:
        body = b"" if head_only else b"".join(parts)
        await send({"type": "http.response.body", "body": body})
        return
    for index, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part,
                    "more_body": index < len(parts) - 1})
