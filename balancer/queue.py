"""A replica's queue of admitted jobs (or, under ``shared-queue``, every replica's)."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, deque
from collections.abc import Callable, Hashable, Iterator

from evenflow.balancer.errors import DeadlineExceeded
from evenflow.balancer.job import Job
from evenflow.balancer.timebase import LoopTime, TimeSource, resolve


class JobQueue:
    """Jobs in priority levels, earliest ``due_s`` first within a level (ties in arrival
    order), with a running sample count and cheap wake-ups for the replicas that read it.

    Batches are taken from the most urgent level first; work stealing takes from the tail of the
    least urgent. Jobs whose caller went away (future cancelled) or whose deadline passed are
    dropped when a batch is taken, never run: the deadline ones fail with ``DeadlineExceeded``.
    ``wait_changed``'s timeout is a timer of ``time``, the balancer's time source (the loop's
    when none is given).
    """

    def __init__(self, levels: int = 1, dropped: Counter[str] | None = None,
                 time: TimeSource | None = None) -> None:
        if levels < 1:
            raise ValueError(f"a queue needs at least one priority level, not {levels}")
        self._levels: list[deque[Job]] = [deque() for _ in range(levels)]
        self._dropped: Counter[str] = Counter() if dropped is None else dropped
        self._shapes: Counter[Hashable] = Counter()  # queued jobs per shape key (keyed only)
        self._count = 0
        self.num_samples = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._time = LoopTime() if time is None else time

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Job]:
        return itertools.chain.from_iterable(self._levels)

    @property
    def oldest_arrival_s(self) -> float:
        """The arrival of the job at the front of each level, the earliest of them: the oldest
        job, unless a tighter deadline went ahead of it."""
        return min(level[0].arrival_s for level in self._levels if level)

    @property
    def earliest_due_s(self) -> float:
        """The earliest ``due_s`` among the jobs at the front of each level."""
        return min(level[0].due_s for level in self._levels if level)

    @property
    def num_shape_groups(self) -> int:
        """How many batches the queue needs at least: one per distinct shape."""
        return max(1, len(self._shapes)) if self._count else 0

    def push(self, job: Job) -> None:
        """Queue ``job`` in due-time order within its level."""
        self._insert(job, job.due_s)

    def _insert(self, job: Job, order_s: float) -> None:
        job.order_s = order_s
        jobs = self._levels[job.level]
        if not jobs or jobs[-1].order_s <= order_s:
            jobs.append(job)  # the common case: due times grow with arrival
        else:
            index = len(jobs) - 1
            while index > 0 and jobs[index - 1].order_s > order_s:
                index -= 1
            jobs.insert(index, job)
        if job.shape_key is not None:
            self._shapes[job.shape_key] += 1
        self._count += 1
        self.num_samples += job.num_samples
        self._wake()

    def push_behind(self, job: Job) -> None:
        """Queue ``job`` behind everything already queued at its level, whatever its due time:
        for work moved here from another replica (stealing, late binding), which was priced
        at the end of this queue, and must not push back jobs this replica already admitted
        against their own predictions. Its due time stays what it is: routing, stealing and
        late binding read it as the time the caller waits for."""
        jobs = self._levels[job.level]
        self._insert(job, max(job.due_s, jobs[-1].order_s) if jobs else job.due_s)

    def pop_tail(self) -> Job:
        """The newest job of the least urgent non-empty level."""
        level = next(level for level in reversed(self._levels) if level)
        job = level.pop()
        self._forget(job)
        return job

    def tail(self) -> Iterator[tuple[int, float]]:
        """Each queued job's (samples, due time), in the order ``pop_tail`` would return them.
        Lazy: stealing reads a few jobs of a long queue, and must not copy all of it."""
        for level in reversed(self._levels):
            for job in reversed(level):
                yield job.num_samples, job.due_s

    def take(self, max_samples: int, now_s: float) -> list[Job]:
        """Jobs from the front of the most urgent levels up to ``max_samples`` (at least one live
        job if any is queued), all of the first one's shape: jobs of other shapes keep their
        places for a later batch."""
        batch: list[Job] = []
        total = 0
        key: Hashable = None
        for jobs in self._levels:
            index = 0
            while index < len(jobs):
                job = jobs[index]
                if self._dead(job, now_s):
                    self._remove(jobs, index)
                    continue
                if batch and job.shape_key != key:
                    index += 1
                    continue
                if batch and total + job.num_samples > max_samples:
                    return batch
                self._remove(jobs, index)
                key = job.shape_key
                batch.append(job)
                total += job.num_samples
                if total >= max_samples:
                    return batch
        return batch

    def purge(self, now_s: float) -> None:
        """Drop every job whose caller went away or whose deadline passed, wherever it is in
        the queue (admission calls this at its bound, so a cancelled call frees its slot)."""
        for index, jobs in enumerate(self._levels):
            live: deque[Job] = deque()
            for job in jobs:
                if self._dead(job, now_s):
                    self._forget(job)
                else:
                    live.append(job)
            self._levels[index] = live

    def _dead(self, job: Job, now_s: float) -> bool:
        """Whether ``job`` must not run (the caller is about to drop it from the queue): its
        caller went away, or its deadline passed (then it fails with DeadlineExceeded)."""
        future = job.future
        if future.done():
            if future.cancelled():
                self._dropped["cancelled"] += 1
            return True
        if job.deadline_s <= now_s:
            self._dropped["deadline"] += 1
            future.set_exception(DeadlineExceeded(
                f"deadline passed after {now_s - job.arrival_s:.3f} s in the queue"))
            return True
        return False

    def _remove(self, jobs: deque[Job], index: int) -> None:
        job = jobs[index]
        del jobs[index]  # O(1) at the front, where it nearly always is
        self._forget(job)

    def _forget(self, job: Job) -> None:
        self._count -= 1
        self.num_samples -= job.num_samples
        key = job.shape_key
        if key is not None:
            left = self._shapes[key] - 1
            if left:
                self._shapes[key] = left
            else:
                del self._shapes[key]

    def fail_all(self, error_of: Callable[[Job], BaseException]) -> None:
        """Fail every queued job with ``error_of(job)``."""
        for jobs in self._levels:
            while jobs:
                job = jobs.popleft()
                if not job.future.done():
                    job.future.set_exception(error_of(job))
        self._count = 0
        self.num_samples = 0
        self._shapes.clear()
        self._wake()

    async def wait_changed(self, timeout_s: float | None = None) -> None:
        """Return when a job is pushed (or after ``timeout_s`` on the queue's time source)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        timer = None if timeout_s is None else self._time.call_later(timeout_s, resolve, waiter)
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
                resolve(waiter)
