"""``AsyncClient``: the asyncio KServe v2 client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
import numpy as np

from evenflow.client import _codec as codec
from evenflow.client.credentials import Credentials, aio_channel
from evenflow.client.errors import from_rpc_error
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

T = TypeVar("T")


class AsyncClient:
    """Asyncio client for any KServe v2 gRPC server (evenflow, Triton, MLServer).

    Example::

        async with AsyncClient("127.0.0.1:8001") as client:
            outputs = await client.infer("mlp", {"x": np.ones((8, 256), np.float32)},
                                         timeout_s=1.0)
            y = outputs["y"]

    ``timeout_s`` becomes the call's gRPC deadline. Calls that fail with UNAVAILABLE are retried
    ``retries`` times with exponential backoff from ``retry_backoff_s``; every other failure raises
    an ``InferenceServerError`` subclass at once.
    """

    def __init__(self, url: str, *, options: codec.ChannelOptions | None = None, retries: int = 2,
                 retry_backoff_s: float = 0.05,
                 credentials: Credentials | None = None) -> None:
        self._channel = aio_channel(url, (options or codec.ChannelOptions()).grpc_options(),
                                    credentials)
        self._metadata = credentials.metadata if credentials is not None else None
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._retries = retries
        self._retry_backoff_s = retry_backoff_s

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any,
                    timeout_s: float | None) -> T:
        delay_s = self._retry_backoff_s
        for attempt in range(self._retries + 1):
            try:
                return await method(request, timeout=timeout_s, metadata=self._metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == self._retries:
                    raise from_rpc_error(exc) from exc
            await asyncio.sleep(delay_s)
            delay_s *= 2
        raise AssertionError("unreachable")

    async def server_live(self, *, timeout_s: float | None = None) -> bool:
        response = await self._call(self._stub.ServerLive, pb.ServerLiveRequest(), timeout_s)
        return response.live

    async def server_ready(self, *, timeout_s: float | None = None) -> bool:
        response = await self._call(self._stub.ServerReady, pb.ServerReadyRequest(), timeout_s)
        return response.ready

    async def model_ready(self, name: str, *, timeout_s: float | None = None) -> bool:
        response = await self._call(self._stub.ModelReady, pb.ModelReadyRequest(name=name),
                                    timeout_s)
        return response.ready

    async def model_metadata(self, name: str, *,
                             timeout_s: float | None = None) -> codec.ModelMetadata:
        response = await self._call(self._stub.ModelMetadata, pb.ModelMetadataRequest(name=name),
                                    timeout_s)
        return codec.parse_metadata(response)

    async def infer(self, model: str, inputs: codec.Inputs, *, outputs: Sequence[str] | None = None,
                    timeout_s: float | None = None, request_id: str | None = None,
                    priority: int | None = None) -> dict[str, np.ndarray]:
        request = codec.build_request(model, inputs, outputs, request_id, priority=priority)
        return codec.parse_response(await self._call(self._stub.ModelInfer, request, timeout_s))

    async def stream_infer(self, model: str,
                           inputs: AsyncIterable[codec.Inputs] | Iterable[codec.Inputs], *,
                           outputs: Sequence[str] | None = None,
                           timeout_s: float | None = None) -> AsyncIterator[codec.StreamResult]:
        """Send every input set over one ModelStreamInfer stream; yield answers as they come
        (match them by ``request_id``: request ``i`` gets id ``str(i)``)."""

        async def requests() -> AsyncIterator[pb.ModelInferRequest]:
            index = 0
            if isinstance(inputs, AsyncIterable):
                async for item in inputs:
                    yield codec.build_request(model, item, outputs, str(index))
                    index += 1
            else:
                for item in inputs:
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
