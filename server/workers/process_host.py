"""The ``process`` worker host: each replica's worker runs in a process of its own, driven over
a ZeroMQ PAIR socket (``ipc.worker_messages``); to the balancer it is a Worker like any other.

A batch crosses once each way: one multipart message with every job's input arrays as raw
frames, one back with every output. The process is started with ``python -m`` (never forked
from a process that has CUDA or gRPC state); it reads its ``WorkerSpec`` from stdin and treats
stdin's end as the engine's death. It ignores SIGINT/SIGTERM: the engine decides when it stops.

When the process dies (``kill -9``, a segfault) every batch it had fails with ``WorkerLost`` at
once, and the replica re-runs them elsewhere and calls ``restart``; a hung process (the
replica's watchdog) is killed by ``restart`` before the new one starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import uuid
from collections.abc import Sequence
from typing import Any

import zmq

from evenflow.balancer.errors import BatchFailed, WorkerLost
from evenflow.balancer.job import BatchResult, BatchTiming, Job, WorkerStatus
from evenflow.server.processes.ipc import arrays, child
from evenflow.server.processes.ipc import worker_messages as msg
from evenflow.server.processes.ipc.errors import from_wire
from evenflow.server.processes.ipc.loop_socket import LoopSocket
from evenflow.server.workers.batch_rows import join_rows, split_rows
from evenflow.server.workers.hosted import HostedWorker
from evenflow.server.workers.worker_spec import WorkerSpec

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 300.0  # loading a model and initialising CUDA can take minutes
_STOP_TIMEOUT_S = 10.0


class ProcessWorker(HostedWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        # One batch at a time (a pipeline: one per stage and one at the door): a hop here
        # costs ~0.2 ms, less than what a second batch in flight would give up (it could no
        # longer be dropped at its deadline, cancelled, stolen or bound late).
        n = len(spec.devices)
        super().__init__(spec, n + 1 if n > 1 else 1)
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._process: asyncio.subprocess.Process | None = None
        self._socket: LoopSocket | None = None
        self._first: asyncio.Future[Any] | None = None  # the process's Ready (or StartFailed)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def pid(self) -> int | None:
        """The worker process's id (None while none runs)."""
        return self._process.pid if self._process is not None else None

    def status(self) -> WorkerStatus:
        return dataclasses.replace(self._status, location=f"pid {self.pid}") \
            if self.pid is not None else self._status

    async def start(self) -> None:
        """Start the process and wait until its worker is built; raises what building raised."""
        address = f"ipc://@evenflow-{os.getpid()}-{uuid.uuid4().hex}"
        pair: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PAIR)
        pair.setsockopt(zmq.LINGER, 0)
        pair.bind(address)
        loop = asyncio.get_running_loop()
        self._first = loop.create_future()
        self._socket = LoopSocket(pair, loop, self._receive)
        process = await child.spawn("evenflow.server.processes.worker_process", address,
                                    settings=self._spec)
        self._process = process
        try:
            ready = await self._wait_ready(process, self._first)
        except BaseException:
            await self._kill()
            raise
        self._status = _status(ready.status)
        self._tasks = [asyncio.create_task(self._watch(process), name=f"watch:{self._name}")]
        logger.info("worker %s: process %d ready", self._name, process.pid)

    async def _wait_ready(self, process: asyncio.subprocess.Process,
                          first: asyncio.Future[Any]) -> msg.Ready:
        exited = asyncio.ensure_future(process.wait())
        try:
            done, _ = await asyncio.wait({first, exited}, timeout=_START_TIMEOUT_S,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if first in done:
            message = first.result()
            if isinstance(message, msg.Ready):
                return message
            if isinstance(message, msg.StartFailed):
                raise from_wire(message.error)
            raise WorkerLost(f"worker {self._name}: unexpected first message {message!r}")
        if exited in done:
            raise WorkerLost(f"worker {self._name}: its process exited with code "
                             f"{process.returncode} while starting")
        raise WorkerLost(f"worker {self._name}: not ready within {_START_TIMEOUT_S:.0f} s")

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        if self._closed:
            raise BatchFailed(f"worker {self._name} is closed")
        socket = self._socket
        if socket is None or self._process is None or self._process.returncode is not None:
            raise WorkerLost(f"worker {self._name}: its process is not running")
        metas: list[arrays.ArrayMeta] = []
        frames: list[object] = []
        arrays.pack(join_rows([job.payload for job in jobs]), metas, frames)
        batch_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[batch_id] = future
        sizes = [job.num_samples for job in jobs]
        header = msg.encoder.encode(msg.RunBatch(id=batch_id, sizes=sizes, arrays=metas))
        try:
            socket.send([header, *frames], arrays.by_reference(frames))
            done, outputs = await future
        finally:
            self._pending.pop(batch_id, None)
        return _result(done, sizes, outputs)

    async def _control(self, request: msg.Control) -> msg.ControlDone:
        socket = self._socket
        if socket is None:
            raise WorkerLost(f"worker {self._name}: its process is not running")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request.id] = future
        try:
            socket.send([msg.encoder.encode(request)])
            done, _ = await future
        finally:
            self._pending.pop(request.id, None)
        if done.error is not None:
            raise from_wire(done.error)
        return done

    async def set_device_speed(self, device: str, speed: float) -> float:
        if device not in self._devices:
            raise KeyError(device)
        done = await self._control(msg.Control(next(self._ids), "speed", device, value=speed))
        return done.value

    async def set_device_fault(self, device: str, fault: str, count: int) -> None:
        if device not in self._devices:
            raise KeyError(device)
        await self._control(msg.Control(next(self._ids), "fault", device, fault=fault,
                                        count=count))

    def _receive(self, parts: list[bytes]) -> None:
        message = msg.from_worker.decode(parts[0])
        if isinstance(message, (msg.Ready, msg.StartFailed)):
            if self._first is not None and not self._first.done():
                self._first.set_result(message)
            return
        if isinstance(message, msg.BatchDone):
            self._status = _status(message.status)
        future = self._pending.get(message.id)
        if future is None or future.done():
            return  # its batch was given up (watchdog, process death)
        if isinstance(message, msg.BatchError):
            future.set_exception(from_wire(message.error))
        else:
            future.set_result((message, parts[1:]))

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        code = await process.wait()
        if not self._closed:
            logger.error("worker %s: process %d exited with code %s", self._name, process.pid,
                         code)
        self._fail_pending(WorkerLost(f"worker {self._name}: its process exited "
                                      f"(code {code})"))

    def _fail_pending(self, error: Exception) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()

    async def close(self) -> None:
        """Let the process finish what it runs and exit (killed after a bound). Idempotent."""
        if not self._close_once():
            return
        process, socket = self._process, self._socket
        if process is not None and socket is not None and process.returncode is None:
            with contextlib.suppress(zmq.ZMQError):
                socket.send([msg.encoder.encode(msg.Stop())])
            try:
                await asyncio.wait_for(process.wait(), _STOP_TIMEOUT_S)
            except TimeoutError:
                logger.warning("worker %s: process %d did not stop within %.0f s; killing it",
                               self._name, process.pid, _STOP_TIMEOUT_S)
        await self._kill()

    async def _kill(self) -> None:
        """Kill the process if it runs, reap it, and close its socket and tasks."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
            await process.wait()
        self._fail_pending(WorkerLost(f"worker {self._name}: its process was stopped"))
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _status(status: msg.Status) -> WorkerStatus:
    return WorkerStatus(tuple(status.stages), status.num_repartitions)


def _result(done: msg.BatchDone, sizes: list[int], frames: list[bytes]) -> BatchResult:
    outputs = arrays.unpack(done.arrays, frames)
    return BatchResult(split_rows(outputs, sizes), BatchTiming(*done.timing_s),
                       BatchTiming(*done.cpu_s) if done.cpu_s is not None else None)
