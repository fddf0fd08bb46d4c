"""ModelBalancer and Replica mechanics with hand-written fake workers on a fake time source.

Progress is gated by the fake workers (a batch finishes when the test releases it) and by the
fake clock (a wait ends when the test advances it), never by sleeping; ``settle`` only lets
already-runnable callbacks run. The balancers use the server's wait values.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest

from evenflow.balancer import (
    BalancerConfig,
    BatchFailed,
    DeadlineExceeded,
    InvalidRequest,
    ModelBalancer,
    OutOfMemory,
    Overloaded,
    Policy,
    ShuttingDown,
)
from evenflow.balancer.ledger import DeviceLedger
from evenflow.balancer.replica import Replica
from evenflow.balancer.watchdog import SETTLE_S
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import BalancerFactory, FakeTime, seed_fit, settle

pytestmark = pytest.mark.timeout(10)

MAX_WAIT_S = BalancerConfig().max_wait_s  # the server's: a forming batch waits this long


async def test_batches_form_up_to_batch_size_while_the_worker_is_busy(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], adaptive_batching=False, max_batch=4)
    futures = [balancer.submit(0, 1)]
    await settle()
    assert worker.batches == [[1]]  # the first request ran alone at once
    futures += [balancer.submit(i, 1) for i in range(1, 6)]
    await settle()
    assert worker.batches == [[1]]  # the rest wait while the worker is busy
    worker.release()
    await settle()
    assert worker.batches == [[1], [1, 1, 1, 1]]
    worker.release()
    await settle()
    # The last one was left forming while the batch of four was being answered: it waits out
    # the max wait for batch mates, then runs alone.
    assert worker.batches == [[1], [1, 1, 1, 1]]
    fake_time.advance(MAX_WAIT_S)
    await settle()
    worker.release()
    await settle()
    assert worker.batches == [[1], [1, 1, 1, 1], [1]]
    assert [f.result() for f in futures] == [("out", i) for i in range(6)]


async def test_expired_jobs_are_dropped_not_run(make_balancer, fake_time: FakeTime) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], adaptive_batching=False, max_batch=8)
    first = balancer.submit("a", 1)
    await settle()
    late = balancer.submit("b", 1, deadline_s=fake_time() + 0.01)
    fake_time.advance(0.02)
    worker.release()
    await settle()
    assert first.result() == ("out", "a")
    with pytest.raises(DeadlineExceeded):
        late.result()
    assert worker.batches == [[1]]


async def test_cancelled_jobs_are_dropped_not_run(make_balancer) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], adaptive_batching=False, max_batch=8)
    balancer.submit("a", 1)
    await settle()
    gone = balancer.submit("b", 1)
    kept = balancer.submit("c", 1)
    gone.cancel()
    worker.release()
    await settle()
    worker.release()
    await settle()
    assert worker.batches == [[1], [1]]
    assert kept.result() == ("out", "c")


async def test_admission_rejects_expired_oversize_and_overload(make_balancer,
                                                               fake_time: FakeTime) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], max_batch=4, max_queued_requests=2)
    with pytest.raises(DeadlineExceeded):
        balancer.submit("x", 1, deadline_s=fake_time())
    with pytest.raises(InvalidRequest, match="exceeds max batch size 4"):
        balancer.submit("x", 5)
    balancer.submit("running", 1)
    await settle()
    balancer.submit("q1", 1)
    balancer.submit("q2", 1)
    with pytest.raises(Overloaded):
        balancer.submit("q3", 1)
    assert balancer.counters.rejected == {"queue_full": 1}


async def test_model_failure_fails_only_its_batch(make_balancer) -> None:
    worker = FakeWorker("w", fail_with=[BatchFailed("boom")])
    balancer = make_balancer([worker])
    bad = balancer.submit("a", 1)
    with pytest.raises(BatchFailed, match="boom"):
        await bad
    assert await balancer.submit("b", 1) == ("out", "b")


async def test_unexpected_worker_exception_becomes_batch_failed(make_balancer) -> None:
    worker = FakeWorker("w", fail_with=[RuntimeError("bug")])
    balancer = make_balancer([worker])
    with pytest.raises(BatchFailed, match="RuntimeError: bug"):
        await balancer.submit("a", 1)
    assert await balancer.submit("b", 1) == ("out", "b")


async def test_out_of_memory_splits_the_batch_and_lowers_the_cap(make_balancer) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], adaptive_batching=False, max_batch=4)
    balancer.submit("first", 1)
    await settle()
    futures = [balancer.submit(i, 1) for i in range(4)]
    worker.release()
    await settle()
    worker.fail_with.append(OutOfMemory("oom"))
    worker.release()  # the batch of 4 runs out of memory
    await settle()
    while worker.num_waiting:
        worker.release()
        await settle()
    assert worker.batches[1:] == [[1, 1, 1, 1], [1, 1], [1, 1]]
    assert [f.result() for f in futures] == [("out", i) for i in range(4)]
    assert balancer.snapshot().replicas[0].batch_size == 2  # the cap halved


async def test_drain_waits_for_admitted_work_then_refuses_new(make_balancer) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker])
    future = balancer.submit("a", 1)
    await settle()
    drain = asyncio.create_task(balancer.drain())
    await settle()
    assert not drain.done()
    with pytest.raises(ShuttingDown) as refused:
        balancer.submit("b", 1)
    assert refused.value.not_run  # refused as it came: safe to send elsewhere
    worker.release()
    await asyncio.wait_for(drain, timeout=5)
    assert future.result() == ("out", "a")


async def test_round_robin_alternates(make_balancer) -> None:
    workers = [FakeWorker("a"), FakeWorker("b")]
    balancer = make_balancer(workers, policy=Policy.ROUND_ROBIN)
    await asyncio.gather(*(balancer.submit(i, 1) for i in range(6)))
    assert sum(len(b) for b in workers[0].batches) == sum(len(b) for b in workers[1].batches)


async def test_shared_queue_lets_any_free_replica_take_the_next_batch(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    workers = [FakeWorker("a", gated=True), FakeWorker("b", gated=True)]
    balancer = make_balancer(workers, policy=Policy.SHARED_QUEUE, adaptive_batching=False,
                             max_batch=2)
    futures = [balancer.submit(i, 1) for i in range(5)]
    await settle()
    assert len(balancer._queues) == 1
    assert workers[0].num_waiting == 1 and workers[1].num_waiting == 1
    workers[1].release()
    await settle()
    fake_time.advance(MAX_WAIT_S)  # the one left waits out the max wait for a batch mate
    await settle()
    assert workers[1].num_waiting == 1  # b took the next batch while a is still busy
    for w in workers:
        while w.num_waiting:
            w.release()
            await settle()
    assert all(f.done() for f in futures)


async def test_least_work_sends_more_to_the_faster_replica(make_balancer) -> None:
    fast, slow = FakeWorker("fast", gated=True), FakeWorker("slow", gated=True)
    balancer = make_balancer([fast, slow], adaptive_batching=False, max_batch=8,
                             work_stealing=False)
    seed_fit(balancer, 0, 0.002, 0.0005)
    seed_fit(balancer, 1, 0.008, 0.002)  # 4x slower
    for i in range(40):
        balancer.submit(i, 1)
    loads = [r.queued_requests + r.load(0.0).running_requests for r in balancer.replicas]
    assert loads[0] > 2.5 * loads[1]
    # Both replicas finish their share at about the same predicted time.
    works = [r.load(1000.0).work_s() for r in balancer.replicas]
    assert max(works) - min(works) <= 0.008 + 0.002 * 8


@contextlib.asynccontextmanager
async def two_busy_replicas(make_balancer) -> AsyncIterator[tuple[ModelBalancer, Replica, Replica]]:
    """Two gated replicas of equal fits, each running one request: (balancer, runner, other).
    On exit every batch is released and both first requests are awaited."""
    balancer = make_balancer([FakeWorker("a", gated=True), FakeWorker("b", gated=True)],
                             adaptive_batching=False, max_batch=4)
    seed_fit(balancer, 0, 0.002, 0.0005)
    seed_fit(balancer, 1, 0.002, 0.0005)
    first = balancer.submit("first", 1)
    await settle()
    runner = next(r for r in balancer.replicas if r.worker.num_waiting)  # type: ignore[attr-defined]
    other = next(r for r in balancer.replicas if r is not runner)
    other_first = balancer.submit("other", 1)  # least work: goes to the idle one
    await settle()
    make_balancer.time.advance(MAX_WAIT_S)  # no batch mate came: it runs alone
    await settle()
    assert other.worker.num_waiting == 1  # type: ignore[attr-defined]
    yield balancer, runner, other
    for r in balancer.replicas:
        while r.worker.num_waiting:  # type: ignore[attr-defined]
            r.worker.release()  # type: ignore[attr-defined]
            await settle()
    await first
    await other_first


async def test_idle_replica_steals_queued_work_from_the_busiest(make_balancer) -> None:
    async with two_busy_replicas(make_balancer) as (balancer, runner, other):
        for i in range(8):  # queued directly on the runner: a mis-route the balancer must fix
            runner.enqueue(_job(balancer, i))
        other.worker.release()  # type: ignore[attr-defined]
        await settle()
        assert other.stats.num_stolen_requests == 4
        assert other.worker.batches[-1] == [1, 1, 1, 1]  # type: ignore[attr-defined]
        assert runner.queued_requests == 4


async def test_a_batch_starting_with_room_takes_work_queued_on_a_busier_replica(
        make_balancer) -> None:
    async with two_busy_replicas(make_balancer) as (balancer, runner, other):
        for i in range(6):  # queued on the running replica: bound there when they arrived
            runner.enqueue(_job(balancer, i))
        other.enqueue(_job(balancer, "own"))  # the other replica has one of its own queued
        other.worker.release()  # type: ignore[attr-defined]
        await settle()
        # Its next batch starts with room for 3 more: they come from the busier replica's tail.
        assert other.worker.batches[-1] == [1, 1, 1, 1]  # type: ignore[attr-defined]
        assert other.stats.num_stolen_requests == 3
        assert runner.queued_requests == 3


def _job(balancer: ModelBalancer, payload: object):
    from evenflow.balancer import Job

    return Job(payload, 1, 1000.0, math.inf, asyncio.get_running_loop().create_future())


async def test_partial_batch_passed_over_by_the_router_runs_without_waiting(
        make_balancer) -> None:
    workers = [FakeWorker(name, gated=True) for name in ("a", "b", "c")]
    # A long max wait: only the early close can start the forming batch within this test.
    balancer = make_balancer(workers, max_batch=8, work_stealing=False,
                             adaptive_batching=False)
    balancer.submit("busy", 1)  # runs alone at once: nothing else was in flight
    await settle()
    balancer.submit("first", 1)  # an idle replica; it waits to fill, as "busy" is in flight
    await settle()
    forming = next(r for r in balancer.replicas if r.queued_requests)
    assert forming.forming and not forming.worker.batches  # type: ignore[attr-defined]
    balancer.submit("second", 1)  # least work: the third, empty replica
    await settle()
    assert forming.worker.batches == [[1]]  # type: ignore[attr-defined]
    assert not forming.forming


async def test_a_lone_request_does_not_wait_for_batch_mates(make_balancer) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], max_batch=8, adaptive_batching=False)
    balancer.submit("only", 1)
    await settle()
    assert worker.batches == [[1]]


async def test_a_more_urgent_request_runs_before_older_less_urgent_ones(
        make_balancer: BalancerFactory) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], priority_levels=3, max_batch=2, adaptive_batching=False)
    first = balancer.submit("first", 1)  # starts at once, alone
    await settle()
    assert worker.num_waiting == 1
    low = [balancer.submit(f"low{i}", 1, priority=3) for i in range(2)]
    default = balancer.submit("default", 1)  # 0: the least urgent level unless configured
    urgent = balancer.submit("urgent", 1, priority=1)
    worker.release()
    await settle()
    assert first.done() and worker.batches[1] == [1, 1]
    worker.release()
    await settle()
    assert urgent.done() and low[0].done() and not low[1].done() and not default.done()
    worker.release()
    await settle()
    assert all(f.done() for f in (*low, default))


def test_priorities_past_the_levels_get_the_default_level_as_on_triton() -> None:
    config = BalancerConfig(priority_levels=2, default_priority_level=1)
    assert [config.level_of(p) for p in (0, 1, 2, 3, 2**64 - 1)] == [0, 0, 1, 0, 0]
    one_level = BalancerConfig()  # tritonclient's priority=2 on a default model is served
    assert [one_level.level_of(p) for p in (0, 1, 2)] == [0, 0, 0]
    with pytest.raises(InvalidRequest, match="priority -1 is negative"):
        config.level_of(-1)
    with pytest.raises(ValueError, match="default_priority_level 3"):
        BalancerConfig(priority_levels=2, default_priority_level=3)


async def measured_balancer(make_balancer: BalancerFactory, **overrides: object
                            ) -> tuple[ModelBalancer, FakeWorker]:
    """One gated replica that has measured a batch (so admission has a prediction)."""
    worker = FakeWorker("w", base_s=0.010, per_sample_s=0.001, gated=True)
    balancer = make_balancer([worker], max_batch=4, adaptive_batching=False, **overrides)
    first = balancer.submit("warm", 1)
    await settle()
    worker.release()
    await first
    return balancer, worker


async def test_admission_refuses_what_is_predicted_to_miss_a_declared_slo(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    balancer, _ = await measured_balancer(make_balancer, latency_target_s=0.05, slo_s=0.05)
    replica = balancer.replicas[0]
    admitted = 0
    with pytest.raises(Overloaded, match="over its SLO of 50 ms"):
        for _ in range(100):
            predicted_s = replica.load(fake_time()).work_s(1)
            balancer.submit("q", 1)
            admitted += 1
            assert predicted_s <= 0.05
    assert replica.load(fake_time()).work_s(1) > 0.05  # the refused one would have been late
    assert admitted >= 4  # at least a batch's worth fits in the target
    assert balancer.counters.rejected == {"latency_target": 1}


async def test_admission_refuses_what_is_predicted_to_miss_its_own_deadline(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    balancer, _ = await measured_balancer(make_balancer, max_queue_delay_s=math.inf)
    balancer.submit("running", 1)
    await settle()
    predicted_s = balancer.replicas[0].load(fake_time()).work_s(1)
    with pytest.raises(Overloaded, match="after the request's deadline"):
        balancer.submit("late", 1, deadline_s=fake_time() + 0.9 * predicted_s)
    balancer.submit("in time", 1, deadline_s=fake_time() + 1.1 * predicted_s)
    assert balancer.counters.rejected == {"deadline": 1}


async def test_a_queueing_budget_refuses_requests_that_would_wait_too_long(
        make_balancer: BalancerFactory) -> None:
    balancer, _ = await measured_balancer(make_balancer, max_queue_delay_s=0.0)
    balancer.submit("starts at once", 1)  # an idle replica: no wait
    await settle()
    with pytest.raises(Overloaded, match="over the queueing budget of 0 ms"):
        balancer.submit("would wait behind it", 1)
    assert balancer.counters.rejected == {"queue_delay": 1}


async def test_a_cancelled_request_gives_its_queue_slot_back(
        make_balancer: BalancerFactory) -> None:
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], max_queued_requests=2, max_queue_delay_s=math.inf)
    balancer.submit("running", 1)
    await settle()
    queued = [balancer.submit("q1", 1), balancer.submit("q2", 1)]
    queued[0].cancel()
    balancer.submit("takes q1's slot", 1)
    assert balancer.counters.dropped == {"cancelled": 1}
    with pytest.raises(Overloaded, match="limit 2"):
        balancer.submit("no slot left", 1)


async def test_a_dead_worker_has_its_batch_rerun_elsewhere_and_is_restarted(
        make_balancer: BalancerFactory) -> None:
    from evenflow.balancer import WorkerLost

    dying = FakeWorker("dying", fail_with=[WorkerLost("thread exited")])
    healthy = FakeWorker("healthy")
    balancer = make_balancer([dying, healthy], policy=Policy.ROUND_ROBIN)
    health_changes: list[list[bool]] = []
    balancer._on_health = lambda: health_changes.append([r.healthy for r in balancer.replicas])
    answer = balancer.submit("a", 1)  # round-robin sends it to "dying" first
    assert await answer == ("out", "a")  # re-run on "healthy"
    assert dying.batches == [[1]] and healthy.batches == [[1]]
    await settle()
    assert dying.restarted == 1
    assert health_changes == [[False, True], [True, True]]  # out of routing, then back
    assert balancer.counters.rerouted == 1


async def test_a_hung_worker_is_caught_by_the_watchdog(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    hung = FakeWorker("hung", gated=True)
    healthy = FakeWorker("healthy")
    balancer = make_balancer([hung, healthy], policy=Policy.ROUND_ROBIN)
    answer = balancer.submit("a", 1)
    await settle()
    # A cold replica's first batch is allowed the whole watchdog_s (30 s by default).
    fake_time.advance(balancer.config.watchdog_s - 0.001)
    await settle()
    assert not answer.done() and all(r.healthy for r in balancer.replicas)
    fake_time.advance(0.001)  # due: the watchdog now checks that the loop runs on time
    await settle()
    assert not answer.done()
    fake_time.advance(SETTLE_S)  # it did: the worker is hung
    await settle()
    assert answer.result() == ("out", "a")  # re-run on the healthy replica
    assert hung.batches == [[1]] and healthy.batches == [[1]]
    assert hung.restarted == 1 and all(r.healthy for r in balancer.replicas)


async def test_a_request_whose_workers_are_lost_twice_fails_unavailable(
        make_balancer: BalancerFactory) -> None:
    from evenflow.balancer import ErrorCode, WorkerLost

    workers = [FakeWorker(f"w{i}", fail_with=[WorkerLost("died")]) for i in range(2)]
    balancer = make_balancer(workers, policy=Policy.ROUND_ROBIN)
    answer = balancer.submit("a", 1)
    with pytest.raises(WorkerLost, match="lost twice") as info:
        await answer
    assert info.value.code is ErrorCode.UNAVAILABLE
    assert not info.value.not_run  # it ran, twice: a client must not send it again blindly


async def test_with_no_replica_in_service_requests_hear_unavailable(
        make_balancer: BalancerFactory) -> None:
    from evenflow.balancer import ErrorCode, WorkerLost

    class Unrestartable(FakeWorker):
        async def restart(self) -> None:
            raise WorkerLost("the device is gone")

    worker = Unrestartable("only", fail_with=[WorkerLost("died")])
    balancer = make_balancer([worker])
    states: list[bool] = []
    balancer._on_health = lambda: states.append(balancer.serving)
    first = balancer.submit("a", 1)
    with pytest.raises(WorkerLost, match="no other replica is in service"):
        await first
    assert states == [False] and not balancer.serving  # health would say NOT_SERVING
    with pytest.raises(WorkerLost, match="no replica in service") as info:
        balancer.submit("b", 1)
    assert info.value.code is ErrorCode.UNAVAILABLE


async def test_a_request_with_a_tight_deadline_runs_before_older_ones(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    # Earliest deadline first within a level: a request without a deadline is due at its
    # arrival plus the latency target (50 ms), so one due in 10 ms goes ahead of older ones.
    worker = FakeWorker("w", gated=True)
    balancer = make_balancer([worker], max_batch=1, adaptive_batching=False)
    first = balancer.submit("first", 1)
    await settle()
    older = [balancer.submit(f"older{i}", 1) for i in range(2)]
    tight = balancer.submit("tight", 1, deadline_s=fake_time() + 0.010)
    worker.release()
    await settle()
    assert first.done() and not tight.done()
    worker.release()
    await settle()
    assert tight.done() and not any(f.done() for f in older)
    for _ in older:
        worker.release()
        await settle()
    assert [f.result() for f in older] == [("out", "older0"), ("out", "older1")]


async def test_late_binding_moves_jobs_a_faster_replica_now_finishes_sooner(
        make_balancer: BalancerFactory) -> None:
    slow = FakeWorker("slow", gated=True, base_s=0.050, per_sample_s=0.0005)
    fast = FakeWorker("fast", gated=True, base_s=0.002, per_sample_s=0.0005)
    balancer = make_balancer([slow, fast], adaptive_batching=False, max_batch=4,
                             work_stealing=False)
    seed_fit(balancer, 0, 0.050, 0.0005)
    seed_fit(balancer, 1, 0.002, 0.0005)
    slow_replica, fast_replica = balancer.replicas
    busy = [balancer.submit("one", 1)]  # runs on the fast replica
    placed = _job(balancer, "placed")
    placed.rebound = True  # already moved once: it stays on the slow replica and runs there
    slow_replica.enqueue(placed)
    busy.append(placed.future)
    await settle()
    assert slow.num_waiting == fast.num_waiting == 1
    for i in range(3):  # bound to the slow replica when they arrived (a mis-route)
        slow_replica.enqueue(_job(balancer, i))
    slow.release()  # the slow one is about to start them: each finishes sooner on the other
    await settle()
    assert balancer.counters.rebound == 3
    assert fast_replica.queued_requests == 3 and not slow_replica.queued_requests
    assert slow.batches == [[1]]  # nothing more started there
    while fast.num_waiting:
        fast.release()
        await settle()
    assert fast.batches[1:] == [[1, 1, 1]]
    await asyncio.gather(*busy)


async def test_late_binding_keeps_jobs_that_finish_soonest_where_they_are(
        make_balancer: BalancerFactory) -> None:
    workers = [FakeWorker("a", gated=True, base_s=0.002, per_sample_s=0.0005),
               FakeWorker("b", gated=True, base_s=0.050, per_sample_s=0.0005)]
    balancer = make_balancer(workers, adaptive_batching=False, max_batch=4, work_stealing=False)
    seed_fit(balancer, 0, 0.002, 0.0005)
    seed_fit(balancer, 1, 0.050, 0.0005)  # the other replica is slower
    fast, slow = balancer.replicas
    for replica, worker in ((slow, workers[1]), (fast, workers[0])):
        job = _job(balancer, replica.name)
        job.rebound = True  # placed: each runs one batch where it is
        replica.enqueue(job)
        await settle()
        if replica is slow:  # the slow one has now measured itself just now: idle, not stale
            worker.release()
            await job.future
    first = job.future
    for i in range(3):
        fast.enqueue(_job(balancer, i))
    workers[0].release()
    await settle()
    assert balancer.counters.rebound == 0 and workers[0].batches[1] == [1, 1, 1]
    workers[0].release()
    await first


async def test_models_sharing_a_device_see_each_others_work(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    ledger = DeviceLedger()
    balancers = []
    for model in ("a", "b"):
        workers = [FakeWorker(f"{model}{i}", gated=True, devices=(f"dev{i}",)) for i in (0, 1)]
        balancer = make_balancer(workers, model_name=model, ledger=ledger,
                                 adaptive_batching=False, max_batch=4, work_stealing=False)
        for index in (0, 1):
            seed_fit(balancer, index, 0.010, 0.001)
        balancers.append(balancer)
    a, b = balancers
    for i in range(12):  # model a's work, all placed on dev0
        a.replicas[0].enqueue(_job(a, i))
    await settle()
    assert a.replicas[0].load(fake_time()).work_s() > 0.04
    # Model b's replica on dev0 holds nothing of its own, but its device is busy with a's work.
    assert b.replicas[0].load(fake_time()).work_s() >= a.replicas[0].own_load(fake_time()).work_s()
    futures = [b.submit(f"b{i}", 1) for i in range(4)]
    await settle()
    assert not b.replicas[0].worker.batches  # type: ignore[attr-defined]
    assert b.replicas[1].worker.batches == [[1, 1, 1, 1]]  # type: ignore[attr-defined]
    for balancer in balancers:
        for replica in balancer.replicas:
            while replica.worker.num_waiting:  # type: ignore[attr-defined]
                replica.worker.release()  # type: ignore[attr-defined]
                await settle()
    await make_balancer.close()
    assert all(f.done() for f in futures)
    assert not ledger._by_device  # closing the balancers took their replicas out


async def test_a_cold_replica_on_a_shared_device_does_not_make_it_look_infinitely_busy(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    # A replica that has not measured a batch prices its own work as unknown (infinite) while
    # it runs its probe batch; to the other model on that device it counts nothing, so the
    # other model's prices, batch sizes and admission stay finite.
    ledger = DeviceLedger()
    cold_worker = FakeWorker("cold", gated=True, devices=("dev0",))
    cold = make_balancer([cold_worker], model_name="cold", ledger=ledger)
    warm = make_balancer([FakeWorker("warm", devices=("dev0",))], model_name="warm",
                         ledger=ledger)
    seed_fit(warm, 0, 0.010, 0.001)
    probe = cold.submit("probe", 1)
    await settle()
    assert math.isinf(cold.replicas[0].own_load(fake_time()).work_s(1))
    assert math.isfinite(warm.replicas[0].load(fake_time()).work_s(1))
    served = warm.submit("x", 1)
    await settle()
    assert not served.done()  # the device is the probe's turn until its batch ends
    cold_worker.release()
    await probe
    assert await served == ("out", "x")


async def test_on_a_shared_device_a_batch_is_formed_when_its_turn_comes(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    # Model b's first request is ready while model a's batch holds dev0; the requests that
    # reach b during that batch join b's, which is taken from the queue only once dev0 is b's.
    ledger = DeviceLedger()
    a_worker = FakeWorker("a", gated=True, devices=("dev0",))
    b_worker = FakeWorker("b", gated=True, devices=("dev0",))
    a = make_balancer([a_worker], model_name="a", ledger=ledger, adaptive_batching=False,
                      max_batch=8)
    b = make_balancer([b_worker], model_name="b", ledger=ledger, adaptive_batching=False,
                      max_batch=8)
    first = a.submit("a0", 1)
    await settle()
    assert a_worker.batches == [[1]]
    waiting = [b.submit(f"b{i}", 1) for i in range(3)]
    await settle()
    assert not b_worker.batches and ledger.turns.waiting("dev0") == 1
    fake_time.advance(0.004)  # a's batch runs on
    a_worker.release()
    await settle()
    assert b_worker.batches == [[1, 1, 1]]  # one batch, formed after a's turn ended
    assert b.replicas[0].stats.turn_wait_s == pytest.approx(0.004)  # sharing's cost, counted
    assert a.replicas[0].stats.turn_wait_s == 0.0
    assert not a_worker.num_waiting
    b_worker.release()
    assert [await f for f in (first, *waiting)] == [("out", p) for p in ("a0", "b0", "b1", "b2")]
    assert not ledger.turns.held("dev0")


async def b_waits_behind_a(make_balancer: BalancerFactory, a_worker: FakeWorker
                           ) -> tuple[DeviceLedger, ModelBalancer, asyncio.Future[Any],
                                      asyncio.Future[Any]]:
    """Models a and b on dev0: a's request runs on ``a_worker`` (gated) while b's waits for
    the turn. The ledger, b's balancer, a's request and b's."""
    ledger = DeviceLedger()
    a = make_balancer([a_worker], model_name="a", ledger=ledger)
    b = make_balancer([FakeWorker("b", devices=("dev0",))], model_name="b", ledger=ledger)
    running = a.submit("a0", 1)
    await settle()
    waiting = b.submit("b0", 1)
    await settle()
    assert not waiting.done() and ledger.turns.waiting("dev0") == 1
    return ledger, b, running, waiting


