"""A replica's queue of admitted jobs (or, under ``shared-queue``, every replica's)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator

from evenflow.balancer.errors import DeadlineExceeded
from evenflow.balancer.job import Job


class JobQueue:
    """FIFO of jobs with a running sample count and cheap wake-ups for the replicas that read it.

    Jobs whose caller went away (future cancelled) or whose deadline passed are dropped when a
    batch is taken, never run: the deadline ones fail with ``DeadlineExceeded``.
    """

    def __init__(self) -> None:
        self._jobs: deque[Job] = deque()
        self.num_samples = 0
        self._waiters: list[asyncio.Future[None]] = []

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs)

    @property
    def oldest_arrival_s(self) -> float:
        return self._jobs[0].arrival_s

    def push(self, job: Job) -> None:
        self._jobs.append(job)
        self.num_samples += job.num_samples
        self._wake()

    def pop_tail(self) -> Job:
        job = self._jobs.pop()
        self.num_samples -= job.num_samples
        return job

    def tail_sizes(self) -> list[int]:
        return [job.num_samples for job in reversed(self._jobs)]

    def take(self, max_samples: int, now_s: float) -> list[Job]:
        """Jobs from the front up to ``max_samples`` (at least one live job if any is queued)."""
        batch: list[Job] = []
        total = 0
        jobs = self._jobs
        while jobs:
            job = jobs[0]
            if job.future.done():
                jobs.popleft()
                self.num_samples -= job.num_samples
                continue
            if job.deadline_s <= now_s:
                jobs.popleft()
                self.num_samples -= job.num_samples
                job.future.set_exception(DeadlineExceeded(
                    f"deadline passed after {now_s - job.arrival_s:.3f} s in the queue"))
                continue
            if batch and total + job.num_samples > max_samples:
                break
            jobs.popleft()
            self.num_samples -= job.num_samples
            batch.append(job)
            total += job.num_samples
            if total >= max_samples:
                break
        return batch

    def fail_all(self, error: BaseException) -> None:
        while self._jobs:
            job = self._jobs.popleft()
            if not job.future.done():
                job.future.set_exception(error)
        self.num_samples = 0
        self._wake()

    async def wait_changed(self, timeout_s: float | None = None) -> None:
        """Return when a job is pushed (or after ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(timeout_s, _resolve, waiter) if timeout_s is not None else None
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def wake(self) -> None:
        """Wake the replicas waiting on this queue without adding a job."""
        self._wake()

    def _wake(self) -> None:
        if self._waiters:
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                _resolve(waiter)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
