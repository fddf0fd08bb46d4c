"""The placement scenarios' machinery in virtual time: simulated GPUs with memory that several
models' replicas share, a loader that takes a model's load time, the Ray-Serve-like autoscaler
baseline, and one open-loop run of a scenario under a placement strategy.

The production ``ModelBalancer`` serves each model and the production ``Placer`` carries out
the strategy's moves (loads first, drains after); only the devices and the clock are simulated.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from benchmarks.virtual_time import VirtualLoop
from evenflow.balancer import BalancerConfig, EvenflowError, ModelBalancer
from evenflow.balancer.capacity import DeviceCost
from evenflow.balancer.job import BatchResult, BatchTiming, Job, SingleDeviceWorker
from evenflow.balancer.ledger import DeviceLedger
from evenflow.balancer.placement.assessment import assess
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile, Placement
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.placer import Placer, PlacerSettings
from evenflow.balancer.placement.report import MoveRecord
from evenflow.balancer.placement.view import PlacerView, Strategy
from evenflow.balancer.timebase import LoopTime
from evenflow.loadtest.percentiles import ordered_percentile
from evenflow.loadtest.slo_search import Probe

GIB = 2**30


@dataclass(frozen=True, slots=True)
class SimModel:
    name: str
    memory_gib: float
    base_s: float  # batch cost at speed 1: base_s + per_sample_s * b
    per_sample_s: float
    load_s: float = 2.0
    min_replicas: int = 0


@dataclass(frozen=True, slots=True)
class Phase:
    """``mix``: each model's share of the requests; ``slow``: (device index, factor it is
    slowed by from this phase on). Tuples, so a scenario can key a cache."""

    seconds: float
    mix: tuple[tuple[str, float], ...]
    slow: tuple[tuple[int, float], ...] = ()

    @property
    def shares(self) -> dict[str, float]:
        return dict(self.mix)


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    models: tuple[SimModel, ...]
    phases: tuple[Phase, ...]
    speeds: tuple[float, ...] = (1.0, 1.0, 0.5, 0.25)
    memory_gib: tuple[float, ...] = (16.0, 16.0, 8.0, 8.0)
    max_batch: int = 64

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(f"sim{i}", int(m * GIB)) for i, m in enumerate(self.memory_gib)]

    def phase_speeds(self) -> list[tuple[float, ...]]:
        speeds = list(self.speeds)
        out = []
        for phase in self.phases:
            for index, factor in phase.slow:
                speeds[index] /= factor
            out.append(tuple(speeds))
        return out

    def profiles(self, slo_s: float, speeds: Sequence[float] | None = None
                 ) -> dict[str, ModelProfile]:
        speeds = self.speeds if speeds is None else speeds
        return {m.name: ModelProfile(
            m.name, int(m.memory_gib * GIB),
            {f"sim{i}": DeviceCost(m.base_s, m.per_sample_s, s) for i, s in enumerate(speeds)},
            self.max_batch, slo_s, m.load_s, m.min_replicas) for m in self.models}

    def start_s(self, index: int) -> float:
        return sum(p.seconds for p in self.phases[:index])


@dataclass(slots=True)
class SimGpu:
    """One simulated device: its speed (changed by slow-downs) and a lock, since a device runs
    one batch at a time whichever model it belongs to."""

    name: str
    speed: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(frozen=True, slots=True)
class Overheads:
    """What a real server adds that the simulated devices do not have: per request, the time
    outside the balancer a client sees on top (the gRPC round trip and codec); per batch, the
    hand-offs to the worker and back, whatever the device's speed. Both 0 compares strategies
    alone; ``benchmarks.placement_real`` measures them on the real server."""

    transport_s: float = 0.0
    batch_overhead_s: float = 0.0


NO_OVERHEADS = Overheads()


@dataclass(slots=True)
class SimReplica(SingleDeviceWorker):
    """A model's replica on a ``SimGpu``."""

    gpu: SimGpu
    base_s: float
    per_sample_s: float
    overhead_s: float = 0.0  # per batch (``Overheads.batch_overhead_s``)

    @property
    def name(self) -> str:
        return self.gpu.name

    @property
    def devices(self) -> Sequence[str]:
        return (self.gpu.name,)

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        samples = sum(job.num_samples for job in jobs)
        async with self.gpu.lock:
            cost_s = (self.base_s + self.per_sample_s * samples) / self.gpu.speed
            await asyncio.sleep(cost_s)
        if self.overhead_s:
            # The hand-offs hold this replica's next batch back, not the device: another
            # model's batch, waiting on the device already, starts meanwhile.
            await asyncio.sleep(self.overhead_s)
        return BatchResult([None] * len(jobs), BatchTiming(0.0, cost_s, 0.0))

    async def restart(self) -> None:
        return None

    async def close(self) -> None:
        return None


