"""The asyncio HTTP/REST transport: aiohttp, one keep-alive pool per client
(``max_connections`` connections; requests beyond them wait for a free one). The session is
made on the first call, inside the event loop that will run it."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from urllib.parse import urlsplit

import aiohttp
import grpc
import numpy as np

from evenflow.client import _rest_codec as rest
from evenflow.client._fanout import fan_out_async
from evenflow.client._http_answer import Answer, health, too_large
from evenflow.client._retry import not_run
from evenflow.client._types import ChannelOptions, Inputs, ModelMetadata, StreamResult
from evenflow.client.credentials import Credentials
from evenflow.client.errors import error_for
from evenflow.proto import metadata


def http_session(base_url: str, max_connections: int,
                 credentials: Credentials | None) -> aiohttp.ClientSession:
    """A keep-alive pool of ``max_connections`` (0: no bound) to one server. It asks for no
    compression: binary tensors do not shrink enough to pay for it."""
    secure = credentials is not None and credentials.secure
    connector = aiohttp.TCPConnector(
        limit=max_connections, limit_per_host=0,
        ssl=credentials.ssl_context() if credentials is not None and secure else True)
    return aiohttp.ClientSession(
        connector=connector, headers=credentials.headers if credentials is not None else None,
        skip_auto_headers=("Accept-Encoding", "User-Agent"), timeout=aiohttp.ClientTimeout())


class AsyncHttpTransport:
    def __init__(self, base_url: str, options: ChannelOptions,
                 credentials: Credentials | None) -> None:
        self._base_url = base_url
        self._credentials = credentials
        self._max_bytes = options.max_message_bytes
        self._window = options.max_connections
        self._session: aiohttp.ClientSession | None = None
        if not urlsplit(base_url).hostname:
            raise ValueError(f"{base_url!r} has no host")

    def _pool(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = http_session(self._base_url, self._window, self._credentials)
        return self._session

    async def _request(self, method: str, path: str, timeout_s: float | None,
                       body: bytes | None = None, headers: dict[str, str] | None = None
                       ) -> Answer:
        try:
            async with self._pool().request(
                    method, self._base_url + path, data=body, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                    allow_redirects=False) as response:
                size = response.content_length
                if size is not None and size > self._max_bytes:
                    raise too_large(size, self._max_bytes)
                data = await response.read()
                return Answer(response.status, data, response.headers.get(rest.HEADER_LENGTH),
                              response.reason or "", response.headers.get(rest.STATUS_HEADER),
                      metadata.MAY_RESEND in response.headers)
        except TimeoutError as exc:  # aiohttp's total covers the wait for a free connection
            raise error_for(grpc.StatusCode.DEADLINE_EXCEEDED,
                            f"no answer from {self._base_url} within {timeout_s} s") from exc
        except aiohttp.ClientConnectorError as exc:
            # No connection was made, so nothing was sent: safe to send again (``_retry``).
            raise not_run(error_for(grpc.StatusCode.UNAVAILABLE,
                                   f"cannot reach {self._base_url}: {exc}")) from exc
        except aiohttp.ClientError as exc:  # may come after the server read the request
            raise error_for(grpc.StatusCode.UNAVAILABLE,
                            f"cannot reach {self._base_url}: {exc}") from exc

    def prepare(self, model: str, inputs: Inputs, outputs: Sequence[str] | None,
                request_id: str | None, priority: int | None,
                timeout_s: float | None) -> rest.RestRequest:
        return rest.build_request(inputs, outputs, request_id, priority=priority,
                                  timeout_s=timeout_s)

    async def infer(self, model: str, request: rest.RestRequest,
                    timeout_s: float | None) -> dict[str, np.ndarray]:
        answer = await self._request("POST", rest.infer_path(model), timeout_s, request.body,
                                     request.headers)
        return answer.outputs()

    async def server_live(self, timeout_s: float | None) -> bool:
        return health(await self._request("GET", rest.LIVE_PATH, timeout_s))

    async def server_ready(self, timeout_s: float | None) -> bool:
        return health(await self._request("GET", rest.READY_PATH, timeout_s))

    async def model_ready(self, name: str, timeout_s: float | None) -> bool:
        return health(await self._request("GET", rest.ready_path(name), timeout_s))

    async def model_metadata(self, name: str, timeout_s: float | None) -> ModelMetadata:
        answer = await self._request("GET", rest.model_path(name), timeout_s)
        return rest.parse_metadata(answer.body_or_raise())

    def stream_infer(self, model: str, inputs: AsyncIterable[Inputs] | Iterable[Inputs],
                     outputs: Sequence[str] | None,
                     timeout_s: float | None) -> AsyncIterator[StreamResult]:
        """Concurrent requests over the pool (HTTP/1.1 has no streams), answers as they finish,
        as gRPC's stream yields them (see ``_fanout``)."""

        async def answer(item: Inputs, request_id: str,
                         remaining_s: float | None) -> dict[str, np.ndarray]:
            request = rest.build_request(item, outputs, request_id, timeout_s=remaining_s)
            return await self.infer(model, request, remaining_s)

        return fan_out_async(inputs, answer, self._window, timeout_s)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

