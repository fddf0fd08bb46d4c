"""Supervising one exec'd child process (a worker process, a front-end).

``Child.start`` runs this interpreter (exec, never fork: nothing of the parent's gRPC or CUDA
state is inherited) with its settings on stdin (``ipc.child``). The child's stderr passes
through to ours, and its last few KiB are kept, so that a child that dies while starting is
reported with its exit code and the traceback it printed. ``until_ready`` waits for the first
of: the child's ready signal (a future its owner resolves from the child's first message), its
exit, a bound; ``stop`` waits a bound for it to exit, then kills it. Restarts are spaced by
``evenflow.balancer.backoff.Backoff``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Sequence
from typing import Any, TypeVar

from evenflow.server.processes.ipc import child

T = TypeVar("T")

# Enough for a Python traceback's last frames and its message.
STDERR_TAIL_BYTES = 4096
# How long a dead child's last output may take to reach us once it has exited.
_TAIL_FLUSH_S = 1.0
_READ_BYTES = 65536


class ChildNotReady(Exception):
    """A child exited, or did not say it was ready within its bound, while starting."""

    def __init__(self, message: str, *, exit_code: int | None, stderr_tail: str) -> None:
        super().__init__(f"{message}; its last output:\n{stderr_tail}" if stderr_tail
                         else message)
        self.exit_code = exit_code
        self.stderr_tail = stderr_tail


class _StderrTail:
    """Copies a pipe to this process's stderr and keeps its last bytes.

    NOTE: a thread, not the event loop, reads the pipe: a busy loop must never leave a child
    blocked on a full pipe while it writes a log line."""

    def __init__(self, read_fd: int, keep_bytes: int) -> None:
        self._fd = read_fd
        self._keep_bytes = keep_bytes
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, name="child-stderr", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        try:
            while data := os.read(self._fd, _READ_BYTES):
                with contextlib.suppress(OSError):  # our own stderr closed: keep the tail
                    _write_all(2, data)
                with self._lock:
                    self._tail += data
                    del self._tail[:-self._keep_bytes]
        finally:
            os.close(self._fd)

    def text(self) -> str:
        with self._lock:
            return self._tail.decode(errors="replace").strip()

    async def flush(self, timeout_s: float) -> None:
        """Wait (bounded) until the pipe ends: a child's last words come after its exit."""
        await asyncio.to_thread(self._thread.join, timeout_s)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


class Child:
    """One child process and the last of its stderr."""

    def __init__(self, name: str, process: asyncio.subprocess.Process,
                 stderr: _StderrTail) -> None:
        self.name = name
        self.process = process
        self._stderr = stderr

    @classmethod
    async def start(cls, name: str, python_args: Sequence[str], *, settings: object,
                    stderr_tail_bytes: int = STDERR_TAIL_BYTES) -> Child:
        """Run ``python python_args`` with ``settings`` on its stdin; ``name`` is what errors
        call it. Cancelled once the process exists, it kills the process (``spawn_python``)."""
        read_fd, write_fd = os.pipe()
        try:
            process = await child.spawn_python(python_args, settings=settings, stderr=write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)  # the child holds its own copy: its exit ends the pipe
        return cls(name, process, _StderrTail(read_fd, stderr_tail_bytes))

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.process.returncode

    def stderr_tail(self) -> str:
        """The last of what it wrote to stderr (up to ``stderr_tail_bytes``)."""
        return self._stderr.text()

    async def wait(self) -> int:
        """Its exit code, once it has exited."""
        return await self.process.wait()

    async def until_ready(self, ready: asyncio.Future[T], timeout_s: float) -> T:
        """``ready``'s value once it is resolved (its exception, if it fails). If the child
        exits first, or ``timeout_s`` passes, it is killed and ``ChildNotReady`` says which,
        with the exit code and the end of its stderr."""
        exited = asyncio.ensure_future(self.process.wait())
        waits: set[asyncio.Future[Any]] = {ready, exited}
        try:
            done, _ = await asyncio.wait(waits, timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if ready in done:
            return ready.result()
        if exited in done:
            await self._stderr.flush(_TAIL_FLUSH_S)
            raise ChildNotReady(f"{self.name}: its process exited with code "
                                f"{self.exit_code} while starting", exit_code=self.exit_code,
                                stderr_tail=self.stderr_tail())
        await self.kill()
        raise ChildNotReady(f"{self.name}: not ready within {timeout_s:g} s", exit_code=None,
                            stderr_tail=self.stderr_tail())

    async def stop(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the child to exit (its owner has told it to), then kill
        it; True when it exited by itself."""
        try:
            await asyncio.wait_for(self.process.wait(), timeout_s)
            return True
        except TimeoutError:
            await self.kill()
            return False

    async def kill(self) -> int:
        """Kill it if it runs, and reap it; its exit code. Idempotent."""
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        return await self.process.wait()
