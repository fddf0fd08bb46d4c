"""Load over HTTP/REST: the same request as the gRPC ``Target`` sends, as Triton's binary
tensor request (built once), posted over one aiohttp keep-alive pool. HTTP/1.1 carries one
request per connection at a time, so the pool is sized to the load: a closed loop's
concurrency, or unbounded for an open loop (it grows to the most requests in flight)."""

from __future__ import annotations

import aiohttp

from evenflow.client import _rest_codec as rest
from evenflow.client._http_aio import http_session
from evenflow.client._tensors import WireTensor
from evenflow.client.credentials import Credentials
from evenflow.loadtest.runner import OK
from evenflow.proto import grpc_service_pb2 as pb


def wire_tensors(request: pb.ModelInferRequest) -> list[WireTensor]:
    """A raw-content gRPC request's inputs, as the REST codec takes them."""
    if len(request.raw_input_contents) != len(request.inputs):
        raise ValueError("the request must carry every input as raw contents")
    return [WireTensor(t.name, t.datatype, tuple(t.shape), raw)
            for t, raw in zip(request.inputs, request.raw_input_contents, strict=True)]


class HttpTarget:
    """A server, a model and the request to send it, over HTTP; ``url`` is the base URL
    (``http://HOST:PORT``). ``connections``: the pool's size (0: unbounded)."""

    def __init__(self, url: str, request: pb.ModelInferRequest, *, timeout_s: float = 30.0,
                 connections: int = 0, credentials: Credentials | None = None) -> None:
        encoded = rest.encode_request(wire_tensors(request), [o.name for o in request.outputs],
                                      request.id, timeout_s=timeout_s)
        self._body, self._headers = encoded.body, encoded.headers
        self._infer_url = url + rest.infer_path(request.model_name, request.model_version)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._url, self._connections, self._credentials = url, connections, credentials
        self._session: aiohttp.ClientSession | None = None
        self.url = url
        self.timeout_s = timeout_s

    async def send(self, index: int) -> str:
        if self._session is None:  # made inside the loop that runs the load
            self._session = http_session(self._url, self._connections, self._credentials)
        try:
            async with self._session.post(self._infer_url, data=self._body,
                                          headers=self._headers,
                                          timeout=self._timeout) as response:
                body = await response.read()
                if response.status == 200:
                    return OK
                return rest.error_of(response.status, body, response.reason or "",
                                     response.headers.get(rest.STATUS_HEADER)).code.name
        except TimeoutError:
            return "DEADLINE_EXCEEDED"
        except aiohttp.ClientError:
            return "UNAVAILABLE"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
