"""Hand-written fakes of evenflow's seams for unit tests: a worker whose batches finish when the
test says so, and a gRPC servicer context that records what a servicer answered. Neither sleeps;
each records what was done to it so a test can assert on it. (The balancer's fake time source is
``tests.unit.balancer_fakes.FakeTime``.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from evenflow.balancer import BatchResult, BatchTiming, Job, SingleDeviceWorker


@dataclass
class FakeWorker(SingleDeviceWorker):
    """A worker whose batches cost ``base_s + per_sample_s * samples`` (reported, not slept).

    With ``gated`` set, each batch waits until the test calls ``release()``, so a test controls
    exactly when batches finish. Every batch is recorded; ``fail_with`` makes the next batch raise.
    """

    name: str
    base_s: float = 0.01
    per_sample_s: float = 0.001
    gated: bool = False
    devices: Sequence[str] = ()
    batches: list[list[int]] = field(default_factory=list)
    fail_with: list[BaseException] = field(default_factory=list)
    closed: bool = False
    restarted: int = 0
    _gates: list[asyncio.Future[None]] = field(default_factory=list)
    started: asyncio.Event | None = None

    def __post_init__(self) -> None:
        self.devices = self.devices or (self.name,)

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        self.batches.append([job.num_samples for job in jobs])
        if self.started is not None:
            self.started.set()
        if self.gated:
            gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._gates.append(gate)
            await gate
        if self.fail_with:
            raise self.fail_with.pop(0)
        samples = sum(job.num_samples for job in jobs)
        cost_s = self.base_s + self.per_sample_s * samples
        return BatchResult([("out", job.payload) for job in jobs], BatchTiming(0.0, cost_s, 0.0))

    def release(self) -> None:
        self._gates = [g for g in self._gates if not g.done()]  # cancelled: the run went away
        gate = self._gates.pop(0)
        gate.set_result(None)

    @property
    def num_waiting(self) -> int:
        return sum(1 for gate in self._gates if not gate.done())

    async def restart(self) -> None:
        self.restarted += 1

    async def close(self) -> None:
        self.closed = True


class Aborted(Exception):
    """What ``FakeContext.abort`` raises, as grpc's own context raises to end the call."""


class FakeContext:
    """The part of ``grpc.aio.ServicerContext`` a servicer uses: the time left before the call's
    deadline, done callbacks (run by ``finish``, as grpc runs them once the status is sent),
    trailing metadata, and ``abort``, which records the status and raises ``Aborted``."""

    def __init__(self, time_remaining_s: float | None = None) -> None:
        self._time_remaining_s = time_remaining_s
        self.code: grpc.StatusCode | None = None
        self.details = ""
        self.trailing_metadata: tuple[tuple[str, str], ...] = ()
        self._done_callbacks: list[Callable[[Any], None]] = []

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing_metadata = metadata

    def time_remaining(self) -> float | None:
        return self._time_remaining_s

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._done_callbacks.append(callback)

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        self.code, self.details = code, details
        raise Aborted(f"{code.name}: {details}")

    def finish(self) -> None:
        """The call's status was sent: run the done callbacks once."""
        callbacks, self._done_callbacks = self._done_callbacks, []
        for callback in callbacks:
            callback(self)
