"""A model's balancer: admission, routing across replicas, work stealing, drain."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from evenflow.balancer.admission import Admission
from evenflow.balancer.config import BalancerConfig
from evenflow.balancer.errors import (
    DeadlineExceeded,
    InvalidRequest,
    Overloaded,
    ShuttingDown,
    WorkerLost,
)
from evenflow.balancer.job import Clock, Job, Worker, unrun
from evenflow.balancer.ledger import DeviceLedger
from evenflow.balancer.parking import ParkingLot
from evenflow.balancer.policies import Policy, choose_least_work, choose_pow2, plan_steal
from evenflow.balancer.queue import JobQueue
from evenflow.balancer.replica import Replica
from evenflow.balancer.stats import (
    BalancerSnapshot,
    CpuParts,
    Lateness,
    ModelCounters,
    ModelStatistics,
)
from evenflow.balancer.timebase import TimeSource, as_time_source

__all__ = ["BalancerConfig", "ModelBalancer"]

logger = logging.getLogger(__name__)


class ModelBalancer:
    """Admits a model's requests and spreads them over its replicas, and owns them: their
    workers' lifecycle (added, removed, closed with the balancer) and their simulated devices'
    admin controls. Readers get copies: ``snapshot()`` and ``statistics()``.

    ``submit`` is synchronous and cheap (it runs once per request on the event loop): it checks
    admission, picks a replica by the policy, appends the job to that replica's queue and returns
    the job's future. Each replica's own loop (see ``Replica``) forms and runs batches.

    ``clock`` prices and times every wait: a ``TimeSource`` (a clock with its timers), or a bare
    clock whose timers are the event loop's (``time.monotonic``, or a virtual loop's ``time``).

    A model may have no replica in routing (none placed yet, evicted, or its last one leaving).
    Its requests are then parked (``ParkingLot``: admitted, in arrival order, each until its
    deadline) while a replica is expected (``expect_replica``: the placer is loading one) or
    while ``on_no_replica`` is set: that callback is called when a request parks and no replica
    is expected yet, so the placer can start a load on demand (it may call ``expect_replica``
    from inside it). The replica that comes into routing takes the parked requests over.
    """

    def __init__(self, *, model_name: str, workers: Sequence[Worker], config: BalancerConfig,
                 clock: Clock | TimeSource = time.monotonic, rng: random.Random | None = None,
                 on_health: Callable[[], None] | None = None,
                 ledger: DeviceLedger | None = None, count_cpu: bool = False,
                 on_no_replica: Callable[[], None] | None = None) -> None:
        self.model_name = model_name
        self.config = config
        self.counters = ModelCounters(cpu=CpuParts() if count_cpu else None)
        self._time = as_time_source(clock)
        self._clock = self._time.clock
        self._rng = rng or random.Random(0)
        self._closing = False
        self._in_system = 0  # admitted requests whose future is not done yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._round_robin = itertools.count()
        self._default_level = config.level_of(0)
        self._admission = Admission(model_name=model_name, config=config,
                                    counters=self.counters)
        self._shared_queue = (self._new_queue() if config.policy is Policy.SHARED_QUEUE
                              else None)
        # Replicas reading one queue share one lateness window too: a request runs on
        # whichever frees first, so its margin is that of all their answers.
        self._shared_lateness = Lateness() if self._shared_queue is not None else None
        self._ledger = ledger
        self._side = _ReplicaSide(self)
        self._queue_of: dict[Replica, JobQueue] = {}
        self._leaving: dict[Replica, asyncio.Future[None]] = {}
        self._replicas: list[Replica] = []
        for worker in workers:
            self._add(worker)
        self._replicas_changed()  # no worker at all is a model placed nowhere yet
        self._in_service = list(self._replicas)  # the healthy replicas, in routing
        self._on_health = on_health
        self._on_no_replica = on_no_replica
        self._expected = False  # a replica is being loaded (the placer said so)
        self._parking = ParkingLot(model_name=model_name, time=self._time,
                                   dropped=self.counters.dropped)

    @property
    def replicas(self) -> tuple[Replica, ...]:
        """The replicas, for tests and diagnostics; the server reads ``snapshot()``."""
        return tuple(self._replicas)

    def _new_queue(self) -> JobQueue:
        return JobQueue(self.config.priority_levels, self.counters.dropped, self._time)

    def _add(self, worker: Worker) -> Replica:
        queue = self._shared_queue if self._shared_queue is not None else self._new_queue()
        replica = Replica(worker=worker, queue=queue, config=self.config,
                          counters=self.counters, time_source=self._time, owner=self._side,
                          ledger=self._ledger, lateness=self._shared_lateness)
        self._queue_of[replica] = queue
        self._replicas.append(replica)
        self._replicas_changed()
        return replica

    def _replicas_changed(self) -> None:
        self._many = len(self._replicas) > 1  # stealing and late binding need another replica
        self._queues = list({id(q): q for q in self._queue_of.values()}.values())

    def add_replica(self, worker: Worker) -> None:
        """A new replica (a device that joined, or one the placer loaded), in routing at once;
        it is cold, so it gets one probe request before its estimate is trusted. The parked
        requests go to the replicas in service, and no replica is expected any more. The
        balancer owns ``worker`` now."""
        replica = self._add(worker)
        if self._loop is not None:
            replica.start()
        self._expected = False
        self._health_changed()

    def expect_replica(self) -> None:
        """A replica is being loaded for this model (the placer calls this before the load
        starts): while none is in routing, requests park until it comes (``add_replica``) or
        its load fails (``cancel_expected``)."""
        self._expected = True

    @property
    def replica_expected(self) -> bool:
        return self._expected

    def cancel_expected(self, reason: str | None = None) -> None:
        """The expected replica will not come (its load failed, or ``reason``): unless a
        replica is in routing (then nothing is parked), every parked request fails."""
        self._expected = False
        if not self._in_service:
            self._parking.fail_all(unrun(
                WorkerLost, reason or f"model {self.model_name!r}: its replica failed to load"))

    async def remove_replica(self, worker: Worker) -> None:
        """The replica of ``worker`` leaves, as in ``remove_device`` (the placer moves one
        replica of a model, not a device)."""
        replica = next((r for r in self._replicas if r.worker is worker), None)
        if replica is None:
            raise ValueError(f"worker {worker.name!r} is not a replica of model "
                             f"{self.model_name!r}")
        await self._remove(replica)

    async def remove_device(self, device: str) -> int:
        """The replicas whose worker runs on ``device`` alone leave: out of routing, their
        queued work moved to the others, their running batches finished; then their workers
        are closed. Returns how many left."""
        leaving = [r for r in self._replicas if tuple(r.devices) == (device,)]
        for replica in leaving:
            await self._remove(replica)
        return len(leaving)

    async def _remove(self, replica: Replica) -> None:
        """Out of routing, its queued work moved to the others (parked or failed when it was
        the last one: ``_reroute``), its running batches finished; then its worker closed.
        A second removal of a replica already leaving (the placer drains it while its device
        leaves) waits for the first."""
        if (leaving := self._leaving.get(replica)) is not None:
            await asyncio.shield(leaving)
            return
        self._leaving[replica] = done = asyncio.get_running_loop().create_future()
        try:
            await self._remove_once(replica)
        finally:
            del self._leaving[replica]
            done.set_result(None)

    async def _remove_once(self, replica: Replica) -> None:
        replica.leave_routing()
        self._health_changed()
        # A shared queue stays with the replicas that still read it; the last one hands it on.
        queued = [] if self._shared_queue is not None and self._in_service else \
            replica.give_up_newest(replica.queued_requests)
        self._reroute([], queued)
        await replica.wait_quiet()
        self._replicas.remove(replica)
        del self._queue_of[replica]
        self._replicas_changed()
        await replica.stop()
        self._health_changed()
        await replica.worker.close()

    def start(self) -> None:
        """Start the replica loops on the running event loop (the one ``submit`` is called on)."""
        self._loop = asyncio.get_running_loop()
        for replica in self._replicas:
            replica.start()

    @property
    def serving(self) -> bool:
        """Whether any replica is in routing (health says NOT_SERVING when none is)."""
        return bool(self._in_service)

    @property
    def routable(self) -> bool:
        """Whether a request submitted now would be admitted rather than refused for want of
        a replica: one is in routing, one is expected, or ``on_no_replica`` would ask for one
        (then it parks). For health: a model that loads on demand is ready with no replica."""
        return bool(self._in_service) or self._expected or self._on_no_replica is not None

    def _health_changed(self) -> None:
        self._in_service = [replica for replica in self._replicas if replica.healthy]
        if self._in_service and len(self._parking):
            self._unpark()
        if self._on_health is not None:
            self._on_health()

    def _unpark(self) -> None:
        """A replica is in routing: the parked jobs go to the replicas in service, oldest
        first, each priced by the policy as it goes (as jobs moved off a lost replica are)."""
        now_s = self._clock()
        for job in self._parking.release():
            replica, _ = self._route(job, now_s)
            replica.enqueue(job)

    @property
    def admitted_requests(self) -> int:
        """Admitted requests not answered yet (queued or running)."""
        return self._in_system

    @property
    def queued_requests(self) -> int:
        """Requests in the replicas' queues (not the parked ones)."""
        return sum(len(queue) for queue in self._queues)

    @property
    def parked_requests(self) -> int:
        """Admitted requests waiting for a replica to come into routing."""
        return len(self._parking)

    def submit(self, payload: Any, num_samples: int, deadline_s: float = math.inf,
               priority: int = 0, shape_key: Hashable = None) -> asyncio.Future[Any]:
        """Admit one request; the returned future resolves to its output or an EvenflowError.
        ``priority``: Triton's request priority, 1 the most urgent, 0 the model's default.
        ``shape_key``: requests share a batch only with requests of the same key (their
        non-batch shapes); None for models whose shapes are fixed."""
        if self._closing:
            raise ShuttingDown(f"model {self.model_name!r} is shutting down", not_run=True)
        if num_samples > self.config.max_batch:
            raise InvalidRequest(f"batch of {num_samples} exceeds max batch size "
                                 f"{self.config.max_batch} of model {self.model_name!r}")
        self.counters.arrived_requests += 1  # demand: refused requests count too
        self.counters.arrived_samples += num_samples
        level = self.config.level_of(priority) if priority else self._default_level
        now_s = self._clock()
        if deadline_s <= now_s:
            raise DeadlineExceeded("deadline passed before the request was queued")
        self._admission.by_count(self._queues, num_samples, now_s)
        if self._loop is None:
            raise RuntimeError("ModelBalancer.start() was not called")
        future: asyncio.Future[Any] = self._loop.create_future()
        job = Job(payload, num_samples, now_s, deadline_s, future, level,
                  shape_key=shape_key,
                  due_s=min(deadline_s, now_s + self.config.latency_target_s))
        if not self._in_service:  # the one branch the parking costs a routed request
            return self._park_new(job)
        replica, finish_s = self._route(job, now_s)
        # A stale replica's price is a probe's 0: it takes the request to measure itself, so
        # admission does not add the spread its old answers left (routing does not either).
        probe = finish_s == 0.0
        self._admission.in_time(replica, num_samples, now_s, finish_s,
                                0.0 if probe else replica.lateness_margin_s(now_s), deadline_s,
                                self._queues, len(self._in_service))
        if self.config.policy is Policy.LEAST_WORK:
            # The router is the only source of work for a replica's queue: a partial batch the
            # router just passed over will not fill, so it should not keep waiting.
            for other in self._replicas:
                if other.forming and other is not replica:
                    other.passed_over()
        if replica.fit_reliable:  # a prediction worth learning the error of
            if probe:  # predicted by its fit, or its answer would teach it a spread of it all
                finish_s = replica.load(now_s).priced_by_fit().work_s(num_samples)
            job.predicted_done_s = now_s + finish_s
        self._in_system += 1
        future.add_done_callback(self._leave_system)
        replica.admit(job, now_s)
        return future

    def _leave_system(self, _: asyncio.Future[Any]) -> None:
        self._in_system -= 1

    def _park_new(self, job: Job) -> asyncio.Future[Any]:
        """Admit ``job`` with no replica in routing: parked, or refused (``WorkerLost`` when
        none is expected and none can be asked for, ``Overloaded`` at the count bound)."""
        if not self.routable:
            raise WorkerLost(f"model {self.model_name!r} has no replica in service "
                             + ("(all are restarting)" if self._replicas else
                                "(none is placed, and none is being loaded)"), not_run=True)
        limit = self.config.max_queued_requests
        parked = len(self._parking)
        if parked >= limit:
            self.counters.rejected["queue_full"] += 1
            raise Overloaded(f"model {self.model_name!r} has {parked} requests waiting for a "
                             f"replica to load (limit {limit}, --max-queued-requests)")
        self._in_system += 1
        job.future.add_done_callback(self._leave_system)
        self._park(job)
        return job.future

    def _park(self, job: Job) -> None:
        """Park an admitted job; ask ``on_no_replica`` for a replica when none is expected and
        this job is the first to wait (once per wait, not once per request: the placer's tick
        asks again for a model whose requests are still parked)."""
        ask = None if self._expected or len(self._parking) else self._on_no_replica
        self._parking.park(job)
        if ask is not None:
            try:
                ask()
            except Exception:  # a placement bug must not lose the admitted request
                logger.exception("model %r: on_no_replica failed", self.model_name)

    def _reroute(self, running: list[Job], queued: list[Job]) -> None:
        """A replica left routing: its queued jobs go to the others; the jobs of the batch it
        was running are re-run once (a second loss fails them with UNAVAILABLE). With no other
        replica in service they park while one is expected or can be asked for, else fail."""
        now_s = self._clock()
        for job in running:
            job.attempts += 1
        for job in (*running, *queued):
            if job.future.done():
                continue
            # Its prediction was for the replica it left: answered late by the time the loss
            # took (a watchdog, a restart), it would teach admission's lateness margin seconds
            # that no routed request will wait, and the margin would refuse every close deadline.
            job.predicted_done_s = math.inf
            if job.attempts > 1 or not self.routable:
                job.future.set_exception(WorkerLost(
                    f"model {self.model_name!r}: "
                    + ("the workers running this request were lost twice" if job.attempts > 1
                       else "its worker was lost and no other replica is in service")))
                continue
            if not self._in_service:  # the last one left, and a replica is expected or asked
                self._park(job)
                continue
            replica, _ = self._route(job, now_s)
            replica.enqueue(job)
            self.counters.rerouted += 1

    def _route(self, job: Job, now_s: float) -> tuple[Replica, float]:
        """The replica for ``job`` and the seconds until it is predicted to finish there."""
        replicas = self._in_service
        num_samples = job.num_samples
        policy = self.config.policy
        if len(replicas) == 1:
            return replicas[0], replicas[0].load(now_s).work_s(num_samples)
        if policy is Policy.LEAST_WORK:
            loads = [replica.load(now_s) for replica in replicas]
            index = choose_least_work(loads, num_samples, self._rng, job.due_s - now_s)
            return replicas[index], loads[index].work_s(num_samples)
        if policy is Policy.POW2:
            loads = [replica.load(now_s) for replica in replicas]
            index = choose_pow2(loads, self._rng)
            return replicas[index], loads[index].work_s(num_samples)
        if policy is Policy.ROUND_ROBIN:
            chosen = replicas[next(self._round_robin) % len(replicas)]  # the live ones
            return chosen, chosen.load(now_s).work_s(num_samples)
        # shared-queue: every replica reads the same queue, so it drains at their summed rate
        # (a fit never prices a batch at zero: ``LatencyModel`` floors it)
        loads = [replica.load(now_s) for replica in replicas]
        rate = sum(load.batch_size / (load.base_s + load.per_sample_s * load.batch_size)
                   for load in loads)
        queued = loads[0].queued_samples + num_samples
        return replicas[0], min(load.running_remaining_s for load in loads) + queued / rate

    def _steal_for(self, thief: Replica) -> None:
        """Move queued jobs to ``thief`` from the busiest replicas first, while each would
        finish sooner there and its next batch has room."""
        if not thief.healthy or not self._many:
            return
        now_s = self._clock()
        victims = [r for r in self._replicas if r is not thief and r.queued_requests]
        if not victims:
            return
        loads = {id(r): r.load(now_s) for r in victims}
        victims.sort(key=lambda r: loads[id(r)].work_s(), reverse=True)
        # A stale thief is priced by its old fit: its probe price (no work at all) is for one
        # routed request, and would let it take a queue's worth it may answer late.
        for victim in victims:
            thief_load = thief.load(now_s).priced_by_fit()
            tail = ((samples, due_s - now_s) for samples, due_s in victim.tail())
            count = plan_steal(thief_load, loads[id(victim)], tail)
            if count:
                thief.accept_moved(victim.give_up_newest(count), stolen=True)

    def _rebind(self, replica: Replica, batch: list[Job]) -> list[Job]:
        """Late binding, as ``replica`` is about to start ``batch``: from the batch's least
        urgent end, move a job to another replica while it is predicted to finish there sooner
        than in this batch (which shrinks as jobs leave). A job moves once at most, so
        predictions that change their minds cannot bounce it between replicas."""
        others = [r for r in self._in_service if r is not replica]
        if not others or not replica.fit_reliable:
            return batch
        now_s = self._clock()
        samples = sum(job.num_samples for job in batch)
        remaining_s = replica.load(now_s).running_remaining_s
        kept = list(batch)
        while kept:
            job = kept[-1]
            if job.rebound:
                break
            here_s = remaining_s + replica.predict_s(samples)
            # Only replicas priced by their own measurements: a cold or stale one is a probe,
            # which routing sends new work to, not work that was already placed.
            candidates = [(other, load) for other in others
                          if not (load := other.load(now_s)).cold and not load.stale]
            if not candidates:
                break
            index = choose_least_work([load for _, load in candidates], job.num_samples,
                                      self._rng, job.due_s - now_s)
            target, load = candidates[index]
            if load.work_s(job.num_samples) >= here_s:
                break
            kept.pop()
            samples -= job.num_samples
            job.rebound = True
            target.accept_moved([job], stolen=False)
            self.counters.rebound += 1
        return kept

    async def set_device_speed(self, device: str, speed: float) -> float | None:
        """Set the speed of the simulated ``device`` in every worker (or pipeline stage) on it;
        the previous speed, or None when no worker here simulates that device."""
        previous: float | None = None
        for replica in self._replicas:
            if device in replica.devices:
                with contextlib.suppress(KeyError):  # not a simulated device
                    previous = await replica.worker.set_device_speed(device, speed)
        return previous

    async def set_device_fault(self, device: str, fault: str, count: int) -> bool:
        """Inject ``fault`` into the next ``count`` batches of the simulated ``device`` in every
        worker on it; whether any worker here simulates that device."""
        found = False
        for replica in self._replicas:
            if device not in replica.devices:
                continue
            try:
                await replica.worker.set_device_fault(device, fault, count)
            except KeyError:
                continue  # not a simulated device
            found = True
        return found

    async def drain(self) -> None:
        """Refuse new work and wait until every admitted request has finished (the parked
        ones too: served by the replica they wait for, or failed at their deadlines)."""
        self._closing = True
        while (self.queued_requests or len(self._parking)
               or any(r.running_requests for r in self._replicas)):
            await asyncio.gather(self._parking.wait_empty(),
                                 *(replica.wait_quiet() for replica in self._replicas))

    async def close(self) -> None:
        """Stop the replica loops, fail anything still queued, and close the workers (call
        ``drain`` first)."""
        self._closing = True
        self._expected = False
        shut = unrun(ShuttingDown, f"model {self.model_name!r} shut down")
        self._parking.fail_all(shut)
        for queue in self._queues:
            queue.fail_all(shut)
        for replica in self._replicas:
            await replica.stop()
        for replica in self._replicas:
            await replica.worker.close()

    def statistics(self) -> ModelStatistics:
        """The model's Triton-style statistics, copied now."""
        return self.counters.statistics()

    def snapshot(self) -> BalancerSnapshot:
        now_s = self._clock()
        config = self.config
        return BalancerSnapshot(
            model_name=self.model_name, policy=config.policy.value,
            batch_policy="adaptive" if config.adaptive_batching else "fixed",
            latency_target_s=config.latency_target_s, queued_requests=self.queued_requests,
            parked_requests=len(self._parking),
            num_rejected=sum(self.counters.rejected.values()),
            rejected_by_reason=dict(self.counters.rejected),
            dropped_by_reason=dict(self.counters.dropped),
            replicas=tuple(replica.snapshot(now_s) for replica in self._replicas))


class _ReplicaSide:
    """The balancer as its replicas see it (a ``ReplicaOwner``), kept off ``ModelBalancer``'s
    own face: what a replica may ask of its balancer, and nothing else."""

    __slots__ = ("_balancer",)

    def __init__(self, balancer: ModelBalancer) -> None:
        self._balancer = balancer

    def others_in_flight(self, replica: Replica) -> bool:
        return self._balancer.admitted_requests > replica.queued_requests

    def find_work(self, replica: Replica) -> None:
        self._balancer._steal_for(replica)

    def rebind(self, replica: Replica, batch: list[Job]) -> list[Job]:
        return self._balancer._rebind(replica, batch)

    def lost(self, replica: Replica, running: list[Job], queued: list[Job]) -> None:
        self._balancer._health_changed()
        self._balancer._reroute(running, queued)

    def restored(self, replica: Replica) -> None:
        self._balancer._health_changed()
