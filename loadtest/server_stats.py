"""The server-side view while load runs: evenflow's stats polled over time, and Triton-style
ModelStatistics before and after (any server that implements it, Triton included), over gRPC
or HTTP (``stats_sources``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from evenflow.client._endpoint import Protocol
from evenflow.client.credentials import Credentials
from evenflow.loadtest.stats_sources import StatsUnavailable, stats_source
from evenflow.proto import grpc_service_pb2 as pb


@dataclass
class ReplicaSample:
    t_s: float
    replica: str
    device: str
    busy_fraction: float
    batch_size: int
    queued_requests: int


@dataclass
class ServerView:
    """What the server said about itself during one measurement."""

    is_evenflow: bool = False
    samples: list[ReplicaSample] = field(default_factory=list)
    breakdown_ms: dict[str, float] = field(default_factory=dict)  # per request: queue, compute
    batch_size_counts: dict[int, int] = field(default_factory=dict)
    policy: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"is_evenflow": self.is_evenflow, "policy": self.policy,
                "breakdown_ms": self.breakdown_ms,
                "batch_size_counts": {str(k): v for k, v in sorted(self.batch_size_counts.items())},
                "samples": [vars(s) for s in self.samples]}


class ServerWatcher:
    """Polls GetStats every ``interval_s`` (when the server is evenflow) between start and stop,
    over the load's transport (``protocol``, as the client reads the URL)."""

    def __init__(self, url: str, model: str, interval_s: float = 0.25,
                 credentials: Credentials | None = None,
                 protocol: Protocol | None = None) -> None:
        self._source = stats_source(url, protocol, credentials)
        self._model = model
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._before: pb.ModelStatistics | None = None
        self.view = ServerView()
        self.origin_s = time.monotonic()

    async def _model_stats(self) -> pb.ModelStatistics | None:
        try:
            response = await self._source.model_stats(self._model)
        except StatsUnavailable:
            return None
        return response.model_stats[0] if response.model_stats else None

    async def start(self, origin_s: float) -> None:
        self.origin_s = origin_s
        self.view = ServerView()
        self._before = await self._model_stats()
        try:
            await self._poll_once()
            self.view.is_evenflow = True
        except StatsUnavailable:
            return
        self._task = asyncio.create_task(self._poll())

    async def _poll_once(self) -> None:
        response = await self._source.evenflow_stats(self._model)
        t_s = time.monotonic() - self.origin_s
        for model in response.models:
            self.view.policy = model.policy
            for replica in model.replicas:
                self.view.samples.append(ReplicaSample(
                    t_s, replica.name, ",".join(replica.devices), replica.busy_fraction,
                    replica.batch_size, replica.queued_requests))

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            with contextlib.suppress(StatsUnavailable):
                await self._poll_once()

    async def stop(self) -> ServerView:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        after = await self._model_stats()
        if self._before is not None and after is not None:
            self.view.breakdown_ms, self.view.batch_size_counts = _difference(self._before, after)
        await self._source.close()
        return self.view


def _difference(before: pb.ModelStatistics,
                after: pb.ModelStatistics) -> tuple[dict[str, float], dict[int, int]]:
    breakdown = {}
    for name in ("queue", "compute_input", "compute_infer", "compute_output", "success"):
        old, new = getattr(before.inference_stats, name), getattr(after.inference_stats, name)
        count = new.count - old.count
        if count > 0:
            breakdown[name] = (new.ns - old.ns) / count / 1e6
    old_counts = {b.batch_size: b.compute_infer.count for b in before.batch_stats}
    counts = {b.batch_size: b.compute_infer.count - old_counts.get(b.batch_size, 0)
              for b in after.batch_stats}
    return breakdown, {size: n for size, n in counts.items() if n > 0}
