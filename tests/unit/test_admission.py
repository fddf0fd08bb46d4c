"""Admission rules alone: predictions in, a refusal (by reason) or nothing out; no event loop
for the rules in time, a queue of real jobs for the count bounds."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import pytest

from evenflow.balancer import BalancerConfig, Job, Overloaded
from evenflow.balancer.admission import Admission
from evenflow.balancer.queue import JobQueue
from evenflow.balancer.stats import ModelCounters

NOW_S = 1000.0


@dataclass
class Placed:
    """The replica a request was routed to, as admission sees it."""

    batch_s: float = 0.010  # its batch would take this long
    joins_next: bool = False  # it fits in the next batch

    def joining_batch_s(self, num_samples: int) -> float:
        return self.batch_s

    def joins_next_batch(self, num_samples: int) -> bool:
        return self.joins_next


def admission(**overrides: object) -> Admission:
    return Admission(model_name="m", config=BalancerConfig(**overrides),  # type: ignore[arg-type]
                     counters=ModelCounters())


@pytest.mark.parametrize(("overrides", "placed", "finish_s", "deadline_s", "reason"), [
    # Predicted past its own deadline: refused whatever else is configured.
    ({}, Placed(), 0.030, NOW_S + 0.020, "deadline"),
    ({}, Placed(), 0.030, NOW_S + 0.040, None),
    # An operator's queueing budget: the wait before its batch starts, to the letter.
    ({"max_queue_delay_s": 0.1}, Placed(batch_s=0.010), 0.111, math.inf, "queue_delay"),
    ({"max_queue_delay_s": 0.1}, Placed(batch_s=0.010), 0.109, math.inf, None),
    # The default budget (0.5 s) refuses nothing while the queues are short (here: empty).
    ({}, Placed(batch_s=0.010), 2.0, math.inf, None),
    # A declared SLO: past it is refused, unless the request joins the next batch.
    ({"slo_s": 0.05}, Placed(), 0.060, math.inf, "latency_target"),
    ({"slo_s": 0.05}, Placed(joins_next=True), 0.060, math.inf, None),
    ({"slo_s": 0.05}, Placed(), 0.040, math.inf, None),
    # No prediction yet (a cold replica): the benefit of the doubt.
    ({"slo_s": 0.05}, Placed(), math.inf, NOW_S + 0.001, None),
])
def test_admission_in_time(overrides: dict[str, object], placed: Placed, finish_s: float,
                           deadline_s: float, reason: str | None) -> None:
    rules = admission(**overrides)
    if reason is None:
        rules.in_time(placed, 1, NOW_S, finish_s, 0.0, deadline_s, [JobQueue()], 1)
        assert not rules.counters.rejected
        return
    with pytest.raises(Overloaded):
        rules.in_time(placed, 1, NOW_S, finish_s, 0.0, deadline_s, [JobQueue()], 1)
    assert rules.counters.rejected == {reason: 1}


def test_measured_lateness_counts_against_the_deadline_and_the_slo() -> None:
    rules = admission(slo_s=0.05)
    # Its answers have come 15 ms later than predicted: 30 ms predicted is 45 ms.
    with pytest.raises(Overloaded, match="after the request's deadline"):
        rules.in_time(Placed(), 1, NOW_S, 0.030, 0.015, NOW_S + 0.040, [JobQueue()], 1)
    with pytest.raises(Overloaded, match=r"\+15 ms of measured lateness"):
        rules.in_time(Placed(), 1, NOW_S, 0.040, 0.015, math.inf, [JobQueue()], 1)
    # Another replica's answers have come on time: the same prediction there is admitted.
    rules.in_time(Placed(), 1, NOW_S, 0.040, 0.0, NOW_S + 0.045, [JobQueue()], 1)
    assert rules.counters.rejected == {"deadline": 1, "latency_target": 1}


async def test_count_bounds_refuse_once_cancelled_jobs_gave_their_slots_back() -> None:
    loop = asyncio.get_running_loop()
    queue = JobQueue()
    jobs = [Job(i, 2, NOW_S, math.inf, loop.create_future()) for i in range(2)]
    for job in jobs:
        queue.push(job)
    rules = admission(max_queued_requests=2, max_queued_samples=6)
    with pytest.raises(Overloaded, match="limit 2"):
        rules.by_count([queue], 1, NOW_S)
    jobs[0].future.cancel()  # its caller went away: its slot is free again
    rules.by_count([queue], 1, NOW_S)
    with pytest.raises(Overloaded, match="5 more exceed the limit of 6"):
        rules.by_count([queue], 5, NOW_S)
    assert rules.counters.rejected == {"queue_full": 2}
