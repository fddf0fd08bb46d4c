"""A model's balancer: admission, routing across replicas, work stealing, drain."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from evenflow.balancer.controller import BatchSizeController
from evenflow.balancer.errors import (
    DeadlineExceeded,
    InvalidRequest,
    Overloaded,
    ShuttingDown,
    WorkerLost,
)
from evenflow.balancer.estimator import LatencyModel
from evenflow.balancer.job import Clock, Job, Worker
from evenflow.balancer.ledger import DeviceLedger
from evenflow.balancer.policies import Policy, choose_least_work, choose_pow2, plan_steal
from evenflow.balancer.queue import JobQueue
from evenflow.balancer.replica import Replica
from evenflow.balancer.stats import BalancerSnapshot, ModelCounters


@dataclass(frozen=True, slots=True)
class BalancerConfig:
    """How one model's requests are admitted, routed and batched.

    Attributes:
        policy: how a request picks a replica (``least-work``; the others are baselines).
        adaptive_batching: size batches from the latency model (else always ``max_batch``).
        max_batch: largest batch a replica runs, and the largest request admitted.
        max_wait_s: longest a request waits for its batch to fill before the batch runs anyway.
        latency_target_s: per-request latency the batch-size controller aims to stay within.
            It is not a promise: admission refuses against it only when it is declared an SLO.
        slo_s: a declared latency SLO (None: none). A request predicted to finish later than
            this after it arrived is refused at once with ``Overloaded``, so what is accepted
            under overload still meets it. At least ``latency_target_s``.
        max_queued_requests, max_queued_samples: admission bounds in count over all of the
            model's queues (requests, samples; None: no sample bound); beyond them a request is
            refused with ``Overloaded``.
        max_queue_delay_s: admission bound in time: a request predicted to wait longer than
            this before its batch starts is refused at once with ``Overloaded`` (inf: no bound).
            None (the default) is the default budget when no SLO is declared (see
            ``queue_budget_s``), and no bound when one is (the SLO bounds the wait). A request
            predicted to finish after its own deadline is refused either way.
        queue_budget_targets, queue_budget_floor_s: the default queueing budget,
            ``max(queue_budget_targets * latency_target_s, queue_budget_floor_s)``. Half a second
            of queueing holds a closed loop of a few hundred clients (the queue is bounded by
            their number) on a model answering a thousand requests a second, and keeps what an
            open-loop overload gets accepted within about a second.
        queue_budget_min_batches: the default budget refuses nothing while the model's queues
            hold fewer samples than this many full batches (``max_batch``) per replica in
            service: a queue that short is bounded by its count, and a prediction over the
            budget there comes from a batch size the controller has just cut (a noisy machine),
            which refusing would turn into errors for a closed loop of that many clients.
        work_stealing: a replica that is idle, or starts a batch with room left, takes queued
            work from the busiest while it would finish sooner there (``least-work`` only).
        late_binding: as a replica is about to start a batch, jobs in it that another replica
            is now predicted to finish sooner move there, once at most (``least-work`` only).
        prior_base_s, prior_per_sample_s: the latency model's starting guess of ``a`` and ``c``.
        watchdog_s, watchdog_floor_s: a worker that has not finished a batch within ten times
            the batch's predicted time (from the replica's own latency fit), and at least
            ``watchdog_floor_s``, is lost: taken out of routing, its work re-run once elsewhere,
            and restarted. Until the fit has measured a batch, the limit is ``watchdog_s``
            (a cold start may load, compile or autotune).
        priority_levels: how many priority levels requests may ask for (Triton's convention:
            1 is the most urgent, ``priority_levels`` the least; a batch is filled from the most
            urgent level first).
        default_priority_level: the level of a request that asks for none (priority 0); None is
            the least urgent level.
    """

    policy: Policy = Policy.LEAST_WORK
    adaptive_batching: bool = True
    max_batch: int = 64
    max_wait_s: float = 0.002
    latency_target_s: float = 0.050
    slo_s: float | None = None
    max_queued_requests: int = 4096
    max_queued_samples: int | None = None
    max_queue_delay_s: float | None = None
    queue_budget_targets: float = 1.0
    queue_budget_floor_s: float = 0.5
    queue_budget_min_batches: int = 2
    work_stealing: bool = True
    late_binding: bool = True
    watchdog_s: float = 30.0
    watchdog_floor_s: float = 2.0
    prior_base_s: float = 0.002
    prior_per_sample_s: float = 0.0002
    priority_levels: int = 1
    default_priority_level: int | None = None

    def __post_init__(self) -> None:
        if self.priority_levels < 1:
            raise ValueError(f"priority_levels must be >= 1, not {self.priority_levels}")
        default = self.default_priority_level
        if default is not None and not 1 <= default <= self.priority_levels:
            raise ValueError(f"default_priority_level {default} is outside the levels "
                             f"1..{self.priority_levels}")
        if self.slo_s is not None and not self.slo_s >= self.latency_target_s:
            # Batches sized for a longer target than the SLO would break it at moderate load.
            raise ValueError(f"slo_s {self.slo_s} is below latency_target_s "
                             f"{self.latency_target_s}: batch sizes would aim past the SLO")

    @property
    def queue_budget_s(self) -> float | None:
        """The longest predicted wait for a batch that admission accepts; None: no bound."""
        if self.max_queue_delay_s is not None:
            return None if math.isinf(self.max_queue_delay_s) else self.max_queue_delay_s
        if self.slo_s is not None:
            return None
        return max(self.queue_budget_targets * self.latency_target_s, self.queue_budget_floor_s)

    def level_of(self, priority: int) -> int:
        """The queue level (0 = most urgent) of a request asking for ``priority`` (0 = the
        default); raises InvalidRequest outside the model's levels."""
        if priority == 0:
            priority = self.default_priority_level or self.priority_levels
        if not 1 <= priority <= self.priority_levels:
            raise InvalidRequest(f"priority {priority} is outside the model's levels "
                                 f"1..{self.priority_levels} (0 asks for the default)")
        return priority - 1


