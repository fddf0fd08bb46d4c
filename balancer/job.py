"""The values that cross the balancer's seams: a queued job, a worker's batch result, and the
small protocols (worker, clock) that the balancer drives."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from evenflow.balancer.errors import EvenflowError

Clock = Callable[[], float]
"""Monotonic seconds; ``time.monotonic`` in production, a fake in tests."""


@dataclass(slots=True, eq=False)
class Job:
    """One admitted request waiting for (or in) a batch.

    ``payload`` is opaque to the balancer (the server puts decoded tensors there); only the worker
    reads it. ``future`` resolves to the worker's output for this job, or to an EvenflowError.
    ``level`` is the job's priority level as an index, 0 the most urgent. ``due_s`` is when it
    is due: the balancer sets it to the earlier of the job's deadline and its arrival plus the
    model's latency target. A queue orders a level by ``order_s``, earliest first: the due time,
    so jobs without a deadline keep arrival order and one with a tight deadline moves ahead of
    them, but for a job moved from another replica, which goes behind what was queued.
    """

    payload: Any
    num_samples: int
    arrival_s: float
    deadline_s: float
    future: asyncio.Future[Any]
    level: int = 0
    predicted_done_s: float = math.inf  # when admission predicted it would be answered
    shape_key: Hashable = None  # jobs batch together only with the same key (None: any)
    attempts: int = 0  # times it was re-run after its worker was lost
    due_s: float = math.inf  # when it is due (its deadline, or arrival + latency target)
    order_s: float = math.inf  # its place in a queue's level (``JobQueue``), set there
    rebound: bool = False  # moved once by late binding (never again)


@dataclass(frozen=True, slots=True)
class BatchTiming:
    """Seconds a batch spent in each phase, measured by the worker on its own thread."""

    copy_in_s: float
    compute_s: float
    copy_out_s: float

    @property
    def total_s(self) -> float:
        return self.copy_in_s + self.compute_s + self.copy_out_s


@dataclass(frozen=True, slots=True)
class BatchResult:
    """A finished batch: one output per job, in the jobs' order, and the batch's measured times
    (``cpu``: the worker thread's CPU time in the same phases, when it measures it)."""

    outputs: Sequence[Any]
    timing: BatchTiming
    cpu: BatchTiming | None = None


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    """What a worker reports about itself besides its batches: a pipeline's stages (device,
    layers, planned and measured seconds), how often it re-partitioned, where it runs, and the
    most device memory one of its batches held above what was allocated before it (None where
    the device does not count it: CPUs, simulated devices)."""

    stages: tuple[Mapping[str, Any], ...] = ()
    num_repartitions: int = 0
    location: str = ""  # where it runs, as its host names it ("" in this process)
    activation_peak_bytes: int | None = None


class Worker(Protocol):
    """A replica's executor: one device, or a pipeline of stages. This is the one seam between
    the balancer and every worker host (a thread in this process, a worker process, a remote
    actor): the balancer sees nothing of a worker but these members and the latency it measures.

    ``max_in_flight`` batches may run at once (1, or a pipeline's stages plus one). ``run`` must
    not block the event loop. It raises ``BatchFailed`` (or ``OutOfMemory``) when the model fails,
    ``WorkerLost`` when whatever runs batches died; any other exception is treated as
    ``BatchFailed`` with its message. ``status`` must be cheap (it is read for every stats call).
    ``set_device_speed`` / ``set_device_fault`` change a simulated device of this worker (tests,
    drills) and raise ``KeyError`` when it has no simulated device of that name.
    """

    @property
    def name(self) -> str: ...

    @property
    def devices(self) -> Sequence[str]: ...

    @property
    def max_in_flight(self) -> int: ...

    async def run(self, jobs: Sequence[Job]) -> BatchResult: ...

    def status(self) -> WorkerStatus: ...

    async def set_device_speed(self, device: str, speed: float) -> float: ...

    async def set_device_fault(self, device: str, fault: str, count: int) -> None: ...

    async def restart(self) -> None:
        """Replace whatever runs batches (a thread, a process) after it died or hung; the old
        one is abandoned. Raises when it cannot (then the replica stays out of routing)."""
        ...

    async def close(self) -> None: ...


class SingleDeviceWorker:
    """The members of ``Worker`` that a worker of one device, running one batch at a time and
    with no simulated controls, answers the same way (mix in, then add ``run`` and the rest)."""

    __slots__ = ()
    max_in_flight = 1

    def status(self) -> WorkerStatus:
        return WorkerStatus()

    async def set_device_speed(self, device: str, speed: float) -> float:
        raise KeyError(device)  # a real device's speed is what it is

    async def set_device_fault(self, device: str, fault: str, count: int) -> None:
        raise KeyError(device)


def unrun(kind: type[EvenflowError], message: str) -> Callable[[Job], EvenflowError]:
    """The error a job fails with before it reaches a worker: marked ``not_run`` unless the
    job already ran once (it waits to be re-run after its worker was lost)."""
    return lambda job: kind(message, not_run=job.attempts == 0)
