"""The load target a URL and a protocol mean, as the client reads them: ``HOST:PORT`` is gRPC
unless the protocol is ``http``; an ``http://`` or ``https://`` URL is HTTP."""

from __future__ import annotations

from evenflow.client._endpoint import Protocol, resolve
from evenflow.client.credentials import Credentials
from evenflow.loadtest.http_target import HttpTarget
from evenflow.loadtest.runner import LoadTarget, Target
from evenflow.proto import grpc_service_pb2 as pb


def make_target(url: str, protocol: Protocol | None, request: pb.ModelInferRequest, *,
                timeout_s: float, credentials: Credentials | None,
                connections: int = 0) -> LoadTarget:
    """``connections``: HTTP's pool size (0: unbounded); gRPC multiplexes on one channel."""
    endpoint = resolve(url, protocol, credentials)
    if endpoint.protocol == "http":
        return HttpTarget(endpoint.address, request, timeout_s=timeout_s,
                          connections=connections, credentials=endpoint.credentials)
    return Target(endpoint.address, request, timeout_s=timeout_s,
                  credentials=endpoint.credentials)
