"""The part every out-of-process worker host shares (worker processes, Ray actors)."""

from __future__ import annotations

from collections.abc import Sequence

from evenflow.balancer import BatchFailed, WorkerStatus
from evenflow.server.workers.worker_spec import WorkerSpec


class HostedWorker:
    """What a worker run elsewhere (a worker process, a Ray actor) knows of itself without
    asking: its spec's name and devices, how many batches it takes at once, and the status its
    last answer carried; and how it restarts: ``_kill`` what runs (dead already, or hung past
    the watchdog), then ``start`` anew, which each host implements."""

    # A restart starts a new process, with a device context of its own: it recovers from a
    # sticky device error (DeviceLost) that a thread of the serving process could not.
    restart_renews_device = True

    def __init__(self, spec: WorkerSpec, max_in_flight: int) -> None:
        self._spec = spec
        self._name = spec.name
        self._devices = tuple(d.name for d in spec.devices)
        self._max_in_flight = max_in_flight
        self._status = WorkerStatus()
        self._closed = False

    async def start(self) -> None:
        raise NotImplementedError

    async def _kill(self) -> None:
        raise NotImplementedError

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
    def name(self) -> str:
        return self._name

    @property
    def devices(self) -> Sequence[str]:
        return self._devices

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    def status(self) -> WorkerStatus:
        return self._status
