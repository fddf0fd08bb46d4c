"""The virtual-time simulator drives the real balancer deterministically; its results are policy
behaviour (exact, repeatable), not machine performance."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Iterator

import pytest

from benchmarks.virtual_time import SimDevice, VirtualLoop, closed_loop, open_loop, percentile
from evenflow.balancer import BalancerConfig, ModelBalancer, Overloaded, Policy
from evenflow.loadtest.arrivals import Arrival, send_times_s

pytestmark = pytest.mark.timeout(30)

SPEEDS = [1.0, 1.0, 0.5, 0.25]
LEAST_WORK = BalancerConfig()  # the server's defaults: least-work, 50 ms target, max wait 2 ms
ROUND_ROBIN = BalancerConfig(policy=Policy.ROUND_ROBIN)
SLO_S = 0.050
SLO = BalancerConfig(slo_s=SLO_S)  # the defaults with the 50 ms target declared an SLO


@pytest.fixture
def loop() -> Iterator[VirtualLoop]:
    virtual = VirtualLoop()
    yield virtual
    virtual.close()


def test_virtual_loop_jumps_over_sleeps(loop: VirtualLoop) -> None:
    wall_start = time.perf_counter()
    loop.run_until_complete(asyncio.sleep(100.0))
    assert loop.time() >= 100.0
    assert time.perf_counter() - wall_start < 5.0


def test_saturated_device_runs_batches_sized_for_the_latency_target(loop: VirtualLoop) -> None:
    # sim:1 costs 10 ms + 2 ms per sample; the 50 ms target allows 7 (2 + 2 * 24 ms) and a live
    # batch of 8 now and then, so a saturated device serves between 7/24 ms and 8/26 ms.
    rate = loop.run_until_complete(closed_loop(LEAST_WORK, [1.0], 64, 1.0, 3.0))
    assert 7 / 0.024 * 0.98 <= rate <= 8 / 0.026 * 1.02


def test_least_work_uses_every_device_and_round_robin_is_held_back_by_the_slowest(
        loop: VirtualLoop) -> None:
    alone = [loop.run_until_complete(closed_loop(LEAST_WORK, [s], 64, 1.0, 3.0))
             for s in SPEEDS]
    least_work = loop.run_until_complete(closed_loop(LEAST_WORK, SPEEDS, 64, 1.0, 3.0))
    round_robin = loop.run_until_complete(closed_loop(ROUND_ROBIN, SPEEDS, 64, 1.0, 3.0))
    assert least_work >= 0.95 * sum(alone)
    # Round-robin gives each device a quarter of the requests, so the slowest sets the pace.
    assert least_work >= 2.5 * round_robin


def test_open_loop_is_deterministic_for_a_seed() -> None:
    runs = []
    for _ in range(2):  # each on a fresh virtual clock, so both start at the same time
        fresh = VirtualLoop()
        try:
            runs.append(fresh.run_until_complete(
                open_loop(LEAST_WORK, SPEEDS, 400.0, 0.5, 2.0, seed=3)))
        finally:
            fresh.close()
    assert runs[0] == runs[1]
    assert len(runs[0]) > 600
    assert percentile(runs[0], 0.5) < percentile(runs[0], 0.99)


async def _overloaded(rate_per_s: float, warmup_s: float, seconds: float
                      ) -> tuple[ModelBalancer, int, int, list[float]]:
    """Poisson arrivals at ``rate_per_s`` on the uneven devices, admitted against a 50 ms SLO;
    after the warm-up: (balancer, answered, refused, latencies of the answered)."""
    loop = asyncio.get_running_loop()
    balancer = ModelBalancer(model_name="sim",
                             workers=[SimDevice(f"sim{i}", s) for i, s in enumerate(SPEEDS)],
                             config=SLO, clock=loop.time, rng=random.Random(0))
    balancer.start()
    refused = answered = 0
    latencies_s: list[float] = []
    pending = []
    start_s = loop.time()
    for offset_s in send_times_s(Arrival.parse("poisson"), rate_per_s, warmup_s + seconds,
                                 seed=5):
        await asyncio.sleep(max(0.0, start_s + offset_s - loop.time()))
        arrived_s = loop.time()
        measured = offset_s >= warmup_s
        try:
            future = balancer.submit(None, 1)
        except Overloaded:
            refused += measured
            continue
        if measured:
            answered += 1
            future.add_done_callback(lambda _, a=arrived_s: latencies_s.append(loop.time() - a))
        pending.append(future)
    await asyncio.gather(*pending)
    await balancer.close()
    return balancer, answered, refused, latencies_s


def test_under_overload_batches_grow_and_admission_sheds_the_rest(loop: VirtualLoop) -> None:
    # The SLO-goodput limit of these devices at 50 ms is 625 req/s (balancer/capacity.py).
    # Offered 1.5 times that, the balancer answers more than the limit's rate (goodput kept
    # up), within the target at p99, and refuses the rest at once: nothing times out.
    seconds = 4.0
    balancer, answered, refused, latencies_s = loop.run_until_complete(
        _overloaded(1.5 * 625.0, 1.0, seconds))
    assert answered / seconds >= 625.0
    assert refused >= 0.2 * (answered + refused)
    assert percentile(latencies_s, 0.99) <= SLO_S
    # Batches run larger than the worst-case size (7 on a speed-1 device) when the oldest
    # request has time left: the live size.
    fast = balancer.snapshot().replicas[0]
    assert fast.batch_size == 7
    assert max(fast.batch_size_counts) > 7


def test_models_sharing_a_device_learn_its_time_not_their_wait_for_it(
        loop: VirtualLoop) -> None:
    # Two models on one simulated device (10 ms + 2 ms per sample), batches taking turns.
    # Each model's fit must learn the device's cost; the wait for the other model's batch is
    # priced through the device ledger, not folded into ``a`` a second time.
    from benchmarks.slo_scenarios import DeviceShare, SharedDevice
    from evenflow.balancer.ledger import DeviceLedger

    async def run() -> list[float]:
        shared = SharedDevice(SimDevice("sim0", 1.0))
        ledger = DeviceLedger()
        balancers = [ModelBalancer(model_name=name, workers=[DeviceShare(shared)],
                                   config=LEAST_WORK, clock=loop.time, rng=random.Random(0),
                                   ledger=ledger) for name in ("a", "b")]
        for balancer in balancers:
            balancer.start()
        rng = random.Random(3)
        pending = []
        for _ in range(600):  # ~150 req/s offered to each model for 2 s
            await asyncio.sleep(rng.expovariate(300.0))
            with contextlib.suppress(Overloaded):
                pending.append(balancers[rng.randrange(2)].submit(None, 1))
        await asyncio.gather(*pending)
        fits = [b.snapshot().replicas[0].fit_base_s for b in balancers]
        for balancer in balancers:
            await balancer.close()
        return fits

    for base_s in loop.run_until_complete(run()):
        assert base_s == pytest.approx(0.010, abs=0.001)
