"""Counters the balancer keeps per replica and per model, and the snapshots it hands out."""

from __future__ import annotations

import bisect
import math
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from evenflow.balancer.job import BatchTiming


class BusyMeter:
    """Fraction of recent wall time a replica spent running batches, over a sliding window."""

    def __init__(self, window_s: float = 1.0) -> None:
        self._window_s = window_s
        self._intervals: deque[tuple[float, float]] = deque()
        self.total_busy_s = 0.0

    def record(self, start_s: float, end_s: float) -> None:
        self._intervals.append((start_s, end_s))
        self.total_busy_s += end_s - start_s
        self._forget_before(end_s - self._window_s)  # bounded even if nobody reads it

    def _forget_before(self, since_s: float) -> None:
        intervals = self._intervals
        while intervals and intervals[0][1] <= since_s:
            intervals.popleft()

    def fraction(self, now_s: float, running_since_s: float | None = None) -> float:
        since_s = now_s - self._window_s
        self._forget_before(since_s)
        busy_s = sum(end - max(start, since_s) for start, end in self._intervals)
        if running_since_s is not None:
            busy_s += now_s - max(running_since_s, since_s)
        return min(1.0, busy_s / self._window_s)


@dataclass(slots=True)
class DurationStat:
    count: int = 0
    total_s: float = 0.0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.total_s += seconds


# Why admission refused a request: a count bound, its own deadline (predicted to finish after
# it), the latency target or the queueing budget (predicted to wait too long).
REJECT_REASONS = ("queue_full", "deadline", "latency_target", "queue_delay")
# Why an admitted request never ran: its deadline passed in the queue, or its caller went away.
DROP_REASONS = ("deadline", "cancelled")

# Upper bounds (seconds) of the request-latency histogram's buckets: fine around the usual
# latency targets (10-100 ms), coarse in the tail; anything above the last goes to +Inf.
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025,
    0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5,
    2.0, 3.0, 5.0, 10.0)


