"""The ``process`` worker host: each replica's worker runs in a process of its own, driven over
a ZeroMQ PAIR socket (``ipc.worker_messages``); to the balancer it is a Worker like any other.

A batch crosses once each way: one multipart message with every job's input arrays as raw
frames, one back with every output. The process is started with ``python -m`` (never forked
from a process that has CUDA or gRPC state) by ``supervisor.Child``, so a process that dies
while starting is reported with its exit code and the end of its stderr; it reads its
``WorkerSpec`` from stdin and treats stdin's end as the engine's death. It ignores
SIGINT/SIGTERM: the engine decides when it stops.

When the process dies (``kill -9``, a segfault) every batch it had fails with ``WorkerLost`` at
once, and the replica re-runs them elsewhere and calls ``restart``; a hung process (the
replica's watchdog) is killed by ``restart`` before the new one starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import uuid
from typing import Any

import msgspec
import numpy as np
import zmq

from evenflow.balancer.errors import WorkerLost
from evenflow.balancer.job import WorkerStatus
from evenflow.server.processes.ipc import arrays
from evenflow.server.processes.ipc import worker_messages as msg
from evenflow.server.processes.ipc.errors import from_wire
from evenflow.server.processes.ipc.loop_socket import LoopSocket
from evenflow.server.processes.pending_calls import PendingCalls
from evenflow.server.processes.supervisor import Child, ChildNotReady
from evenflow.server.workers.hosted import BatchReply, HostedWorker, worker_status
from evenflow.server.workers.worker_spec import WorkerSpec

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 300.0  # loading a model and initialising CUDA can take minutes
_STOP_TIMEOUT_S = 10.0

# A call's answer: the reply and the frames that followed it.
_Answer = tuple[BatchReply | msg.ControlDone, list[bytes]]


class ProcessWorker(HostedWorker):
    def __init__(self, spec: WorkerSpec) -> None:
        # One batch at a time (a pipeline: one per stage and one at the door): a hop here
        # costs ~0.2 ms, less than what a second batch in flight would give up (it could no
        # longer be dropped at its deadline, cancelled, stolen or bound late).
        n = len(spec.devices)
        super().__init__(spec, n + 1 if n > 1 else 1)
        self._calls: PendingCalls[_Answer] = PendingCalls()
        self._child: Child | None = None
        self._socket: LoopSocket | None = None
        self._first: asyncio.Future[Any] | None = None  # the process's Ready (or StartFailed)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def pid(self) -> int | None:
        """The worker process's id (None while none runs)."""
        return self._child.pid if self._child is not None else None

    @property
    def _process(self) -> asyncio.subprocess.Process | None:
        """The running process itself (tests wait on its exit code)."""
        return self._child.process if self._child is not None else None

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
        first: asyncio.Future[Any] = loop.create_future()
        self._first = first
        self._socket = LoopSocket(pair, loop, self._receive)
        started = await Child.start(
            f"worker {self._name}", ["-m", "evenflow.server.processes.worker_process", address],
            settings=self._spec)
        self._child = started
        try:
            ready = await self._until_ready(started, first)
        except BaseException:
            await self._kill()
            raise
        self._status = worker_status(ready.status)
        self._tasks = [asyncio.create_task(self._watch(started), name=f"watch:{self._name}")]
        logger.info("worker %s: process %d ready", self._name, started.pid)

    async def _until_ready(self, started: Child, first: asyncio.Future[Any]) -> msg.Ready:
        try:
            message = await started.until_ready(first, _START_TIMEOUT_S)
        except ChildNotReady as exc:
            raise WorkerLost(str(exc)) from exc
        if isinstance(message, msg.Ready):
            return message
        if isinstance(message, msg.StartFailed):
            raise from_wire(message.error)
        raise WorkerLost(f"worker {self._name}: unexpected first message {message!r}")

    def _running_socket(self) -> LoopSocket:
        socket, child = self._socket, self._child
        if socket is None or child is None or child.exit_code is not None:
            raise WorkerLost(f"worker {self._name}: its process is not running")
        return socket

    def _send(self, parts: list[Any], by_reference: bool = False) -> None:
        """Send to the running process, or raise ``WorkerLost`` as a call to a dead one must."""
        socket = self._running_socket()
        try:
            socket.send(parts, by_reference)
        except zmq.Again as exc:
            # A PAIR with no high-water mark refuses a send only when it has no peer: ZeroMQ
            # saw the process's end before this loop reaped it.
            raise WorkerLost(f"worker {self._name}: its process is not running") from exc

    async def _exchange(self, sizes: list[int], inputs: list[np.ndarray]
                        ) -> tuple[BatchReply, list[np.ndarray]]:
        self._running_socket()  # before packing: a dead process needs no copy of the inputs
        metas: list[arrays.ArrayMeta] = []
        frames: list[object] = []
        arrays.pack(inputs, metas, frames)
        call_id, answer = self._calls.add()
        header = msg.encoder.encode(msg.RunBatch(id=call_id, sizes=sizes, arrays=metas))
        try:
            self._send([header, *frames], arrays.by_reference(frames))
            reply, out_frames = await answer
        finally:
            self._calls.discard(call_id)
        assert isinstance(reply, (msg.BatchDone, msg.BatchError))
        if isinstance(reply, msg.BatchError):
            return reply, []
        return reply, arrays.unpack(reply.arrays, out_frames)

    async def _send_control(self, request: msg.Control) -> msg.ControlDone:
        call_id, answer = self._calls.add()
        try:
            # Checked as a batch is: once the process has exited nothing would answer (or fail)
            # a call queued now, and an admin RPC would wait for the next restart.
            self._send([msg.encoder.encode(msgspec.structs.replace(request, id=call_id))])
            done, _ = await answer
        finally:
            self._calls.discard(call_id)
        assert isinstance(done, msg.ControlDone)
        return done

    def _receive(self, parts: list[bytes]) -> None:
        message = msg.from_worker.decode(parts[0])
        if isinstance(message, (msg.Ready, msg.StartFailed)):
            if self._first is not None and not self._first.done():
                self._first.set_result(message)
            return
        # Dropped when its call was given up (watchdog, process death).
        self._calls.resolve(message.id, (message, parts[1:]))

    async def _watch(self, started: Child) -> None:
        code = await started.wait()
        if not self._closed:
            logger.error("worker %s: process %d exited with code %s", self._name, started.pid,
                         code)
        self._calls.fail_all(WorkerLost(f"worker {self._name}: its process exited "
                                        f"(code {code})"))

    async def close(self) -> None:
        """Let the process finish what it runs and exit (killed after a bound). Idempotent."""
        if not self._close_once():
            return
        started, socket = self._child, self._socket
        if started is not None and socket is not None and started.exit_code is None:
            with contextlib.suppress(zmq.ZMQError):
                socket.send([msg.encoder.encode(msg.Stop())])
            if not await started.stop(_STOP_TIMEOUT_S):
                logger.warning("worker %s: process %d did not stop within %.0f s; killed it",
                               self._name, started.pid, _STOP_TIMEOUT_S)
        await self._kill()

    async def _kill(self) -> None:
        """Kill the process if it runs, reap it, and close its socket and tasks."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        started, self._child = self._child, None
        if started is not None:
            await started.kill()
        self._calls.fail_all(WorkerLost(f"worker {self._name}: its process was stopped"))
        if self._socket is not None:
            self._socket.close()
            self._socket = None
