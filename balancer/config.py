"""How one model's requests are admitted, routed and batched: the balancer's settings."""

from __future__ import annotations

import math
from dataclasses import dataclass

from evenflow.balancer.errors import InvalidRequest
from evenflow.balancer.estimator import PRIOR_BASE_S, PRIOR_PER_SAMPLE_S
from evenflow.balancer.policies import Policy


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
    prior_base_s: float = PRIOR_BASE_S
    prior_per_sample_s: float = PRIOR_PER_SAMPLE_S
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
    def steals_work(self) -> bool:
        """Whether replicas take queued work from busier ones (``least-work`` only)."""
        return self.policy is Policy.LEAST_WORK and self.work_stealing

    @property
    def binds_late(self) -> bool:
        """Whether a batch about to start may move jobs elsewhere (``least-work`` only)."""
        return self.policy is Policy.LEAST_WORK and self.late_binding

    @property
    def queue_budget_s(self) -> float | None:
        """The longest predicted wait for a batch that admission accepts; None: no bound."""
        if self.max_queue_delay_s is not None:
            return None if math.isinf(self.max_queue_delay_s) else self.max_queue_delay_s
        if self.slo_s is not None:
            return None
        return max(self.queue_budget_targets * self.latency_target_s, self.queue_budget_floor_s)

    def level_of(self, priority: int) -> int:
        """The queue level (0 = most urgent) of a request asking for ``priority``: 0, and any
        priority past the model's levels, get the default level, as Triton's scheduler does
        (Triton serves ``priority=2`` sent to a one-level model, and clients rely on it). A
        negative priority is InvalidRequest (the wire's is unsigned; the codecs refuse one)."""
        if priority < 0:
            raise InvalidRequest(f"priority {priority} is negative; 1..{self.priority_levels} "
                                 "are the model's levels, 0 asks for the default")
        if priority == 0 or priority > self.priority_levels:
            priority = self.default_priority_level or self.priority_levels
        return priority - 1
