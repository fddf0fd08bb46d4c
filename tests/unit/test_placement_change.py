"""A big change in the demand: past its threshold and past counting noise. Pure functions and
a strategy fed views built from seeded Poisson counts; no loop, no clock but the numbers
given."""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from evenflow.balancer.capacity import DeviceCost
from evenflow.balancer.placement import auto, planner
from evenflow.balancer.placement.assessment import Assessment
from evenflow.balancer.placement.auto import AutoSettings, AutoStrategy
from evenflow.balancer.placement.change import ChangeTest
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile, Placement
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.regime import RegimeDemand
from evenflow.balancer.placement.view import PlacerView

WINDOW_S = 2.0
FIRST = {"a": 0.6, "b": 0.2, "c": 0.2}
SHIFTED = {"a": 0.2, "b": 0.6, "c": 0.2}


def rates(mix: Mapping[str, float], total_per_s: float) -> dict[str, float]:
    return {name: share * total_per_s for name, share in mix.items()}


def test_a_shifted_mix_is_a_big_change() -> None:
    assert ChangeTest().is_big(rates(SHIFTED, 180.0), rates(FIRST, 180.0))


def test_a_total_blip_that_counting_noise_explains_is_not() -> None:
    # 214 and 175 samples/s over 2 s windows: 1.22x, but 2.8 standard deviations of two
    # Poisson counts apart.
    test = ChangeTest()
    assert not test.is_big(rates(FIRST, 214.0), rates(FIRST, 175.0))
    # The same factor over ten times the samples is a change.
    assert test.is_big(rates(FIRST, 2140.0), rates(FIRST, 1750.0))


def test_noise_is_counted_in_requests_not_samples() -> None:
    # 1,750 and 2,140 samples/s is past noise as one-sample requests, not as 8-sample ones
    # (an eighth of the independent arrivals).
    test = ChangeTest()
    eight = dict.fromkeys(FIRST, 8.0)
    assert test.is_big(rates(FIRST, 2140.0), rates(FIRST, 1750.0), dict.fromkeys(FIRST, 1.0))
    assert not test.is_big(rates(FIRST, 2140.0), rates(FIRST, 1750.0), eight)
    shifted_now = rates(SHIFTED, 180.0 * 8)
    assert test.is_big(shifted_now, rates(FIRST, 180.0 * 8), eight)


def test_a_significant_change_below_the_threshold_is_not_big() -> None:
    # Every model's rate within 1.15x, every share within 0.15.
    assert not ChangeTest().is_big(rates({"a": 0.57, "b": 0.22, "c": 0.21}, 5000.0),
                                   rates(FIRST, 5000.0))
    assert not ChangeTest().is_big(rates(FIRST, 5500.0), rates(FIRST, 5000.0))


def test_one_model_of_seven_arriving_or_leaving_is_a_big_change() -> None:
    # Its share is 1/7, under the share threshold; its rate moves from 0.
    six = {f"m{i}": 60.0 for i in range(6)}
    seven = {**six, "m6": 60.0}
    assert ChangeTest().is_big(seven, six)
    assert ChangeTest().is_big(six, seven)
    # One model's rate doubling is a change too (past noise: 240 requests against 120).
    assert ChangeTest().is_big({**six, "m0": 120.0}, six)
    assert not ChangeTest().is_big({**six, "m0": 66.0}, six)


def test_idle_to_busy_and_back_are_big_changes() -> None:
    test = ChangeTest()
    assert test.is_big(rates(FIRST, 1.0), {})
    assert test.is_big({"a": 0.0}, rates(FIRST, 1.0))
    assert not test.is_big({"a": 0.0}, {})


def test_a_model_new_to_the_mix_counts_from_a_zero_share() -> None:
    now = {**rates(FIRST, 180.0), "d": 90.0}
    assert ChangeTest().is_big(now, rates(FIRST, 180.0))


# -- the strategy: plans for a shift, not for noise --------------------------------------------

SPEEDS = {"d0": 1.0, "d1": 1.0, "d2": 0.5, "d3": 0.25}
GIB = 2**30
DEVICES = [DeviceInfo(name, (16 if speed >= 1 else 8) * GIB) for name, speed in SPEEDS.items()]
PROFILES = {name: ModelProfile(name, 7 * GIB,
                               {d: DeviceCost(0.010, 0.002, s) for d, s in SPEEDS.items()},
                               64, 0.1) for name in "abc"}
PLACED: Placement = frozenset({("a", "d0"), ("a", "d1"), ("b", "d0"), ("c", "d1"),
                               ("b", "d2"), ("c", "d3")})
TICK_S = 0.5


