"""Fakes for driving the real placer on live balancers in unit tests: a loader that takes
``LOAD_S`` of fake time, a strategy the test scripts, and a ``World`` of two devices (16 and
8 GiB) that checks, at every step of fake time, that no device's memory is exceeded."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from evenflow.balancer import BalancerConfig, ModelBalancer
from evenflow.balancer.capacity import DeviceCost
from evenflow.balancer.ledger import DeviceLedger
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.placer import Placer, PlacerSettings
from evenflow.balancer.placement.view import PlacerView, Strategy
from evenflow.balancer.timebase import sleep_s
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import FakeTime, answered, settle

GIB = 2**30
DEVICES = [DeviceInfo("d0", 16 * GIB), DeviceInfo("d1", 8 * GIB)]
LOAD_S = 2.0
SETTINGS = PlacerSettings(on_demand_wait_s=5.0)


class Loader:
    """Loads in ``LOAD_S`` of fake time, and fails where it is told to; keeps the workers it
    made and counts the loads cancelled."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self.fail: set[tuple[str, str]] = set()
        self.loaded: list[tuple[str, str]] = []
        self.workers: list[FakeWorker] = []
        self.cancelled = 0

    async def load_replica(self, model: str, device: str) -> FakeWorker:
        try:
            await sleep_s(self.time, LOAD_S)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if (model, device) in self.fail:
            raise RuntimeError("out of memory while loading")
        self.loaded.append((model, device))
        self.workers.append(FakeWorker(f"{model}@{device}", devices=(device,)))
        return self.workers[-1]


def profile(name: str, memory_gib: float, min_replicas: int = 0,
            pinned: frozenset[str] = frozenset()) -> ModelProfile:
    return ModelProfile(name, int(memory_gib * GIB),
                        {d.name: DeviceCost(0.01, 0.001, 1.0) for d in DEVICES}, 16, 0.05,
                        LOAD_S, min_replicas, pinned=pinned)


class Scripted:
    """A strategy that proposes what the test queued, once."""

    def __init__(self) -> None:
        self.queued: list[tuple[Move, str]] = []

    def moves(self, view: PlacerView) -> Sequence[tuple[Move, str]]:
        moves, self.queued = self.queued, []
        return moves


class World:
    def __init__(self, time: FakeTime, speeds: Mapping[str, float] | None = None,
                 settings: PlacerSettings = SETTINGS, strategy: Strategy | None = None) -> None:
        """``strategy``: the placer's, else one the test scripts (``self.strategy``)."""
        self.time = time
        self.ledger = DeviceLedger()
        self.loader = Loader(time)
        self.strategy = Scripted()
        self.placer = Placer(devices=DEVICES, speeds=speeds or {}, loader=self.loader,
                             strategy=strategy or self.strategy, time_source=time,
                             settings=settings)
        self.balancers: dict[str, ModelBalancer] = {}
        self.placer.start()  # its ticks run on the fake clock

    def model(self, name: str, memory_gib: float, on: Sequence[str] = (),
              min_replicas: int = 0, pinned: frozenset[str] = frozenset()) -> ModelBalancer:
        workers = {d: FakeWorker(f"{name}@{d}", devices=(d,)) for d in on}
        balancer = ModelBalancer(model_name=name, workers=list(workers.values()),
                                 config=BalancerConfig(max_wait_s=0.0), clock=self.time,
                                 ledger=self.ledger,
                                 on_no_replica=self.placer.no_replica_callback(name))
        balancer.start()
        self.balancers[name] = balancer
        self.placer.add_model(profile(name, memory_gib, min_replicas, pinned),
                              DeviceCost(0.01, 0.001), balancer, workers)
        return balancer

    async def run_for(self, seconds: float, step_s: float = 0.05) -> None:
        """Move time on, checking the memory held on every device at each step."""
        for _ in range(int(seconds / step_s)):
            await settle()
            for device in DEVICES:
                held = sum(self.placer.profiles()[m].memory_bytes
                           for m, d, _ in self.placer.snapshot().replicas if d == device.name)
                assert held <= device.memory_bytes, (device.name, self.placer.snapshot())
            self.time.advance(step_s)
        await settle()

    def outcomes(self) -> list[tuple[str, str, str, str]]:
        """The recent moves as (kind, model, device, outcome), oldest first."""
        return [(r.kind, r.model, r.device, r.outcome) for r in self.placer.snapshot().recent]

    def serving(self, name: str) -> list[str]:
        return sorted(d for m, d, state in self.placer.snapshot().replicas
                      if m == name and state == "serving")

    async def close(self) -> None:
        # Moving the clock while the placer closes: a test that failed may leave a move that
        # waits on fake time, and its teardown should end, not hang.
        await answered(self.time, asyncio.ensure_future(self.placer.close()), step_s=0.05)
        for balancer in self.balancers.values():
            await balancer.close()
