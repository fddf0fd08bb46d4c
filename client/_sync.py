"""``Client``: the blocking KServe v2 client."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc
import numpy as np

from evenflow.client import _codec as codec
from evenflow.client.credentials import Credentials, sync_channel
from evenflow.client.errors import from_rpc_error
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

T = TypeVar("T")


class Client:
    """Blocking client for any KServe v2 gRPC server; the same calls as ``AsyncClient``.

    Example::

        with Client("127.0.0.1:8001") as client:
            y = client.infer("mlp", {"x": np.ones((1, 256), np.float32)})["y"]
    """

    def __init__(self, url: str, *, options: codec.ChannelOptions | None = None, retries: int = 2,
                 retry_backoff_s: float = 0.05,
                 credentials: Credentials | None = None) -> None:
        self._channel = sync_channel(url, (options or codec.ChannelOptions()).grpc_options(),
                                     credentials)
        self._metadata = credentials.metadata if credentials is not None else None
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._retries = retries
        self._retry_backoff_s = retry_backoff_s

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., T], request: Any, timeout_s: float | None) -> T:
        delay_s = self._retry_backoff_s
        for attempt in range(self._retries + 1):
            try:
                return method(request, timeout=timeout_s, metadata=self._metadata)
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == self._retries:
                    raise from_rpc_error(exc) from exc
            time.sleep(delay_s)
            delay_s *= 2
        raise AssertionError("unreachable")

    def server_live(self, *, timeout_s: float | None = None) -> bool:
        return self._call(self._stub.ServerLive, pb.ServerLiveRequest(), timeout_s).live

    def server_ready(self, *, timeout_s: float | None = None) -> bool:
        return self._call(self._stub.ServerReady, pb.ServerReadyRequest(), timeout_s).ready

    def model_ready(self, name: str, *, timeout_s: float | None = None) -> bool:
        return self._call(self._stub.ModelReady, pb.ModelReadyRequest(name=name),
                          timeout_s).ready

    def model_metadata(self, name: str, *, timeout_s: float | None = None) -> codec.ModelMetadata:
        return codec.parse_metadata(self._call(self._stub.ModelMetadata,
                                         pb.ModelMetadataRequest(name=name), timeout_s))

    def infer(self, model: str, inputs: codec.Inputs, *, outputs: Sequence[str] | None = None,
              timeout_s: float | None = None, request_id: str | None = None,
              priority: int | None = None) -> dict[str, np.ndarray]:
        request = codec.build_request(model, inputs, outputs, request_id, priority=priority)
        return codec.parse_response(self._call(self._stub.ModelInfer, request, timeout_s))

    def stream_infer(self, model: str, inputs: Iterable[codec.Inputs], *,
                     outputs: Sequence[str] | None = None,
                     timeout_s: float | None = None) -> Iterator[codec.StreamResult]:
        """One ModelStreamInfer stream; request ``i`` gets id ``str(i)``."""
        requests = (codec.build_request(model, item, outputs, str(i))
                    for i, item in enumerate(inputs))
        call = self._stub.ModelStreamInfer(requests, timeout=timeout_s,
                                            metadata=self._metadata)
        try:
            for response in call:
                yield codec.parse_stream_response(response)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from exc
        finally:
            call.cancel()
