"""A model with no replica in routing (issue 22, "more models than memory"): its requests park
while a replica is expected or can be asked for, wait within their deadlines, and are served by
the replica that comes; without either they are refused as before.

Fake workers and the fake clock drive every step (``balancer_fakes``); nothing sleeps.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from evenflow.balancer import (
    BalancerConfig,
    BatchResult,
    DeadlineExceeded,
    Job,
    ModelBalancer,
    Overloaded,
    ShuttingDown,
    Worker,
    WorkerLost,
)
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import FakeTime, answered, release_all, settle

pytestmark = pytest.mark.timeout(10)


@dataclass
class RecordingWorker(FakeWorker):
    """A ``FakeWorker`` that records the payloads of each batch, in the order it ran them."""

    payloads: list[list[Any]] = field(default_factory=list)

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        self.payloads.append([job.payload for job in jobs])
        return await super().run(jobs)


class Make(Protocol):
    def __call__(self, workers: Sequence[Worker] = (), *,
                 on_no_replica: Callable[[], None] | None = None,
                 **overrides: Any) -> ModelBalancer: ...


class Asker:
    """An ``on_no_replica`` that counts its calls and, like the placer, says a replica is
    coming (``expects``) unless told not to."""

    def __init__(self, expects: bool = True) -> None:
        self.calls = 0
        self.expects = expects
        self.balancer: ModelBalancer | None = None

    def __call__(self) -> None:
        self.calls += 1
        if self.expects and self.balancer is not None:
            self.balancer.expect_replica()


@pytest.fixture
async def make(fake_time: FakeTime) -> AsyncIterator[Make]:
    """Started balancers on ``fake_time`` (``BalancerFactory`` takes no ``on_no_replica``),
    closed at teardown with every worker they own closed."""
    made: list[ModelBalancer] = []

    def build(workers: Sequence[Worker] = (), *,
              on_no_replica: Callable[[], None] | None = None,
              **overrides: Any) -> ModelBalancer:
        balancer = ModelBalancer(model_name="m", workers=workers,
                                 config=BalancerConfig(**overrides), clock=fake_time,
                                 rng=random.Random(0), on_no_replica=on_no_replica)
        balancer.start()
        made.append(balancer)
        return balancer

    yield build
    for balancer in made:
        release_all(balancer)
        await balancer.close()
        assert balancer.parked_requests == 0
        assert all(r._task is None for r in balancer.replicas)
        assert all(r.worker.closed for r in balancer.replicas  # type: ignore[attr-defined]
                   if isinstance(r.worker, FakeWorker))


def asking(make: Make, *, expects: bool = True, **overrides: Any) -> tuple[ModelBalancer, Asker]:
    asker = Asker(expects)
    balancer = make(on_no_replica=asker, **overrides)
    asker.balancer = balancer
    return balancer, asker


async def test_an_empty_balancer_parks_and_asks_once_per_wait(make: Make,
                                                               fake_time: FakeTime) -> None:
    balancer, asker = asking(make)
    assert not balancer.serving and balancer.routable and not balancer.replica_expected
    futures = [balancer.submit(i, 1) for i in range(3)]
    assert asker.calls == 1  # the first parked request asked; the placer now expects one
    assert balancer.replica_expected
    assert (balancer.parked_requests, balancer.admitted_requests,
            balancer.queued_requests) == (3, 3, 0)
    assert balancer.snapshot().parked_requests == 3
    balancer.cancel_expected()
    await settle()
    assert not balancer.replica_expected
    for future in futures:
        with pytest.raises(WorkerLost, match="its replica failed to load"):
            future.result()
    assert (balancer.parked_requests, balancer.admitted_requests) == (0, 0)
    again = balancer.submit(9, 1)  # a new wait: it asks again
    assert asker.calls == 2 and balancer.parked_requests == 1
    balancer.add_replica(FakeWorker("w"))
    assert not balancer.replica_expected
    assert await answered(fake_time, again) == [("out", 9)]


async def test_a_callback_that_expects_nothing_is_not_asked_per_request(
        make: Make, fake_time: FakeTime) -> None:
    # The placer may find no memory now: its tick asks again while requests are parked.
    balancer, asker = asking(make, expects=False)
    futures = [balancer.submit(i, 1) for i in range(4)]
    assert asker.calls == 1 and balancer.parked_requests == 4
    assert not balancer.replica_expected
    balancer.add_replica(FakeWorker("w"))
    assert await answered(fake_time, *futures) == [("out", i) for i in range(4)]


async def test_parked_requests_are_served_in_arrival_order_by_the_replica_that_comes(
        make: Make, fake_time: FakeTime) -> None:
    balancer = make(max_batch=1, adaptive_batching=False)
    balancer.expect_replica()
    futures = []
    for i in range(5):
        futures.append(balancer.submit(f"r{i}", 1))
        fake_time.advance(0.001)
    assert balancer.parked_requests == 5
    worker = RecordingWorker("w")
    balancer.add_replica(worker)
    assert balancer.parked_requests == 0 and balancer.serving
    assert await answered(fake_time, *futures) == [("out", f"r{i}") for i in range(5)]
    assert worker.payloads == [[f"r{i}"] for i in range(5)]
    assert fake_time.num_pending <= len(balancer.replicas)  # the parking timer is gone


async def test_a_parked_request_fails_exactly_at_its_deadline(
        make: Make, fake_time: FakeTime) -> None:
    balancer = make()
    balancer.expect_replica()
    start_s = fake_time()
    late = balancer.submit("late", 1, deadline_s=start_s + 0.2)
    soon = balancer.submit("soon", 1, deadline_s=start_s + 0.05)
    fake_time.advance(0.05 - 1e-6)
    assert not soon.done()  # not before its deadline
    fake_time.advance(1e-6)
    assert soon.done()  # at it, not a poll later
    with pytest.raises(DeadlineExceeded, match="waiting for a replica of model 'm' to load"):
        soon.result()
    assert balancer.counters.dropped["deadline"] == 1
    assert fake_time.num_pending == 1  # one timer, re-armed for the later deadline
    assert balancer.parked_requests == 1 and not late.done()
    fake_time.advance(0.1)
    balancer.add_replica(FakeWorker("w"))
    assert await answered(fake_time, late) == [("out", "late")]
    await settle()
    assert balancer.admitted_requests == 0


async def test_the_parking_bound_refuses_with_overloaded_and_a_cancelled_call_frees_its_slot(
        make: Make) -> None:
    balancer = make(max_queued_requests=2)
    balancer.expect_replica()
    first, _ = balancer.submit(0, 1), balancer.submit(1, 1)
    with pytest.raises(Overloaded, match=r"2 requests waiting for a replica to load \(limit 2, "
                                         r"--max-queued-requests\)"):
        balancer.submit(2, 1)
    assert balancer.counters.rejected["queue_full"] == 1
    first.cancel()
    await settle()
    assert balancer.parked_requests == 1 and balancer.counters.dropped["cancelled"] == 1
    balancer.submit(3, 1)
    assert balancer.parked_requests == 2


async def test_without_a_callback_or_an_expected_replica_it_refuses_as_before(
        make: Make) -> None:
    balancer = make()
    assert not balancer.routable
    with pytest.raises(WorkerLost, match="none is placed, and none is being loaded"):
        balancer.submit(0, 1)
    assert balancer.admitted_requests == 0


async def test_the_last_replica_leaving_parks_its_queue_for_the_expected_one(
        make: Make, fake_time: FakeTime) -> None:
    old = FakeWorker("old", gated=True)
    balancer = make([old], max_batch=1, adaptive_batching=False)
    futures = [balancer.submit(i, 1) for i in range(5)]
    await settle()
    assert old.num_waiting == 1 and balancer.queued_requests == 4
    balancer.expect_replica()  # the placer loads the replacement before the old one leaves
    removal = asyncio.create_task(balancer.remove_replica(old))
    await settle()
    assert (balancer.parked_requests, balancer.queued_requests) == (4, 0)
    futures += [balancer.submit(i, 1) for i in range(5, 7)]  # arriving meanwhile: parked
    assert balancer.parked_requests == 6 and not removal.done()
    old.release()  # its running batch finishes there
    await removal
    assert old.closed and balancer.replicas == ()
    balancer.add_replica(FakeWorker("new"))
    assert await answered(fake_time, *futures) == [("out", i) for i in range(7)]  # none lost


async def test_the_last_replica_leaving_with_none_expected_fails_its_queue_as_before(
        make: Make) -> None:
    old = FakeWorker("old", gated=True)
    balancer = make([old], max_batch=1, adaptive_batching=False)
    running, queued = balancer.submit(0, 1), balancer.submit(1, 1)
    await settle()
    removal = asyncio.create_task(balancer.remove_replica(old))
    await settle()
    with pytest.raises(WorkerLost, match="no other replica is in service"):
        queued.result()
    old.release()
    await removal
    assert running.result() == ("out", 0)
    with pytest.raises(ValueError, match="'old' is not a replica of model 'm'"):
        await balancer.remove_replica(old)


async def test_drain_waits_for_parked_requests(make: Make, fake_time: FakeTime) -> None:
    balancer = make()
    balancer.expect_replica()
    futures = [balancer.submit(i, 1) for i in range(2)]
    drain = asyncio.create_task(balancer.drain())
    await settle()
    assert not drain.done()
    with pytest.raises(ShuttingDown):
        balancer.submit(2, 1)
    balancer.add_replica(FakeWorker("w"))
    assert await answered(fake_time, *futures) == [("out", 0), ("out", 1)]
    await drain


async def test_close_fails_parked_requests_with_shutting_down(make: Make) -> None:
    balancer = make()
    balancer.expect_replica()
    future = balancer.submit(0, 1)
    await balancer.close()
    with pytest.raises(ShuttingDown, match="model 'm' shut down"):
        future.result()
    assert not balancer.replica_expected and balancer.parked_requests == 0


async def test_a_failing_callback_leaves_the_request_parked(
        make: Make, fake_time: FakeTime, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise RuntimeError("placer bug")

    balancer = make(on_no_replica=broken)
    future = balancer.submit(0, 1)
    assert balancer.parked_requests == 1 and "on_no_replica failed" in caplog.text
    balancer.add_replica(FakeWorker("w"))
    assert await answered(fake_time, future) == [("out", 0)]