class SimLoader:
    """Loads a replica in its model's ``load_s`` of virtual time."""

    def __init__(self, models: Mapping[str, SimModel], gpus: Mapping[str, SimGpu],
                 batch_overhead_s: float = 0.0) -> None:
        self._models = models
        self._gpus = gpus
        self._batch_overhead_s = batch_overhead_s
        self.loads = 0

    async def load_replica(self, model: str, device: str) -> SimReplica:
        spec = self._models[model]
        await asyncio.sleep(spec.load_s)
        self.loads += 1
        return SimReplica(self._gpus[device], spec.base_s, spec.per_sample_s,
                          self._batch_overhead_s)


class RayLikeAutoscaler:
    """Ray Serve's request-based autoscaling: each model wants ``ceil(ongoing / target)``
    replicas (ongoing: its requests queued or running; target 2 per replica), at least one;
    a change holds for ``upscale_delay_s`` / ``downscale_delay_s`` before it is made; a new
    replica goes to the device with the most free memory that fits it (Ray's spread across
    nodes), a dropped one is the newest. Ray's defaults are 30 s and 600 s; these are shorter,
    in the baseline's favour on runs this long."""

    def __init__(self, balancers: Mapping[str, ModelBalancer], target: float = 2.0,
                 upscale_delay_s: float = 2.0, downscale_delay_s: float = 10.0) -> None:
        self._balancers = balancers
        self.target = target
        self.upscale_delay_s = upscale_delay_s
        self.downscale_delay_s = downscale_delay_s
        self._wants_since: dict[str, tuple[int, float]] = {}

    def moves(self, view: PlacerView) -> Sequence[tuple[Move, str]]:
        moves: list[tuple[Move, str]] = []
        placement = set(view.placement)
        for name, balancer in sorted(self._balancers.items()):
            have = sorted(d for n, d in placement if n == name)
            ongoing = balancer.admitted_requests
            want = max(1, math.ceil(ongoing / self.target)) if ongoing or have else 0
            if want == len(have):
                self._wants_since.pop(name, None)
                continue
            direction, since_s = self._wants_since.get(name, (want, view.now_s))
            if (direction > len(have)) != (want > len(have)):
                since_s = view.now_s
            self._wants_since[name] = (want, since_s)
            delay_s = self.upscale_delay_s if want > len(have) else self.downscale_delay_s
            if view.now_s - since_s < delay_s:
                continue
            profile = view.profiles[name]
            if want > len(have):
                free = {d.name: d.memory_bytes - sum(view.profiles[n].memory_bytes
                                                      for n, w in placement if w == d.name)
                        for d in view.devices if d.name not in have}
                fitting = [d for d, f in free.items() if f >= profile.memory_bytes]
                if fitting:
                    device = max(fitting, key=lambda d: (free[d], d))
                    moves.append((Move("add", name, device), "autoscaler"))
                    placement.add((name, device))
            elif len(have) > 1:
                moves.append((Move("drop", name, have[-1]), "autoscaler"))
                placement.discard((name, have[-1]))
            self._wants_since.pop(name, None)
        return moves


@dataclass(slots=True)
class Run:
    """One run's answers: per phase, the latencies of requests arriving after the settling
    time, and errors; per second, the requests sent and those answered within the SLO; and
    the live placement over time."""

    phase_latencies_s: list[list[float]]
    phase_sent: list[int]
    phase_errors: list[int]
    ok_by_second: list[int]
    placements: list[tuple[float, Placement]]
    moves: tuple[MoveRecord, ...] = ()
    sent_by_second: list[int] = field(default_factory=list)

    @classmethod
    def empty(cls, phases: int, seconds: float) -> Run:
        return cls([[] for _ in range(phases)], [0] * phases, [0] * phases,
                   [0] * int(seconds + 1), [], sent_by_second=[0] * int(seconds + 1))


