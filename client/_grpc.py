"""The gRPC transports (blocking and asyncio): KServe v2's GRPCInferenceService, one channel
(HTTP/2, every call multiplexed) per client."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

import grpc
import numpy as np

from evenflow.client import _codec as codec
from evenflow.client._fanout import each_input
from evenflow.client._retry import not_run
from evenflow.client._types import ChannelOptions, Inputs, ModelMetadata, StreamResult
from evenflow.client.credentials import Credentials, aio_channel, sync_channel
from evenflow.client.errors import InferenceServerError, from_rpc_error
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.proto import metadata

# grpc-core's words for a call that failed before it left the client: no address answered, or
# the name did not resolve. Nothing was sent, so sending again cannot run the request twice.
_NOT_SENT = re.compile(r"^(failed to connect to all addresses|DNS resolution failed|"
                       r"empty address list)")


def _error(exc: grpc.RpcError) -> InferenceServerError:
    """The client's error for a failed call; an UNAVAILABLE the server cannot have run (never
    sent, or marked by evenflow's server as its own refusal) is marked ``not_run``."""
    error = from_rpc_error(exc)
    if error.code is grpc.StatusCode.UNAVAILABLE and (
            _NOT_SENT.match(error.details) or _marked_may_resend(exc)):
        not_run(error)
    return error


def _marked_may_resend(exc: grpc.RpcError) -> bool:
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return any(key == metadata.MAY_RESEND for key, _ in trailing or ())


class _RequestFailure:
    """The first exception raised while producing a stream's requests (building one, or the
    caller's own input iterator). gRPC pulls requests on its own thread (blocking) or task
    (asyncio) and swallows such an exception: the blocking call ends UNKNOWN "Exception
    iterating requests!", the asyncio call is cancelled and its reader gets a bare
    CancelledError. So the producer keeps it here and cancels the call, and the reader raises
    it in the caller's place, as the HTTP path raises it."""

    def __init__(self) -> None:
        # The blocking call's producer thread may fail before ModelStreamInfer has returned
        # the call to cancel: whichever of ``fail`` and ``attach`` comes second cancels it.
        self._lock = threading.Lock()
        self._cancel: Callable[[], object] | None = None
        self.error: Exception | None = None

    def attach(self, cancel: Callable[[], object]) -> None:
        """``cancel``: the call's."""
        with self._lock:
            self._cancel = cancel
            failed = self.error is not None
        if failed:
            cancel()

    def fail(self, error: Exception) -> None:
        with self._lock:
            self.error = error
            cancel = self._cancel
        if cancel is not None:
            cancel()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            # ``from None``: the cancellation this caused is ours, not news to the caller
            raise self.error from None


