"""The KServe v2 gRPC servicer of the process that holds the models: the edge's inference
calls plus model metadata, configuration, statistics and model control."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from evenflow.balancer import EvenflowError, InvalidRequest
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.server.edge.model_names import MODEL_VERSION
from evenflow.server.edge.servicer import EdgeServicer
from evenflow.server.edge.status import answers_errors
from evenflow.server.engine.model_config import model_config, model_metadata, model_statistics
from evenflow.server.engine.model_control import (
    ModelManager,
    ModelState,
    source_from_load_parameters,
)
from evenflow.server.engine.served import ModelTable


class InferenceServicer(EdgeServicer):
    def __init__(self, *, models: ModelTable, manager: ModelManager, server_name: str,
                 server_version: str, max_tensor_elements: int,
                 on_failure: Callable[[str, str], None]) -> None:
        super().__init__(models=models, server_name=server_name, server_version=server_version,
                         max_tensor_elements=max_tensor_elements, on_failure=on_failure)
        self._table = models
        self._manager = manager

    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: grpc.aio.ServicerContext) -> pb.ModelReadyResponse:
        try:
            self._table.get(request.name, request.version)
        except EvenflowError:
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.ready)

    @answers_errors
    async def ModelMetadata(self, request: pb.ModelMetadataRequest,
                            context: grpc.aio.ServicerContext) -> pb.ModelMetadataResponse:
        model = self._table.get(request.name, request.version)
        return model_metadata(model)

    @answers_errors
    async def ModelConfig(self, request: pb.ModelConfigRequest,
                          context: grpc.aio.ServicerContext) -> pb.ModelConfigResponse:
        model = self._table.get(request.name, request.version)
        return pb.ModelConfigResponse(config=model_config(model))

    @answers_errors
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest,
                              context: grpc.aio.ServicerContext) -> pb.ModelStatisticsResponse:
        if request.name:
            models = [self._table.get(request.name, request.version)]
        else:
            models = list(self._table)
        return pb.ModelStatisticsResponse(model_stats=[model_statistics(m) for m in models])

    @answers_errors
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest,
                              context: grpc.aio.ServicerContext) -> pb.RepositoryIndexResponse:
        """Every model the configuration names (and any loaded since), with its state;
        ``ready`` lists only those that serve."""
        index = pb.RepositoryIndexResponse.ModelIndex
        return pb.RepositoryIndexResponse(models=[
            index(name=name, version=MODEL_VERSION, state=entry.state.value, reason=entry.reason)
            for name, entry in self._manager.index()
            if not request.ready or entry.state is ModelState.READY])

    @answers_errors
    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest,
                                  context: grpc.aio.ServicerContext
                                  ) -> pb.RepositoryModelLoadResponse:
        """Load (or reload) a configured model. The ``config`` parameter, a JSON object, may
        name another ``source`` where the server allows any source."""
        source = source_from_load_parameters(request.parameters)
        try:
            await self._manager.load(request.model_name, source)
        except (ValueError, TypeError, OSError, ImportError) as exc:
            raise InvalidRequest(f"loading model {request.model_name!r} failed: {exc}") from exc
        return pb.RepositoryModelLoadResponse()

    @answers_errors
    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest,
                                    context: grpc.aio.ServicerContext
                                    ) -> pb.RepositoryModelUnloadResponse:
        """Stop routing to the model, let its admitted requests finish, then close it."""
        await self._manager.unload(request.model_name)
        return pb.RepositoryModelUnloadResponse()
