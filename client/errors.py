"""The client's exceptions. Every failed call raises an ``InferenceServerError`` that carries the
gRPC status code, over HTTP too (the HTTP status is mapped to the code gRPC would have sent, and
kept in ``http_status``); subclasses name the common ones so callers can catch what they handle.

    InferenceServerError            .code (grpc.StatusCode), .details (server's message)
    ├── ModelNotFoundError          NOT_FOUND                          HTTP 404
    ├── InvalidInputError           INVALID_ARGUMENT                   HTTP 400
    ├── DeadlineExceededError       DEADLINE_EXCEEDED                  HTTP 504, 408
    ├── ServerOverloadedError       RESOURCE_EXHAUSTED                 HTTP 429, 503 (refusal)
    ├── ServerUnavailableError      UNAVAILABLE (retried first)        HTTP 503, no connection
    ├── ServerInternalError         INTERNAL (e.g. the model raised)   HTTP 500
    └── AuthenticationError         UNAUTHENTICATED, PERMISSION_DENIED HTTP 401, 403
"""

from __future__ import annotations

import re

import grpc


class InferenceServerError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str, http_status: int | None = None) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.http_status = http_status


class ModelNotFoundError(InferenceServerError):
    pass


class InvalidInputError(InferenceServerError):
    pass


class DeadlineExceededError(InferenceServerError):
    pass


class ServerOverloadedError(InferenceServerError):
    pass


class ServerUnavailableError(InferenceServerError):
    pass


class ServerInternalError(InferenceServerError):
    pass


class AuthenticationError(InferenceServerError):
    pass


_BY_CODE: dict[grpc.StatusCode, type[InferenceServerError]] = {
    grpc.StatusCode.NOT_FOUND: ModelNotFoundError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInputError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ServerOverloadedError,
    grpc.StatusCode.UNAVAILABLE: ServerUnavailableError,
    grpc.StatusCode.INTERNAL: ServerInternalError,
    grpc.StatusCode.UNAUTHENTICATED: AuthenticationError,
    grpc.StatusCode.PERMISSION_DENIED: AuthenticationError,
}

_CODE_OF_HTTP: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

# HTTP answers a refusal (gRPC's RESOURCE_EXHAUSTED) and an unavailable server alike, 503; the
# message tells them apart: a status-name prefix (as in a gRPC stream's error_message),
# evenflow's admission wording (balancer/admission.py) or Triton's queue limit.
_OVERLOADED = re.compile(r"^RESOURCE_EXHAUSTED\b|is predicted to (answer|queue)|"
                         r"requests queued \(limit|samples queued;|Exceeds maximum queue size")


def error_for(code: grpc.StatusCode, details: str,
              http_status: int | None = None) -> InferenceServerError:
    return _BY_CODE.get(code, InferenceServerError)(code, details, http_status)


def from_rpc_error(exc: grpc.RpcError) -> InferenceServerError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return error_for(code, details or "")


def code_of_http(status: int, message: str) -> grpc.StatusCode:
    """The gRPC status an HTTP error answer stands for (``message``: its ``error``)."""
    code = _CODE_OF_HTTP.get(status, grpc.StatusCode.UNKNOWN)
    if code is grpc.StatusCode.UNAVAILABLE and _OVERLOADED.search(message):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return code


def from_http_error(status: int, message: str) -> InferenceServerError:
    return error_for(code_of_http(status, message), message, status)


def malformed_response(what: str) -> InferenceServerError:
    """The server's answer does not decode (the client's view of a server bug)."""
    return error_for(grpc.StatusCode.INTERNAL, f"malformed response: {what}")