class _Serving:
    """A scenario's devices, models and placer, started from the first phase's best
    placement."""

    def __init__(self, scenario: Scenario, strategy_name: str, slo_s: float, seed: int,
                 start: Placement | None = None, overheads: Overheads = NO_OVERHEADS) -> None:
        from benchmarks.placement_bound import first_phase_placement

        loop = asyncio.get_running_loop()
        devices = scenario.devices()
        self.gpus = {d.name: SimGpu(d.name, s)
                     for d, s in zip(devices, scenario.speeds, strict=True)}
        loader = SimLoader({m.name: m for m in scenario.models}, self.gpus,
                           overheads.batch_overhead_s)
        ledger = DeviceLedger()
        config = BalancerConfig(latency_target_s=slo_s, slo_s=slo_s,
                                max_batch=scenario.max_batch, max_queued_requests=100_000)
        start = first_phase_placement(scenario, slo_s) if start is None else start
        self.balancers: dict[str, ModelBalancer] = {}
        profiles = scenario.profiles(slo_s)
        self.placer = Placer(
            devices=devices, speeds={d.name: s for d, s in zip(devices, scenario.speeds,
                                                               strict=True)},
            loader=loader, strategy=make_strategy(strategy_name, self.balancers),
            time_source=LoopTime(loop.time), mode=strategy_name, settings=PlacerSettings())
        for model in scenario.models:
            workers = {d: SimReplica(self.gpus[d], model.base_s, model.per_sample_s,
                                     overheads.batch_overhead_s)
                       for n, d in sorted(start) if n == model.name}
            balancer = ModelBalancer(
                model_name=model.name, workers=list(workers.values()), config=config,
                clock=loop.time, rng=random.Random(seed + len(self.balancers)), ledger=ledger,
                on_no_replica=self.placer.no_replica_callback(model.name))
            self.balancers[model.name] = balancer
            self.placer.add_model(profiles[model.name],
                                  DeviceCost(model.base_s, model.per_sample_s), balancer,
                                  workers)
            balancer.start()
        self.placer.start()

    async def close(self) -> None:
        await self.placer.close()
        for balancer in self.balancers.values():
            await balancer.close()


async def run_scenario(scenario: Scenario, strategy_name: str, slo_s: float, rate_per_s: float,
                       seed: int, settle_s: float, warmup_s: float = 10.0,
                       start: Placement | None = None,
                       overheads: Overheads = NO_OVERHEADS) -> Run:
    """One open-loop run: ``warmup_s`` at the first phase's mix, then the phases. Every
    strategy starts from ``start``, by default the static placement sized for the first phase
    (the warm-up lets it settle). Requests of one sample each, Poisson arrivals, each
    request's model drawn from its phase's mix. A latency is from a request's arrival to its
    answer, plus ``overheads.transport_s``."""
    loop = asyncio.get_running_loop()
    serving = _Serving(scenario, strategy_name, slo_s, seed, start, overheads)
    phases = [Phase(warmup_s, scenario.phases[0].mix), *scenario.phases]
    bounds_s = [loop.time()]
    for phase in phases:
        bounds_s.append(bounds_s[-1] + phase.seconds)
    speeds_now = list(scenario.speeds)
    for index, phase in enumerate(phases):
        for device, factor in phase.slow:
            speeds_now[device] /= factor
            loop.call_at(bounds_s[index], _set_speed, serving.gpus[f"sim{device}"],
                         speeds_now[device])
    result = Run.empty(len(scenario.phases), bounds_s[-1] - bounds_s[1])
    rng = random.Random(seed)
    pending: list[asyncio.Future[object]] = []

    def answered(future: asyncio.Future[object], arrived_s: float, phase: int,
                 counted: bool) -> None:
        if future.cancelled() or future.exception() is not None:
            result.phase_errors[phase] += counted
            return
        latency_s = loop.time() - arrived_s + overheads.transport_s
        if counted:
            result.phase_latencies_s[phase].append(latency_s)
        if latency_s <= slo_s:
            result.ok_by_second[int(arrived_s - bounds_s[1])] += 1

    now_s = bounds_s[0]
    next_sample_s = bounds_s[1]
    for index, phase in enumerate(phases):
        names = sorted(phase.shares)
        weights = [phase.shares[n] for n in names]
        measured = index - 1  # the warm-up is phase -1
        while (now_s := now_s + rng.expovariate(rate_per_s)) < bounds_s[index + 1]:
            await asyncio.sleep(max(0.0, now_s - loop.time()))
            if now_s >= next_sample_s:
                result.placements.append((now_s - bounds_s[1], frozenset(
                    (model, device) for model, device, state in serving.placer.snapshot().replicas
                    if state == "serving")))
                next_sample_s += 0.5
            counted = measured >= 0 and now_s >= bounds_s[index] + settle_s
            result.phase_sent[measured] += counted
            if measured >= 0:
                result.sent_by_second[int(now_s - bounds_s[1])] += 1
            try:
                future = serving.balancers[rng.choices(names, weights)[0]].submit(None, 1)
            except EvenflowError:
                result.phase_errors[measured] += counted
                continue
            if measured >= 0:
                future.add_done_callback(functools.partial(
                    answered, arrived_s=now_s, phase=measured, counted=counted))
            pending.append(future)
        now_s = bounds_s[index + 1]
    await asyncio.gather(*pending, return_exceptions=True)
    result.moves = tuple(serving.placer.snapshot().recent)
    await serving.close()
    return result


