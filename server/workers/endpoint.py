"""The worker's side of an out-of-process host: one dispatch from the engine's requests
(``ipc.worker_messages``) to the built worker, shared by worker processes and Ray actors.

Transport-free: the arrays of a batch come in and go out as numpy arrays beside the message.
A worker process carries them as ZeroMQ frames (``ipc.arrays``: the reply's ``arrays`` then
describe them); a Ray actor hands them to Ray's object store (``arrays`` stays empty)."""

from __future__ import annotations

import asyncio
import math

import numpy as np

from evenflow.balancer import Job, Worker
from evenflow.balancer.errors import DeviceLost
from evenflow.server.processes.ipc import worker_messages as msg
from evenflow.server.processes.ipc.errors import to_wire


class WorkerEndpoint:
    """Answers one engine's requests against ``worker``; every error comes back as a reply
    (``ipc.errors``), never raised. ``device_lost`` turns true once a batch lost the device:
    nothing can run on this process's device context again (a worker process then exits)."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker
        self.device_lost = False

    @property
    def worker(self) -> Worker:
        return self._worker

    def status(self) -> msg.Status:
        status = self._worker.status()
        return msg.Status([dict(stage) for stage in status.stages], status.num_repartitions,
                          status.activation_peak_bytes)

    def ready(self) -> msg.Ready:
        worker = self._worker
        return msg.Ready(name=worker.name, devices=list(worker.devices),
                         max_in_flight=worker.max_in_flight, status=self.status())

    async def run_batch(self, request: msg.RunBatch, inputs: list[np.ndarray]
                        ) -> tuple[msg.BatchDone | msg.BatchError, list[np.ndarray]]:
        """Run the batch and answer it: the reply, and each output of the whole batch (the
        engine cuts them per job, by ``request.sizes``)."""
        # The batch's inputs came whole: one job of all its rows, whose outputs go back whole.
        job = Job(payload=inputs, num_samples=sum(request.sizes), arrival_s=0.0,
                  deadline_s=math.inf, future=asyncio.get_running_loop().create_future())
        try:
            result = await self._worker.run([job])
        except Exception as exc:
            if isinstance(exc, DeviceLost):
                self.device_lost = True
            return msg.BatchError(request.id, to_wire(exc)), []
        timing, cpu = result.timing, result.cpu
        done = msg.BatchDone(
            id=request.id, timing_s=(timing.copy_in_s, timing.compute_s, timing.copy_out_s),
            cpu_s=(cpu.copy_in_s, cpu.compute_s, cpu.copy_out_s) if cpu is not None else None,
            arrays=[], status=self.status())
        return done, list(result.outputs[0])

    async def control(self, request: msg.Control) -> msg.ControlDone:
        """Apply an admin control ("speed" answers the speed now in force)."""
        try:
            if request.op == "speed":
                value = await self._worker.set_device_speed(request.device, request.value)
                return msg.ControlDone(request.id, value)
            if request.op == "fault":
                await self._worker.set_device_fault(request.device, request.fault,
                                                    request.count)
                return msg.ControlDone(request.id)
            raise ValueError(f"unknown control {request.op!r}")
        except Exception as exc:
            return msg.ControlDone(request.id, error=to_wire(exc))

    async def close(self) -> None:
        await self._worker.close()
