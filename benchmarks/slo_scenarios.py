"""The SLO-goodput scenario set, and one open-loop run of a scenario in virtual time.

Each scenario is a set of simulated devices (batch of ``b`` samples costs
``(base + per_sample * b) / speed``), an arrival process, request sizes, how many models share
the devices, and events (a device slowing down mid-run). ``probe`` runs the production
``ModelBalancer`` against it on ``VirtualLoop`` and returns one ``Probe`` for the SLO search.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from benchmarks.virtual_time import SimDevice
from evenflow.balancer import BalancerConfig, EvenflowError, ModelBalancer
from evenflow.balancer.capacity import DeviceCost, slo_limit_per_s
from evenflow.balancer.job import BatchResult, Job, SingleDeviceWorker
from evenflow.balancer.ledger import DeviceLedger
from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.loadtest.percentiles import ordered_percentile
from evenflow.loadtest.slo_search import Probe


@dataclass(frozen=True, slots=True)
class SlowDown:
    """At ``at_fraction`` of the measured window, device ``device`` runs ``factor`` times
    slower."""

    at_fraction: float
    device: int
    factor: float


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    speeds: tuple[float, ...] = (1.0, 1.0, 0.5, 0.25)
    arrival: str = "poisson"
    base_s: float = 0.010  # the server's sim model: 10 ms + 2 ms per sample at speed 1
    per_sample_s: float = 0.002
    sizes: tuple[int, int] = (1, 1)  # samples per request, uniform in [low, high]
    models: int = 1  # models sharing the devices, equal shares of the traffic
    slow_downs: tuple[SlowDown, ...] = ()
    max_batch: int = 64

    @property
    def mean_size(self) -> float:
        return (self.sizes[0] + self.sizes[1]) / 2.0

    def phases(self) -> list[tuple[float, ...]]:
        """The device speeds in each phase of the run (one phase per slow-down, plus the
        first)."""
        speeds = list(self.speeds)
        phases = [tuple(speeds)]
        for event in sorted(self.slow_downs, key=lambda e: e.at_fraction):
            speeds[event.device] /= event.factor
            phases.append(tuple(speeds))
        return phases

    def limit_per_s(self, slo_s: float) -> float:
        """The reference goodput in requests/s: the computed limit of the slowest phase (the
        rate is held through every phase), in samples/s divided by the mean request size."""
        return min(slo_limit_per_s([DeviceCost(self.base_s, self.per_sample_s, s)
                                    for s in speeds], slo_s, self.max_batch)
                   for speeds in self.phases()) / self.mean_size


SCENARIOS = (
    Scenario("steady"),
    Scenario("slow-down", slow_downs=(SlowDown(0.25, 0, 4.0),)),
    Scenario("bursts", arrival="gamma:4"),
    Scenario("two-models", models=2),
    # Sizes up to 32 samples need a cheaper sample to fit a 50 ms SLO at all.
    Scenario("mixed-sizes", sizes=(1, 32), per_sample_s=0.00025),
)


@dataclass(slots=True)
class SharedDevice:
    """One simulated device that several models' replicas use: batches run one at a time."""

    device: SimDevice
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(slots=True)
class DeviceShare(SingleDeviceWorker):
    """A model's worker on a shared device."""

    shared: SharedDevice

    @property
    def name(self) -> str:
        return self.shared.device.name

    @property
    def devices(self) -> Sequence[str]:
        return self.shared.device.devices

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        async with self.shared.lock:
            return await self.shared.device.run(jobs)

    async def restart(self) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Window:
    """How long a probe runs (virtual seconds), and what a real server adds that the simulated
    devices do not have: per request, the time outside the balancer a client sees on top (the
    gRPC round trip and codec); per batch, the hand-offs to the worker and back. Both 0
    compares policies alone; ``benchmarks.slo_real_time`` measures them on a real server."""

    warmup_s: float = 2.0
    measured_s: float = 8.0
    transport_s: float = 0.0
    batch_overhead_s: float = 0.0


async def probe(scenario: Scenario, config: BalancerConfig, rate_per_s: float, seed: int,
                window: Window = Window()) -> Probe:
    """One open-loop run of ``scenario`` at ``rate_per_s`` on a virtual-time loop. Latency is
    from a request's arrival to its answer; a refusal (or a failed request) counts as an
    error; only requests arriving in the measured window count."""
    loop = asyncio.get_running_loop()
    config = replace(config, max_batch=scenario.max_batch)
    devices = [SharedDevice(SimDevice(f"sim{i}", speed, scenario.base_s, scenario.per_sample_s,
                                      window.batch_overhead_s))
               for i, speed in enumerate(scenario.speeds)]
    ledger = DeviceLedger()
    balancers = [ModelBalancer(model_name=f"m{k}", workers=[DeviceShare(d) for d in devices],
                               config=config, clock=loop.time, rng=random.Random(seed + k),
                               ledger=ledger)
                 for k in range(scenario.models)]
    for balancer in balancers:
        balancer.start()
    start_s = loop.time()
    measured_from_s = start_s + window.warmup_s
    for event in scenario.slow_downs:
        sim = devices[event.device].device
        loop.call_at(measured_from_s + event.at_fraction * window.measured_s,
                     _slow, sim, event.factor)
    rng = random.Random(seed * 7919 + 1)
    latencies_s: list[float] = []
    sent = errors = 0
    pending: list[asyncio.Future[object]] = []

    def answered(future: asyncio.Future[object], arrived_s: float) -> None:
        nonlocal errors
        if future.cancelled() or future.exception() is not None:
            errors += 1
        else:
            latencies_s.append(loop.time() - arrived_s + window.transport_s)

    for offset_s in send_times_s(Arrival.parse(scenario.arrival), rate_per_s,
                                 window.warmup_s + window.measured_s, seed):
        await asyncio.sleep(max(0.0, start_s + offset_s - loop.time()))
        arrived_s = loop.time()
        measured = arrived_s >= measured_from_s
        balancer = balancers[rng.randrange(len(balancers))]
        try:
            future = balancer.submit(None, rng.randint(*scenario.sizes))
        except EvenflowError:
            errors += measured
            sent += measured
            continue
        sent += measured
        if measured:
            future.add_done_callback(functools.partial(answered, arrived_s=arrived_s))
        pending.append(future)
    await asyncio.gather(*pending, return_exceptions=True)
    for balancer in balancers:
        await balancer.close()
    latencies_s.sort()
    nan = math.nan
    return Probe(rate_per_s, seed,
                 ordered_percentile(latencies_s, 0.5) if latencies_s else nan,
                 ordered_percentile(latencies_s, 0.99) if latencies_s else nan,
                 errors / sent if sent else 0.0, len(latencies_s) / window.measured_s)


def _slow(device: SimDevice, factor: float) -> None:
    device.speed /= factor