class ModelBalancer:
    """Admits a model's requests and spreads them over its replicas.

    ``submit`` is synchronous and cheap (it runs once per request on the event loop): it checks
    admission, picks a replica by the policy, appends the job to that replica's queue and returns
    the job's future. Each replica's own loop (see ``Replica``) forms and runs batches.
    """

    def __init__(self, *, model_name: str, workers: Sequence[Worker], config: BalancerConfig,
                 clock: Clock = time.monotonic, rng: random.Random | None = None,
                 on_health: Callable[[], None] | None = None,
                 ledger: DeviceLedger | None = None) -> None:
        if not workers:
            raise ValueError(f"model {model_name!r} has no workers")
        self.model_name = model_name
        self.config = config
        self.counters = ModelCounters()
        self._clock = clock
        self._rng = rng or random.Random(0)
        self._closing = False
        self._in_system = 0  # admitted requests whose future is not done yet
        self._loop: asyncio.AbstractEventLoop | None = None
        self._round_robin = itertools.count()
        self._default_level = config.level_of(0)
        self._queue_budget_s = config.queue_budget_s  # read on every request
        self._shared_queue = (JobQueue(config.priority_levels, self.counters.dropped)
                              if config.policy is Policy.SHARED_QUEUE else None)
        self._many = len(workers) > 1  # stealing and late binding need another replica
        self.replicas = [self._make_replica(worker) for worker in workers]
        self._queues = list({id(r.queue): r.queue for r in self.replicas}.values())
        self._in_service = list(self.replicas)  # the healthy replicas, in routing
        self._on_health = on_health
        self._ledger = ledger

    def _make_replica(self, worker: Worker) -> Replica:
        config = self.config
        least_work = config.policy is Policy.LEAST_WORK
        return Replica(
            worker=worker,
            queue=self._shared_queue if self._shared_queue is not None
            else JobQueue(config.priority_levels, self.counters.dropped),
            controller=BatchSizeController(
                max_batch=config.max_batch, latency_target_s=config.latency_target_s,
                max_wait_s=config.max_wait_s, adaptive=config.adaptive_batching),
            estimator=LatencyModel(prior_base_s=config.prior_base_s,
                                   prior_per_sample_s=config.prior_per_sample_s),
            counters=self.counters, max_wait_s=config.max_wait_s, clock=self._clock,
            find_work=self._steal_for if least_work and config.work_stealing else None,
            others_in_flight=self._others_in_flight,
            watchdog_s=config.watchdog_s, watchdog_floor_s=config.watchdog_floor_s,
            on_lost=self._reroute, on_health=self._health_changed,
            rebind=self._rebind if least_work and config.late_binding else None)

    def add_replica(self, worker: Worker) -> Replica:
        """A new replica (a device that joined), in routing at once; it is cold, so it gets
        one probe request before its estimate is trusted."""
        replica = self._make_replica(worker)
        self.replicas.append(replica)
        self._many = len(self.replicas) > 1
        self._queues = list({id(r.queue): r.queue for r in self.replicas}.values())
        if self._loop is not None:
            self._start_replica(replica)
        self._health_changed()
        return replica

    async def remove_replica(self, replica: Replica) -> None:
        """Take ``replica`` out of routing, move its queued work to the others, let its running
        batch finish, and stop it (its worker is the caller's to close)."""
        replica.healthy = False
        self._health_changed()
        queue = replica.queue
        queued = [] if queue is self._shared_queue else \
            [queue.pop_tail() for _ in range(len(queue))][::-1]
        self._reroute(replica, [], queued)
        await replica.wait_quiet()
        self.replicas.remove(replica)
        self._many = len(self.replicas) > 1
        self._queues = list({id(r.queue): r.queue for r in self.replicas}.values())
        if self._ledger is not None:
            self._ledger.remove(replica)
            replica.ledger = None
        await replica.stop()
        self._health_changed()

    def start(self) -> None:
        """Start the replica loops on the running event loop (the one ``submit`` is called on)."""
        self._loop = asyncio.get_running_loop()
        for replica in self.replicas:
            self._start_replica(replica)

    def _start_replica(self, replica: Replica) -> None:
        if self._ledger is not None:
            self._ledger.add(replica)
            replica.ledger = self._ledger
        replica.start()

    @property
    def serving(self) -> bool:
        """Whether any replica is in routing (health says NOT_SERVING when none is)."""
        return bool(self._in_service)

    def _health_changed(self) -> None:
        self._in_service = [replica for replica in self.replicas if replica.healthy]
        if self._on_health is not None:
            self._on_health()

    @property
    def admitted_requests(self) -> int:
        """Admitted requests not answered yet (queued or running)."""
        return self._in_system

    @property
    def queued_requests(self) -> int:
        return sum(len(queue) for queue in self._queues)

    def submit(self, payload: Any, num_samples: int, deadline_s: float = math.inf,
               priority: int = 0, shape_key: Hashable = None) -> asyncio.Future[Any]:
        """Admit one request; the returned future resolves to its output or an EvenflowError.
        ``priority``: Triton's request priority, 1 the most urgent, 0 the model's default.
        ``shape_key``: requests share a batch only with requests of the same key (their
        non-batch shapes); None for models whose shapes are fixed."""
        if self._closing:
            raise ShuttingDown(f"model {self.model_name!r} is shutting down")
        if num_samples > self.config.max_batch:
            raise InvalidRequest(f"batch of {num_samples} exceeds max batch size "
                                 f"{self.config.max_batch} of model {self.model_name!r}")
        level = self.config.level_of(priority) if priority else self._default_level
        now_s = self._clock()
        if deadline_s <= now_s:
            raise DeadlineExceeded("deadline passed before the request was queued")
        if not self.serving:
            raise WorkerLost(f"model {self.model_name!r} has no replica in service (all are "
                             "restarting)")
        self._admit_by_count(num_samples, now_s)
        if self._loop is None:
            raise RuntimeError("ModelBalancer.start() was not called")
        future: asyncio.Future[Any] = self._loop.create_future()
        job = Job(payload, num_samples, now_s, deadline_s, future, level,
                  shape_key=shape_key,
                  due_s=min(deadline_s, now_s + self.config.latency_target_s))
        replica, finish_s = self._route(job, now_s)
        self._admit_in_time(replica, num_samples, now_s, finish_s, deadline_s)
        if self.config.policy is Policy.LEAST_WORK:
            # The router is the only source of work for a replica's queue: a partial batch the
            # router just passed over will not fill, so it should not keep waiting.
            for other in self.replicas:
                if other.forming and other is not replica:
                    other.close_forming_batch()
        if replica.estimator.fit.reliable:  # a prediction worth learning the error of
            job.predicted_done_s = now_s + finish_s
        self._in_system += 1
        future.add_done_callback(self._leave_system)
        replica.note_arrival(num_samples, now_s)
        replica.queue.push(job)
        return future

    def _admit_by_count(self, num_samples: int, now_s: float) -> None:
        if self._count_bound_hit(num_samples) is None:
            return
        for queue in self._queues:  # cancelled and expired requests give their slots back
            queue.purge(now_s)
        reason = self._count_bound_hit(num_samples)
        if reason is not None:
            self.counters.rejected["queue_full"] += 1
            raise Overloaded(reason)

    def _count_bound_hit(self, num_samples: int) -> str | None:
        """Why ``num_samples`` more would break a count bound, or None."""
        config = self.config
        queued = self.queued_requests
        if queued >= config.max_queued_requests:
            return (f"model {self.model_name!r} has {queued} requests queued (limit "
                    f"{config.max_queued_requests}, --max-queued-requests)")
        if config.max_queued_samples is not None:
            samples = sum(queue.num_samples for queue in self._queues)
            if samples + num_samples > config.max_queued_samples:
                return (f"model {self.model_name!r} has {samples} samples queued; "
                        f"{num_samples} more exceed the limit of "
                        f"{config.max_queued_samples} (--max-queue-samples)")
        return None

    def _admit_in_time(self, replica: Replica, num_samples: int, now_s: float, finish_s: float,
                       deadline_s: float) -> None:
        """Refuse now what the latency model predicts cannot finish in time (Nexus-style early
        drop), rather than queue it to time out later: past its own deadline, past the queueing
        budget, or past the declared SLO. A replica that has not measured a batch yet has no
        prediction (infinite work): it is given the benefit of the doubt, within the count
        bounds, until its first batch is measured."""
        config, counters = self.config, self.counters
        if not math.isfinite(finish_s):
            return
        if now_s + finish_s + counters.lateness.margin_s > deadline_s:
            counters.rejected["deadline"] += 1
            raise Overloaded(f"model {self.model_name!r} is predicted to answer in "
                             f"{finish_s * 1e3:.0f} ms, after the request's deadline "
                             f"({(deadline_s - now_s) * 1e3:.0f} ms from now)")
        budget_s = self._queue_budget_s
        if budget_s is not None:
            wait_s = finish_s - replica.estimator.predict_s(
                max(num_samples, replica.controller.batch_size))
            if wait_s > budget_s and (config.max_queue_delay_s is not None
                                      or self._past_min_queue(num_samples)):
                counters.rejected["queue_delay"] += 1
                raise Overloaded(f"model {self.model_name!r} is predicted to queue the request "
                                 f"for {wait_s * 1e3:.0f} ms, over the queueing budget of "
                                 f"{budget_s * 1e3:.0f} ms (--max-queue-delay-ms)")
        slo_s = config.slo_s
        if slo_s is None:
            return
        if replica.queue.num_samples + num_samples <= replica.controller.batch_size:
            # It joins the next batch: the batch sizes already keep that within the target
            # (max wait + the running batch + its own), so a prediction near the SLO at
            # moderate load is no reason to refuse it.
            return
        if finish_s + counters.lateness.margin_s > slo_s:
            counters.rejected["latency_target"] += 1
            raise Overloaded(f"model {self.model_name!r} is predicted to answer in "
                             f"{finish_s * 1e3:.0f} ms (+{counters.lateness.margin_s * 1e3:.0f} "
                             f"ms of measured lateness), over its SLO of {slo_s * 1e3:.0f} ms "
                             "(--slo-ms)")

    def _past_min_queue(self, num_samples: int) -> bool:
        """Whether ``num_samples`` more would queue more than ``queue_budget_min_batches`` full
        batches per replica in service (below that the default budget refuses nothing)."""
        config = self.config
        queued = sum(queue.num_samples for queue in self._queues) + num_samples
        return queued > config.queue_budget_min_batches * config.max_batch * len(self._in_service)

    def _leave_system(self, _: asyncio.Future[Any]) -> None:
        self._in_system -= 1

    def _others_in_flight(self, replica: Replica) -> bool:
        """Whether any admitted request is outside ``replica``'s forming batch."""
        return self._in_system > len(replica.queue)

    def _reroute(self, lost: Replica, running: list[Job], queued: list[Job]) -> None:
        """A replica lost its worker: its queued jobs go to the others; the jobs of the batch it
        was running are re-run once (a second loss fails them with UNAVAILABLE)."""
        now_s = self._clock()
        for job in running:
            job.attempts += 1
        for job in (*running, *queued):
            if job.future.done():
                continue
            if job.attempts > 1 or not self.serving:
                job.future.set_exception(WorkerLost(
                    f"model {self.model_name!r}: "
                    + ("the workers running this request were lost twice" if job.attempts > 1
                       else "its worker was lost and no other replica is in service")))
                continue
            replica, _ = self._route(job, now_s)
            replica.queue.push(job)
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
            index = choose_least_work(loads, num_samples, self._rng)
            return replicas[index], loads[index].work_s(num_samples)
        if policy is Policy.POW2:
            loads = [replica.load(now_s) for replica in replicas]
            index = choose_pow2(loads, self._rng)
            return replicas[index], loads[index].work_s(num_samples)
        if policy is Policy.ROUND_ROBIN:
            chosen = replicas[next(self._round_robin) % len(replicas)]  # the live ones
            return chosen, chosen.load(now_s).work_s(num_samples)
        # shared-queue: every replica reads the same queue, so it drains at their summed rate
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
        victims = [r for r in self.replicas if r is not thief and len(r.queue)]
        if not victims:
            return
        loads = {id(r): r.load(now_s) for r in victims}
        victims.sort(key=lambda r: loads[id(r)].work_s(), reverse=True)
        for victim in victims:
            count = plan_steal(thief.load(now_s), loads[id(victim)], victim.queue.tail_sizes())
            if not count:
                continue
            moved = [victim.queue.pop_tail() for _ in range(count)]
            for job in reversed(moved):
                thief.queue.push_behind(job)
            thief.stats.num_stolen_requests += count

    def _rebind(self, replica: Replica, batch: list[Job]) -> list[Job]:
        """Late binding, as ``replica`` is about to start ``batch``: from the batch's least
        urgent end, move a job to another replica while it is predicted to finish there sooner
        than in this batch (which shrinks as jobs leave). A job moves once at most, so
        predictions that change their minds cannot bounce it between replicas."""
        others = [r for r in self._in_service if r is not replica]
        if not others or not replica.estimator.fit.reliable:
            return batch
        now_s = self._clock()
        samples = sum(job.num_samples for job in batch)
        remaining_s = replica.load(now_s).running_remaining_s
        kept = list(batch)
        while kept:
            job = kept[-1]
            if job.rebound:
                break
            here_s = remaining_s + replica.estimator.predict_s(samples)
            # Only replicas priced by their own measurements: a cold or stale one is a probe,
            # which routing sends new work to, not work that was already placed.
            candidates = [(other, load) for other in others
                          if not (load := other.load(now_s)).cold and not load.stale]
            if not candidates:
                break
            index = choose_least_work([load for _, load in candidates], job.num_samples,
                                      self._rng)
            target, load = candidates[index]
            if load.work_s(job.num_samples) >= here_s:
                break
            kept.pop()
            samples -= job.num_samples
            job.rebound = True
            target.queue.push_behind(job)
            self.counters.rebound += 1
        return kept

    async def drain(self) -> None:
        """Refuse new work and wait until every admitted request has finished."""
        self._closing = True
        while self.queued_requests or any(r.load(self._clock()).running_requests
                                          for r in self.replicas):
            await asyncio.gather(*(replica.wait_quiet() for replica in self.replicas))

    async def close(self) -> None:
        """Stop the replica loops and fail anything still queued (call ``drain`` first)."""
        self._closing = True
        for queue in self._queues:
            queue.fail_all(ShuttingDown(f"model {self.model_name!r} shut down"))
        for replica in self.replicas:
            if self._ledger is not None:
                self._ledger.remove(replica)
                replica.ledger = None
            await replica.stop()

    def snapshot(self) -> BalancerSnapshot:
        now_s = self._clock()
        config = self.config
        return BalancerSnapshot(
            model_name=self.model_name, policy=config.policy.value,
            batch_policy="adaptive" if config.adaptive_batching else "fixed",
            latency_target_s=config.latency_target_s, queued_requests=self.queued_requests,
            num_rejected=sum(self.counters.rejected.values()),
            rejected_by_reason=dict(self.counters.rejected),
            dropped_by_reason=dict(self.counters.dropped),
            replicas=tuple(replica.snapshot(now_s) for replica in self.replicas))
