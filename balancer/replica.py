"""One replica: its queue, batch formation, latency model, controller, and the loop that feeds
its worker one batch at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

from evenflow.balancer.answers import answer_batch, fail_jobs
from evenflow.balancer.backoff import Backoff
from evenflow.balancer.config import BalancerConfig
from evenflow.balancer.controller import BatchSizeController
from evenflow.balancer.errors import (
    BatchFailed,
    DeviceLost,
    EvenflowError,
    OutOfMemory,
    ShuttingDown,
    WorkerLost,
)
from evenflow.balancer.estimator import LatencyModel
from evenflow.balancer.job import BatchResult, Job, Worker
from evenflow.balancer.ledger import DeviceLedger
from evenflow.balancer.policies import ReplicaLoad
from evenflow.balancer.queue import JobQueue
from evenflow.balancer.stats import (
    ArrivalRate,
    Lateness,
    ModelCounters,
    ReplicaCounters,
    ReplicaSnapshot,
)
from evenflow.balancer.timebase import LoopTime, TimeSource, sleep_s
from evenflow.balancer.turns import DeviceTurns
from evenflow.balancer.watchdog import Watchdog

logger = logging.getLogger(__name__)

_STALE_S = 1.0  # an idle replica whose last batch ended longer ago than this gets a probe
# An idle replica looks for work to steal this often: one whose estimate is too slow gets no
# new work from routing, and only a batch it steals can show that it is faster.
_IDLE_POLL_S = 0.02
# A batch running this many times its predicted time is hung, not slow: predictions miss by
# tens of percent, a device that throttles by a few times, never by ten.
_WATCHDOG_BATCHES = 10.0
# A failed restart is retried after this, doubling up to the maximum: the first retry is soon
# enough to ride out a process that was still exiting, the cap keeps a dead host's log quiet.
_FIRST_RESTART_DELAY_S = 0.05
_MAX_RESTART_DELAY_S = 30.0


class ReplicaOwner(Protocol):
    """What a replica asks of the balancer that routes to it."""

    def others_in_flight(self, replica: Replica) -> bool:
        """Whether any admitted request is outside ``replica``'s queue (more may join it)."""
        ...

    def find_work(self, replica: Replica) -> None:
        """Work stealing: move queued work of busier replicas to ``replica``."""
        ...

    def rebind(self, replica: Replica, batch: list[Job]) -> list[Job]:
        """Late binding: the part of ``batch`` that stays on ``replica`` (the rest moved)."""
        ...

    def lost(self, replica: Replica, running: list[Job], queued: list[Job]) -> None:
        """``replica`` left routing (its worker was lost): re-run ``running`` once and route
        ``queued`` elsewhere."""
        ...

    def restored(self, replica: Replica) -> None:
        """``replica`` is back in routing (its worker restarted)."""
        ...


def restart_renews_device(worker: Worker) -> bool:
    """Whether ``worker.restart`` gives it a fresh device context (a new process), so that a
    restart recovers from ``DeviceLost``. Workers say so with a ``restart_renews_device``
    attribute; one that does not (threads of this process) is assumed not to."""
    return bool(getattr(worker, "restart_renews_device", False))


