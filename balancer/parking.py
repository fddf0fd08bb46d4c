"""Where a model's admitted requests wait while it has no replica in routing and one is being
loaded (issue 22, "more models than memory"): in arrival order, each until its own deadline."""

from __future__ import annotations

import asyncio
import functools
import math
from collections import Counter
from collections.abc import Callable

from evenflow.balancer.errors import DeadlineExceeded
from evenflow.balancer.job import Job
from evenflow.balancer.timebase import Cancellable, TimeSource, resolve


class ParkingLot:
    """Admitted jobs waiting for a replica, in FIFO order (``release`` hands them over in it).

    A parked job fails with ``DeadlineExceeded`` exactly at its deadline: one timer of the
    balancer's ``time`` is armed for the earliest deadline parked, and re-armed for the next one
    when it fires (no polling). A job whose caller went away (future cancelled) leaves at once,
    so it holds no slot and ``drain`` does not wait for it. Drops are counted by reason in
    ``dropped``, the model's counter that the replicas' queues count theirs in.
    """

    def __init__(self, *, model_name: str, time: TimeSource, dropped: Counter[str]) -> None:
        self._model_name = model_name
        self._time = time
        self._dropped = dropped
        self._jobs: dict[Job, None] = {}  # insertion-ordered: FIFO, and O(1) removal
        self._timer: Cancellable | None = None
        self._armed_s = math.inf  # the deadline the timer is armed for
        self._empty_waiters: list[asyncio.Future[None]] = []

    def __len__(self) -> int:
        return len(self._jobs)

    def park(self, job: Job) -> None:
        self._jobs[job] = None
        job.future.add_done_callback(functools.partial(self._gone, job))
        if job.deadline_s < self._armed_s:
            self._arm(job.deadline_s)

    def release(self) -> list[Job]:
        """Every parked job, oldest first, out of the lot (a replica is in routing now)."""
        jobs = [job for job in self._jobs if not job.future.done()]
        self._clear()
        return jobs

    def fail_all(self, error_of: Callable[[Job], BaseException]) -> None:
        """Fail every parked job with ``error_of(job)``."""
        for job in self.release():
            job.future.set_exception(error_of(job))

    async def wait_empty(self) -> None:
        """Return once no job is parked (released, expired, failed or given up by its caller)."""
        if not self._jobs:
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._empty_waiters.append(waiter)
        await waiter

    def _gone(self, job: Job, future: asyncio.Future[object]) -> None:
        """A job's future is done (this callback stays on it after it was released: then the
        job is not here any more and nothing happens)."""
        if job not in self._jobs:
            return
        del self._jobs[job]
        if future.cancelled():
            self._dropped["cancelled"] += 1
        if not self._jobs:
            self._clear()

    def _arm(self, deadline_s: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._armed_s = deadline_s
        self._timer = self._time.call_later(deadline_s - self._time.clock(), self._expire)

    def _expire(self) -> None:
        """The timer fired: fail every job whose deadline has come, then re-arm for the next.
        The armed deadline counts as come even if the clock reads a hair earlier (float
        rounding of ``now + delay``), so the timer never re-arms for the same deadline."""
        self._timer = None
        now_s = self._time.clock()
        due_s = max(now_s, self._armed_s)
        self._armed_s = math.inf
        expired = [job for job in self._jobs if job.deadline_s <= due_s]
        for job in expired:
            del self._jobs[job]
            self._dropped["deadline"] += 1
            job.future.set_exception(DeadlineExceeded(
                f"deadline passed after {now_s - job.arrival_s:.3f} s waiting for a replica of "
                f"model {self._model_name!r} to load"))
        next_s = min((job.deadline_s for job in self._jobs), default=math.inf)
        if math.isfinite(next_s):
            self._arm(next_s)
        elif not self._jobs:
            self._clear()

    def _clear(self) -> None:
        self._jobs.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_s = math.inf
        waiters, self._empty_waiters = self._empty_waiters, []
        for waiter in waiters:
            resolve(waiter)