def sliding_windows(phases: list[tuple[float, Mapping[str, float]]], total_per_s: float,
                    seed: int) -> list[dict[str, float]]:
    """Each tick's rates over the last ``WINDOW_S``, as the placer's demand meter reads them:
    Poisson arrivals at ``total_per_s``, each one's model drawn from its phase's mix
    (``phases``: seconds and mix)."""
    rng = random.Random(seed)
    arrivals: list[tuple[float, str]] = []
    begin_s = 0.0
    for seconds, mix in phases:
        at_s = begin_s + rng.expovariate(total_per_s)
        while at_s < begin_s + seconds:
            arrivals.append((at_s, rng.choices(list(mix), list(mix.values()))[0]))
            at_s += rng.expovariate(total_per_s)
        begin_s += seconds
    windows = []
    for tick in range(int(begin_s / TICK_S)):
        now_s = tick * TICK_S
        counts = collections.Counter(name for at_s, name in arrivals
                                     if now_s - WINDOW_S < at_s <= now_s)
        windows.append({name: counts[name] / WINDOW_S for name in PROFILES})
    return windows


@dataclass
class PlanLog:
    """When the strategy ran the planner (a plan for a placement that is already right moves
    nothing, so the moves alone would not show it)."""

    now_s: float = 0.0
    at_s: list[float] = field(default_factory=list)


@pytest.fixture
def plans(monkeypatch: pytest.MonkeyPatch) -> PlanLog:
    log = PlanLog()

    def counting(*args: Any, **kwargs: Any) -> planner.Plan:
        log.at_s.append(log.now_s)
        return planner.propose(*args, **kwargs)

    monkeypatch.setattr(auto, "propose", counting)
    return log


def run(strategy: AutoStrategy, windows: list[dict[str, float]], log: PlanLog) -> None:
    for tick, demand in enumerate(windows):
        log.now_s = tick * TICK_S
        strategy.moves(PlacerView(log.now_s, DEVICES, PROFILES, PLACED, PLACED, demand, demand,
                                  {name: 0.01 for name in PROFILES}, moves_left=30))


def only_big_changes(test: ChangeTest | None = None) -> AutoStrategy:
    # No periodic plan, no tuner: only the big-change branch plans.
    return AutoStrategy(AutoSettings(plan_interval_s=1e9, tuner_pause_s=1e9,
                                     change=test or ChangeTest()))


def test_a_steady_mix_at_a_few_hundred_samples_a_second_is_planned_for_once(
        plans: PlanLog) -> None:
    run(only_big_changes(), sliding_windows([(300.0, FIRST)], 180.0, seed=0), plans)
    # The first tick's plan (for no demand yet), then one from idle once the change has held.
    assert plans.at_s == [0.0, WINDOW_S + TICK_S]


def test_one_window_against_another_passes_the_thresholds_not_the_noise_test() -> None:
    # What the strategy's reference (the mean since the last change) spares it, shown on one
    # window as the reference: these windows (this seed's) wander past 1.15x in total, as the
    # placement benchmark's did, and never by 4 standard deviations.
    windows = sliding_windows([(300.0, FIRST)], 180.0, seed=0)[int(WINDOW_S / TICK_S):]
    reference = windows[0]
    assert any(ChangeTest(min_z=0.0).is_big(window, reference) for window in windows)
    assert not any(ChangeTest().is_big(window, reference) for window in windows)


def test_the_regime_demand_is_the_mean_since_it_restarted() -> None:
    regime = RegimeDemand()
    assert regime.mean_per_s() == {}
    regime.restart({"a": 100.0})
    regime.add({"a": 80.0, "b": 30.0})
    assert regime.mean_per_s() == {"a": 90.0, "b": 15.0}
    regime.restart({"b": 60.0})
    assert regime.mean_per_s() == {"b": 60.0}


def test_a_shift_is_planned_for_once_it_has_held_for_the_window(plans: PlanLog) -> None:
    run(only_big_changes(), sliding_windows([(30.0, FIRST), (30.0, SHIFTED)], 180.0, seed=1),
        plans)
    *_, first, shifted = plans.at_s
    assert first < 30.0
    assert 30.0 + WINDOW_S < shifted <= 30.0 + 2 * WINDOW_S + TICK_S


# -- a periodic plan moves only for a gain that shows twice --------------------------------------

@dataclass
class FakePlanner:
    """Finds a gain (one move) at the times in ``gains_at_s``, none otherwise."""

    gains_at_s: set[float]
    now_s: float = 0.0

    def propose(self, placement: Placement, *args: Any, **kwargs: Any) -> planner.Plan:
        none = Assessment(1.0, {}, {})
        if self.now_s not in self.gains_at_s:
            return planner.Plan(placement, (), none, none)
        return planner.Plan(placement | {("a", "d2")}, (Move("add", "a", "d2"),), none,
                            Assessment(1.3, {}, {}))