async def test_a_failed_batch_on_a_shared_device_hands_the_turn_on(
        make_balancer: BalancerFactory) -> None:
    failing = FakeWorker("a", gated=True, devices=("dev0",), fail_with=[RuntimeError("oom")])
    _, _, doomed, served = await b_waits_behind_a(make_balancer, failing)
    failing.release()
    with pytest.raises(BatchFailed, match="oom"):
        await doomed
    assert await served == ("out", "b0")  # the failure ended a's turn; b's came


async def test_a_model_closed_while_it_waits_for_a_turn_fails_its_requests_and_leaves_the_line(
        make_balancer: BalancerFactory) -> None:
    holder = FakeWorker("a", gated=True, devices=("dev0",))
    ledger, b, running, waiting = await b_waits_behind_a(make_balancer, holder)
    await b.close()
    with pytest.raises(ShuttingDown):
        await waiting
    assert ledger.turns.waiting("dev0") == 0
    holder.release()
    assert await running == ("out", "a0")
    await settle()
    assert not ledger.turns.held("dev0")  # nobody left in line: the device is free again


async def test_an_added_replica_takes_work_at_once(make_balancer) -> None:
    busy = FakeWorker("busy", gated=True)
    balancer = make_balancer([busy], policy=Policy.LEAST_WORK)
    first = balancer.submit(0, 1)
    await settle()
    assert busy.batches == [[1]]
    joined = FakeWorker("joined")
    balancer.add_replica(joined)
    second = balancer.submit(1, 1)
    await settle()
    assert joined.batches == [[1]]  # idle and cold: it gets the request, not the busy one
    assert second.result() == ("out", 1)
    busy.release()
    await settle()
    assert first.result() == ("out", 0)
    assert [r.worker for r in balancer.replicas] == [busy, joined]


