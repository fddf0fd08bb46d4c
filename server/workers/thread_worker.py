"""A worker that runs batches on its own OS thread and hands results back to the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

from evenflow.balancer.errors import BatchFailed, EvenflowError, WorkerLost
from evenflow.balancer.job import BatchResult, Job, SingleDeviceWorker
from evenflow.server.workers.identity import WorkerIdentity

logger = logging.getLogger(__name__)

_STOP = object()


class ThreadExit(BaseException):
    """Ends a worker's thread from inside a batch, as a crash would (fault injection): the
    batch in hand is answered WorkerLost and the thread is gone."""


class ThreadWorker(WorkerIdentity, SingleDeviceWorker):
    """Base of the device workers: one thread, one batch at a time.

    ``run`` posts the batch to the thread and awaits a future that the thread resolves through
    ``call_soon_threadsafe``, so the event loop never blocks on a device. Subclasses implement
    ``_thread_main_context`` (per-thread setup such as ``torch.inference_mode``, which is
    thread-local) and ``_execute``.
    """

    def __init__(self, *, name: str, devices: Sequence[str]) -> None:
        super().__init__(name, devices)
        self._closed = False
        self._inbox, self._thread = self._start_thread()

    def _start_thread(self) -> tuple[queue.SimpleQueue[Any], threading.Thread]:
        inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        thread = threading.Thread(target=self._thread_main, args=(inbox,),
                                  name=f"worker:{self._name}", daemon=True)
        thread.start()
        return inbox, thread

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        if self._closed:
            raise BatchFailed(f"worker {self._name} is closed")
        if not self._thread.is_alive():
            raise WorkerLost(f"worker {self._name}'s thread has exited")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[BatchResult] = loop.create_future()
        self._inbox.put((jobs, future, loop))
        return await future

    async def close(self, timeout_s: float = 10.0) -> None:
        """Finish the batch in hand, then stop the thread. A thread still busy after
        ``timeout_s`` (a hung device) is abandoned: it is a daemon, so it cannot hold the
        process. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(_STOP)
        await asyncio.to_thread(self._thread.join, timeout_s)
        if self._thread.is_alive():
            logger.warning("worker %s did not stop within %.0f s; abandoning its thread",
                           self._name, timeout_s)

    async def restart(self) -> None:
        """A new thread with a new inbox; the old thread (dead, or hung in a batch) is abandoned:
        it is told to stop when it next reads its own inbox, and its late result goes to a
        future already settled. It is a daemon, so it cannot hold the process."""
        if self._closed:
            raise BatchFailed(f"worker {self._name} is closed")
        self._inbox.put(_STOP)
        self._inbox, self._thread = await asyncio.to_thread(self._start_thread)

    def _thread_main(self, inbox: queue.SimpleQueue[Any]) -> None:
        with contextlib.suppress(ThreadExit):
            self._thread_loop(inbox)

    def _thread_loop(self, inbox: queue.SimpleQueue[Any]) -> None:
        in_hand: tuple[asyncio.Future[Any], asyncio.AbstractEventLoop] | None = None
        try:
            with self._thread_main_context():
                while True:
                    item = inbox.get()
                    if item is _STOP:
                        return
                    jobs, future, loop = item
                    in_hand = (future, loop)
                    self._serve(jobs, future, loop)
                    in_hand = None
        finally:
            if in_hand is not None:  # the thread is dying with a batch in hand: say so
                future, loop = in_hand
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_set_exception, future, WorkerLost(
                        f"worker {self._name}'s thread exited while running a batch"))

    def _serve(self, jobs: Sequence[Job], future: asyncio.Future[Any],
               loop: asyncio.AbstractEventLoop) -> None:
        deliver: Callable[[asyncio.Future[Any], Any], None]
        try:
            result: Any = self._execute(jobs)
            deliver = _set_result
        except EvenflowError as exc:
            result, deliver = exc, _set_exception
        except Exception as exc:
            result = BatchFailed(f"{type(exc).__name__}: {exc}")
            deliver = _set_exception
        try:
            loop.call_soon_threadsafe(deliver, future, result)
        except RuntimeError:  # the loop closed while the batch ran
            logger.debug("%s: loop closed before a result could be delivered", self._name)

    def _thread_main_context(self) -> Any:
        raise NotImplementedError

    def _execute(self, jobs: Sequence[Job]) -> BatchResult:
        raise NotImplementedError


def _set_result(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
