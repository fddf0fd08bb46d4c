"""Admission: refuse a request at once, rather than queue it to fail later, when the model's
queues are at a count bound or when the latency model predicts it cannot finish in time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

from evenflow.balancer.config import BalancerConfig
from evenflow.balancer.errors import Overloaded
from evenflow.balancer.queue import JobQueue
from evenflow.balancer.stats import ModelCounters


class Placement(Protocol):
    """What admission asks of the replica a request was routed to."""

    def joining_batch_s(self, num_samples: int) -> float: ...

    def joins_next_batch(self, num_samples: int) -> bool: ...


class Admission:
    """One model's admission rules (``BalancerConfig``: count bounds, queueing budget, SLO).
    A refusal raises ``Overloaded`` and is counted by reason in ``counters.rejected``."""

    def __init__(self, *, model_name: str, config: BalancerConfig,
                 counters: ModelCounters) -> None:
        self.model_name = model_name
        self.config = config
        self.counters = counters
        self._queue_budget_s = config.queue_budget_s  # read on every request

    def by_count(self, queues: Sequence[JobQueue], num_samples: int, now_s: float) -> None:
        """Refuse ``num_samples`` more when the model's ``queues`` are at a count bound (after
        dropping what was cancelled or expired: those give their slots back)."""
        if self._count_bound_hit(queues, num_samples) is None:
            return
        for queue in queues:
            queue.purge(now_s)
        reason = self._count_bound_hit(queues, num_samples)
        if reason is not None:
            self.counters.rejected["queue_full"] += 1
            raise Overloaded(reason)

    def _count_bound_hit(self, queues: Sequence[JobQueue], num_samples: int) -> str | None:
        """Why ``num_samples`` more would break a count bound, or None."""
        config = self.config
        queued = sum(len(queue) for queue in queues)
        if queued >= config.max_queued_requests:
            return (f"model {self.model_name!r} has {queued} requests queued (limit "
                    f"{config.max_queued_requests}, --max-queued-requests)")
        if config.max_queued_samples is not None:
            samples = sum(queue.num_samples for queue in queues)
            if samples + num_samples > config.max_queued_samples:
                return (f"model {self.model_name!r} has {samples} samples queued; "
                        f"{num_samples} more exceed the limit of "
                        f"{config.max_queued_samples} (--max-queue-samples)")
        return None

    def in_time(self, replica: Placement, num_samples: int, now_s: float, finish_s: float,
                margin_s: float, deadline_s: float, queues: Sequence[JobQueue],
                num_in_service: int) -> None:
        """Refuse now what the latency model predicts cannot finish in time (Nexus-style early
        drop), rather than queue it to time out later: past its own deadline, past the queueing
        budget, or past the declared SLO. ``margin_s`` is how much later than predicted the
        replica's answers have lately come. A replica that has not measured a batch yet has no
        prediction (infinite work): it is given the benefit of the doubt, within the count
        bounds, until its first batch is measured."""
        config, counters = self.config, self.counters
        if not math.isfinite(finish_s):
            return
        if now_s + finish_s + margin_s > deadline_s:
            counters.rejected["deadline"] += 1
            raise Overloaded(f"model {self.model_name!r} is predicted to answer in "
                             f"{finish_s * 1e3:.0f} ms, after the request's deadline "
                             f"({(deadline_s - now_s) * 1e3:.0f} ms from now)")
        budget_s = self._queue_budget_s
        if budget_s is not None:
            wait_s = finish_s - replica.joining_batch_s(num_samples)
            if wait_s > budget_s and (config.max_queue_delay_s is not None
                                      or self._past_min_queue(queues, num_samples,
                                                              num_in_service)):
                counters.rejected["queue_delay"] += 1
                raise Overloaded(f"model {self.model_name!r} is predicted to queue the request "
                                 f"for {wait_s * 1e3:.0f} ms, over the queueing budget of "
                                 f"{budget_s * 1e3:.0f} ms (--max-queue-delay-ms)")
        slo_s = config.slo_s
        if slo_s is None:
            return
        if replica.joins_next_batch(num_samples):
            # It joins the next batch: the batch sizes already keep that within the target
            # (max wait + the running batch + its own), so a prediction near the SLO at
            # moderate load is no reason to refuse it.
            return
        if finish_s + margin_s > slo_s:
            counters.rejected["latency_target"] += 1
            raise Overloaded(f"model {self.model_name!r} is predicted to answer in "
                             f"{finish_s * 1e3:.0f} ms (+{margin_s * 1e3:.0f} "
                             f"ms of measured lateness), over its SLO of {slo_s * 1e3:.0f} ms "
                             "(--slo-ms)")

    def _past_min_queue(self, queues: Sequence[JobQueue], num_samples: int,
                        num_in_service: int) -> bool:
        """Whether ``num_samples`` more would queue more than ``queue_budget_min_batches`` full
        batches per replica in service (below that the default budget refuses nothing)."""
        config = self.config
        queued = sum(queue.num_samples for queue in queues) + num_samples
        return queued > config.queue_budget_min_batches * config.max_batch * num_in_service
