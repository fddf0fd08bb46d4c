"""Runs a gRPC method of this process's servicers on a request that arrived elsewhere (a
front-end process forwards every call but inference here as bytes): the servicer's own code,
with a context whose ``abort`` becomes the reply's status."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

logger = logging.getLogger(__name__)

_OK = grpc.StatusCode.OK.value[0]


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class _ForwardedContext:
    """The part of grpc.aio.ServicerContext that evenflow's non-inference servicers use."""

    def __init__(self, deadline_s: float) -> None:
        self._deadline_s = deadline_s
        self.code: grpc.StatusCode | None = None
        self.details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "", *_: Any) -> None:
        raise _Aborted(code, details)

    def set_trailing_metadata(self, metadata: Any) -> None:
        """Dropped: only the status crosses back, and the front-end marks it again as it
        answers (``status.abort``)."""

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def time_remaining(self) -> float | None:
        return None if self._deadline_s == float("inf") else \
            max(0.0, self._deadline_s - time.monotonic())

    def invocation_metadata(self) -> tuple[()]:
        return ()


def _parsed(handler: grpc.RpcMethodHandler, path: str, request: bytes) -> Any:
    if handler.request_deserializer is None:
        return request
    try:
        return handler.request_deserializer(request)
    except DecodeError as exc:
        # The client's bytes, not a server bug: INVALID_ARGUMENT, and no traceback in the log
        # (any client could fill it).
        raise _Aborted(grpc.StatusCode.INVALID_ARGUMENT,
                       f"the request is not a valid protobuf message for {path}") from exc


class ProxiedCalls:
    """Method path -> handler, captured from the generated ``add_*_to_server`` functions."""

    def __init__(self) -> None:
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add(self, register: Callable[[Any, Any], None], servicer: object) -> None:
        register(servicer, self)

    # The generated code calls these two on what it believes is a server.
    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass  # the same methods come again through add_registered_method_handlers

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for method, handler in handlers.items():
            self._handlers[f"/{service}/{method}"] = handler

    def __contains__(self, path: str) -> bool:
        return path in self._handlers

    async def call(self, path: str, request: bytes, deadline_s: float) -> tuple[int, str, bytes]:
        """(status code value, details, response bytes) of running ``path`` on ``request``."""
        handler = self._handlers.get(path)
        if handler is None or handler.unary_unary is None:
            return grpc.StatusCode.UNIMPLEMENTED.value[0], f"method {path} not found", b""
        context = _ForwardedContext(deadline_s)
        try:
            message = _parsed(handler, path, request)
            response = await handler.unary_unary(message, context)
        except _Aborted as aborted:
            return aborted.code.value[0], aborted.details, b""
        except NotImplementedError:
            code = context.code or grpc.StatusCode.UNIMPLEMENTED
            return code.value[0], context.details or "not implemented", b""
        except Exception as exc:  # a server bug: INTERNAL, logged, as in-process
            logger.exception("forwarded call %s failed inside the server", path)
            return grpc.StatusCode.INTERNAL.value[0], f"internal server error " \
                f"({type(exc).__name__}); see the server log", b""
        if context.code is not None and context.code != grpc.StatusCode.OK:
            return context.code.value[0], context.details, b""
        serialize = handler.response_serializer
        return _OK, "", serialize(response) if serialize is not None else response
