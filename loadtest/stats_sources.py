"""Where the load tester reads a server's own view: Triton-style ModelStatistics and evenflow's
GetStats, over gRPC (the RPCs) or HTTP (``/v2/models/{m}/stats`` and ``/evenflow/v1/stats``,
the same messages as JSON). Either raises ``StatsUnavailable`` where the server does not
answer (not evenflow, or not reachable)."""

from __future__ import annotations

from typing import Any, Protocol

import aiohttp
import grpc
import msgspec
from google.protobuf import json_format
from google.protobuf.message import Message

from evenflow.client import _rest_codec as rest
from evenflow.client._endpoint import Protocol as Transport
from evenflow.client._endpoint import resolve
from evenflow.client._http_aio import http_session
from evenflow.client.credentials import Credentials, aio_channel
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc
from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc

_TIMEOUT_S = 5.0


class StatsUnavailable(Exception):
    pass


class StatsSource(Protocol):
    async def model_stats(self, model: str) -> pb.ModelStatisticsResponse: ...

    async def evenflow_stats(self, model: str) -> ef.GetStatsResponse: ...

    async def close(self) -> None: ...


class GrpcStats:
    def __init__(self, url: str, credentials: Credentials | None) -> None:
        self._channel = aio_channel(url, [], credentials)
        self._metadata = credentials.metadata if credentials is not None else None
        self._stats = ef_grpc.EvenflowStatsStub(self._channel)
        self._kserve = pb_grpc.GRPCInferenceServiceStub(self._channel)

    async def model_stats(self, model: str) -> pb.ModelStatisticsResponse:
        try:
            return await self._kserve.ModelStatistics(pb.ModelStatisticsRequest(name=model),
                                                      timeout=_TIMEOUT_S,
                                                      metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise StatsUnavailable(str(exc)) from exc

    async def evenflow_stats(self, model: str) -> ef.GetStatsResponse:
        try:
            return await self._stats.GetStats(ef.GetStatsRequest(model_name=model),
                                              timeout=_TIMEOUT_S, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise StatsUnavailable(str(exc)) from exc

    async def close(self) -> None:
        await self._channel.close()


class HttpStats:
    """``url``: the base URL (``http://HOST:PORT``)."""

    def __init__(self, url: str, credentials: Credentials | None) -> None:
        self._url, self._credentials = url, credentials
        self._session: aiohttp.ClientSession | None = None

    async def _get(self, path: str, into: Message) -> Any:
        if self._session is None:  # made inside the loop that polls
            self._session = http_session(self._url, 2, self._credentials)
        try:
            async with self._session.get(self._url + path, timeout=aiohttp.ClientTimeout(
                    total=_TIMEOUT_S)) as response:
                body = await response.read()
                if response.status != 200:
                    raise StatsUnavailable(f"{path}: HTTP {response.status}")
            return json_format.ParseDict(msgspec.json.decode(body), into,
                                         ignore_unknown_fields=True)
        except (TimeoutError, aiohttp.ClientError, msgspec.DecodeError,
                json_format.ParseError) as exc:
            raise StatsUnavailable(f"{path}: {exc}") from exc

    async def model_stats(self, model: str) -> pb.ModelStatisticsResponse:
        response: pb.ModelStatisticsResponse = await self._get(
            rest.model_path(model) + "/stats", pb.ModelStatisticsResponse())
        return response

    async def evenflow_stats(self, model: str) -> ef.GetStatsResponse:
        response: ef.GetStatsResponse = await self._get("/evenflow/v1/stats",
                                                        ef.GetStatsResponse())
        kept = [m for m in response.models if m.model_name == model]  # the route has no filter
        del response.models[:]
        response.models.extend(kept)
        return response

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def stats_source(url: str, protocol: Transport | None,
                 credentials: Credentials | None) -> StatsSource:
    endpoint = resolve(url, protocol, credentials)
    if endpoint.protocol == "http":
        return HttpStats(endpoint.address, endpoint.credentials)
    return GrpcStats(endpoint.address, endpoint.credentials)
