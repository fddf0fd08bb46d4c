"""The virtual-time simulator drives the real balancer deterministically; its results are policy
behaviour (exact, repeatable), not machine performance."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from benchmarks.virtual_time import VirtualLoop, closed_loop, open_loop, percentile
from evenflow.balancer import BalancerConfig, Policy

pytestmark = pytest.mark.timeout(30)

SPEEDS = [1.0, 1.0, 0.5, 0.25]
LEAST_WORK = BalancerConfig()  # the server's defaults: least-work, 50 ms target, max wait 2 ms
ROUND_ROBIN = BalancerConfig(policy=Policy.ROUND_ROBIN)


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
