"""The KServe v2 gRPC servicer: converts protos at the edge and delegates to the balancers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping

import grpc

from evenflow.balancer import ErrorCode, EvenflowError, InvalidRequest
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server import codec
from evenflow.server.model_config import model_config, model_metadata, model_statistics
from evenflow.server.model_control import ModelControlError, ModelManager
from evenflow.server.served import MODEL_VERSION, ModelTable, ServedModel

logger = logging.getLogger(__name__)

STATUS_OF: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
}

# Only what is implemented: statistics makes perf_analyzer read the server-side breakdown.
EXTENSIONS = ("model_configuration", "model_repository", "statistics", "binary_tensor_data")
_MAX_STREAM_IN_FLIGHT = 1024


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, *, models: ModelTable, manager: ModelManager, server_name: str,
                 server_version: str) -> None:
        self._models = models
        self._manager = manager
        # (model, status code) -> requests answered with that error; counted on failure only.
        self.failures: Counter[tuple[str, str]] = Counter()
        self._metadata = pb.ServerMetadataResponse(name=server_name, version=server_version,
                                                   extensions=EXTENSIONS)
        self.ready = False

    async def _infer(self, request: pb.ModelInferRequest,
                     deadline_s: float) -> pb.ModelInferResponse:
        model = self._models.get(request.model_name, request.model_version)
        specs = model.definition
        arrays, num_samples = codec.decode_inputs(request, specs.inputs)
        chosen = codec.requested_outputs(request, specs.outputs)
        priority = _priority(request) if request.parameters else 0
        outputs = await model.balancer.submit(arrays, num_samples, deadline_s, priority)
        return codec.encode_response(request, specs.outputs, chosen, outputs)

    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        try:
            return await self._infer(request, _deadline_s(context))
        except EvenflowError as exc:
            self._count_failure(request, exc)
            await context.abort(STATUS_OF[exc.code], str(exc))
            raise  # unreachable: abort raises

    async def ModelStreamInfer(self, request_iterator: AsyncIterator[pb.ModelInferRequest],
                               context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Requests are run concurrently; responses are written as they finish (match by id).
        A failed request yields a response with ``error_message`` and the stream goes on."""
        deadline_s = _deadline_s(context)
        results: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        slots = asyncio.Semaphore(_MAX_STREAM_IN_FLIGHT)
        tasks: set[asyncio.Task[None]] = set()

        async def one(request: pb.ModelInferRequest) -> None:
            try:
                response = pb.ModelStreamInferResponse(
                    infer_response=await self._infer(request, deadline_s))
            except EvenflowError as exc:
                self._count_failure(request, exc)
                response = pb.ModelStreamInferResponse(
                    error_message=f"{exc.code.name}: {exc}",
                    infer_response=pb.ModelInferResponse(model_name=request.model_name,
                                                         id=request.id))
            finally:
                slots.release()
            results.put_nowait(response)

        async def read() -> None:
            try:
                async for request in request_iterator:
                    await slots.acquire()
                    task = asyncio.create_task(one(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if tasks:
                    await asyncio.gather(*tasks)
            finally:
                results.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await results.get()) is not None:
                yield item
            await reader
        finally:
            for task in (reader, *tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(reader, *tasks, return_exceptions=True)

    def _count_failure(self, request: pb.ModelInferRequest, exc: EvenflowError) -> None:
        # Only served names become labels: a client must not grow the metrics without bound.
        model = request.model_name if request.model_name in self._models else ""
        self.failures[model, STATUS_OF[exc.code].name] += 1
        _log_failure(request, exc)

    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: grpc.aio.ServicerContext) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: grpc.aio.ServicerContext) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.ready)

    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        try:
            self._models.get(request.name, request.version)
        except EvenflowError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest,
                             context: grpc.aio.ServicerContext) -> pb.ServerMetadataResponse:
        return self._metadata

    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        model = await self._lookup(request.name, request.version, context)
        return model_metadata(model)

    async def ModelConfig(self, request: pb.ModelConfigRequest,
                          context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
        model = await self._lookup(request.name, request.version, context)
        return pb.ModelConfigResponse(config=model_config(model))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: grpc.aio.ServicerContext) -> pb.ModelStatisticsResponse:
        if request.name:
            models = [await self._lookup(request.name, request.version, context)]
        else:
            models = list(self._models)
        return pb.ModelStatisticsResponse(model_stats=[model_statistics(m) for m in models])

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        """Every model the configuration names (and any loaded since), with its state;
        ``ready`` lists only those that serve."""
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[
            index(name=name, version=MODEL_VERSION, state=entry.state.value, reason=entry.reason)
            for name, entry in self._manager.index()
            if not request.ready or entry.state.value == "READY"])

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: grpc.aio.ServicerContext
                                  ) -> pb.RepositoryModelLoadResponse:
        """Load (or reload) a configured model. The ``config`` parameter, a JSON object, may
        name another ``source`` where the server allows any source."""
        try:
            source = _source_from_parameters(request.parameters)
            await self._manager.load(request.model_name, source)
        except EvenflowError as exc:
            await context.abort(STATUS_OF[exc.code], str(exc))
        except (ValueError, TypeError, OSError, ImportError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"loading model {request.model_name!r} failed: {exc}")
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: grpc.aio.ServicerContext
                                    ) -> pb.RepositoryModelUnloadResponse:
        """Stop routing to the model, let its admitted requests finish, then close it."""
        try:
            await self._manager.unload(request.model_name)
        except EvenflowError as exc:
            await context.abort(STATUS_OF[exc.code], str(exc))
        return pb.RepositoryModelUnloadResponse()

    async def _lookup(self, name: str, version: str,
                      context: grpc.aio.ServicerContext) -> ServedModel:
        try:
            return self._models.get(name, version)
        except EvenflowError as exc:
            await context.abort(STATUS_OF[exc.code], str(exc))
            raise


