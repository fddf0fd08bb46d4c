"""Routing policies: pure functions over a snapshot of each replica's load.

``least-work`` is evenflow's policy; ``round-robin``, ``pow2`` (Ray Serve's power of two choices)
and ``shared-queue`` (Triton's: one queue, any free replica takes the next batch) are baselines
kept in the same code so comparisons are honest. ``shared-queue`` needs no choice function: its
replicas pull from one queue.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Predicted finishing times this close are a tie (broken at random): float noise, not a choice.
_TIE_S = 1e-12


class Policy(enum.Enum):
    LEAST_WORK = "least-work"
    ROUND_ROBIN = "round-robin"
    SHARED_QUEUE = "shared-queue"
    POW2 = "pow2"


@dataclass(slots=True, kw_only=True)
class ReplicaLoad:
    """What a policy may know about one replica at one instant. Built for every replica on
    every routing decision, so not ``frozen``: a frozen dataclass's ``__init__`` sets each field
    through ``object.__setattr__`` (1.6 us against 0.7 us for these eleven fields, measured);
    nothing keeps or mutates one after the decision."""

    running_remaining_s: float  # predicted time left in the batch now running (0 when idle)
    running_requests: int
    queued_samples: int
    queued_requests: int
    base_s: float  # fitted fixed cost per batch, a
    per_sample_s: float  # fitted cost per sample, c
    batch_size: int  # the replica's current batch size
    arrival_rate_per_s: float = 0.0  # samples recently routed here per second
    cold: bool = False  # no batch measured yet: its a and c are only the prior
    shape_groups: int = 1  # distinct input shapes queued: each needs a batch of its own
    stale: bool = False  # idle, and its fit was last confirmed long ago: worth one probe
    # How much later than predicted this replica's answers have come lately (the high quantile
    # of answered minus predicted, at least 0): how far its prediction may be off.
    spread_s: float = 0.0

    def priced_by_fit(self) -> ReplicaLoad:
        """This load priced by its fit even when stale: what the replica is predicted to take,
        not the probe's price of no work that routing offers a stale replica."""
        return dataclasses.replace(self, stale=False) if self.stale else self

    def work_s(self, extra_samples: int = 0) -> float:
        """Seconds until this replica has finished everything it holds, plus ``extra_samples``
        appended to its queue: the running batch's remainder, then the queue in batches.

        With ``extra_samples``, the batch they land in also grows by the samples expected to
        arrive before it starts (up to the batch size): a busy replica's next batch fills up
        behind a new request and takes longer, which a snapshot of the queue alone misses.
        """
        if self.stale:
            # A replica that has sat idle on an old estimate (a device that was slow, or lost,
            # and has recovered) gets one request to measure itself again; a still-slow one
            # costs that request, then is priced by its new measurement. Exactly 0 only here:
            # a fit never prices work at 0 (``LatencyModel`` floors it).
            return 0.0
        if self.cold and (self.running_requests or self.queued_samples):
            # Probe, then trust: a replica that has not reported a batch yet takes one batch's
            # worth at most, or a slow new device priced by the prior would soak up a burst.
            return math.inf
        samples = self.queued_samples + extra_samples
        num_batches = max(math.ceil(samples / self.batch_size), self.shape_groups) \
            if samples else 0
        joiners = 0.0
        if extra_samples and self.arrival_rate_per_s > 0.0:
            starts_in_s = self.running_remaining_s + (num_batches - 1) * (
                self.base_s + self.per_sample_s * self.batch_size)
            room = self.batch_size * num_batches - samples
            joiners = min(float(room), self.arrival_rate_per_s * starts_in_s)
        return (self.running_remaining_s + num_batches * self.base_s
                + (samples + joiners) * self.per_sample_s)


def choose_least_work(loads: Sequence[ReplicaLoad], num_samples: int, rng: random.Random,
                      within_s: float = math.inf) -> int:
    """The replica where ``num_samples`` more would finish soonest; ties broken at random.

    With ``within_s`` (the seconds left until the request is due), the soonest of the replicas
    predicted to finish within it even as late as their predictions have lately come
    (``spread_s``), when there is one: a replica predicted sooner but with a wide spread (a
    device shared with other models, whose batches come between this model's) is often late,
    where one predicted a little later but narrowly (a device of its own, such as an overflow
    replica that answers one request within the SLO while idle) answers in time. Where no
    replica is safe so, the soonest of all, as without ``within_s``.
    """
    best_s = safe_best_s = math.inf
    best: list[int] = []
    safe_best: list[int] = []
    for index, load in enumerate(loads):
        finish_s = load.work_s(num_samples)
        if finish_s < best_s - _TIE_S:
            best_s = finish_s
            best = [index]
        elif finish_s <= best_s + _TIE_S:
            best.append(index)
        if not load.stale and finish_s + load.spread_s > within_s:
            continue  # a stale replica's 0 is a probe's price, taken as routing always has
        if finish_s < safe_best_s - _TIE_S:
            safe_best_s = finish_s
            safe_best = [index]
        elif finish_s <= safe_best_s + _TIE_S:
            safe_best.append(index)
    chosen = safe_best or best
    return chosen[0] if len(chosen) == 1 else rng.choice(chosen)


def choose_pow2(loads: Sequence[ReplicaLoad], rng: random.Random) -> int:
    """Two replicas at random; the one with fewer requests outstanding (queued plus running)."""
    if len(loads) == 1:
        return 0
    first, second = rng.sample(range(len(loads)), 2)

    def outstanding(i: int) -> int:
        return loads[i].queued_requests + loads[i].running_requests

    return first if outstanding(first) <= outstanding(second) else second


def plan_steal(thief: ReplicaLoad, victim: ReplicaLoad,
               victim_tail: Iterable[tuple[int, float]]) -> int:
    """How many jobs a replica should take from the tail of a busier replica's queue.

    ``victim_tail`` gives each of the victim's queued jobs' size and the seconds left until it
    is due, last queued first; it is read only as far as jobs move. A job moves when it would
    finish sooner on the thief (behind what the thief already holds and took) than where it is,
    unless it is in time where it is and would not be on the thief. The thief takes no more than
    the room left in its next batch (an idle thief: one batch, or one job of any size), so it
    never hoards work it cannot start now.
    """
    room = thief.batch_size - thief.queued_samples
    taken_samples = 0
    victim_samples = victim.queued_samples
    count = 0
    for samples, within_s in victim_tail:
        if taken_samples + samples > room and (count or thief.queued_samples):
            break
        here_s = dataclasses.replace(victim, queued_samples=victim_samples, queued_requests=0,
                                     arrival_rate_per_s=0.0, cold=False, shape_groups=1,
                                     stale=False).work_s()
        there_s = thief.work_s(taken_samples + samples)
        if there_s >= here_s:
            break
        if here_s + victim.spread_s <= within_s < there_s + thief.spread_s:
            break  # in time where it is even as late as that replica has been, not on the thief
        taken_samples += samples
        victim_samples -= samples
        count += 1
    return count