async def test_a_removed_replica_hands_its_queue_over_and_finishes_its_batch(
        make_balancer) -> None:
    leaving = FakeWorker("leaving", gated=True)
    staying = FakeWorker("staying", gated=True)
    balancer = make_balancer([leaving, staying], policy=Policy.ROUND_ROBIN,
                             adaptive_batching=False, max_batch=1)
    futures = [balancer.submit(i, 1) for i in range(4)]  # 0, 2 -> leaving; 1, 3 -> staying
    await settle()
    assert leaving.batches == [[1]] and staying.batches == [[1]]
    removal = asyncio.create_task(balancer.remove_device("leaving"))
    await settle()
    assert not removal.done()  # its running batch is not finished yet
    leaving.release()  # request 0 finishes where it ran
    await settle()
    await removal
    assert [r.worker for r in balancer.replicas] == [staying]
    assert leaving.closed and not staying.closed  # the balancer closed the worker it removed
    while staying.num_waiting:  # 1, then 3 and the moved 2, one batch each
        staying.release()
        await settle()
    assert [f.result() for f in futures] == [("out", i) for i in range(4)]
    assert len(leaving.batches) == 1  # request 2 moved, never ran there


async def test_statistics_are_a_copy_taken_when_asked(make_balancer: BalancerFactory) -> None:
    worker = FakeWorker("w", base_s=0.010, per_sample_s=0.001)
    balancer = make_balancer([worker])
    assert await balancer.submit("a", 1) == ("out", "a")
    before = balancer.statistics()
    assert await balancer.submit("b", 1) == ("out", "b")
    after = balancer.statistics()
    assert (before.inference_count, before.execution_count, before.success.count) == (1, 1, 1)
    assert (after.inference_count, after.execution_count, after.success.count) == (2, 2, 2)
    assert before.batches[1].compute_infer.count == 1  # the copy did not move on
    assert after.batches[1].compute_infer.total_s == pytest.approx(2 * 0.011)
    assert before.latency_buckets[-1] == (math.inf, 1) and after.latency_buckets[-1][1] == 2
    assert before.cpu_seconds is None


