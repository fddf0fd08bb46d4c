"""``AsyncClient``: the asyncio KServe v2 client."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from functools import partial
from types import TracebackType
from typing import Any

import numpy as np

from evenflow.client._endpoint import Protocol, open_transport
from evenflow.client._grpc import AsyncGrpcTransport
from evenflow.client._http_aio import AsyncHttpTransport
from evenflow.client._retry import Retries, marked_not_run
from evenflow.client._transport import AsyncTransport
from evenflow.client._types import ChannelOptions, Inputs, ModelMetadata, StreamResult
from evenflow.client.credentials import Credentials


class AsyncClient:
    """Asyncio client for any KServe v2 server (evenflow, Triton, MLServer), over gRPC
    (``HOST:PORT``, the default) or HTTP/REST (an ``http://`` or ``https://`` URL, or
    ``protocol="http"``): the same calls, answers and errors over both.

    Example::

        async with AsyncClient("127.0.0.1:8001") as client:  # or "http://127.0.0.1:8000"
            outputs = await client.infer("mlp", {"x": np.ones((8, 256), np.float32)},
                                         timeout_s=1.0)
            y = outputs["y"]

    ``timeout_s`` is the call's deadline, retries included, sent to the server too (gRPC's
    deadline; over HTTP Triton's ``timeout`` parameter): each attempt gets the time left.
    Calls that fail with UNAVAILABLE (no connection, or a server that cannot serve now) are
    retried up to ``retries`` times with exponential backoff from ``retry_backoff_s``, while
    the deadline lasts; every other failure raises an ``InferenceServerError`` subclass at
    once. An ``infer`` is retried only when the server cannot have run it: no connection was
    made, or evenflow's server marked its UNAVAILABLE ``evenflow-may-resend`` (a request that
    never reached a worker). A worker or connection lost mid-call, and another server's
    UNAVAILABLE (Triton's), are raised, not retried. Over HTTP the pool keeps
    ``options.max_connections`` connections alive; waiting for a free one counts against
    ``timeout_s``.
    """

    def __init__(self, url: str, *, protocol: Protocol | None = None,
                 options: ChannelOptions | None = None, retries: int = 2,
                 retry_backoff_s: float = 0.05,
                 credentials: Credentials | None = None) -> None:
        self.protocol: Protocol
        self._transport: AsyncTransport[Any]
        self.protocol, self._transport = open_transport(
            url, protocol, credentials, options, AsyncHttpTransport, AsyncGrpcTransport)
        self._retries = Retries(retries, retry_backoff_s)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._transport.close()

    async def server_live(self, *, timeout_s: float | None = None) -> bool:
        return await self._retries.acall(self._transport.server_live, timeout_s)

    async def server_ready(self, *, timeout_s: float | None = None) -> bool:
        return await self._retries.acall(self._transport.server_ready, timeout_s)

    async def model_ready(self, name: str, *, timeout_s: float | None = None) -> bool:
        return await self._retries.acall(partial(self._transport.model_ready, name), timeout_s)

    async def model_metadata(self, name: str, *,
                             timeout_s: float | None = None) -> ModelMetadata:
        return await self._retries.acall(partial(self._transport.model_metadata, name),
                                         timeout_s)

    async def infer(self, model: str, inputs: Inputs, *, outputs: Sequence[str] | None = None,
                    timeout_s: float | None = None, request_id: str | None = None,
                    priority: int | None = None) -> dict[str, np.ndarray]:
        """Output name -> array (read-only views of the answer's bytes; BYTES outputs as
        object arrays of bytes)."""
        # Every attempt sends the same id (the transports would draw a fresh one each time).
        request_id = uuid.uuid4().hex if request_id is None else request_id

        async def attempt(left_s: float | None) -> dict[str, np.ndarray]:
            # Prepared per attempt: over HTTP the body carries the server's deadline, which
            # for a retry is the time left.
            request = self._transport.prepare(model, inputs, outputs, request_id, priority,
                                              left_s)
            return await self._transport.infer(model, request, left_s)

        return await self._retries.acall(attempt, timeout_s, marked_not_run)

    def stream_infer(self, model: str, inputs: AsyncIterable[Inputs] | Iterable[Inputs], *,
                     outputs: Sequence[str] | None = None,
                     timeout_s: float | None = None) -> AsyncIterator[StreamResult]:
        """Every input set, answers yielded as they come; request ``i`` gets id ``str(i)``
        (match answers by ``request_id``) and a failed one is a ``StreamResult`` with its
        error (the stream goes on). ``timeout_s`` bounds the whole stream. gRPC: one
        ModelStreamInfer stream. HTTP (no streams in HTTP/1.1): concurrent requests, up to
        ``max_connections`` at once, over the client's pool, with the same answers in the
        same way."""
        return self._transport.stream_infer(model, inputs, outputs, timeout_s)
