"""The edge of the KServe v2 gRPC service: inference calls decoded and validated against the
model's tensor specs, handed to the model, and answered. It runs where the gRPC port is: in the
single server process, or in each front-end process (``--frontends N``), where the models it
hands requests to are the engine's, reached over ZeroMQ. Imports neither torch nor the models."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
import numpy as np

from evenflow.balancer import (
    ErrorCode,
    EvenflowError,
    InvalidRequest,
    ModelNotFound,
    ShuttingDown,
)
from evenflow.balancer.stats import CpuParts
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.edge import codec, shapes
from evenflow.server.edge.decoding import Undecodable
from evenflow.server.edge.status import (
    abort,
    abort_with,
    internal_error,
    status_of,
    stream_error_message,
)
from evenflow.server.models.spec import Padding, TensorSpec
from evenflow.server.observability import cpu_accounting

logger = logging.getLogger(__name__)

# Only what is implemented: statistics makes perf_analyzer read the server-side breakdown.
EXTENSIONS = ("model_configuration", "model_repository", "statistics", "binary_tensor_data")
# Requests of one stream admitted and not yet written (in flight, or answered and queued): a
# client that reads slowly holds the reader back (gRPC flow control) instead of growing a queue.
_MAX_STREAM_IN_FLIGHT = 1024
# Triton marks every response of a non-decoupled model's stream as its request's last one;
# clients that serve decoupled models too (tritonclient, genai-perf) look for it.
_FINAL_RESPONSE = "triton_final_response"


class TensorSpecs(Protocol):
    """What the edge needs of a model's definition."""

    @property
    def inputs(self) -> Sequence[TensorSpec]: ...

    @property
    def outputs(self) -> Sequence[TensorSpec]: ...

    @property
    def padding(self) -> Padding | None: ...

    @property
    def variable_shapes(self) -> bool: ...


class InferTarget(Protocol):
    """A model as the edge sees it: its tensor specs, and where its requests go."""

    @property
    def definition(self) -> TensorSpecs: ...

    @property
    def cpu_parts(self) -> CpuParts | None: ...

    def submit(self, payload: Any, num_samples: int, deadline_s: float, priority: int,
               shape_key: Hashable = None) -> Awaitable[Any]: ...


class ModelDirectory(Protocol):
    def get(self, name: str, version: str = "") -> InferTarget: ...

    def __contains__(self, name: str) -> bool: ...