def _priority(request: pb.ModelInferRequest) -> int:
    """Triton's ``priority`` request parameter (an integer; 0 or absent: the default level)."""
    if "priority" not in request.parameters:
        return 0
    parameter = request.parameters["priority"]
    kind = parameter.WhichOneof("parameter_choice")
    if kind not in ("int64_param", "uint64_param"):
        raise InvalidRequest(f"parameter 'priority' must be an integer, not {kind}")
    value = int(getattr(parameter, kind))
    if value < 0:
        raise InvalidRequest(f"parameter 'priority' must be >= 0, not {value}")
    return value


def _log_failure(request: pb.ModelInferRequest, exc: EvenflowError) -> None:
    """A failed request, with its id: a warning when the server failed it (INTERNAL), debug
    when the request itself was at fault or refused (those can come by the thousand)."""
    level = logging.WARNING if exc.code is ErrorCode.INTERNAL else logging.DEBUG
    if logger.isEnabledFor(level):
        logger.log(level, "request failed: %s", exc, extra={
            "request_id": request.id, "model": request.model_name, "code": exc.code.name})


def _source_from_parameters(parameters: Mapping[str, pb.ModelRepositoryParameter]) -> str | None:
    unknown = sorted(set(parameters) - {"config"})
    if unknown:
        raise ModelControlError(f"unsupported load parameters {unknown}: evenflow loads model "
                                "sources by name or path, not uploaded files",
                                ErrorCode.INVALID_ARGUMENT)
    if "config" not in parameters:
        return None
    try:
        config = json.loads(parameters["config"].string_param)
    except json.JSONDecodeError as exc:
        raise ModelControlError(f"load parameter 'config' is not JSON: {exc}",
                                ErrorCode.INVALID_ARGUMENT) from exc
    if not isinstance(config, dict) or set(config) - {"source"} or \
            not isinstance(config.get("source", ""), str):
        raise ModelControlError("load parameter 'config' must be a JSON object with at most a "
                                "string 'source'", ErrorCode.INVALID_ARGUMENT)
    return config.get("source")


def _deadline_s(context: grpc.aio.ServicerContext) -> float:
    remaining_s = context.time_remaining()
    return math.inf if remaining_s is None else time.monotonic() + remaining_s