def periodic_moves(gains_at_s: set[float], monkeypatch: pytest.MonkeyPatch,
                   seconds: float = 30.0) -> list[float]:
    """When a strategy with only periodic plans (every 10 s) returned moves."""
    fake = FakePlanner(gains_at_s)
    monkeypatch.setattr(auto, "propose", fake.propose)
    monkeypatch.setattr(auto, "with_overflow", lambda plan, *args: plan)
    strategy = AutoStrategy(AutoSettings(tuner_pause_s=1e9, change=ChangeTest(share=1.0,
                                                                             rate_factor=1e9)))
    demand = rates(FIRST, 180.0)
    moved_at_s = []
    for tick in range(int(seconds / TICK_S)):
        fake.now_s = tick * TICK_S
        if strategy.moves(PlacerView(fake.now_s, DEVICES, PROFILES, PLACED, PLACED, demand,
                                     demand, {}, moves_left=30)):
            moved_at_s.append(fake.now_s)
    return moved_at_s


def test_a_periodic_gain_seen_once_moves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # The plan from idle comes at 2 s; the periodic checks at 12 and 24 s find a gain that the
    # windows 2 s after them do not (without the confirmation, a move at 12 s).
    assert periodic_moves({12.0, 24.0}, monkeypatch) == []


def test_a_periodic_gain_seen_again_in_a_disjoint_window_moves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A device slowed at 9 s: every plan from then on finds the gain (the fake's placement
    # never changes, so it is found again after the next interval too).
    always = {tick * TICK_S for tick in range(18, 60)}
    assert periodic_moves(always, monkeypatch) == [14.0, 26.0]


def slowed(factor: float, device: str = "d0") -> dict[str, ModelProfile]:
    return {name: dataclasses.replace(profile, costs={
        **profile.costs, device: DeviceCost(0.010 * factor, 0.002 * factor, 1.0)})
        for name, profile in PROFILES.items()}


@pytest.mark.parametrize(("factor", "planned_at_s"), [(4.0, [20.0]), (1.3, [])])
def test_a_device_whose_costs_step_is_planned_for_at_once(
        plans: PlanLog, factor: float, planned_at_s: list[float]) -> None:
    # No periodic plan, no tuner, a steady mix: from 20 s d0 costs ``factor`` times as much.
    strategy = only_big_changes()
    demand = rates(FIRST, 180.0)
    for tick in range(60):
        plans.now_s = tick * TICK_S
        profiles = PROFILES if plans.now_s < 20.0 else slowed(factor)
        strategy.moves(PlacerView(plans.now_s, DEVICES, profiles, PLACED, PLACED, demand,
                                  demand, {}, moves_left=30))
    assert plans.at_s[1:] == planned_at_s  # after the first plan (from idle)


def test_a_plan_that_moves_is_logged_with_why(monkeypatch: pytest.MonkeyPatch,
                                              caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=auto.__name__):
        periodic_moves({12.0, 14.0}, monkeypatch, seconds=15.0)
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("placement plan (periodic): headroom 1.00 -> 1.30 for a=108, b=36, "
                           "c=36 samples/s; costs at one sample a@d0=12, a@d1=12, a@d2=24,")


def test_a_periodic_plan_is_for_the_mean_since_the_last_change(
        monkeypatch: pytest.MonkeyPatch) -> None:
    windows = sliding_windows([(30.0, FIRST)], 180.0, seed=2)
    asked: list[tuple[float, dict[str, float]]] = []
    now = [0.0]

    def recording(placement: Placement, devices: Any, profiles: Any,
                  demand_per_s: Mapping[str, float], settings: Any) -> planner.Plan:
        asked.append((now[0], dict(demand_per_s)))
        return planner.propose(placement, devices, profiles, demand_per_s, settings)

    monkeypatch.setattr(auto, "propose", recording)
    strategy = AutoStrategy(AutoSettings(tuner_pause_s=1e9))
    for tick, demand in enumerate(windows):
        now[0] = tick * TICK_S
        strategy.moves(PlacerView(now[0], DEVICES, PROFILES, PLACED, PLACED, demand, demand,
                                  {}, moves_left=30))
    (changed_at_s, first), (periodic_at_s, periodic) = asked[1:3]
    assert changed_at_s == WINDOW_S + TICK_S and periodic_at_s == changed_at_s + 10.0
    assert first == windows[int(changed_at_s / TICK_S)]
    since = windows[int(changed_at_s / TICK_S):int(periodic_at_s / TICK_S) + 1]
    assert periodic == pytest.approx({name: sum(w[name] for w in since) / len(since)
                                      for name in PROFILES})
    # Nearer the mix's own rates than the window of the same tick.
    truth = rates(FIRST, 180.0)
    assert sum(abs(periodic[n] - truth[n]) for n in truth) < \
        sum(abs(windows[int(periodic_at_s / TICK_S)][n] - truth[n]) for n in truth)