class EdgeServicer(pb_grpc.GRPCInferenceServiceServicer):
    """ModelInfer, ModelStreamInfer and the server-level calls. ``on_failure`` hears each failed
    request's (model, status name): where it is counted for the whole server's metrics (here,
    or in the engine for a front-end process)."""

    def __init__(self, *, models: ModelDirectory, server_name: str, server_version: str,
                 max_tensor_elements: int, on_failure: Callable[[str, str], None]) -> None:
        self._models = models
        self._max_elements = max_tensor_elements
        self._on_failure = on_failure
        self._metadata = pb.ServerMetadataResponse(name=server_name, version=server_version,
                                                   extensions=EXTENSIONS)
        self.ready = False
        self.draining = False  # shutting down: new inference calls hear UNAVAILABLE
        self._open_calls = 0  # taken before the drain, status not yet sent
        self._all_sent = asyncio.Event()
        self._all_sent.set()
        self._streams: set[_InferStream] = set()

    @property
    def metadata(self) -> pb.ServerMetadataResponse:
        return self._metadata

    @property
    def serving(self) -> bool:
        """What ServerReady answers (and the HTTP ``/v2/health/ready``)."""
        return self.ready

    def drain(self) -> None:
        """Shutting down: new inference calls, and new requests on open streams, hear
        UNAVAILABLE; what was admitted is still answered, and each open stream ends with
        UNAVAILABLE once its admitted requests have their responses."""
        self.ready, self.draining = False, True
        for stream in self._streams:
            stream.drain()

    def track(self, context: grpc.aio.ServicerContext) -> None:
        """Count the call until gRPC has sent its status (``answered`` waits for that)."""
        self._open_calls += 1
        self._all_sent.clear()
        context.add_done_callback(self._call_done)

    def _call_done(self, _context: grpc.aio.ServicerContext | None) -> None:
        self._open_calls -= 1
        if self._open_calls == 0:
            self._all_sent.set()

    async def answered(self, timeout_s: float) -> int:
        """Wait (up to ``timeout_s``) until every call taken before the drain has had its status
        sent; returns how many have not."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_sent.wait(), timeout_s)
        return self._open_calls

    async def _infer(self, request: pb.ModelInferRequest | Undecodable,
                     deadline_s: float) -> pb.ModelInferResponse:
        checked = self._checked(request)
        model = self._local_model(checked)
        if model is None:
            model = await self._missing_model(checked.model_name, checked.model_version)
        pending = self._admit(checked, model, deadline_s)
        return pending.respond(await pending.answer)

    def _checked(self, request: pb.ModelInferRequest | Undecodable) -> pb.ModelInferRequest:
        if self.draining:
            raise _shutting_down()
        if isinstance(request, Undecodable):
            raise InvalidRequest(request.reason)
        return request

    def _local_model(self, request: pb.ModelInferRequest) -> InferTarget | None:
        try:
            return self._models.get(request.model_name, request.model_version)
        except ModelNotFound:
            return None

    def _admit(self, request: pb.ModelInferRequest, model: InferTarget,
               deadline_s: float) -> _Pending:
        """Decode and validate ``request`` against ``model`` and hand it over; what comes back
        is the answer to wait for and how to encode it."""
        specs = model.definition
        priority = 0
        if request.parameters:
            priority, timeout_s = codec.read_parameters(request)
            if timeout_s is not None:
                deadline_s = min(deadline_s, time.monotonic() + timeout_s)
        # With EVENFLOW_CPU_PARTS=1, this thread's CPU time in decode, routing and encode.
        cpu = model.cpu_parts
        clock = time.thread_time if cpu is not None else cpu_accounting.no_clock
        started_s = clock()
        arrays, num_samples = codec.decode_inputs(request, specs.inputs, self._max_elements)
        chosen = codec.requested_outputs(request, specs.outputs)
        answer, lengths = submit_arrays(model, arrays, num_samples, deadline_s, priority,
                                        started_s, clock)
        return _Pending(answer, request, specs.outputs, chosen, lengths, cpu)

    async def model(self, name: str, version: str) -> InferTarget:
        """The model ``name`` serves requests to (ModelNotFound when there is none), for an
        edge of another protocol (HTTP) that decodes requests itself."""
        try:
            return self._models.get(name, version)
        except ModelNotFound:
            return await self._missing_model(name, version)

    def refuse_when_draining(self) -> None:
        """ShuttingDown once the server drains: a new request goes to another replica."""
        if self.draining:
            raise _shutting_down()

    @contextlib.contextmanager
    def open_request(self) -> Iterator[None]:
        """Count a request of another protocol (HTTP) until its answer is written, as
        ``track`` counts a gRPC call, so that ``answered`` waits for it too."""
        self._open_calls += 1
        self._all_sent.clear()
        try:
            yield
        finally:
            self._call_done(None)

    def count_failure(self, model_name: str, request_id: str, exc: EvenflowError) -> None:
        """A failed request, counted for the server's metrics and logged (see ``_log_failure``)."""
        # Only served names become labels: a client must not grow the metrics without bound.
        self._on_failure(model_name if model_name in self._models else "", status_of(exc).name)
        _log_failure(model_name, request_id, exc)

    async def _missing_model(self, name: str, version: str) -> InferTarget:
        """A request named a model this directory does not hold: where the directory is a
        copy (a front-end's), refresh it and look again; here, NOT_FOUND."""
        return self._models.get(name, version)

    async def ModelInfer(self, request: pb.ModelInferRequest | Undecodable,
                         context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        if not self.draining:
            self.track(context)
        try:
            return await self._infer(request, call_deadline_s(context))
        except EvenflowError as exc:
            self._count_failure(request, exc)
            await abort_with(context, exc)
        except Exception as exc:  # a server bug: INTERNAL, logged, and the server keeps serving
            internal = _internal_error(request, exc)
            self._count_failure(request, internal)
            await abort_with(context, internal)

    async def ModelStreamInfer(self,
                               request_iterator: AsyncIterator[pb.ModelInferRequest | Undecodable],
                               context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests are run concurrently; responses are written as they finish (match by id).
        A failed request yields a response with ``error_message`` and the stream goes on
        (``_InferStream``). A drain ends the stream with UNAVAILABLE once what it admitted
        is answered."""
        if self.draining:
            await abort(context, grpc.StatusCode.UNAVAILABLE, str(_shutting_down()))
        self.track(context)
        stream = _InferStream(self, call_deadline_s(context))
        self._streams.add(stream)
        reader = asyncio.create_task(stream.read(request_iterator))
        try:
            # Checked before each wait, not on the first wake-up: a refusal the reader queued
            # in the same turn of the loop as the drain is still written.
            while not (stream.ended and stream.results.empty()):
                if (item := await stream.results.get()) is not None:
                    yield item
                    # Resumed once gRPC has sent ``item`` and wants the next: only now is its
                    # slot free, so responses a slow client has not taken stay within the bound.
                    stream.written()
                elif reader.done() and not reader.cancelled() and reader.exception():
                    break  # reading failed: ``await reader`` ends the call with its error
            if not stream.requests_ended:  # drained while the client still sends
                await abort(context, grpc.StatusCode.UNAVAILABLE, str(_shutting_down()))
            await reader
        finally:
            self._streams.discard(stream)
            await stream.close(reader)

    def _stream_error(self, request: pb.ModelInferRequest | Undecodable,
                      error: Exception) -> pb.ModelStreamInferResponse:
        exc = error if isinstance(error, EvenflowError) else _internal_error(request, error)
        self._count_failure(request, exc)
        response = pb.ModelStreamInferResponse(error_message=stream_error_message(exc))
        infer_response = response.infer_response
        infer_response.model_name, infer_response.id = request.model_name, request.id
        infer_response.parameters[_FINAL_RESPONSE].bool_param = True
        return response

    def _count_failure(self, request: pb.ModelInferRequest | Undecodable,
                       exc: EvenflowError) -> None:
        self.count_failure(request.model_name, request.id, exc)

    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.serving)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        return self._metadata


def _log_failure(model_name: str, request_id: str, exc: EvenflowError) -> None:
    """A failed request, with its id: a warning when the server failed it (INTERNAL), debug
    when the request itself was at fault or refused (those can come by the thousand)."""
    level = logging.WARNING if exc.code is ErrorCode.INTERNAL else logging.DEBUG
    if logger.isEnabledFor(level):
        logger.log(level, "request failed: %s", exc, extra={
            "request_id": request_id, "model": model_name, "code": exc.code.name})


def submit_arrays(model: InferTarget, arrays: list[np.ndarray], num_samples: int,
                  deadline_s: float, priority: int, started_s: float,
                  clock: Callable[[], float]) -> tuple[Awaitable[Any], tuple[int, ...] | None]:
    """Hand decoded, validated inputs to ``model`` (padded to a shape the model batches, where
    it pads); returns the answer to wait for and the sizes to cut padded outputs back to.
    ``started_s`` on ``clock``: when decoding began, for the CPU breakdown."""
    specs = model.definition
    lengths = shape_key = None
    if specs.variable_shapes:
        if specs.padding is not None:
            arrays, lengths = shapes.pad_inputs(arrays, specs.inputs, specs.padding)
        shape_key = shapes.shape_key(arrays)
    cpu = model.cpu_parts
    decoded_s = clock()
    answer = model.submit(arrays, num_samples, deadline_s, priority, shape_key=shape_key)
    if cpu is not None:
        cpu.add("decode", decoded_s - started_s)
        cpu.add("route", clock() - decoded_s)
    return answer, lengths


def _shutting_down() -> ShuttingDown:
    return ShuttingDown("the server is shutting down; send to another replica", not_run=True)


def _internal_error(request: pb.ModelInferRequest | Undecodable,
                    error: Exception) -> EvenflowError:
    return internal_error(error, f"request {request.id!r} to model {request.model_name!r}")


class _InferStream:
    """One ModelStreamInfer call's requests in flight. Each request is decoded and handed over
    as it is read and its response built by a callback on its answer, so a stream costs no
    task per request (a model a front-end must look up first takes ``_infer`` in a task).
    ``results`` holds the responses to write; a ``None`` in it only wakes the writer to check
    ``ended``. A request takes a slot before it is started and gives it back once its response
    (or its refusal) is written (``written``), so at most ``_MAX_STREAM_IN_FLIGHT`` responses
    are ever queued: past that, reading waits for the client to take some."""

    def __init__(self, edge: EdgeServicer, deadline_s: float) -> None:
        self._edge = edge
        self._deadline_s = deadline_s
        self.results: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        self._slots = asyncio.Semaphore(_MAX_STREAM_IN_FLIGHT)  # admitted, not yet written
        self._in_flight: set[asyncio.Future[Any]] = set()  # answers not yet queued
        self._draining = False
        self.requests_ended = False  # the client half-closed (or the reader stopped)

    @property
    def ended(self) -> bool:
        """Every admitted request has its response queued, and no more will be admitted."""
        return not self._in_flight and (self.requests_ended or self._draining)

    async def read(self, requests: AsyncIterator[pb.ModelInferRequest | Undecodable]) -> None:
        """Start every request the client sends, until it half-closes."""
        try:
            async for request in requests:
                await self._slots.acquire()
                self._start(request)
        finally:
            self.requests_ended = True
            self.results.put_nowait(None)

    def written(self) -> None:
        """A response the writer took from ``results`` has been sent: its slot is free."""
        self._slots.release()

    def drain(self) -> None:
        """The server is shutting down: end the stream once every admitted request has its
        response (those read from now on are refused, see ``EdgeServicer._checked``)."""
        self._draining = True
        self.results.put_nowait(None)

    async def close(self, reader: asyncio.Task[None]) -> None:
        """Stop reading and drop the answers still awaited (the call ended or was cancelled)."""
        pending = (reader, *self._in_flight)
        for future in pending:
            future.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*pending, return_exceptions=True)

    def _start(self, request: pb.ModelInferRequest | Undecodable) -> None:
        edge = self._edge
        respond: Callable[[Any], pb.ModelInferResponse]
        try:
            checked = edge._checked(request)
            model = edge._local_model(checked)
            if model is None:
                answer = asyncio.ensure_future(edge._infer(checked, self._deadline_s))
                respond = _as_is
            else:
                pending = edge._admit(checked, model, self._deadline_s)
                answer, respond = asyncio.ensure_future(pending.answer), pending.respond
        except Exception as error:
            self.results.put_nowait(edge._stream_error(request, error))
            return
        self._in_flight.add(answer)
        answer.add_done_callback(functools.partial(self._answered, request, respond))

    def _answered(self, request: pb.ModelInferRequest | Undecodable,
                  respond: Callable[[Any], pb.ModelInferResponse],
                  answer: asyncio.Future[Any]) -> None:
        if answer.cancelled():  # the stream is being torn down
            return
        try:
            infer_response = respond(answer.result())
            # Set on the response before it is copied into the stream message: one map entry,
            # about 1 us (timeit; no cheaper with CopyFrom of a prebuilt parameter).
            infer_response.parameters[_FINAL_RESPONSE].bool_param = True
            response = pb.ModelStreamInferResponse(infer_response=infer_response)
        except Exception as error:  # every id is answered; a server bug as INTERNAL
            response = self._edge._stream_error(request, error)
        self.results.put_nowait(response)
        self._in_flight.discard(answer)
        if self.ended:
            self.results.put_nowait(None)


@dataclass(slots=True)
class _Pending:
    """An admitted request: the answer to wait for, and how to encode it once it comes."""

    answer: Awaitable[Any]
    request: pb.ModelInferRequest
    outputs: Sequence[TensorSpec]
    chosen: list[int]  # indices into ``outputs`` of those the request asked for
    lengths: tuple[int, ...] | None  # variable sizes to cut padded outputs back to
    cpu: CpuParts | None

    def respond(self, arrays: Any) -> pb.ModelInferResponse:
        if self.lengths:
            arrays = shapes.cut_outputs(arrays, self.outputs, self.lengths)
        cpu = self.cpu
        clock = time.thread_time if cpu is not None else cpu_accounting.no_clock
        encoding_s = clock()
        response = codec.encode_response(self.request, self.outputs, self.chosen, arrays)
        if cpu is not None:
            cpu.add("encode", clock() - encoding_s)
        return response


def _as_is(response: pb.ModelInferResponse) -> pb.ModelInferResponse:
    return response


def call_deadline_s(context: grpc.aio.ServicerContext) -> float:
    """The call's deadline on ``time.monotonic()`` (inf: none), as the balancer reads it."""
    remaining_s = context.time_remaining()
    return math.inf if remaining_s is None else time.monotonic() + remaining_s
