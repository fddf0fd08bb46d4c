"""What the balancer and its replicas do when things go wrong and come right again: answers
after a worker loss and what admission learns from them, a worker that answers the wrong
number of outputs, replicas out of routing beside a shared queue, restarts that finish after
the replica was retired or removed, a batch split for memory when the model closes, a drain
while a batch forms, and a device whose batches measure no time at all.

Fake workers gate each batch and ``FakeTime`` moves only when the test says so; nothing sleeps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from evenflow.balancer import (
    BatchFailed,
    BatchResult,
    DeviceLost,
    Job,
    OutOfMemory,
    Overloaded,
    Policy,
    ShuttingDown,
    WorkerLost,
)
from evenflow.balancer.replica import Replica
from evenflow.balancer.stats import LATENESS_FORGET_S
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import BalancerFactory, FakeTime, release_all, seed_fit, settle

pytestmark = pytest.mark.timeout(10)


async def served(factory: BalancerFactory, *futures: asyncio.Future[Any]) -> None:
    """Open the gates of every balancer ``factory`` made, and move its clock on in 1 ms steps,
    until ``futures`` are all done (1 s of fake time at most)."""
    for _ in range(1000):
        await settle()
        if all(future.done() for future in futures):
            return
        for balancer in factory._made:
            release_all(balancer)
        await settle()
        factory.time.advance(0.001)
    raise AssertionError("not answered within 1 s of fake time")


# Lateness: what re-run jobs teach admission, and how long a margin lasts.

async def test_jobs_rerun_after_a_worker_loss_do_not_poison_the_lateness_margin(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    lost = FakeWorker("a", gated=True, fail_with=[WorkerLost("died")])
    balancer = make_balancer([lost])
    seed_fit(balancer, 0, 0.002, 0.0005)  # reliable: each admitted job carries a prediction
    futures = [balancer.submit(i, 1) for i in range(8)]
    await settle()
    balancer.add_replica(FakeWorker("b"))
    fake_time.advance(3.0)  # the watchdog takes the batch back after 2 s; it is re-run
    await served(make_balancer, *futures)
    assert all(f.result()[0] == "out" for f in futures) and balancer.counters.rerouted
    # What the re-run jobs waited for was the watchdog, not a prediction missed by 2 s.
    assert all(r.lateness_margin_s(fake_time()) < 0.1 for r in balancer.replicas)
    admitted = balancer.submit("tight", 1, deadline_s=fake_time() + 1.0)
    await served(make_balancer, admitted)
    assert admitted.result() == ("out", "tight")


async def test_a_lateness_margin_no_answer_has_confirmed_lately_is_forgotten(
        make_balancer: BalancerFactory, fake_time: FakeTime) -> None:
    stalled = FakeWorker("a", gated=True)
    balancer = make_balancer([stalled])
    seed_fit(balancer, 0, 0.002, 0.0005)
    futures = [balancer.submit(i, 1) for i in range(8)]
    await settle()
    fake_time.advance(1.5)  # a stall short of the watchdog: every answer comes 1.5 s late
    await served(make_balancer, *futures)
    assert balancer.replicas[0].lateness_margin_s(fake_time()) > 1.0
    with pytest.raises(Overloaded, match="deadline"):  # refused on fresh evidence
        balancer.submit("tight", 1, deadline_s=fake_time() + 1.0)
    # Every request carries a deadline that close, so none is admitted to refresh the margin:
    # once no answer has confirmed it for a while, it is forgotten, not kept for ever.
    fake_time.advance(LATENESS_FORGET_S)
    admitted = balancer.submit("tight", 1, deadline_s=fake_time() + 1.0)
    await served(make_balancer, admitted)
    assert admitted.result() == ("out", "tight")


# A worker that breaks the protocol.

@dataclass
class WrongCountWorker(FakeWorker):
    """Its first ``short`` batches answer no outputs at all (a worker bug)."""

    short: int = 1

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        result = await super().run(jobs)
        if self.short:
            self.short -= 1
            return BatchResult([], result.timing)
        return result


async def test_a_worker_answering_the_wrong_number_of_outputs_fails_its_batch_only(
        make_balancer: BalancerFactory) -> None:
    balancer = make_balancer([WrongCountWorker("w")])
    first = balancer.submit("a", 1)
    await served(make_balancer, first)
    with pytest.raises(BatchFailed, match="returned 0 outputs for a batch of 1 requests"):
        first.result()
    second = balancer.submit("b", 1)
    await served(make_balancer, second)  # the replica's loop lives on
    assert second.result() == ("out", "b")
    assert balancer.admitted_requests == 0


# Replicas out of routing beside a shared queue.

async def test_a_leaving_replica_takes_nothing_more_from_the_shared_queue(
        make_balancer: BalancerFactory) -> None:
    leaving, staying = FakeWorker("a", gated=True), FakeWorker("b", gated=True)
    balancer = make_balancer([leaving, staying], policy=Policy.SHARED_QUEUE,
                             adaptive_batching=False, max_batch=1)
    futures = [balancer.submit(i, 1) for i in range(4)]
    await settle()
    assert leaving.batches == [[1]] and staying.batches == [[1]]
    removal = asyncio.create_task(balancer.remove_replica(leaving))
    await settle()
    leaving.release()  # its running batch finishes where it ran
    await settle()
    assert len(leaving.batches) == 1  # the two queued ones are the staying replica's now
    await asyncio.wait_for(removal, 5)
    await served(make_balancer, *futures)
    assert [f.result() for f in futures] == [("out", i) for i in range(4)]
    assert len(staying.batches) == 3


# Restarts that finish after the replica left routing for another reason.

@dataclass
class SlowRestartPipeline(FakeWorker):
    """Two batches in flight (a pipeline); a restart ends when the test sets ``restart_gate``."""

    max_in_flight = 2
    restart_gate: asyncio.Event = field(default_factory=asyncio.Event)

    async def restart(self) -> None:
        await self.restart_gate.wait()
        await super().restart()


async def test_a_restart_that_ends_after_the_device_was_lost_leaves_the_replica_retired(
        make_balancer: BalancerFactory) -> None:
    worker = SlowRestartPipeline("p", gated=True,
                                 fail_with=[WorkerLost("died"), DeviceLost("poisoned")])
    balancer = make_balancer([worker], adaptive_batching=False, max_batch=1)
    futures = [balancer.submit(i, 1) for i in range(2)]
    await settle()
    assert worker.num_waiting == 2
    worker.release()  # batch 1: the worker is lost, its restart begins
    await settle()
    worker.release()  # batch 2: the device is lost too, for good
    await settle()
    (replica,) = balancer.replicas
    assert replica.unusable_reason == "poisoned" and not balancer.serving
    worker.restart_gate.set()  # the restart begun before that ends
    await settle()
    assert worker.restarted == 1
    assert not replica.healthy and not balancer.serving  # still retired
    assert all(isinstance(f.exception(), WorkerLost) for f in futures)


async def test_a_restart_that_ends_while_the_replica_leaves_keeps_it_out_of_routing(
        make_balancer: BalancerFactory) -> None:
    worker = SlowRestartPipeline("p", gated=True, fail_with=[WorkerLost("died")])
    balancer = make_balancer([worker], adaptive_batching=False, max_batch=1)
    lost, running = (balancer.submit(i, 1) for i in range(2))
    await settle()
    worker.release()  # batch 1: the worker is lost, its restart begins; batch 2 runs on
    await settle()
    removal = asyncio.create_task(balancer.remove_replica(worker))
    await settle()
    assert not removal.done()  # it waits for batch 2
    worker.restart_gate.set()
    await settle()
    assert worker.restarted == 1
    assert not balancer.replicas[0].healthy and not balancer.serving  # it is leaving
    worker.release()
    await asyncio.wait_for(removal, 5)
    assert not balancer.replicas and worker.closed
    assert isinstance(lost.exception(), WorkerLost) and running.result() == ("out", 1)


# A batch split for memory.

async def test_closing_during_an_out_of_memory_split_answers_both_halves(
        make_balancer: BalancerFactory) -> None:
    worker = FakeWorker("w", gated=True, fail_with=[OutOfMemory("oom")])
    balancer = make_balancer([worker], adaptive_batching=False, max_batch=2)
    futures = [balancer.submit(i, 1) for i in range(2)]
    await settle()
    worker.release()  # out of memory: the first half runs alone
    await settle()
    assert worker.batches == [[1, 1], [1]]
    await balancer.close()
    errors = [f.exception() for f in futures]
    assert all(isinstance(e, ShuttingDown) for e in errors)
    # The half that was running may have run; the half that waited for it did not.
    assert [getattr(e, "not_run", None) for e in errors] == [False, True]
    assert balancer.admitted_requests == 0


async def test_a_worker_lost_in_the_first_half_of_a_split_runs_the_second_half_elsewhere(
        make_balancer: BalancerFactory) -> None:
    split = FakeWorker("a", gated=True, fail_with=[OutOfMemory("oom"), WorkerLost("died")])
    balancer = make_balancer([split], adaptive_batching=False, max_batch=2)
    futures = [balancer.submit(i, 1) for i in range(2)]
    await settle()
    assert split.batches == [[1, 1]]
    other = FakeWorker("b")
    balancer.add_replica(other)
    split.release()  # out of memory: the first half runs alone
    await settle()
    split.release()  # the worker is lost under the first half
    await served(make_balancer, *futures)
    assert split.batches == [[1, 1], [1]]  # the second half never ran on the lost worker
    assert [f.result() for f in futures] == [("out", 0), ("out", 1)]
    assert other.batches and balancer.counters.rerouted == 2


# Drain while a batch forms.

async def test_drain_waits_for_a_forming_batch_without_spinning(
        make_balancer: BalancerFactory, fake_time: FakeTime,
        monkeypatch: pytest.MonkeyPatch) -> None:
    balancer = make_balancer([FakeWorker("a"), FakeWorker("b")], policy=Policy.ROUND_ROBIN,
                             adaptive_batching=False, max_batch=4, work_stealing=False)
    futures = [balancer.submit(i, 1) for i in range(2)]
    await settle()
    # One request each, and another in flight: each waits out max_wait_s for batch mates.
    assert all(replica.forming for replica in balancer.replicas)
    calls = 0
    wait_quiet = Replica.wait_quiet

    async def counted(replica: Replica) -> None:
        nonlocal calls
        calls += 1
        await wait_quiet(replica)

    monkeypatch.setattr(Replica, "wait_quiet", counted)
    drain = asyncio.create_task(balancer.drain())
    await settle()
    assert calls == 2 and not drain.done()  # one wait per replica, not a spin
    await served(make_balancer, *futures)
    await asyncio.wait_for(drain, 5)
    assert calls <= 6


# A device whose batches take no measurable time.

async def test_batches_measured_at_zero_seconds_leave_shared_queue_routing_working(
        make_balancer: BalancerFactory) -> None:
    workers = [FakeWorker(name, base_s=0.0, per_sample_s=0.0) for name in ("a", "b")]
    balancer = make_balancer(workers, policy=Policy.SHARED_QUEUE)
    first = balancer.submit("a", 1)
    await served(make_balancer, first)
    second = balancer.submit("b", 1)  # priced by the rate both replicas drain the queue at
    await served(make_balancer, second)
    assert (first.result(), second.result()) == (("out", "a"), ("out", "b"))
    assert all(replica.predict_s(1) > 0.0 for replica in balancer.replicas)  # never free