class GrpcTransport:
    def __init__(self, address: str, options: ChannelOptions,
                 credentials: Credentials | None) -> None:
        self._channel = sync_channel(address, options.grpc_options(), credentials)
        self._metadata = credentials.metadata if credentials is not None else None
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)

    def _unary(self, method: Any, request: Any, timeout_s: float | None) -> Any:
        try:
            return method(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise _error(exc) from exc

    def prepare(self, model: str, inputs: Inputs, outputs: Sequence[str] | None,
                request_id: str | None, priority: int | None,
                timeout_s: float | None) -> pb.ModelInferRequest:
        return codec.build_request(model, inputs, outputs, request_id, priority=priority)

    def infer(self, model: str, request: pb.ModelInferRequest,
              timeout_s: float | None) -> dict[str, np.ndarray]:
        return codec.parse_response(self._unary(self._stub.ModelInfer, request, timeout_s))

    def server_live(self, timeout_s: float | None) -> bool:
        return bool(self._unary(self._stub.ServerLive, pb.ServerLiveRequest(), timeout_s).live)

    def server_ready(self, timeout_s: float | None) -> bool:
        return bool(self._unary(self._stub.ServerReady, pb.ServerReadyRequest(),
                                timeout_s).ready)

    def model_ready(self, name: str, timeout_s: float | None) -> bool:
        return bool(self._unary(self._stub.ModelReady, pb.ModelReadyRequest(name=name),
                                timeout_s).ready)

    def model_metadata(self, name: str, timeout_s: float | None) -> ModelMetadata:
        return codec.parse_metadata(self._unary(self._stub.ModelMetadata,
                                                pb.ModelMetadataRequest(name=name), timeout_s))

    def stream_infer(self, model: str, inputs: Iterable[Inputs], outputs: Sequence[str] | None,
                     timeout_s: float | None) -> Iterator[StreamResult]:
        failure = _RequestFailure()

        def requests() -> Iterator[pb.ModelInferRequest]:
            try:
                for i, item in enumerate(inputs):
                    yield codec.build_request(model, item, outputs, str(i))
            except Exception as exc:
                failure.fail(exc)  # then end the requests: the call is (or will be) cancelled

        call = self._stub.ModelStreamInfer(requests(), timeout=timeout_s,
                                           metadata=self._metadata)
        failure.attach(call.cancel)
        try:
            for response in call:
                yield codec.parse_stream_response(response)
        except grpc.RpcError as exc:
            failure.raise_if_failed()
            raise _error(exc) from exc
        finally:
            call.cancel()
        # Failing before ``attach`` ended the requests (a half-close) before the cancel, so the
        # server may have ended the stream cleanly.
        failure.raise_if_failed()

    def close(self) -> None:
        self._channel.close()


class AsyncGrpcTransport:
    def __init__(self, address: str, options: ChannelOptions,
                 credentials: Credentials | None) -> None:
        self._channel = aio_channel(address, options.grpc_options(), credentials)
        self._metadata = credentials.metadata if credentials is not None else None
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)

    async def _unary(self, method: Any, request: Any, timeout_s: float | None) -> Any:
        try:
            return await method(request, timeout=timeout_s, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise _error(exc) from exc

    def prepare(self, model: str, inputs: Inputs, outputs: Sequence[str] | None,
                request_id: str | None, priority: int | None,
                timeout_s: float | None) -> pb.ModelInferRequest:
        return codec.build_request(model, inputs, outputs, request_id, priority=priority)

    async def infer(self, model: str, request: pb.ModelInferRequest,
                    timeout_s: float | None) -> dict[str, np.ndarray]:
        return codec.parse_response(await self._unary(self._stub.ModelInfer, request,
                                                      timeout_s))

    async def server_live(self, timeout_s: float | None) -> bool:
        return bool((await self._unary(self._stub.ServerLive, pb.ServerLiveRequest(),
                                       timeout_s)).live)

    async def server_ready(self, timeout_s: float | None) -> bool:
        return bool((await self._unary(self._stub.ServerReady, pb.ServerReadyRequest(),
                                       timeout_s)).ready)

    async def model_ready(self, name: str, timeout_s: float | None) -> bool:
        return bool((await self._unary(self._stub.ModelReady, pb.ModelReadyRequest(name=name),
                                       timeout_s)).ready)

    async def model_metadata(self, name: str, timeout_s: float | None) -> ModelMetadata:
        return codec.parse_metadata(await self._unary(
            self._stub.ModelMetadata, pb.ModelMetadataRequest(name=name), timeout_s))

    async def stream_infer(self, model: str, inputs: AsyncIterable[Inputs] | Iterable[Inputs],
                           outputs: Sequence[str] | None,
                           timeout_s: float | None) -> AsyncIterator[StreamResult]:
        """One ModelStreamInfer stream; answers as they come (request ``i`` has id
        ``str(i)``)."""

        failure = _RequestFailure()

        async def requests() -> AsyncIterator[pb.ModelInferRequest]:
            index = 0
            try:
                async for item in each_input(inputs):
                    yield codec.build_request(model, item, outputs, str(index))
                    index += 1
            except Exception as exc:
                failure.fail(exc)  # cancels the call, and with it gRPC's task running this

        call = self._stub.ModelStreamInfer(requests(), timeout=timeout_s,
                                            metadata=self._metadata)
        failure.attach(call.cancel)
        try:
            async for response in call:
                yield codec.parse_stream_response(response)
        except grpc.aio.AioRpcError as exc:
            failure.raise_if_failed()
            raise _error(exc) from exc
        except asyncio.CancelledError:
            # A call we cancelled raises a bare CancelledError from its read: raise what made
            # us cancel it instead, unless the caller's task is itself being cancelled.
            if not _being_cancelled():
                failure.raise_if_failed()
            raise
        finally:
            call.cancel()
        failure.raise_if_failed()

    async def close(self) -> None:
        await self._channel.close()


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