async def test_admin_controls_reach_the_simulated_devices_of_the_balancers_workers(
        make_balancer: BalancerFactory) -> None:
    class SimWorker(FakeWorker):
        """Simulates its one device: records the speed and faults it is given."""

        speed = 1.0
        faults: list[tuple[str, int]]

        async def set_device_speed(self, device: str, speed: float) -> float:
            previous, self.speed = self.speed, speed
            return previous

        async def set_device_fault(self, device: str, fault: str, count: int) -> None:
            self.faults.append((fault, count))

    sim = SimWorker("sim0")
    sim.faults = []
    real = FakeWorker("cuda0")  # a real device: its speed and faults are what they are
    balancer = make_balancer([sim, real])
    assert await balancer.set_device_speed("sim0", 0.5) == 1.0 and sim.speed == 0.5
    assert await balancer.set_device_speed("cuda0", 0.5) is None
    assert await balancer.set_device_speed("nowhere", 0.5) is None
    assert await balancer.set_device_fault("sim0", "hang", 2) and sim.faults == [("hang", 2)]
    assert not await balancer.set_device_fault("cuda0", "hang", 1)


async def test_a_replica_removed_twice_at_once_leaves_once(make_balancer) -> None:
    # The placer drains a replica while its device leaves: both removals end, neither fails.
    leaving = FakeWorker("leaving", gated=True)
    staying = FakeWorker("staying", gated=True)
    balancer = make_balancer([leaving, staying], policy=Policy.ROUND_ROBIN,
                             adaptive_batching=False, max_batch=1)
    future = balancer.submit(0, 1)
    await settle()
    assert leaving.batches == [[1]]  # a running batch keeps both removals waiting
    drain = asyncio.create_task(balancer.remove_replica(leaving))
    gone = asyncio.create_task(balancer.remove_device("leaving"))
    await settle()
    assert not drain.done() and not gone.done()
    leaving.release()
    await settle()
    assert await gone == 1
    await drain
    assert [r.worker for r in balancer.replicas] == [staying] and leaving.closed
    assert future.result() == ("out", 0)


