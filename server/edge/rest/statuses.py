"""The one place evenflow's errors (and gRPC statuses that crossed a process) become HTTP
statuses, with Triton's mapping: 400 for a bad request, 404 for a model that is not there, 503
for a server that is unavailable or overloaded, 500 for a server fault."""

from __future__ import annotations

import grpc

from evenflow.balancer import EvenflowError
from evenflow.server.edge.status import status_of

HTTP_STATUS_OF: dict[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 503,  # refused by admission: overloaded
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


def http_status(code: grpc.StatusCode) -> int:
    """The HTTP status of a gRPC status code (500 for any not listed)."""
    return HTTP_STATUS_OF.get(code, 500)


def http_status_of(error: EvenflowError) -> int:
    return http_status(status_of(error))
