"""A replica alone: its waits on the injected time source, and what it asks of its owner.

The owner is a hand-written ``ReplicaOwner`` that records each call; the clock is ``FakeTime``,
so the server's wait values (2 ms to fill a batch, 30 s watchdog, 50 ms first restart delay)
end exactly when the test moves the clock, never before.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from evenflow.balancer import BalancerConfig, Job, ShuttingDown, WorkerLost
from evenflow.balancer.queue import JobQueue
from evenflow.balancer.replica import Replica
from evenflow.balancer.stats import ModelCounters
from evenflow.balancer.timebase import LoopTime, as_time_source, sleep_s
from evenflow.balancer.watchdog import SETTLE_S
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import FakeTime, settle

pytestmark = pytest.mark.timeout(10)

CONFIG = BalancerConfig(adaptive_batching=False, max_batch=4)


class RecordingOwner:
    """A ``ReplicaOwner`` that says other requests are in flight (so batches wait to fill),
    never moves work, and records what the replica told it."""

    def __init__(self) -> None:
        self.others = True
        self.lost_calls: list[tuple[list[Job], list[Job]]] = []
        self.restored_calls = 0

    def others_in_flight(self, replica: Replica) -> bool:
        return self.others

    def find_work(self, replica: Replica) -> None:
        return None

    def rebind(self, replica: Replica, batch: list[Job]) -> list[Job]:
        return batch

    def lost(self, replica: Replica, running: list[Job], queued: list[Job]) -> None:
        self.lost_calls.append((running, queued))

    def restored(self, replica: Replica) -> None:
        self.restored_calls += 1


@pytest.fixture
async def make_replica(fake_time: FakeTime
                       ) -> AsyncIterator[Callable[..., Replica]]:
    made: list[Replica] = []

    def make(worker: FakeWorker, owner: RecordingOwner | None = None,
             config: BalancerConfig = CONFIG) -> Replica:
        replica = Replica(worker=worker, queue=JobQueue(time=fake_time), config=config,
                          counters=ModelCounters(), time_source=fake_time, owner=owner)
        replica.start()
        made.append(replica)
        return replica

    yield make
    for replica in made:
        while replica.worker.num_waiting:  # type: ignore[attr-defined]
            replica.worker.release()  # type: ignore[attr-defined]
        await replica.stop()
        assert replica._task is None


def job(fake_time: FakeTime, payload: object = None) -> Job:
    return Job(payload, 1, fake_time(), math.inf, asyncio.get_running_loop().create_future())


async def start_alone(replica: Replica, running: Job) -> None:
    """Admit ``running`` and start its batch at once (the router passed the replica over)."""
    replica.admit(running, running.arrival_s)
    await settle()
    replica.passed_over()
    await settle()


async def test_a_partial_batch_waits_out_max_wait_s_on_the_injected_clock(
        make_replica: Callable[..., Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w")
    replica = make_replica(worker, RecordingOwner())
    first = job(fake_time, "a")
    replica.admit(first, fake_time())
    await settle()
    assert fake_time.num_pending == 1  # the wait is a timer of the injected source
    fake_time.advance(CONFIG.max_wait_s * 0.99)
    await settle()
    assert not worker.batches and replica.forming  # still waiting for batch mates
    replica.admit(job(fake_time, "b"), fake_time())  # one joins while it waits
    fake_time.advance(CONFIG.max_wait_s * 0.01)  # the first has now waited the max wait
    await settle()
    assert worker.batches == [[1, 1]] and first.future.result() == ("out", "a")


async def test_a_batch_passed_over_by_the_router_runs_without_waiting(
        make_replica: Callable[..., Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w")
    replica = make_replica(worker, RecordingOwner())
    replica.admit(job(fake_time), fake_time())
    await settle()
    assert replica.forming
    replica.passed_over()
    await settle()
    assert worker.batches == [[1]] and not replica.forming


async def test_a_lost_worker_hands_its_jobs_over_and_restarts_with_backoff(
        make_replica: Callable[..., Replica], fake_time: FakeTime) -> None:
    class FailsToRestart(FakeWorker):
        """Its first two restarts fail (a process that cannot start yet)."""

        failures = 2

        async def restart(self) -> None:
            if self.failures:
                self.failures -= 1
                raise OSError("not yet")
            await super().restart()

    worker = FailsToRestart("w", gated=True, fail_with=[WorkerLost("died")])
    owner = RecordingOwner()
    replica = make_replica(worker, owner)
    running, queued = job(fake_time, "running"), job(fake_time, "queued")
    await start_alone(replica, running)
    replica.admit(queued, fake_time())
    worker.release()  # the batch fails: the worker is lost
    await settle()
    assert owner.lost_calls == [([running], [queued])] and not replica.healthy
    # Restarts are retried after 50 ms, then 100 ms: nothing earlier.
    fake_time.advance(0.05 - 0.001)
    await settle()
    assert worker.failures == 1
    fake_time.advance(0.001)
    await settle()
    assert worker.failures == 0 and not replica.healthy
    fake_time.advance(0.1)
    await settle()
    assert worker.restarted == 1 and replica.healthy and replica.restarts == 1
    assert owner.restored_calls == 1


async def test_a_hung_batch_is_lost_after_the_watchdog_on_the_injected_clock(
        make_replica: Callable[..., Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w", gated=True)
    owner = RecordingOwner()
    replica = make_replica(worker, owner)
    hung = job(fake_time, "hung")
    await start_alone(replica, hung)
    fake_time.advance(CONFIG.watchdog_s)  # a cold replica's first batch gets watchdog_s
    await settle()
    assert not owner.lost_calls  # due; it checks the loop is on time before it blames
    fake_time.advance(SETTLE_S)
    await settle()
    assert owner.lost_calls == [([hung], [])]
    assert worker.restarted == 1 and replica.healthy


async def test_without_an_owner_a_lost_worker_fails_its_jobs(
        make_replica: Callable[..., Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w", fail_with=[WorkerLost("died")])
    replica = make_replica(worker)
    lost = job(fake_time)
    replica.admit(lost, fake_time())
    fake_time.advance(CONFIG.max_wait_s)  # alone, with no owner to say so: it waits to fill
    await settle()
    with pytest.raises(WorkerLost, match="died"):
        lost.future.result()


async def test_stop_answers_the_running_batch(
        make_replica: Callable[..., Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w", gated=True)
    replica = make_replica(worker, RecordingOwner())
    running = job(fake_time)
    await start_alone(replica, running)
    await replica.stop()
    with pytest.raises(ShuttingDown):
        running.future.result()


async def test_sleep_s_ends_when_the_fake_clock_passes_it(fake_time: FakeTime) -> None:
    sleeper = asyncio.ensure_future(sleep_s(fake_time, 0.5))
    await settle()
    fake_time.advance(0.499)
    await settle()
    assert not sleeper.done()
    fake_time.advance(0.001)
    await settle()
    assert sleeper.done() and fake_time.num_pending == 0


async def test_a_bare_clock_gets_the_loops_timers() -> None:
    loop = asyncio.get_running_loop()
    source = as_time_source(loop.time)
    assert isinstance(source, LoopTime) and source.clock == loop.time
    fired: list[Any] = []
    source.call_later(0.0, fired.append, "fired")
    await settle()
    assert fired == ["fired"]
    fake = FakeTime()
    assert as_time_source(fake) is fake


async def test_a_replica_prices_the_spread_of_its_own_predictions(
        make_replica: Callable[..., Replica], fake_time: FakeTime) -> None:
    replica = make_replica(FakeWorker("w"), RecordingOwner())
    assert replica.load(fake_time()).spread_s == 0.0  # nothing answered yet
    late = job(fake_time)
    late.predicted_done_s = fake_time() - 0.015  # answered 15 ms after its prediction
    unpredicted = job(fake_time)  # admitted without a prediction: nothing to learn from it
    await start_alone(replica, late)
    await start_alone(replica, unpredicted)
    assert late.future.done() and unpredicted.future.done()
    assert replica.load(fake_time()).spread_s == pytest.approx(0.015)