async def test_a_stale_replica_steals_only_what_its_old_fit_says_finishes_sooner(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    # A stale replica (idle on a fit measured long ago) is priced at no work at all so that
    # routing sends it one probe; stealing by that price would take a batch from a busy
    # replica to a device that may still be slow.
    workers = [FakeWorker("fast", gated=True), FakeWorker("slow", gated=True)]
    balancer = make_balancer(workers, adaptive_batching=False, max_batch=4)
    seed_fit(balancer, 0, 0.002, 0.0005)
    seed_fit(balancer, 1, 0.050, 0.0005)  # measured (long ago, by the fake clock): stale
    fast, slow = balancer.replicas
    assert slow.load(fake_time()).stale
    first = _job(balancer, "first")
    fast.enqueue(first)
    await settle()
    queued = [_job(balancer, i) for i in range(3)]
    for job in queued:  # bound to the busy fast replica: 3 ms there, 51.5 ms by the slow fit
        fast.enqueue(job)
    fake_time.advance(0.1)  # the idle slow replica looks for work every 20 ms meanwhile
    await settle()
    assert slow.stats.num_stolen_requests == 0 and fast.queued_requests == 3
    while workers[0].num_waiting or fast.queued_requests:
        workers[0].release()
        await settle()
        fake_time.advance(MAX_WAIT_S)
        await settle()
    await asyncio.gather(first.future, *(job.future for job in queued))
    assert workers[1].batches == []


async def test_least_work_routes_past_a_sooner_replica_whose_answers_come_late(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    # Replica a is predicted sooner (10.5 ms) but its answers have come 45 ms late; b is
    # predicted at 30.5 ms and on time. Within a 50 ms target only b answers in time.
    workers = [FakeWorker("a", gated=True), FakeWorker("b", gated=True)]
    # Late binding would give x back to a as b's batch starts: a is b's only alternative, and
    # where no other replica is in time it takes the soonest, as routing does
    # (docs/architecture.md).
    balancer = make_balancer(workers, adaptive_batching=False, max_batch=4,
                             latency_target_s=0.050, late_binding=False)
    seed_fit(balancer, 0, 0.010, 0.0005)
    seed_fit(balancer, 1, 0.030, 0.0005)
    for replica in balancer.replicas:
        replica._last_done_s = fake_time()  # measured just now: priced by its fit, not stale
    late = balancer.replicas[0]._lateness
    late.add(0.045)
    late.refresh(fake_time())
    first = balancer.submit("x", 1)
    await settle()
    assert (workers[0].num_waiting, workers[1].num_waiting) == (0, 1)
    # With a due time a spread cannot matter to (a 1 s target), the sooner one.
    balancer.config = dataclasses.replace(balancer.config, latency_target_s=1.0)
    second = balancer.submit("y", 1)
    await settle()
    assert balancer.replicas[0].queued_requests == 1  # forming: x is in flight elsewhere
    fake_time.advance(MAX_WAIT_S)
    await settle()
    for worker in workers:
        worker.release()
    assert await asyncio.gather(first, second) == [("out", "x"), ("out", "y")]


def _stale_and_fresh(make_balancer: BalancerFactory, fake_time: FakeTime) -> ModelBalancer:
    """Replicas a and b with one reliable fit (10.5 ms a request); a has sat idle for 2 s, so
    routing prices it at a probe's no work and sends it the next request."""
    workers = [FakeWorker("a", gated=True), FakeWorker("b", gated=True)]
    balancer = make_balancer(workers, adaptive_batching=False, max_batch=4,
                             latency_target_s=0.050, work_stealing=False, late_binding=False)
    for index in (0, 1):
        seed_fit(balancer, index, 0.010, 0.0005)
    balancer.replicas[0]._last_done_s = fake_time() - 2.0
    balancer.replicas[1]._last_done_s = fake_time()
    return balancer


async def test_a_stale_replicas_probe_is_predicted_by_its_fit(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    # Predicted at "now" (its probe price), the answer would teach a a spread of its whole
    # batch time, and routing would then pass it over as late.
    balancer = _stale_and_fresh(make_balancer, fake_time)
    stale = balancer.replicas[0]
    future = balancer.submit("x", 1)
    await settle()
    assert stale.worker.num_waiting == 1
    fake_time.advance(0.0105)  # answered exactly when its fit says
    stale.worker.release()
    assert await future == ("out", "x")
    assert stale.lateness_margin_s(fake_time()) == pytest.approx(0.0, abs=1e-9)


async def test_a_stale_replicas_probe_is_admitted_whatever_spread_its_old_answers_left(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    # Its answers came 60 ms late before it idled; routing sends it the probe regardless, so
    # admission must not refuse the probe by that spread (b would have answered in time).
    balancer = _stale_and_fresh(make_balancer, fake_time)
    stale = balancer.replicas[0]
    stale._lateness.add(0.060)
    stale._lateness.refresh(fake_time())
    future = balancer.submit("x", 1, deadline_s=fake_time() + 0.050)
    await settle()
    assert stale.worker.num_waiting == 1
    fake_time.advance(0.0105)
    stale.worker.release()
    assert await future == ("out", "x")


async def test_late_binding_moves_a_job_to_where_it_answers_in_time_by_its_spread(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    slow, wide, narrow = (FakeWorker(name, gated=True) for name in ("slow", "wide", "narrow"))
    balancer = make_balancer([slow, wide, narrow], adaptive_batching=False, max_batch=4,
                             work_stealing=False)
    for index, base_s in enumerate((0.050, 0.002, 0.020)):
        seed_fit(balancer, index, base_s, 0.0005)
        balancer.replicas[index]._last_done_s = fake_time()  # measured just now: not stale
    slow_replica, wide_replica, narrow_replica = balancer.replicas
    late = wide_replica._lateness  # its answers have come 60 ms after their predictions
    late.add(0.060)
    late.refresh(fake_time())
    placed = _job(balancer, "placed")
    placed.rebound = True  # stays on the slow replica, and holds it while the next one queues
    slow_replica.enqueue(placed)
    await settle()
    from evenflow.balancer import Job

    due = Job("due", 1, fake_time(), math.inf, asyncio.get_running_loop().create_future(),
              due_s=fake_time() + 0.050)
    slow_replica.enqueue(due)
    slow.release()  # about to start it: 50 ms here, 2.5 ms on the wide one but 60 ms late
    await settle()
    assert narrow_replica.queued_requests + narrow.num_waiting == 1
    assert not wide_replica.queued_requests and not wide.num_waiting
    fake_time.advance(MAX_WAIT_S)
    await settle()
    narrow.release()
    assert await due.future == ("out", "due")
    await placed.future


async def test_a_shared_queue_admits_by_the_lateness_of_the_models_answers(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    # A shared queue's request runs on whichever replica frees first: its lateness is that of
    # the model's answers from all of them, not of the replica routing names.
    workers = [FakeWorker("a"), FakeWorker("b")]
    balancer = make_balancer(workers, policy=Policy.SHARED_QUEUE, max_batch=4)
    seed_fit(balancer, 0, 0.010, 0.0005)
    seed_fit(balancer, 1, 0.010, 0.0005)
    late = balancer.replicas[1]._lateness  # an answer from b came 45 ms late
    late.add(0.045)
    late.refresh(fake_time())
    # Routing names a (the queue's first replica), whose window is b's too.
    assert balancer.replicas[0].lateness_margin_s(fake_time()) == pytest.approx(0.045)
    with pytest.raises(Overloaded, match="deadline"):
        balancer.submit("x", 1, deadline_s=fake_time() + 0.040)
    assert balancer.counters.rejected == {"deadline": 1}
