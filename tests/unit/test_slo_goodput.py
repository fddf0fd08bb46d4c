"""The SLO-goodput reference limit and the bisection search, against fakes whose answer is
known."""

from __future__ import annotations

import asyncio
import math
import random

import pytest

from benchmarks.slo_scenarios import SCENARIOS, Window, probe
from benchmarks.virtual_time import VirtualLoop
from evenflow.balancer import BalancerConfig, Policy
from evenflow.balancer.capacity import DeviceCost, largest_batch_within, slo_limit_per_s
from evenflow.loadtest.slo_search import Probe, SearchSettings, search_goodput

pytestmark = pytest.mark.timeout(30)

SIM = (0.010, 0.002)  # the sim model: 10 ms + 2 ms per sample at speed 1


def test_the_limit_sums_each_devices_best_rate_within_the_slo() -> None:
    costs = [DeviceCost(*SIM, speed) for speed in (1.0, 1.0, 0.5, 0.25)]
    # SLO 50 ms: 2 t(b) <= 50 ms. Speed 1: t(7) = 24 ms, 7 / 24 ms = 291.7/s each; speed 0.5:
    # t(1) = 24 ms, 41.7/s; speed 0.25: t(1) = 48 ms, too slow for any batch.
    assert [largest_batch_within(c, 0.050, 64) for c in costs] == [7, 7, 1, 0]
    assert slo_limit_per_s(costs, 0.050, 64) == pytest.approx(2 * 7 / 0.024 + 1 / 0.024)
    # SLO 100 ms: b = 20 (t = 50 ms), 7 (48 ms), 1 (48 ms).
    assert slo_limit_per_s(costs, 0.100, 64) == pytest.approx(
        2 * 20 / 0.050 + 7 / 0.048 + 1 / 0.048)


def test_the_limit_respects_the_largest_batch() -> None:
    assert largest_batch_within(DeviceCost(0.001, 0.0001), 1.0, 64) == 64
    assert largest_batch_within(DeviceCost(0.001, 0.0), 1.0, 16) == 16
    assert largest_batch_within(DeviceCost(0.001, 0.0), 0.001, 16) == 0


def _threshold_server(capacity_per_s: float, seen: list[float]):
    """A fake whose p99 stays under 40 ms up to ``capacity_per_s`` and then grows fast."""
    async def measure(rate_per_s: float, seed: int) -> Probe:
        seen.append(rate_per_s)
        await asyncio.sleep(0)
        p99_s = 0.040 if rate_per_s <= capacity_per_s else 0.040 * rate_per_s / capacity_per_s \
            + 0.02
        return Probe(rate_per_s, seed, 0.02, p99_s, 0.0, min(rate_per_s, capacity_per_s))
    return measure


@pytest.mark.parametrize("start_per_s", [10.0, 437.0, 5000.0])
async def test_the_search_finds_the_boundary_from_any_start(start_per_s: float) -> None:
    seen: list[float] = []
    found = await search_goodput(_threshold_server(437.0, seen),
                                 SearchSettings(slo_s=0.050, start_per_s=start_per_s,
                                                tolerance=0.02))
    assert 437.0 * 0.98 <= found.goodput_per_s <= 437.0
    assert found.low_per_s <= found.goodput_per_s < found.high_per_s <= 437.0 * 1.05
    assert len(found.probes) == len(seen) <= 30


async def test_errors_over_the_threshold_fail_a_rate_whatever_its_latency() -> None:
    async def refusing(rate_per_s: float, seed: int) -> Probe:
        errors = 0.0 if rate_per_s <= 200.0 else 0.05  # sheds load: fast answers, many refusals
        return Probe(rate_per_s, seed, 0.001, 0.002, errors, rate_per_s)

    found = await search_goodput(refusing, SearchSettings(slo_s=0.050, start_per_s=100.0))
    assert 200.0 * 0.97 <= found.goodput_per_s <= 200.0


async def test_nothing_passes_means_zero_goodput() -> None:
    async def hopeless(rate_per_s: float, seed: int) -> Probe:
        return Probe(rate_per_s, seed, math.nan, math.nan, 1.0, 0.0)

    found = await search_goodput(hopeless, SearchSettings(slo_s=0.050, start_per_s=100.0))
    assert found.goodput_per_s == 0.0 and found.probes


async def test_near_the_boundary_the_majority_of_repeats_decides() -> None:
    # Each run near 300/s passes or fails by chance (seeded by the run's seed); the majority of
    # three makes the answer no worse than the noise band and every rate in the bisection is
    # run two or three times.
    async def noisy(rate_per_s: float, seed: int) -> Probe:
        chance_of_passing = min(1.0, max(0.0, (330.0 - rate_per_s) / 60.0))
        passes = random.Random(seed).random() < chance_of_passing
        return Probe(rate_per_s, seed, 0.01, 0.03 if passes else 0.08, 0.0, rate_per_s)

    found = await search_goodput(noisy, SearchSettings(slo_s=0.050, start_per_s=200.0))
    assert 270.0 <= found.goodput_per_s <= 330.0
    assert [p.rate_per_s for p in found.probes[:2]] == [200.0, 400.0]  # the bracket, once each
    bisected = [p.rate_per_s for p in found.probes[2:]]
    assert all(2 <= bisected.count(rate) <= 3 for rate in bisected)
    assert found.low_per_s <= found.goodput_per_s <= found.high_per_s


def test_a_scenario_limit_is_that_of_its_slowest_phase() -> None:
    steady, slow_down = SCENARIOS[0], SCENARIOS[1]
    assert steady.limit_per_s(0.050) == pytest.approx(625.0)
    # sim0 at a quarter of its speed fits no batch in 50 ms: sim1 (7/24 ms) and sim2 (1/24 ms).
    assert slow_down.limit_per_s(0.050) == pytest.approx(8 / 0.024)


def test_in_virtual_time_least_work_meets_the_slo_where_round_robin_cannot() -> None:
    steady = SCENARIOS[0]
    rate = 0.8 * steady.limit_per_s(0.050)
    p99 = {}
    for policy in (Policy.LEAST_WORK, Policy.ROUND_ROBIN):
        loop = VirtualLoop()
        try:
            result = loop.run_until_complete(probe(
                steady, BalancerConfig(policy=policy, latency_target_s=0.050), rate, seed=1,
                window=Window(warmup_s=1.0, measured_s=3.0)))
        finally:
            loop.close()
        p99[policy] = result.p99_s
        assert result.rate_per_s == rate
    assert p99[Policy.LEAST_WORK] <= 0.050 < p99[Policy.ROUND_ROBIN]
