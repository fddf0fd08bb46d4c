"""The gRPC transports (blocking and asyncio): KServe v2's GRPCInferenceService, one channel
(HTTP/2, every call multiplexed) per client."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from typing import Any

import grpc
import numpy as np

from evenflow.client import _codec as codec
from evenflow.client._fanout import each_input
from evenflow.client._types import ChannelOptions, Inputs, ModelMetadata, StreamResult
from evenflow.client.credentials import Credentials, aio_channel, sync_channel
from evenflow.client.errors import from_rpc_error
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc


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
            raise from_rpc_error(exc) from exc

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
        requests = (codec.build_request(model, item, outputs, str(i))
                    for i, item in enumerate(inputs))
        call = self._stub.ModelStreamInfer(requests, timeout=timeout_s, metadata=self._metadata)
        try:
            for response in call:
                yield codec.parse_stream_response(response)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        finally:
            call.cancel()

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
            raise from_rpc_error(exc) from exc

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

        async def requests() -> AsyncIterator[pb.ModelInferRequest]:
            index = 0
            async for item in each_input(inputs):
                yield codec.build_request(model, item, outputs, str(index))
                index += 1

        call = self._stub.ModelStreamInfer(requests(), timeout=timeout_s,
                                            metadata=self._metadata)
        try:
            async for response in call:
                yield codec.parse_stream_response(response)
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from exc
        finally:
            call.cancel()

    async def close(self) -> None:
        await self._channel.close()
