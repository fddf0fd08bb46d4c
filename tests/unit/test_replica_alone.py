"""A Replica with no balancer: jobs in, answers (or errors) out, driven by a fake worker on
``FakeTime``. What it does with failed batches, memory, lost devices, callers that went away and
several batches in flight, and what it reports. (Waits, watchdog, restarts and what it asks of
its owner: test_replica.)"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from evenflow.balancer import (
    BalancerConfig,
    BatchFailed,
    DeviceLost,
    Job,
    OutOfMemory,
)
from evenflow.balancer.queue import JobQueue
from evenflow.balancer.replica import Replica
from evenflow.balancer.stats import ModelCounters
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import FakeTime, settle

pytestmark = pytest.mark.timeout(10)

MAX_BATCH = 4
# Fixed batches of MAX_BATCH: a full queue starts a batch at once, whatever the latency fit says.
CONFIG = BalancerConfig(adaptive_batching=False, max_batch=MAX_BATCH)


class PipelineWorker(FakeWorker):
    """A fake worker that runs two batches at once, as a pipeline of one stage plus the door."""

    max_in_flight = 2


class RenewingWorker(FakeWorker):
    """A fake worker whose restart gives it a fresh device context (a new process)."""

    restart_renews_device = True


@pytest.fixture
async def make_replica(fake_time: FakeTime) -> AsyncIterator[Callable[[FakeWorker], Replica]]:
    """Started replicas without an owner; at teardown each is stopped with its gates opened,
    and its loop must be gone."""
    made: list[Replica] = []

    def make(worker: FakeWorker) -> Replica:
        replica = Replica(worker=worker, queue=JobQueue(time=fake_time), config=CONFIG,
                          counters=ModelCounters(), time_source=fake_time)
        replica.start()
        made.append(replica)
        return replica

    yield make
    for replica in made:
        worker = replica.worker
        assert isinstance(worker, FakeWorker)
        while worker.num_waiting:
            worker.release()
        await replica.stop()
        assert replica._task is None


def admit(replica: Replica, fake_time: FakeTime, *payloads: Any) -> list[Job]:
    """One-sample jobs, admitted to ``replica`` now."""
    loop = asyncio.get_running_loop()
    jobs = [Job(payload, 1, fake_time(), math.inf, loop.create_future()) for payload in payloads]
    for job in jobs:
        replica.admit(job, fake_time())
    return jobs


async def test_a_full_batch_starts_at_once_and_each_job_gets_its_own_output(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w")
    replica = make_replica(worker)
    jobs = admit(replica, fake_time, "a", "b", "c", "d")
    await settle()  # no time passes: a full batch does not wait
    assert worker.batches == [[1, 1, 1, 1]]
    assert [job.future.result() for job in jobs] == [("out", p) for p in "abcd"]


async def test_a_partial_batch_has_room_for_what_still_fits(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w")
    replica = make_replica(worker)
    admit(replica, fake_time, "a", "b", "c")
    await settle()
    assert replica.forming and replica.queued_requests == 3 and not worker.batches
    assert replica.joins_next_batch(1) and not replica.joins_next_batch(2)


@pytest.mark.parametrize(("raised", "heard"), [
    (BatchFailed("the model raised"), "the model raised"),
    (ValueError("a worker bug"), "ValueError: a worker bug"),
], ids=["batch-failed", "worker-bug"])
async def test_a_failed_batch_fails_only_its_jobs_and_the_replica_serves_on(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime,
        raised: Exception, heard: str) -> None:
    worker = FakeWorker("w", fail_with=[raised])
    replica = make_replica(worker)
    failed = admit(replica, fake_time, "a", "b", "c", "d")
    await settle()
    for job in failed:
        with pytest.raises(BatchFailed, match=f"^{heard}$"):
            job.future.result()
    served = admit(replica, fake_time, "e", "f", "g", "h")
    await settle()
    assert [job.future.result() for job in served] == [("out", p) for p in "efgh"]
    assert replica.healthy and worker.restarted == 0


async def test_out_of_memory_splits_the_batch_in_half_and_lowers_the_cap(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w", fail_with=[OutOfMemory("CUDA out of memory")])
    replica = make_replica(worker)
    jobs = admit(replica, fake_time, "a", "b", "c", "d")
    await settle()
    assert worker.batches == [[1, 1, 1, 1], [1, 1], [1, 1]]
    assert [job.future.result() for job in jobs] == [("out", p) for p in "abcd"]
    assert replica.controller.cap == 2
    admit(replica, fake_time, "e", "f", "g", "h")
    await settle()
    assert worker.batches[3:] == [[1, 1], [1, 1]]  # the lowered cap holds


async def test_out_of_memory_on_a_single_job_fails_it(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w", fail_with=[OutOfMemory("CUDA out of memory")])
    replica = make_replica(worker)
    (job,) = admit(replica, fake_time, "a")
    await settle()
    replica.passed_over()  # run the partial batch now
    await settle()
    with pytest.raises(OutOfMemory):
        job.future.result()
    assert replica.controller.cap == 1


async def test_a_lost_device_takes_a_thread_worker_out_for_good(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    lost = DeviceLost("device-side assert triggered")
    worker = FakeWorker("w", gated=True, fail_with=[lost])
    replica = make_replica(worker)
    running = admit(replica, fake_time, "a", "b", "c", "d")
    await settle()
    queued = admit(replica, fake_time, "e")
    worker.release()
    await settle()
    for job in [*running, *queued]:  # no owner to re-run them: they fail with the loss
        assert job.future.exception() is lost
    fake_time.advance(60.0)  # past any restart back-off
    await settle()
    assert not replica.healthy and worker.restarted == 0
    assert replica.unusable_reason == "device-side assert triggered"
    assert replica.snapshot(fake_time()).unusable_reason == "device-side assert triggered"
    await asyncio.wait_for(replica.wait_quiet(), 5)  # it holds nothing


async def test_a_lost_device_restarts_a_worker_whose_restart_renews_it(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    lost = DeviceLost("device-side assert triggered")
    worker = RenewingWorker("w", fail_with=[lost])
    replica = make_replica(worker)
    running = admit(replica, fake_time, "a", "b", "c", "d")
    await settle()  # the first restart is tried at once
    assert all(job.future.exception() is lost for job in running)
    assert replica.healthy and worker.restarted == 1 and replica.unusable_reason == ""
    served = admit(replica, fake_time, "e", "f", "g", "h")
    await settle()
    assert [job.future.result() for job in served] == [("out", p) for p in "efgh"]


async def test_a_caller_that_went_away_mid_batch_is_not_answered_and_the_rest_are(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w", gated=True)
    replica = make_replica(worker)
    jobs = admit(replica, fake_time, "a", "b", "c", "d")
    await settle()
    jobs[1].future.cancel()
    worker.release()
    await settle()
    assert jobs[1].future.cancelled()
    assert [jobs[i].future.result() for i in (0, 2, 3)] == [("out", p) for p in "acd"]
    assert replica.snapshot(fake_time()).num_samples == 4  # the batch still ran all four


async def test_a_pipeline_runs_as_many_batches_at_once_as_it_has_room_for(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    worker = PipelineWorker("w", gated=True)
    replica = make_replica(worker)
    first, second, third = (admit(replica, fake_time, *[name] * MAX_BATCH)
                            for name in ("first", "second", "third"))
    await settle()
    assert worker.num_waiting == 2 and replica.running_requests == 2 * MAX_BATCH
    assert replica.queued_requests == MAX_BATCH  # the third waits for a slot
    worker.release()
    await settle()
    assert all(job.future.done() for job in first) and worker.num_waiting == 2
    worker.release()
    worker.release()
    await settle()
    assert all(job.future.done() for job in [*second, *third])


async def test_wait_quiet_returns_once_nothing_is_queued_or_running(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w", gated=True)
    replica = make_replica(worker)
    admit(replica, fake_time, "a", "b", "c", "d")
    await settle()
    quiet = asyncio.create_task(replica.wait_quiet())
    await settle()
    assert not quiet.done()
    worker.release()
    await asyncio.wait_for(quiet, 5)


async def test_the_snapshot_and_the_fit_report_the_batches_it_ran(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    worker = FakeWorker("w", base_s=0.01, per_sample_s=0.001, gated=True, devices=("cuda:0",))
    replica = make_replica(worker)
    admit(replica, fake_time, *"abcd")
    await settle()
    admit(replica, fake_time, *"ef")
    running = replica.snapshot(fake_time())
    assert (running.name, running.devices) == ("w", ("cuda:0",))
    assert (running.running_requests, running.queued_requests, running.num_batches) == (4, 2, 0)
    worker.release()
    await settle()
    done = replica.snapshot(fake_time())
    assert (done.num_batches, done.num_samples, done.batch_size_counts) == (1, 4, {4: 1})
    assert (done.healthy, done.restarts, done.queued_requests) == (True, 0, 2)
    # One size measured: the fit answers that size as measured (0.01 + 4 * 0.001 s).
    assert replica.predict_s(MAX_BATCH) == pytest.approx(0.014)


async def test_requests_and_samples_are_counted_apart(
        make_replica: Callable[[FakeWorker], Replica], fake_time: FakeTime) -> None:
    replica = make_replica(FakeWorker("w"))
    loop = asyncio.get_running_loop()
    jobs = [Job(payload, samples, fake_time(), math.inf, loop.create_future())
            for payload, samples in (("a", 3), ("b", 1))]
    for job in jobs:
        replica.admit(job, fake_time())
    await settle()
    assert all(job.future.done() for job in jobs)
    snapshot = replica.snapshot(fake_time())
    assert (snapshot.num_requests, snapshot.num_samples) == (2, 4)
