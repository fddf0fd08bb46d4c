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
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine
from typing import Any

import msgspec
import zmq

from evenflow.server.edge import event_loop
from evenflow.server.observability.logs import configure_logging
from evenflow.server.processes.ipc import arrays, child
from evenflow.server.processes.ipc import worker_messages as msg
from evenflow.server.processes.ipc.errors import to_wire
from evenflow.server.processes.ipc.loop_socket import LoopSocket
from evenflow.server.workers.endpoint import WorkerEndpoint
from evenflow.server.workers.thread_host import build_thread_worker, load_spec_definition
from evenflow.server.workers.worker_spec import WorkerSpec

logger = logging.getLogger(__name__)

DEVICE_LOST_EXIT_CODE = 3
# How long the socket may still deliver the last answers (a DeviceLost) once the process ends.
_LINGER_MS = 1000


class _Server:
    """Serves the engine's socket: each batch and each control runs as a task of its own
    (controls while a batch runs), answered through the endpoint. ``Stop``, the engine's death
    or a lost device ends ``serve``."""

    def __init__(self, endpoint: WorkerEndpoint, socket: zmq.Socket[bytes],
                 loop: asyncio.AbstractEventLoop) -> None:
        self._endpoint = endpoint
        self._tasks: set[asyncio.Task[None]] = set()
        self.stopped = asyncio.Event()
        self.device_lost = asyncio.Event()
        self._socket = LoopSocket(socket, loop, self._receive)

    def send_ready(self) -> None:
        self._socket.send([msg.encoder.encode(self._endpoint.ready())])

    async def serve(self, engine_gone: asyncio.Event) -> None:
        try:
            await event_loop.first_set(self.stopped, engine_gone, self.device_lost)
        finally:
            self.stopped.set()  # what arrives from now on is not taken
            name = self._endpoint.worker.name
            if self.device_lost.is_set():
                logger.error("worker %s: the device is lost; exiting", name)
            if engine_gone.is_set():
                logger.warning("worker %s: the engine is gone; exiting", name)
                for task in self._tasks:
                    task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        await self._endpoint.close()
        self._socket.close(linger_ms=_LINGER_MS)

    def _receive(self, parts: list[bytes]) -> None:
        if self.stopped.is_set():
            return
        message = msg.to_worker.decode(parts[0])
        if isinstance(message, msg.Stop):
            self.stopped.set()
            return
        work: Coroutine[Any, Any, None] = (
            self._run(message, parts[1:]) if isinstance(message, msg.RunBatch)
            else self._control(message))
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, batch: msg.RunBatch, frames: list[bytes]) -> None:
        reply, outputs = await self._endpoint.run_batch(batch,
                                                        arrays.unpack(batch.arrays, frames))
        if isinstance(reply, msg.BatchError):
            self._socket.send([msg.encoder.encode(reply)])
            if self._endpoint.device_lost:
                self.device_lost.set()
            return
        metas: list[arrays.ArrayMeta] = []
        out_frames: list[object] = []
        arrays.pack(outputs, metas, out_frames)
        header = msg.encoder.encode(msgspec.structs.replace(reply, arrays=metas))
        self._socket.send([header, *out_frames], arrays.by_reference(out_frames))

    async def _control(self, control: msg.Control) -> None:
        self._socket.send([msg.encoder.encode(await self._endpoint.control(control))])


def _ignore(parts: list[bytes]) -> None:
    """A worker that could not start takes nothing from the engine."""


async def _main(spec: WorkerSpec, address: str) -> int:
    """Serve until stopped; the process's exit code."""
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PAIR)
    socket.connect(address)  # connecting meanwhile: what is sent before it is up is queued
    loop = asyncio.get_running_loop()
    engine_gone = child.watch_parent(loop)
    started_s = time.perf_counter()
    try:
        worker = await asyncio.to_thread(
            lambda: build_thread_worker(spec, load_spec_definition(spec)))
    except Exception as exc:
        logger.exception("worker %s: could not start", spec.name)
        failed = LoopSocket(socket, loop, _ignore)
        failed.send([msg.encoder.encode(msg.StartFailed(to_wire(exc)))])
        failed.close(linger_ms=_LINGER_MS)
        return 0
    server = _Server(WorkerEndpoint(worker), socket, loop)
    try:
        server.send_ready()
        logger.info("worker %s: process %d ready in %.1f s", worker.name, os.getpid(),
                    time.perf_counter() - started_s)
        await server.serve(engine_gone)
    finally:
        await server.close()  # lingers until the last answer (a DeviceLost) is sent
    return DEVICE_LOST_EXIT_CODE if server.device_lost.is_set() else 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # The engine decides when this process stops (Ctrl-C reaches the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = child.read_settings(WorkerSpec)
    configure_logging(spec.log_level, spec.log_format)
    try:
        code = event_loop.run(_main(spec, args[0]))
    finally:
        # pyzmq never terminates a context at exit, so the socket's linger alone does not keep
        # the process alive: a last answer still queued (StartFailed, a DeviceLost) would be
        # dropped, and the engine would see only the exit. Terminating waits for it, up to
        # the linger (a socket left open is closed with it).
        zmq.Context.instance().destroy(linger=_LINGER_MS)
    sys.exit(code)


if __name__ == "__main__":
    main()