class LatencyHistogram:
    """Cumulative-at-read histogram of request latencies (successful requests), for Prometheus'
    ``histogram_quantile``. One bisect and one increment per request."""

    __slots__ = ("counts", "total_s")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)  # the last is +Inf
        self.total_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
        self.total_s += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, requests at or below it) per bucket, +Inf last."""
        running, buckets = 0, []
        for bound, count in zip((*LATENCY_BUCKETS_S, float("inf")), self.counts, strict=True):
            running += count
            buckets.append((bound, running))
        return buckets


# A lateness margin that no answer has confirmed for this long is forgotten. The margin can
# refuse every request that would renew it (all of a model's traffic carries deadlines closer
# than a stall's lateness): kept until answers renew it, it would refuse them for good. Five
# seconds is long beside any batch a server answers (the window of 512 turns over in less at
# 100 requests a second), so a loaded model keeps its margin; a stall's margin ends within it.
LATENESS_FORGET_S = 5.0


class Lateness:
    """How much later than predicted admitted requests were answered: the high quantile of a
    sliding window, refreshed once per batch. One per replica (a shared queue's replicas share
    one): the margin it keeps is what the device-time model misses there (batch joiners,
    thread hand-offs, a busy loop, another model's turns on the device), learned rather than
    guessed. Admission adds it to a prediction; routing, work stealing and late binding read it
    as the replica's spread. All read it through ``margin_at``: a margin no answer has renewed
    for ``LATENESS_FORGET_S`` is forgotten, its window with it."""

    __slots__ = ("_fresh", "_grown", "_heard_s", "_quantile", "_recent", "_since_refresh",
                 "margin_s")

    # Sorting the window costs ~15 us: once per this many new values while lateness stays
    # within the margin, at once when a value passes it (a stall must raise the margin now).
    _REFRESH_EVERY = 32

    def __init__(self, window: int = 512, quantile: float = 0.99) -> None:
        self._recent: deque[float] = deque(maxlen=window)
        self._quantile = quantile
        self._since_refresh = 0
        self._grown = False
        self._fresh = False  # a value came since the last refresh
        self._heard_s = -math.inf  # when a refresh last had a new value
        self.margin_s = 0.0

    def add(self, late_s: float) -> None:
        if late_s > -math.inf:  # admitted without a prediction (a cold replica): nothing to learn
            self._recent.append(late_s)
            self._since_refresh += 1
            self._grown = self._grown or late_s > self.margin_s
            self._fresh = True

    def refresh(self, now_s: float) -> None:
        """Recompute the margin (values added until ``now_s``): at once when a new value passed
        it, else once per 32 new values (and for each of the first 32)."""
        if self._fresh:
            self._fresh = False
            self._heard_s = now_s
        if not self._grown and self._since_refresh < self._REFRESH_EVERY \
                and len(self._recent) > self._REFRESH_EVERY:
            return
        self._since_refresh = 0
        self._grown = False
        if self._recent:
            ordered = sorted(self._recent)  # nearest rank, as loadtest.percentiles
            index = max(0, math.ceil(self._quantile * len(ordered)) - 1)
            self.margin_s = max(0.0, ordered[index])

    def margin_at(self, now_s: float) -> float:
        """The margin to add to a prediction made at ``now_s``: ``margin_s``, or 0 once no new
        value has come for ``LATENESS_FORGET_S`` (then the window is cleared too, so that the
        next answers are not judged beside the values that set the old margin)."""
        if now_s - self._heard_s <= LATENESS_FORGET_S:
            return self.margin_s
        if self._recent:
            self._recent.clear()
            self._since_refresh = 0
            self._grown = False
        self.margin_s = 0.0
        return 0.0


@dataclass(slots=True)
class BatchSizeStat:
    """Triton's per-batch-size statistics: how often each size ran and its phase times."""

    compute_input: DurationStat = field(default_factory=DurationStat)
    compute_infer: DurationStat = field(default_factory=DurationStat)
    compute_output: DurationStat = field(default_factory=DurationStat)


CPU_PARTS = ("decode", "route", "batching", "batch_in", "model", "batch_out", "completion",
             "encode")
"""The parts of a request's path whose CPU time is counted (``CpuParts``), in path order:
the front-end's decode of the request, admission and routing, batch formation, the worker's
input batching, the model, the worker's output split, completion of the batch's requests on the
event loop, the front-end's encode of the response. What is not here (gRPC, the event loop
itself, hand-offs between threads) is the process's CPU time minus their sum."""


class CpuParts:
    """CPU seconds per part of the request path, each measured on the thread that runs it
    (``time.thread_time``: a system call per reading, so it is on only when asked for)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(CPU_PARTS, 0.0)

    def add(self, part: str, seconds: float) -> None:
        self.seconds[part] += seconds

    def add_batch(self, cpu: BatchTiming) -> None:
        """A worker thread's CPU seconds in a batch's phases: input batching, model, split."""
        seconds = self.seconds
        seconds["batch_in"] += cpu.copy_in_s
        seconds["model"] += cpu.compute_s
        seconds["batch_out"] += cpu.copy_out_s


class ArrivalRate:
    """Samples per second recently routed to a replica: an exponentially decaying rate, so a
    burst counts at once and fades over about ``tau_s`` once it ends."""

    __slots__ = ("_at_s", "_per_s", "_tau_s")

    def __init__(self, tau_s: float = 0.5) -> None:
        self._tau_s = tau_s
        self._per_s = 0.0
        self._at_s = 0.0

    def add(self, num_samples: int, now_s: float) -> None:
        self._per_s = self.per_s(now_s) + num_samples / self._tau_s
        self._at_s = now_s

    def per_s(self, now_s: float) -> float:
        return self._per_s * math.exp(-max(0.0, now_s - self._at_s) / self._tau_s)


@dataclass(slots=True)
class ModelCounters:
    """Triton-style inference statistics for one model, summed over its replicas."""

    success: DurationStat = field(default_factory=DurationStat)
    fail: DurationStat = field(default_factory=DurationStat)
    queue: DurationStat = field(default_factory=DurationStat)
    compute_input: DurationStat = field(default_factory=DurationStat)
    compute_infer: DurationStat = field(default_factory=DurationStat)
    compute_output: DurationStat = field(default_factory=DurationStat)
    batches: dict[int, BatchSizeStat] = field(default_factory=dict)
    inference_count: int = 0
    execution_count: int = 0
    last_inference_s: float = 0.0  # wall clock (time.time) of the last finished batch
    # Requests refused at admission, by reason: queue_full (a count bound), deadline (predicted
    # to finish after its own deadline), latency_target / queue_delay (over the time budget).
    rejected: Counter[str] = field(default_factory=Counter)
    # Admitted requests that never ran, by reason: deadline (passed in the queue), cancelled.
    dropped: Counter[str] = field(default_factory=Counter)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)
    cpu: CpuParts | None = None  # CPU time by part of the request path, when measured
    rerouted: int = 0  # requests moved off a replica that lost its worker
    rebound: int = 0  # requests moved by late binding as their batch was about to start
    # Every request that reached submit, refused or not, and its samples (demand).
    arrived_requests: int = 0
    arrived_samples: int = 0

    def statistics(self) -> ModelStatistics:
        """A copy of what the server reports of the model (Triton's statistics and metrics)."""
        return ModelStatistics(
            success=_copy(self.success), fail=_copy(self.fail), queue=_copy(self.queue),
            compute_input=_copy(self.compute_input), compute_infer=_copy(self.compute_infer),
            compute_output=_copy(self.compute_output),
            batches={size: BatchSizeStat(_copy(stat.compute_input), _copy(stat.compute_infer),
                                         _copy(stat.compute_output))
                     for size, stat in self.batches.items()},
            inference_count=self.inference_count, execution_count=self.execution_count,
            last_inference_s=self.last_inference_s,
            latency_buckets=tuple(self.latency.cumulative()),
            latency_total_s=self.latency.total_s,
            cpu_seconds=None if self.cpu is None else dict(self.cpu.seconds))

    def record_batch(self, num_samples: int, timing: BatchTiming) -> None:
        stat = self.batches.get(num_samples)
        if stat is None:
            stat = self.batches[num_samples] = BatchSizeStat()
        stat.compute_input.add(timing.copy_in_s)
        stat.compute_infer.add(timing.compute_s)
        stat.compute_output.add(timing.copy_out_s)
        self.execution_count += 1
        self.inference_count += num_samples


def _copy(stat: DurationStat) -> DurationStat:
    return DurationStat(stat.count, stat.total_s)


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """A model's statistics at one instant, copied from its ``ModelCounters``: Triton's
    per-model and per-batch-size durations, the request-latency histogram (cumulative
    ``(upper bound, requests)`` buckets, +Inf last) and, when counted, CPU seconds by part."""

    success: DurationStat
    fail: DurationStat
    queue: DurationStat
    compute_input: DurationStat
    compute_infer: DurationStat
    compute_output: DurationStat
    batches: dict[int, BatchSizeStat]
    inference_count: int
    execution_count: int
    last_inference_s: float  # wall clock (time.time) of the last finished batch
    latency_buckets: tuple[tuple[float, int], ...]
    latency_total_s: float
    cpu_seconds: dict[str, float] | None  # None: not counted (EVENFLOW_CPU_PARTS unset)


@dataclass(frozen=True, slots=True)
class ReplicaSnapshot:
    name: str
    devices: tuple[str, ...]
    busy_fraction: float
    busy_s: float
    queued_requests: int
    queued_samples: int
    outstanding_work_s: float
    batch_size: int
    fit_base_s: float
    fit_per_sample_s: float
    fit_reliable: bool
    num_batches: int
    num_samples: int
    num_stolen_requests: int
    running_requests: int
    batch_size_counts: dict[int, int]
    stages: tuple[Mapping[str, Any], ...] = ()  # pipeline replicas: their worker's plan
    num_repartitions: int = 0
    healthy: bool = True  # in routing (False while its lost worker restarts)
    restarts: int = 0
    location: str = ""  # where the worker runs (its host's name for it; "" in this process)
    unusable_reason: str = ""  # why the replica is out of routing for good (a lost device)
    num_requests: int = 0  # answered by its batches
    turn_wait_s: float = 0.0  # waiting for a turn on a device shared with other models
    # The fit is accurate lately, perhaps at one batch size alone; its measurements' weighted
    # mean batch size and latency (``LatencyFit``).
    fit_settled: bool = False
    fit_batch_size: float = 0.0
    fit_latency_s: float = 0.0


@dataclass(frozen=True, slots=True)
class BalancerSnapshot:
    model_name: str
    policy: str
    batch_policy: str
    latency_target_s: float
    queued_requests: int
    num_rejected: int
    replicas: tuple[ReplicaSnapshot, ...]
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    parked_requests: int = 0  # admitted, waiting for a replica to load (not in queued)


class ReplicaCounters:
    """Per-replica counters read by the stats RPC."""

    def __init__(self) -> None:
        self.busy = BusyMeter()
        self.num_batches = 0
        self.num_samples = 0
        self.num_requests = 0
        self.num_stolen_requests = 0
        # Seconds ready batches waited for a turn on a device shared with other models: what
        # sharing costs this replica.
        self.turn_wait_s = 0.0
        self.batch_size_counts: Counter[int] = Counter()

    def record_batch(self, num_samples: int, num_requests: int, start_s: float,
                     end_s: float) -> None:
        """A batch of ``num_samples`` from ``num_requests`` requests ran on the device from
        ``start_s`` to ``end_s``."""
        self.busy.record(start_s, end_s)
        self.num_batches += 1
        self.num_samples += num_samples
        self.num_requests += num_requests
        self.batch_size_counts[num_samples] += 1
