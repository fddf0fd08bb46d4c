"""The client's exceptions. Every failed call raises an ``InferenceServerError`` that carries the
gRPC status code; subclasses name the common ones so callers can catch what they handle.

    InferenceServerError            .code (grpc.StatusCode), .details (server's message)
    ├── ModelNotFoundError          NOT_FOUND
    ├── InvalidInputError           INVALID_ARGUMENT
    ├── DeadlineExceededError       DEADLINE_EXCEEDED
    ├── ServerOverloadedError       RESOURCE_EXHAUSTED
    ├── ServerUnavailableError      UNAVAILABLE (retried first, see Client)
    ├── ServerInternalError         INTERNAL (e.g. the model raised)
    └── AuthenticationError         UNAUTHENTICATED (no or wrong token)
"""

from __future__ import annotations

import grpc


class InferenceServerError(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


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
}


def error_for(code: grpc.StatusCode, details: str) -> InferenceServerError:
    return _BY_CODE.get(code, InferenceServerError)(code, details)


def from_rpc_error(exc: grpc.RpcError) -> InferenceServerError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return error_for(code, details or "")
