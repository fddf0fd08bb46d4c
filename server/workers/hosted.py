"""The engine's side of an out-of-process worker host (worker processes, Ray actors): what
both send (``ipc.worker_messages``, answered by ``endpoint.WorkerEndpoint`` over there) and how
they read the replies. Each host only carries a request and its arrays across its transport."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np

from evenflow.balancer import BatchFailed, WorkerStatus
from evenflow.balancer.job import BatchResult, BatchTiming, Job
from evenflow.server.processes.ipc import worker_messages as msg
from evenflow.server.processes.ipc.errors import from_wire
from evenflow.server.workers.batch_rows import join_rows, split_rows
from evenflow.server.workers.identity import WorkerIdentity
from evenflow.server.workers.worker_spec import WorkerSpec

BatchReply: TypeAlias = msg.BatchDone | msg.BatchError


class HostedWorker(WorkerIdentity):
    """What a worker run elsewhere (a worker process, a Ray actor) knows of itself without
    asking: its spec's name and devices, how many batches it takes at once, and the status its
    last answer carried; how it runs a batch and a control: the request to the host's
    ``_exchange`` / ``_send_control``, the reply read here; and how it restarts: ``_kill`` what
    runs (dead already, or hung past the watchdog), then ``start`` anew.

    A batch crosses once each way: each input of the whole batch (the jobs' rows one after
    another), each output of the whole batch back, cut per job here."""

    # A restart starts a new process, with a device context of its own: it recovers from a
    # sticky device error (DeviceLost) that a thread of the serving process could not.
    restart_renews_device = True

    def __init__(self, spec: WorkerSpec, max_in_flight: int) -> None:
        self._spec = spec
        super().__init__(spec.name, [d.name for d in spec.devices])
        self._max_in_flight = max_in_flight
        self._status = WorkerStatus()
        self._closed = False

    async def start(self) -> None:
        raise NotImplementedError

    async def _kill(self) -> None:
        raise NotImplementedError

    async def _exchange(self, sizes: list[int], inputs: list[np.ndarray]
                        ) -> tuple[BatchReply, list[np.ndarray]]:
        """Send a ``RunBatch`` of these rows and inputs; its reply and the batch's outputs."""
        raise NotImplementedError

    async def _send_control(self, request: msg.Control) -> msg.ControlDone:
        raise NotImplementedError

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        if self._closed:
            raise BatchFailed(f"worker {self._name} is closed")
        sizes = [job.num_samples for job in jobs]
        reply, outputs = await self._exchange(sizes, join_rows([job.payload for job in jobs]))
        if isinstance(reply, msg.BatchError):
            raise from_wire(reply.error)
        self._status = worker_status(reply.status, self._status.location)
        return BatchResult(split_rows(outputs, sizes), BatchTiming(*reply.timing_s),
                           BatchTiming(*reply.cpu_s) if reply.cpu_s is not None else None)

    async def _control(self, request: msg.Control) -> float:
        if request.device not in self._devices:
            raise KeyError(request.device)
        done = await self._send_control(request)
        if done.error is not None:
            raise from_wire(done.error)
        return done.value

    async def set_device_speed(self, device: str, speed: float) -> float:
        return await self._control(msg.Control(0, "speed", device, value=speed))

    async def set_device_fault(self, device: str, fault: str, count: int) -> None:
        await self._control(msg.Control(0, "fault", device, fault=fault, count=count))

    def _close_once(self) -> bool:
        """Mark the worker closed; False when it already was (``close`` is idempotent)."""
        if self._closed:
            return False
        self._closed = True
        return True

    async def restart(self) -> None:
        if self._closed:
            raise BatchFailed(f"worker {self._name} is closed")
        await self._kill()
        await self.start()

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def status(self) -> WorkerStatus:
        return self._status


def worker_status(status: msg.Status, location: str = "") -> WorkerStatus:
    return WorkerStatus(tuple(status.stages), status.num_repartitions, location,
                        status.activation_peak_bytes)
