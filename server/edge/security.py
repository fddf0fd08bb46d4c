"""Who may call: TLS and mutual TLS for the gRPC port and the metrics endpoint, and a bearer
token checked by a server interceptor.

The token guards RPC groups, as Triton's restricted protocols do: ``inference`` (inference,
metadata, readiness, reflection), ``statistics``, ``model-control`` and ``admin``; the gRPC
health service always stays open for orchestrator probes. Comparison is constant-time.
"""

from __future__ import annotations

import hmac
import os
import ssl
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

TOKEN_ENV = "EVENFLOW_AUTH_TOKEN"
GROUPS = ("inference", "statistics", "model-control", "admin")
_HEALTH_PREFIX = "/grpc.health.v1.Health/"
_GROUP_OF_METHOD = {
    "/inference.GRPCInferenceService/ModelStatistics": "statistics",
    "/inference.GRPCInferenceService/RepositoryIndex": "model-control",
    "/inference.GRPCInferenceService/RepositoryModelLoad": "model-control",
    "/inference.GRPCInferenceService/RepositoryModelUnload": "model-control",
}
_GROUP_OF_SERVICE = {"/evenflow.v1.EvenflowStats/": "statistics",
                     "/evenflow.v1.EvenflowAdmin/": "admin"}


def group_of(method: str) -> str | None:
    """The RPC group of a full method name; None for the always-open health service."""
    if method.startswith(_HEALTH_PREFIX):
        return None
    if method in _GROUP_OF_METHOD:
        return _GROUP_OF_METHOD[method]
    for prefix, group in _GROUP_OF_SERVICE.items():
        if method.startswith(prefix):
            return group
    return "inference"


@dataclass(frozen=True, slots=True)
class TlsFiles:
    cert: Path
    key: Path
    client_ca: Path | None = None  # set: clients must present a certificate it signed

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.client_ca.read_bytes() if self.client_ca else None,
            require_client_auth=self.client_ca is not None)

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.load_verify_locations(self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def load_token(path: Path | None) -> str | None:
    """The token from ``path`` (first line), else from $EVENFLOW_AUTH_TOKEN, else None."""
    text = path.read_text(encoding="utf-8") if path is not None else os.environ.get(TOKEN_ENV)
    if text is None:
        return None
    token = text.strip().splitlines()[0].strip() if text.strip() else ""
    if len(token) < 16:
        source = str(path) if path is not None else f"${TOKEN_ENV}"
        raise ValueError(f"{source}: the auth token must be at least 16 characters")
    return token


def token_matches(header: str | None, token: str) -> bool:
    """Whether ``header`` is ``Bearer <token>`` (constant time in the token)."""
    if header is None or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].encode(), token.encode())


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls in the guarded groups without ``authorization: Bearer TOKEN``."""

    def __init__(self, token: str, groups: Collection[str] = GROUPS) -> None:
        self._token = token
        self._groups = frozenset(groups)

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        group = group_of(details.method)
        if group is None or group not in self._groups:
            return await continuation(details)
        header = next((value for key, value in details.invocation_metadata or ()
                       if key == "authorization"), None)
        if token_matches(header if isinstance(header, str) else None, self._token):
            return await continuation(details)
        handler = await continuation(details)
        return _refusal(handler)


def _refusal(handler: grpc.RpcMethodHandler | None) -> grpc.RpcMethodHandler:
    """A handler of the same shape that answers UNAUTHENTICATED."""
    message = "missing or wrong bearer token (metadata 'authorization: Bearer TOKEN')"

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - abort raises

    if handler is None:
        return grpc.unary_unary_rpc_method_handler(unary)
    deserializer, serializer = handler.request_deserializer, handler.response_serializer
    if handler.response_streaming:
        factory = (grpc.stream_stream_rpc_method_handler if handler.request_streaming
                   else grpc.unary_stream_rpc_method_handler)
        return factory(streaming, request_deserializer=deserializer,
                       response_serializer=serializer)
    factory = (grpc.stream_unary_rpc_method_handler if handler.request_streaming
               else grpc.unary_unary_rpc_method_handler)
    return factory(unary, request_deserializer=deserializer, response_serializer=serializer)