class Replica:
    """Drives one worker.

    The loop takes a batch from the queue when the queue holds the batch's live size, when
    the oldest job has waited ``max_wait_s``, when the model has no other request in flight, or
    when the balancer says no more work is coming (``passed_over``); runs it on the worker; feeds
    the measured time to the latency model and the controller; resolves each job's future. Every
    wait is a timer of the injected ``TimeSource``, the clock that prices the replica too.

    The replica asks its ``owner`` (a ``ReplicaOwner``, its balancer) for what it cannot see
    alone. Late binding (``config.binds_late``): as a batch is about to start, the owner may move
    jobs in it to a replica that is now predicted to finish them sooner (the routing decision was
    made when the job arrived; this is the last moment it can be revised).

    Work stealing (``config.steals_work``): the replica asks the owner for work when its queue is
    empty, again every ``_IDLE_POLL_S`` while it stays so (a replica whose estimate is wrong,
    and so gets no new work, still takes work), and when it is about to start a batch with room
    left: work queued elsewhere when it was routed can be bound late, to the batch that starts
    now.

    A batch that runs out of memory is split in half and retried (``_split``), and the
    controller's cap drops; any other failure fails only that batch's jobs, as does a batch
    answered with a different number of outputs than it has jobs.

    A worker that dies, or runs a batch past the watchdog (ten times its predicted time, at
    least ``watchdog_floor_s``, or ``watchdog_s`` before the latency fit has measured a batch;
    time the event loop itself was stalled does not count: ``Watchdog``), is lost: the replica
    leaves routing, hands the batch's jobs and its queue to the owner (``lost``: the balancer
    re-runs them elsewhere), and restarts the worker, backing off while restarts fail; then it
    is back in routing (``restored``), unless it left routing for good meanwhile. Out of routing
    its loop takes no batch, not even from a shared queue.

    A worker whose device is lost (``DeviceLost``: a sticky CUDA error poisons the device's
    context, so every later batch on it would fail) is lost the same way, but a restart helps
    only a worker that restarts into a fresh process (``restart_renews_device``); any other
    stays out of routing for good, with ``unusable_reason`` saying why.
    """

    def __init__(self, *, worker: Worker, queue: JobQueue, config: BalancerConfig,
                 counters: ModelCounters, time_source: TimeSource | None = None,
                 owner: ReplicaOwner | None = None, ledger: DeviceLedger | None = None,
                 lateness: Lateness | None = None) -> None:
        self.worker = worker
        self._queue = queue
        self._controller = BatchSizeController(
            max_batch=config.max_batch, latency_target_s=config.latency_target_s,
            max_wait_s=config.max_wait_s, adaptive=config.adaptive_batching)
        self._estimator = LatencyModel(prior_base_s=config.prior_base_s,
                                       prior_per_sample_s=config.prior_per_sample_s)
        self.stats = ReplicaCounters()
        self._model_counters = counters
        self._max_wait_s = config.max_wait_s
        self._time = LoopTime() if time_source is None else time_source
        self._clock = self._time.clock
        self._owner = owner
        # The owner again, where its work stealing and late binding are on (else None).
        self._stealer = owner if config.steals_work else None
        self._binder = owner if config.binds_late else None
        self._running_since_s: float | None = None
        self._running_end_s = 0.0
        self._running_requests = 0
        self._max_in_flight = max(1, worker.max_in_flight)
        self._in_flight: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        # Nothing queued for it to run and nothing running (out of routing: nothing running).
        self._quiet = asyncio.Event()
        self._quiet.set()
        self.forming = False  # a partial batch is waiting for more work (up to max_wait_s)
        self._arrivals = ArrivalRate()
        self._close_early = False
        self._watchdog_s = config.watchdog_s
        self._watchdog_floor_s = min(config.watchdog_floor_s, config.watchdog_s)
        # Set while in routing (``healthy``): the loop takes batches only then.
        self._routed = asyncio.Event()
        self._routed.set()
        self._leaving = False  # out of routing for good (``leave_routing``): never restored
        self._losses = 0  # times its worker was lost, so a batch can tell it was lost meanwhile
        self.unusable_reason = ""  # set when a lost device takes the replica out for good
        self.restarts = 0
        self._last_done_s = -math.inf
        self._restart_task: asyncio.Task[None] | None = None
        self._ledger = ledger  # models sharing devices: their replicas' work delays this one
        self._turn: tuple[DeviceTurns, str] | None = None  # the shared device this batch holds
        # How late its answers came against their predictions: routing's ``spread_s`` and
        # admission's margin (``lateness``: a window shared with the replicas of one queue).
        self._lateness = lateness if lateness is not None else Lateness()

    @property
    def name(self) -> str:
        return self.worker.name

    @property
    def devices(self) -> Sequence[str]:
        return self.worker.devices

    @property
    def healthy(self) -> bool:
        """In routing (False while a lost worker restarts, and for good on a lost device)."""
        return self._routed.is_set()

    @property
    def controller(self) -> BatchSizeController:
        """The batch-size controller, for tests that check its cap; the balancer asks
        ``joins_next_batch`` and ``joining_batch_s`` instead."""
        return self._controller

    def start(self) -> None:
        """Start the loop on the running event loop, and join the device ledger."""
        if self._task is None:
            if self._ledger is not None:
                self._ledger.add(self)
            self._task = asyncio.create_task(self._run(), name=f"replica:{self.name}")

    async def stop(self) -> None:
        """Leave the device ledger; cancel the loop and any batch in flight (after the balancer
        drained them). The worker stays open (``ModelBalancer`` closes it)."""
        if self._ledger is not None:
            self._ledger.remove(self)
            self._ledger = None
        tasks = [t for t in (self._task, self._restart_task, *self._in_flight) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None

    async def wait_quiet(self) -> None:
        """Return once nothing is queued for it to run and no batch is running (out of
        routing, it runs nothing more: once no batch is running)."""
        await self._quiet.wait()

    # What the balancer's admission and routing read.

    @property
    def queued_requests(self) -> int:
        return len(self._queue)

    @property
    def running_requests(self) -> int:
        return self._running_requests

    @property
    def fit_reliable(self) -> bool:
        """Whether the latency fit's predictions are trusted (measured, and accurate lately)."""
        return self._estimator.fit.reliable

    def predict_s(self, num_samples: int) -> float:
        """Predicted seconds of a batch of ``num_samples``."""
        return self._estimator.predict_s(num_samples)

    def joining_batch_s(self, num_samples: int) -> float:
        """Predicted seconds of the batch a request of ``num_samples`` would run in: at least
        the controller's batch size."""
        return self._estimator.predict_s(max(num_samples, self._controller.batch_size))

    def lateness_margin_s(self, now_s: float) -> float:
        """How much later than predicted this replica's answers have come lately."""
        return self._lateness.margin_at(now_s)

    def joins_next_batch(self, num_samples: int) -> bool:
        """Whether ``num_samples`` more still fit in the next batch this replica starts."""
        return self._queue.num_samples + num_samples <= self._controller.batch_size

    def tail(self) -> Iterator[tuple[int, float]]:
        """(samples, due time) of the queued jobs, newest (least urgent) first: the order they
        are given up in (``give_up_newest``). Read it before the queue changes."""
        return self._queue.tail()

    # What the balancer's routing does to it.

    def admit(self, job: Job, now_s: float) -> None:
        """Queue a newly admitted job routed here, and count it in the arrival rate."""
        self._arrivals.add(job.num_samples, now_s)
        self._queue.push(job)

    def enqueue(self, job: Job) -> None:
        """Queue a job already admitted elsewhere (re-routed off a lost replica)."""
        self._queue.push(job)

    def accept_moved(self, jobs: Sequence[Job], *, stolen: bool) -> None:
        """Queue jobs moved here from another replica (``stolen`` by this one's work stealing,
        or moved by late binding) behind what is queued already: they were priced there. They
        keep the prediction made when they were routed (docs/architecture.md, Admission)."""
        for job in jobs:
            self._queue.push_behind(job)
        if stolen:
            self.stats.num_stolen_requests += len(jobs)

    def give_up_newest(self, count: int) -> list[Job]:
        """Take the ``count`` newest, least urgent queued jobs out, in queue order."""
        return [self._queue.pop_tail() for _ in range(count)][::-1]

    def passed_over(self) -> None:
        """The router sent the latest work elsewhere: a partial batch here will not fill, so
        run it now rather than delay the requests already in it."""
        if self.forming:
            self._close_early = True
            self._queue.wake()

    def leave_routing(self) -> None:
        """Out of routing for good (its device left): the balancer takes its queue over, and a
        restart that ends meanwhile does not bring it back."""
        self._leaving = True
        self._out_of_routing()

    def _out_of_routing(self) -> None:
        self._routed.clear()
        if not self._running_requests:
            # It holds nothing now: its own queue goes to the balancer, a shared one is for
            # the replicas in routing. Said now, not when its loop next wakes (a forming batch
            # waits out max_wait_s first), so a removal need not wait for that.
            self._quiet.set()

    def _next_batch_size(self, now_s: float, remaining_s: float) -> int:
        """How large the next batch may be, given when it starts and how long its oldest
        request will have waited by then."""
        oldest_s = self._queue.oldest_arrival_s if len(self._queue) else now_s
        return self._controller.live_batch_size(self._estimator.fit,
                                               now_s + remaining_s - oldest_s)

    def load(self, now_s: float) -> ReplicaLoad:
        """What the policies price: this replica's own work, and, when other models' replicas
        share its device (``ledger``), theirs as time before its next batch can start."""
        shared_s = self._ledger.others_work_s(self, now_s) if self._ledger is not None else 0.0
        return self.own_load(now_s, shared_s)

    def _shares_device(self) -> bool:
        return self._ledger is not None and self._ledger.shared(self)

    def own_load(self, now_s: float, shared_s: float = 0.0) -> ReplicaLoad:
        fit = self._estimator.fit
        remaining = max(0.0, self._running_end_s - now_s) if self._running_requests else 0.0
        remaining += shared_s
        stale = (not self._running_requests and not len(self._queue) and self._estimator.observed
                 and now_s - self._last_done_s > _STALE_S and not shared_s)
        return ReplicaLoad(
            running_remaining_s=remaining, running_requests=self._running_requests,
            queued_samples=self._queue.num_samples, queued_requests=len(self._queue),
            base_s=fit.base_s, per_sample_s=fit.per_sample_s,
            batch_size=self._next_batch_size(now_s, remaining),
            arrival_rate_per_s=self._arrivals.per_s(now_s), cold=not self._estimator.observed,
            shape_groups=self._queue.num_shape_groups, stale=stale,
            spread_s=self._lateness.margin_at(now_s))

    def snapshot(self, now_s: float) -> ReplicaSnapshot:
        fit = self._estimator.fit
        status = self.worker.status()
        return ReplicaSnapshot(
            name=self.name, devices=tuple(self.worker.devices),
            busy_fraction=self.stats.busy.fraction(now_s, self._running_since_s),
            busy_s=self.stats.busy.total_busy_s, queued_requests=len(self._queue),
            queued_samples=self._queue.num_samples, outstanding_work_s=self.load(now_s).work_s(),
            batch_size=self._controller.batch_size, fit_base_s=fit.base_s,
            fit_per_sample_s=fit.per_sample_s, fit_reliable=fit.reliable,
            fit_settled=fit.settled, fit_batch_size=fit.batch_size,
            fit_latency_s=fit.latency_s,
            num_batches=self.stats.num_batches, num_samples=self.stats.num_samples,
            num_requests=self.stats.num_requests,
            num_stolen_requests=self.stats.num_stolen_requests,
            turn_wait_s=self.stats.turn_wait_s,
            running_requests=self._running_requests,
            batch_size_counts=dict(self.stats.batch_size_counts),
            stages=status.stages, num_repartitions=status.num_repartitions,
            healthy=self.healthy, restarts=self.restarts, location=status.location,
            unusable_reason=self.unusable_reason)

    async def _run(self) -> None:
        if self._max_in_flight == 1:
            while True:
                jobs = await self._next_batch()
                if jobs:
                    try:
                        await self._execute(jobs)
                    finally:
                        self._end_turn()
        # A pipeline takes several batches at once: one per stage, plus one waiting at the door.
        slots = asyncio.Semaphore(self._max_in_flight)
        while True:
            await slots.acquire()
            jobs = await self._next_batch()
            if not jobs:
                slots.release()
                continue
            task = asyncio.create_task(self._execute(jobs))
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)
            task.add_done_callback(lambda _: slots.release())

    async def _next_batch(self) -> list[Job]:
        queue, owner, stealer = self._queue, self._owner, self._stealer
        while True:
            if not self._routed.is_set():
                # Out of routing (restarting, leaving, or out for good): take nothing until back
                # in routing. A shared queue would still feed this loop, and its jobs would be
                # lost with the worker again, or keep a leaving replica from ever leaving.
                self.forming = False
                if not self._running_requests:
                    self._quiet.set()
                await self._routed.wait()
                continue
            if not len(queue):
                if not self._running_requests:
                    self._quiet.set()
                if stealer is not None:
                    stealer.find_work(self)
                if not len(queue):
                    await queue.wait_changed(None if stealer is None else _IDLE_POLL_S)
                    continue
            # Work it will run is queued (forming, or waiting for a turn on a shared device):
            # not quiet, or a drain would spin through its wait until the batch starts.
            self._quiet.clear()
            now_s = self._clock()
            size = self._next_batch_size(now_s, 0.0)
            wait_s = queue.oldest_arrival_s + self._max_wait_s - now_s
            # Waiting can only fill the batch with requests that are coming; when the model has
            # nothing else in flight (a lone client, low load), none is known to be coming.
            alone = owner is not None and not owner.others_in_flight(self)
            if queue.num_samples >= size or wait_s <= 0.0 or self._close_early or alone:
                self.forming = self._close_early = False
                if await self._take_turn():
                    if not self._routed.is_set():  # it left routing while it waited its turn
                        self._end_turn()
                        continue
                    # The device may have been another model's until now: more may have
                    # queued, and the oldest request has waited longer: sized afresh.
                    now_s = self._clock()
                    size = self._next_batch_size(now_s, 0.0)
                if queue.num_samples < size and stealer is not None:
                    stealer.find_work(self)  # top the batch up from busier replicas' queues
                cpu = self._model_counters.cpu
                started_s = time.thread_time() if cpu is not None else 0.0
                jobs = queue.take(size, now_s)
                if self._binder is not None and jobs:
                    # Late binding: keep what finishes here first.
                    jobs = self._binder.rebind(self, jobs)
                if cpu is not None:
                    cpu.add("batching", time.thread_time() - started_s)
                if jobs:
                    return jobs
                self._end_turn()
                continue
            self.forming = True
            await queue.wait_changed(wait_s)

    async def _take_turn(self) -> bool:
        """On a device shared with other models' replicas (one device, one batch at a time),
        wait for this replica's turn there (``DeviceTurns``); True once it holds one (at once
        or after the others' batches), False where it takes no turns."""
        if self._ledger is None or self._max_in_flight > 1 or len(self.devices) != 1 \
                or not self._ledger.shared(self):
            return False
        device = self.devices[0]
        turns = self._ledger.turns
        asked_s = self._clock()
        await turns.take(device, self._queue.earliest_due_s)
        self._turn = (turns, device)
        self.stats.turn_wait_s += self._clock() - asked_s
        return True

    def _end_turn(self) -> None:
        if self._turn is not None:
            turns, device = self._turn
            self._turn = None
            turns.give_back(device)

    async def _execute(self, jobs: list[Job]) -> None:
        num_samples = sum(job.num_samples for job in jobs)
        start_s = self._clock()
        losses = self._losses
        if not self._running_requests:
            self._running_since_s = start_s
            self._running_end_s = start_s
        # Batches in flight drain one per predicted batch time (a pipeline's slowest stage).
        self._running_end_s = max(self._running_end_s, start_s) + \
            self._estimator.predict_s(num_samples)
        self._running_requests += len(jobs)
        self._quiet.clear()
        try:
            result = await self._run_watched(jobs, num_samples)
        except WorkerLost as exc:
            self._lost(jobs, exc)
            return
        except OutOfMemory as exc:
            self._controller.on_out_of_memory(num_samples)
            logger.warning("%s: out of memory at batch %d; cap now %d", self.name, num_samples,
                           self._controller.cap)
            if len(jobs) > 1:
                await self._split(jobs, losses)
            else:
                self._fail(jobs, exc)
            return
        except EvenflowError as exc:
            self._fail(jobs, exc)
            return
        except Exception as exc:  # a worker bug must fail its batch, not kill the replica
            logger.exception("%s: worker raised", self.name)
            self._fail(jobs, BatchFailed(f"{type(exc).__name__}: {exc}"))
            return
        except asyncio.CancelledError:  # stopped with the batch in flight: answer, never drop
            self._fail(jobs, ShuttingDown(f"{self.name} stopped while running the batch"))
            raise
        finally:
            self._running_requests -= len(jobs)
            if not self._running_requests:
                self._running_since_s = None
                if not len(self._queue) or not self._routed.is_set():
                    self._quiet.set()
        self._answer(jobs, num_samples, start_s, result)

    def _answer(self, jobs: list[Job], num_samples: int, start_s: float,
                result: BatchResult) -> None:
        """Answer a batch that ran: each job its output, or all of them ``BatchFailed`` when
        the outputs do not match the jobs one for one."""
        if len(result.outputs) != len(jobs):
            logger.error("%s: the worker returned %d outputs for a batch of %d requests",
                         self.name, len(result.outputs), len(jobs))
            self._fail(jobs, BatchFailed(f"{self.name} returned {len(result.outputs)} outputs "
                                         f"for a batch of {len(jobs)} requests"))
            return
        # The batch ran; a bug while answering it must still answer it and leave the loop
        # running, or the replica would stay in routing with nothing taking its queue.
        try:
            cpu = self._model_counters.cpu
            if cpu is None:
                self._complete(jobs, num_samples, start_s, result)
                return
            completing_s = time.thread_time()
            self._complete(jobs, num_samples, start_s, result)
            cpu.add("completion", time.thread_time() - completing_s)
            if result.cpu is not None:
                cpu.add_batch(result.cpu)
        except Exception as exc:
            logger.exception("%s: answering a batch failed", self.name)
            self._fail([job for job in jobs if not job.future.done()],
                       BatchFailed(f"{type(exc).__name__}: {exc}"))

    async def _split(self, jobs: list[Job], losses: int) -> None:
        """Run ``jobs``, a batch that ran out of memory, as two halves one after the other,
        each answered whatever happens. Stopped during the first, the second fails with it.
        If the worker was lost since the batch started (under the first half, or under another
        batch of a pipeline) and is not back, what has not run goes to the owner to re-run
        elsewhere, as a lost worker's running batch does, not to the worker being restarted."""
        half = len(jobs) // 2
        first, second = jobs[:half], jobs[half:]
        if self._lost_since(losses):
            self._hand_over(jobs)
            return
        try:
            await self._execute(first)
        except asyncio.CancelledError:
            # The second half has not run: only waited for the first.
            self._fail(second, ShuttingDown(f"{self.name} stopped while running the batch",
                                            not_run=all(job.attempts == 0 for job in second)))
            raise
        if self._lost_since(losses):
            self._hand_over(second)
            return
        await self._execute(second)

    def _lost_since(self, losses: int) -> bool:
        """Whether the worker was lost since ``_losses`` was ``losses`` and is out of routing
        still (restarting, or out for good)."""
        return self._losses != losses and not self._routed.is_set()

    def _hand_over(self, jobs: list[Job]) -> None:
        """Jobs of a batch that was running when the worker was lost, not run since: to the
        owner, to re-run once elsewhere (with no owner they fail)."""
        logger.error("%s: worker lost during a split batch; re-routing %d requests", self.name,
                     len(jobs))
        if self._owner is not None:
            self._owner.lost(self, jobs, [])
        else:
            self._fail(jobs, WorkerLost(f"{self.name} was lost while running the batch"))

    async def _run_watched(self, jobs: list[Job], num_samples: int) -> BatchResult:
        floor_s = self._watchdog_floor_s if self._estimator.observed else self._watchdog_s
        timeout_s = max(floor_s, _WATCHDOG_BATCHES * self._estimator.predict_s(num_samples))
        if math.isinf(timeout_s):
            return await self.worker.run(jobs)
        watchdog = Watchdog(timeout_s, time=self._time)
        try:
            async with watchdog:
                return await self.worker.run(jobs)
        except TimeoutError:
            if not watchdog.expired:
                raise
            raise WorkerLost(f"{self.name} did not finish a batch within {timeout_s:.1f} s "
                             "(watchdog)") from None

    def _lost(self, jobs: list[Job], error: WorkerLost) -> None:
        """Out of routing; the batch and the queue go back to the balancer; restart (unless
        the device is lost and a restart would not renew it: then out for good)."""
        logger.error("%s: worker lost (%s); re-routing %d running and %d queued requests",
                     self.name, error, len(jobs), len(self._queue))
        # Restarting a thread of this process would run on the same poisoned context.
        retire = isinstance(error, DeviceLost) and not restart_renews_device(self.worker)
        if retire:
            self.unusable_reason = str(error)
        self._losses += 1
        self._out_of_routing()
        queued = self.give_up_newest(len(self._queue))
        if self._owner is not None:
            self._owner.lost(self, jobs, queued)
        else:
            self._fail([*jobs, *queued], error)
        if retire:
            logger.error("%s: device unusable; out of routing until the server restarts",
                         self.name)
            return
        if self._leaving:
            return  # its worker is about to be closed: nothing to restart it for
        if self._restart_task is None:
            self._restart_task = asyncio.create_task(self._restart(),
                                                     name=f"restart:{self.name}")

    async def _restart(self) -> None:
        backoff = Backoff(_FIRST_RESTART_DELAY_S, _MAX_RESTART_DELAY_S)
        try:
            while True:
                try:
                    await self.worker.restart()
                except Exception:
                    delay_s = backoff.next_s()
                    logger.exception("%s: restart failed; retrying in %.1f s", self.name,
                                     delay_s)
                    await sleep_s(self._time, delay_s)
                    continue
                self.restarts += 1
                if self.unusable_reason or self._leaving:
                    # Taken out for good while it restarted (another batch lost the device, or
                    # the replica is being removed): a restart does not undo that.
                    logger.warning("%s: worker restarted; staying out of routing", self.name)
                    return
                logger.warning("%s: worker restarted; back in routing", self.name)
                self._routed.set()
                if self._owner is not None:
                    self._owner.restored(self)
                return
        finally:
            self._restart_task = None

    def _complete(self, jobs: list[Job], num_samples: int, start_s: float,
                  result: BatchResult) -> None:
        now_s = self._clock()
        self._last_done_s = now_s
        device_s = result.timing.total_s
        # What a request sees of its batch is the time from the batch's start to its answer on
        # this loop: the device time plus the hand-offs to the worker and back and any delay of
        # a busy loop. That is what the fit learns (it lands in ``a``), so batch sizes and
        # admission budget for it. Batches that overlap (a pipeline) share the wall time, and on
        # a device shared with other models without a turn there the wall time holds the wait
        # for their batches (priced through the ledger): those learn the device time.
        overlapped = self._max_in_flight > 1 or (self._turn is None and self._shares_device())
        batch_s = device_s if overlapped else max(device_s, now_s - start_s)
        self._estimator.observe(num_samples, batch_s)
        self._controller.update(self._estimator.fit, num_samples, batch_s)
        self.stats.record_batch(num_samples, len(jobs), now_s - device_s, now_s)
        for job in jobs:
            self._lateness.add(now_s - job.predicted_done_s)
        self._lateness.refresh(now_s)
        answer_batch(self._model_counters, jobs, result.outputs, timing=result.timing,
                     num_samples=num_samples, start_s=start_s, now_s=now_s)

    def _fail(self, jobs: Sequence[Job], error: BaseException) -> None:
        fail_jobs(self._model_counters, jobs, error, self._clock())