def _set_speed(gpu: SimGpu, speed: float) -> None:
    gpu.speed = speed


def make_strategy(name: str, balancers: Mapping[str, ModelBalancer]) -> Strategy:
    from evenflow.balancer.placement.auto import AutoStrategy
    from evenflow.balancer.placement.view import Static

    if name == "auto":
        return AutoStrategy()
    if name == "static":
        return Static()
    if name == "ray-like":
        return RayLikeAutoscaler(balancers)
    raise ValueError(f"unknown strategy {name!r}")


def phase_percentiles_s(run: Run, q: float) -> list[float]:
    """Each phase's q-quantile of its counted latencies (nan for a phase without any)."""
    out = []
    for latencies in run.phase_latencies_s:
        latencies.sort()
        out.append(ordered_percentile(latencies, q) if latencies else math.nan)
    return out


def probe_of(run: Run, rate_per_s: float, seed: int) -> Probe:
    """The run as one probe of the SLO search: its worst phase decides (p99 and errors)."""
    p99s, p50s = phase_percentiles_s(run, 0.99), phase_percentiles_s(run, 0.5)
    errors = [failed / sent if sent else 0.0
              for sent, failed in zip(run.phase_sent, run.phase_errors, strict=True)]
    p99 = math.nan if any(math.isnan(p) for p in p99s) else max(p99s)
    served = sum(len(x) for x in run.phase_latencies_s)
    return Probe(rate_per_s, seed, max(p50s), p99, max(errors), float(served))


def run_probe(scenario: Scenario, strategy: str, slo_s: float, rate_per_s: float, seed: int,
              settle_s: float) -> Probe:
    loop = VirtualLoop()
    try:
        run = loop.run_until_complete(run_scenario(scenario, strategy, slo_s, rate_per_s, seed,
                                                   settle_s))
    finally:
        loop.close()
    return probe_of(run, rate_per_s, seed)


def headroom_over_time(run: Run, scenario: Scenario, slo_s: float, rate_per_s: float
                       ) -> list[tuple[float, float]]:
    """The live placement's computed headroom for the phase's true demand, over time."""
    out = []
    speeds = scenario.phase_speeds()
    for at_s, placement in run.placements:
        index = max(i for i in range(len(scenario.phases)) if scenario.start_s(i) <= at_s)
        demand = {n: share * rate_per_s for n, share in scenario.phases[index].mix}
        profiles = scenario.profiles(slo_s, speeds[index])
        out.append((at_s, assess(placement, profiles, demand).headroom))
    return out
