"""A worker process: ``python -m evenflow.server.processes.worker_process ADDRESS``, started by
``process_host.ProcessWorker``. Reads its WorkerSpec (4-byte length, then msgpack) from stdin,
builds the replica's worker on its own threads exactly as the thread host would, then serves
batches and controls from the engine's socket until told to stop or stdin ends (the engine is
gone).

A batch that loses the device (``DeviceLost``: a sticky CUDA error has poisoned this process's
context) is answered, and then the process exits with ``DEVICE_LOST_EXIT_CODE``: nothing can run
on that context again, and the engine's restart starts a process with a fresh one."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import signal
import sys
import time
from typing import Any

import zmq
import zmq.asyncio

from evenflow.balancer import Job, Worker
from evenflow.balancer.errors import DeviceLost
from evenflow.server.observability.logs import configure_logging
from evenflow.server.processes.ipc import arrays, child
from evenflow.server.processes.ipc import worker_messages as msg
from evenflow.server.processes.ipc.errors import to_wire
from evenflow.server.workers.thread_host import build_thread_worker, load_spec_definition
from evenflow.server.workers.worker_spec import WorkerSpec

logger = logging.getLogger(__name__)

DEVICE_LOST_EXIT_CODE = 3


def _status(worker: Worker) -> msg.Status:
    status = worker.status()
    return msg.Status([dict(stage) for stage in status.stages], status.num_repartitions)


class _Server:
    def __init__(self, worker: Worker, socket: zmq.asyncio.Socket) -> None:
        self._worker = worker
        self._socket = socket
        self._tasks: set[asyncio.Task[None]] = set()
        self.device_lost = asyncio.Event()

    async def serve(self, engine_gone: asyncio.Event) -> None:
        receiving = asyncio.create_task(self._receive())
        gone = asyncio.create_task(engine_gone.wait())
        lost = asyncio.create_task(self.device_lost.wait())
        try:
            await asyncio.wait({receiving, gone, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (receiving, gone, lost):
                task.cancel()
            await asyncio.gather(receiving, gone, lost, return_exceptions=True)
            if self.device_lost.is_set():
                logger.error("worker %s: the device is lost; exiting", self._worker.name)
            if engine_gone.is_set():
                logger.warning("worker %s: the engine is gone; exiting", self._worker.name)
                for task in self._tasks:
                    task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _receive(self) -> None:
        loop = asyncio.get_running_loop()
        for count in itertools.count(1):
            if count % arrays.YIELD_EVERY == 0:
                await asyncio.sleep(0)
            parts = await self._socket.recv_multipart()
            message = msg.to_worker.decode(parts[0])
            if isinstance(message, msg.Stop):
                return
            work = (self._run(message, parts[1:], loop) if isinstance(message, msg.RunBatch)
                    else self._control(message))
            task = asyncio.create_task(work)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: msg.RunBatch, frames: list[bytes],
                   loop: asyncio.AbstractEventLoop) -> None:
        # The engine sent the batch's inputs whole: one job of all its rows, whose outputs go
        # back whole too (the engine cuts them per request).
        jobs = [Job(payload=arrays.unpack(batch.arrays, frames), num_samples=sum(batch.sizes),
                    arrival_s=0.0, deadline_s=math.inf, future=loop.create_future())]
        try:
            result = await self._worker.run(jobs)
        except Exception as exc:
            await self._socket.send_multipart([msg.encoder.encode(
                msg.BatchError(batch.id, to_wire(exc)))])
            if isinstance(exc, DeviceLost):
                self.device_lost.set()
            return
        metas: list[arrays.ArrayMeta] = []
        out_frames: list[object] = []
        arrays.pack(result.outputs[0], metas, out_frames)
        timing, cpu = result.timing, result.cpu
        header = msg.encoder.encode(msg.BatchDone(
            id=batch.id, timing_s=(timing.copy_in_s, timing.compute_s, timing.copy_out_s),
            cpu_s=(cpu.copy_in_s, cpu.compute_s, cpu.copy_out_s) if cpu is not None else None,
            arrays=metas, status=_status(self._worker)))
        await self._socket.send_multipart([header, *out_frames],
                                          copy=not arrays.by_reference(out_frames))

    async def _control(self, control: msg.Control) -> None:
        done: msg.ControlDone
        try:
            if control.op == "speed":
                value = await self._worker.set_device_speed(control.device, control.value)
                done = msg.ControlDone(control.id, value)
            elif control.op == "fault":
                await self._worker.set_device_fault(control.device, control.fault, control.count)
                done = msg.ControlDone(control.id)
            else:
                raise ValueError(f"unknown control {control.op!r}")
        except Exception as exc:
            done = msg.ControlDone(control.id, error=to_wire(exc))
        await self._socket.send_multipart([msg.encoder.encode(done)])


async def _main(spec: WorkerSpec, address: str) -> int:
    """Serve until stopped; the process's exit code."""
    socket = zmq.asyncio.Context.instance().socket(zmq.PAIR)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(address)
    engine_gone = child.watch_parent(asyncio.get_running_loop())
    started_s = time.perf_counter()
    try:
        worker = await asyncio.to_thread(
            lambda: build_thread_worker(spec, load_spec_definition(spec)))
    except Exception as exc:
        logger.exception("worker %s: could not start", spec.name)
        await socket.send_multipart([msg.encoder.encode(msg.StartFailed(to_wire(exc)))])
        socket.close()
        return 0
    try:
        await socket.send_multipart([msg.encoder.encode(msg.Ready(
            name=worker.name, devices=list(worker.devices), max_in_flight=worker.max_in_flight,
            status=_status(worker)))])
        logger.info("worker %s: process %d ready in %.1f s", worker.name, os.getpid(),
                    time.perf_counter() - started_s)
        server = _Server(worker, socket)
        await server.serve(engine_gone)
    finally:
        await worker.close()
        socket.close()  # lingers until the last answer (a DeviceLost) is sent
    return DEVICE_LOST_EXIT_CODE if server.device_lost.is_set() else 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # The engine decides when this process stops (Ctrl-C reaches the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = child.read_settings(WorkerSpec)
    configure_logging(spec.log_level, spec.log_format)
    run: Any
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    sys.exit(run(_main(spec, args[0])))


if __name__ == "__main__":
    main()
