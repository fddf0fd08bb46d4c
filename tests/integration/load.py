"""Load for fault tests: clients each on its own connection, one request at a time until
stopped, every outcome counted; waiters are woken by the answers themselves (no sleeps)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable

import grpc
import numpy as np

from evenflow.proto import grpc_service_pb2 as pb
from evenflow.proto import grpc_service_pb2_grpc as pb_grpc
from evenflow.server.models.spec import SimProfile

FAST = SimProfile(base_ms=2.0, per_sample_ms=0.0)
_X = np.ones((1, 256), np.float32)


def sim_request(model: str = "sim") -> pb.ModelInferRequest:
    """One sample of ones for a model with one FP32 input ``x`` of 256 (sim, mlp)."""
    return pb.ModelInferRequest(
        model_name=model, inputs=[pb.ModelInferRequest.InferInputTensor(
            name="x", datatype="FP32", shape=[1, 256])], raw_input_contents=[_X.tobytes()])


class Load:
    """``clients`` loops, each on its own connection, one request at a time until stopped;
    every outcome is counted per client, and waiters are woken after each answer."""

    def __init__(self, url: str, clients: int, model: str = "sim") -> None:
        # A local subchannel pool per channel: separate TCP connections (and so, with
        # --frontends, possibly different front-end processes).
        self.channels = [grpc.aio.insecure_channel(url, options=[
            ("grpc.use_local_subchannel_pool", 1)]) for _ in range(clients)]
        self.request = sim_request(model)
        self.ok: Counter[int] = Counter()
        self.failed: Counter[int] = Counter()
        self.sent: Counter[int] = Counter()
        self.errors: list[tuple[int, str, str]] = []  # (client, status, details) of failures
        self._changed = asyncio.Condition()
        self._stop = False
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Load:
        self._tasks = [asyncio.create_task(self._loop(i)) for i in range(len(self.channels))]
        return self

    async def __aexit__(self, *_: object) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks)
        for channel in self.channels:
            await channel.close()

    async def _loop(self, index: int) -> None:
        stub = pb_grpc.GRPCInferenceServiceStub(self.channels[index])
        while not self._stop:
            self.sent[index] += 1
            try:
                await stub.ModelInfer(self.request, timeout=20, wait_for_ready=True)
                self.ok[index] += 1
            except grpc.aio.AioRpcError as exc:
                self.failed[index] += 1
                self.errors.append((index, exc.code().name, str(exc.details())[:200]))
            async with self._changed:
                self._changed.notify_all()

    async def until(self, predicate: Callable[[], bool], timeout_s: float) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), timeout_s)

    def answered(self) -> bool:
        """Every request sent has exactly one answer (checked once the loops stopped)."""
        return all(self.ok[i] + self.failed[i] == self.sent[i]
                   for i in range(len(self.channels)))
