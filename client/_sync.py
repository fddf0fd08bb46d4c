"""``Client``: the blocking KServe v2 client."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from functools import partial
from types import TracebackType
from typing import Any

import numpy as np

from evenflow.client._endpoint import Protocol, open_transport
from evenflow.client._grpc import GrpcTransport
from evenflow.client._http import HttpTransport
from evenflow.client._retry import Retries, marked_not_run
from evenflow.client._transport import Transport
from evenflow.client._types import ChannelOptions, Inputs, ModelMetadata, StreamResult
from evenflow.client.credentials import Credentials


class Client:
    """Blocking client for any KServe v2 server (evenflow, Triton, MLServer), over gRPC
    (``HOST:PORT``, the default) or HTTP/REST (an ``http://`` or ``https://`` URL, or
    ``protocol="http"``); the same calls, answers, errors, deadlines and retries over both, as
    ``AsyncClient``.

    Example::

        with Client("127.0.0.1:8001") as client:             # or "http://127.0.0.1:8000"
            y = client.infer("mlp", {"x": np.ones((1, 256), np.float32)})["y"]
    """

    def __init__(self, url: str, *, protocol: Protocol | None = None,
                 options: ChannelOptions | None = None, retries: int = 2,
                 retry_backoff_s: float = 0.05,
                 credentials: Credentials | None = None) -> None:
        self.protocol: Protocol
        self._transport: Transport[Any]
        self.protocol, self._transport = open_transport(
            url, protocol, credentials, options, HttpTransport, GrpcTransport)
        self._retries = Retries(retries, retry_backoff_s)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._transport.close()

    def server_live(self, *, timeout_s: float | None = None) -> bool:
        return self._retries.call(self._transport.server_live, timeout_s)

    def server_ready(self, *, timeout_s: float | None = None) -> bool:
        return self._retries.call(self._transport.server_ready, timeout_s)

    def model_ready(self, name: str, *, timeout_s: float | None = None) -> bool:
        return self._retries.call(partial(self._transport.model_ready, name), timeout_s)

    def model_metadata(self, name: str, *, timeout_s: float | None = None) -> ModelMetadata:
        return self._retries.call(partial(self._transport.model_metadata, name), timeout_s)

    def infer(self, model: str, inputs: Inputs, *, outputs: Sequence[str] | None = None,
              timeout_s: float | None = None, request_id: str | None = None,
              priority: int | None = None) -> dict[str, np.ndarray]:
        """Output name -> array (read-only views of the answer's bytes; BYTES outputs as
        object arrays of bytes). ``timeout_s`` bounds the call, retries included, and is the
        server's deadline too."""
        # Every attempt sends the same id (the transports would draw a fresh one each time).
        request_id = uuid.uuid4().hex if request_id is None else request_id

        def attempt(left_s: float | None) -> dict[str, np.ndarray]:
            # Prepared per attempt: over HTTP the body carries the server's deadline, which
            # for a retry is the time left.
            request = self._transport.prepare(model, inputs, outputs, request_id, priority,
                                              left_s)
            return self._transport.infer(model, request, left_s)

        return self._retries.call(attempt, timeout_s, marked_not_run)

    def stream_infer(self, model: str, inputs: Iterable[Inputs], *,
                     outputs: Sequence[str] | None = None,
                     timeout_s: float | None = None) -> Iterator[StreamResult]:
        """Every input set, answers yielded as they finish; request ``i`` gets id ``str(i)``
        and a failed one is a ``StreamResult`` with its error (the stream goes on).
        ``timeout_s`` bounds the whole stream. gRPC: one ModelStreamInfer stream. HTTP (no
        streams in HTTP/1.1): concurrent requests, up to ``max_connections`` at once, over
        the client's pool, with the same answers in the same way."""
        return self._transport.stream_infer(model, inputs, outputs, timeout_s)
