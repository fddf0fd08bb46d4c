"""JobQueue alone: order within a level, batch bounds, dropping dead jobs, failing all, and
wake-ups. (Priority levels and shape groups are covered in test_policies.)"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Hashable

import pytest

from evenflow.balancer import DeadlineExceeded, Job, ShuttingDown
from evenflow.balancer.queue import JobQueue

pytestmark = pytest.mark.timeout(10)


def job(name: str, num_samples: int = 1, *, arrival_s: float = 1.0, due_s: float = math.inf,
        deadline_s: float = math.inf, level: int = 0, shape_key: Hashable = None) -> Job:
    """A job whose payload is its name (created inside the test's running loop)."""
    future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    return Job(name, num_samples, arrival_s, deadline_s, future, level=level,
               shape_key=shape_key, due_s=due_s)


def names(jobs: list[Job]) -> list[str]:
    return [j.payload for j in jobs]


def test_a_queue_needs_a_priority_level() -> None:
    with pytest.raises(ValueError, match="at least one priority level"):
        JobQueue(levels=0)


async def test_within_a_level_the_earliest_due_goes_first_and_ties_keep_arrival_order() -> None:
    queue = JobQueue()
    for name, due_s in [("a", 3.0), ("b", 1.0), ("c", 2.0), ("d", 1.0), ("e", 5.0)]:
        queue.push(job(name, due_s=due_s))
    assert names(queue.take(10, now_s=0.0)) == ["b", "d", "c", "a", "e"]


async def test_oldest_arrival_is_the_earliest_front_of_any_level() -> None:
    queue = JobQueue(levels=2)
    queue.push(job("late-urgent", arrival_s=5.0, level=0))
    queue.push(job("early-lax", arrival_s=2.0, level=1))
    queue.push(job("tight", arrival_s=7.0, due_s=0.5, level=0))  # goes ahead of late-urgent
    assert queue.oldest_arrival_s == 2.0


async def test_a_batch_stops_before_it_would_pass_max_samples() -> None:
    queue = JobQueue()
    for name, size in [("a", 3), ("b", 4), ("c", 1)]:
        queue.push(job(name, size))
    assert names(queue.take(6, now_s=0.0)) == ["a"]  # b would make 7
    assert (len(queue), queue.num_samples) == (2, 5)
    assert names(queue.take(5, now_s=0.0)) == ["b", "c"]
    assert (len(queue), queue.num_samples) == (0, 0)


async def test_a_job_larger_than_the_batch_still_runs_alone() -> None:
    queue = JobQueue()
    queue.push(job("big", 9))
    queue.push(job("small", 1))
    assert names(queue.take(4, now_s=0.0)) == ["big"]


async def test_a_batch_drops_cancelled_and_expired_jobs_and_fails_the_expired() -> None:
    dropped: Counter[str] = Counter()
    queue = JobQueue(dropped=dropped)
    gone, expired, live = job("gone"), job("expired", 2, deadline_s=4.0), job("live", 3)
    for queued in (gone, expired, live):
        queue.push(queued)
    gone.future.cancel()
    assert names(queue.take(10, now_s=4.0)) == ["live"]
    assert dropped == Counter(cancelled=1, deadline=1)
    with pytest.raises(DeadlineExceeded, match=r"deadline passed after 3\.000 s in the queue"):
        expired.future.result()
    assert (len(queue), queue.num_samples) == (0, 0)


async def test_a_batch_of_only_dead_jobs_is_empty() -> None:
    queue = JobQueue()
    queue.push(job("expired", deadline_s=1.0))
    assert queue.take(10, now_s=2.0) == []
    assert len(queue) == 0


async def test_purge_drops_dead_jobs_anywhere_and_keeps_the_order_of_the_rest() -> None:
    dropped: Counter[str] = Counter()
    queue = JobQueue(levels=2, dropped=dropped)
    jobs = [job("a"), job("b", deadline_s=2.0), job("c", level=1), job("d", level=1)]
    for queued in jobs:
        queue.push(queued)
    jobs[3].future.cancel()
    queue.purge(now_s=2.0)
    assert (len(queue), queue.num_samples, dropped) == (2, 2, Counter(cancelled=1, deadline=1))
    assert isinstance(jobs[1].future.exception(), DeadlineExceeded)
    assert names(list(queue)) == ["a", "c"]


async def test_work_moved_in_queues_behind_what_is_already_admitted() -> None:
    queue = JobQueue()
    queue.push(job("admitted", due_s=10.0))
    moved = job("moved", due_s=1.0)  # due earlier, but priced at the end of this queue
    queue.push_behind(moved)
    # still due when it was (stealing and late binding read that), ordered behind
    assert (moved.due_s, moved.order_s) == (1.0, 10.0)
    queue.push(job("new", due_s=11.0))
    assert names(queue.take(10, now_s=0.0)) == ["admitted", "moved", "new"]


async def test_work_moved_into_an_empty_level_keeps_its_due_time() -> None:
    queue = JobQueue(levels=2)
    queue.push(job("other-level", due_s=10.0, level=1))
    moved = job("moved", due_s=1.0, level=0)
    queue.push_behind(moved)
    assert moved.due_s == 1.0


async def test_fail_all_fails_every_waiting_caller_once_and_empties_the_queue() -> None:
    queue = JobQueue(levels=2)
    jobs = [job("a", 2, shape_key=(3,)), job("b", 3, level=1, shape_key=(5,))]
    for queued in jobs:
        queue.push(queued)
    jobs[0].future.cancel()  # a caller that went away hears nothing
    error = ShuttingDown("closing")
    queue.fail_all(lambda _: error)
    assert jobs[0].future.cancelled()
    assert jobs[1].future.exception() is error
    assert (len(queue), queue.num_samples, queue.num_shape_groups) == (0, 0, 0)
    assert list(queue) == []


async def test_a_push_wakes_every_waiter() -> None:
    queue = JobQueue()
    waiters = [asyncio.create_task(queue.wait_changed()) for _ in range(3)]
    await asyncio.sleep(0)  # let them start waiting
    assert not any(w.done() for w in waiters)
    queue.push(job("a"))
    await asyncio.wait_for(asyncio.gather(*waiters), timeout=5)


async def test_wake_wakes_a_waiter_without_adding_a_job() -> None:
    queue = JobQueue()
    waiter = asyncio.create_task(queue.wait_changed())
    await asyncio.sleep(0)
    queue.wake()
    await asyncio.wait_for(waiter, timeout=5)
    assert len(queue) == 0


async def test_fail_all_wakes_the_waiters() -> None:
    queue = JobQueue()
    waiter = asyncio.create_task(queue.wait_changed())
    await asyncio.sleep(0)
    queue.fail_all(lambda _: ShuttingDown("closing"))
    await asyncio.wait_for(waiter, timeout=5)


async def test_a_wait_with_a_timeout_returns_without_a_push() -> None:
    queue = JobQueue()
    await asyncio.wait_for(queue.wait_changed(timeout_s=0.0), timeout=5)


async def test_a_cancelled_wait_leaves_the_queue_usable() -> None:
    queue = JobQueue()
    waiter = asyncio.create_task(queue.wait_changed(timeout_s=3600.0))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    queue.push(job("a"))  # must not try to resolve the cancelled waiter
    second = asyncio.create_task(queue.wait_changed())
    await asyncio.sleep(0)
    queue.wake()
    await asyncio.wait_for(second, timeout=5)
