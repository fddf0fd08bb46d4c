"""The one place evenflow's errors become gRPC statuses: every servicer (inference, streaming,
model control, stats, admin) raises EvenflowError subclasses and this module answers them."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, TypeVar

import grpc

from evenflow.balancer import ErrorCode, EvenflowError, InvalidRequest
from evenflow.proto import metadata

logger = logging.getLogger(__name__)

STATUS_OF: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}
_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


_MAY_RESEND = ((metadata.MAY_RESEND, "1"),)


def status_of(error: EvenflowError) -> grpc.StatusCode:
    return STATUS_OF[error.code]


async def abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode,
                details: str) -> NoReturn:
    """End the call with ``code`` and ``details``."""
    await context.abort(code, details)
    raise AssertionError("unreachable: abort raises")


def may_resend(error: EvenflowError) -> bool:
    """Whether the client may send the request again: an UNAVAILABLE for a request that never
    reached a worker (``not_run``). Marked so on both protocols (``proto/metadata.py``)."""
    return error.not_run and status_of(error) is grpc.StatusCode.UNAVAILABLE


async def abort_with(context: grpc.aio.ServicerContext, error: EvenflowError) -> NoReturn:
    """End the call with ``error``'s status, marked when the client ``may_resend`` it."""
    if may_resend(error):
        context.set_trailing_metadata(_MAY_RESEND)
    await abort(context, status_of(error), str(error))


def status_from_value(value: int) -> grpc.StatusCode:
    """A status that crossed a process boundary as its number."""
    return _BY_VALUE.get(value, grpc.StatusCode.UNKNOWN)


def stream_error_message(error: EvenflowError) -> str:
    """A failed request's ``error_message`` in a ModelStreamInfer response (the stream has no
    per-response status): the status name, then the message; ``client`` parses it back."""
    return f"{status_of(error).name}: {error}"


def internal_error(error: Exception, what: str) -> EvenflowError:
    """What a caller hears when the server itself fails (a bug): INTERNAL, with the exception
    logged here with its traceback."""
    logger.error("%s failed inside the server", what, exc_info=error)
    return EvenflowError(f"internal server error ({type(error).__name__}); see the server log")


Request = TypeVar("Request")
Response = TypeVar("Response")
Method = Callable[[Any, Request, grpc.aio.ServicerContext], Awaitable[Response]]


def answers_errors(method: Method[Request, Response]) -> Method[Request, Response]:
    """A unary servicer method whose EvenflowErrors (and bad arguments, ValueError) become
    their status, and whose bugs become INTERNAL."""

    @functools.wraps(method)
    async def answered(self: Any, request: Request,
                       context: grpc.aio.ServicerContext) -> Response:
        try:
            return await method(self, request, context)
        except EvenflowError as exc:
            error: EvenflowError = exc
        except ValueError as exc:
            error = InvalidRequest(str(exc))
        except Exception as exc:
            error = internal_error(exc, f"{type(self).__name__}.{method.__name__}")
        await abort_with(context, error)

    return answered
