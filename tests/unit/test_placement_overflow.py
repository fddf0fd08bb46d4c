"""Overflow replicas: a device the capacity arithmetic gives no work (``2 t(1)`` over the SLO)
but on which a model answers one request within its SLO gets a replica of the model that needs
capacity most, swapped only for a clearly needier model. Pure functions and a strategy fed
views: no loop, no clock but the numbers given."""

from __future__ import annotations

import dataclasses

import pytest

from evenflow.balancer.capacity import DeviceCost
from evenflow.balancer.placement.assessment import assess
from evenflow.balancer.placement.auto import AutoSettings, AutoStrategy
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile, Placement, fits
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.overflow import (
    overflow_changes,
    overflow_replicas,
    with_overflow,
)
from evenflow.balancer.placement.planner import propose
from evenflow.balancer.placement.tuner import TunerSettings
from evenflow.balancer.placement.view import PlacerView

GIB = 2**30
# The placement benchmark's devices: at a 50 ms SLO the speed-0.25 device answers one request
# of these models in 48 ms, so the arithmetic (two batches) gives it nothing.
SPEEDS = {"d0": 1.0, "d1": 1.0, "d2": 0.5, "d3": 0.25}
DEVICES = [DeviceInfo(name, (16 if speed >= 1 else 8) * GIB) for name, speed in SPEEDS.items()]
SLO_S = 0.05


def profile(name: str, *, max_replicas: int | None = None, slo_s: float = SLO_S
            ) -> ModelProfile:
    return ModelProfile(name, 7 * GIB,
                        {d: DeviceCost(0.010, 0.002, s) for d, s in SPEEDS.items()}, 64, slo_s,
                        max_replicas=max_replicas)


PROFILES = {name: profile(name) for name in "abc"}
# b hot and alone on d0; a and c pooled over d1 and d2; nothing on d3.
PLACED: Placement = frozenset({("b", "d0"), ("a", "d1"), ("c", "d1"), ("a", "d2")})
B_HOT = {"a": 80.0, "b": 240.0, "c": 80.0}


def test_an_idle_device_gets_the_hot_model_on_a_single_device() -> None:
    drops, adds = overflow_changes(PLACED, DEVICES, PROFILES, B_HOT)
    assert (drops, adds) == ([], [("b", "d3")])
    assert assess(PLACED | {("b", "d3")}, PROFILES, B_HOT).headroom == pytest.approx(
        assess(PLACED, PROFILES, B_HOT).headroom)  # the arithmetic gives it nothing


def test_no_overflow_where_one_request_alone_misses_the_slo() -> None:
    tight = {name: profile(name, slo_s=0.045) for name in "abc"}  # 48 ms > 45 ms on d3
    drops, adds = overflow_changes(PLACED, DEVICES, tight, B_HOT)
    assert all(device != "d3" for _, device in drops + adds)
    # d2 (24 ms alone, 48 ms for two batches) no longer serves by the arithmetic at 45 ms:
    # its replica of a, pooled with d1's, gives way to b's overflow.
    assert (drops, adds) == ([("a", "d2")], [("b", "d2")])


def test_no_overflow_on_a_device_that_serves_demand() -> None:
    relaxed = {name: profile(name, slo_s=0.1) for name in "abc"}  # 2 t(1) = 96 ms fits
    assert overflow_replicas(PLACED | {("a", "d3")}, DEVICES, relaxed, B_HOT) == []


def test_the_overflow_replica_follows_a_clearly_needier_model_only() -> None:
    held = PLACED | {("a", "d3")}
    assert overflow_changes(held, DEVICES, PROFILES, B_HOT) == ([("a", "d3")], [("b", "d3")])
    # c's demand just over a's: the same load and serving replicas, not 1.5x the demand.
    near_tie = frozenset({("b", "d0"), ("b", "d1"), ("a", "d1"), ("c", "d0"), ("a", "d3")})
    even = {"a": 100.0, "b": 100.0, "c": 110.0}
    drops, adds = overflow_changes(near_tie, DEVICES, PROFILES, even)
    assert all(device != "d3" for _, device in drops + adds)


def test_a_lightly_loaded_model_takes_no_overflow_replica_however_much_needier() -> None:
    held = PLACED | {("a", "d3")}
    light = {name: rate / 20.0 for name, rate in B_HOT.items()}  # b 12 samples/s, a 4
    assert overflow_changes(held, DEVICES, PROFILES, light) == ([], [])
    # A free device still gets one: nothing is dropped for it.
    assert overflow_changes(PLACED, DEVICES, PROFILES, light) == ([], [("b", "d3")])


def test_an_overflow_replica_that_is_its_models_only_one_stays() -> None:
    only_there = frozenset({("b", "d0"), ("c", "d1"), ("a", "d3")})
    assert overflow_changes(only_there, DEVICES, PROFILES, B_HOT)[0] == []


def test_overflow_keeps_memory_and_the_replica_bounds() -> None:
    capped = {**PROFILES, "b": profile("b", max_replicas=1)}
    assert ("b", "d3") not in overflow_replicas(PLACED, DEVICES, capped, B_HOT)  # b at its max
    idle_there = PLACED | {("x", "d3")}  # an idle model holds d3's memory
    with_x = {**PROFILES, "x": profile("x")}
    assert fits(idle_there, DEVICES, with_x)
    assert overflow_changes(idle_there, DEVICES, with_x, B_HOT) == ([], [])  # not evicted


def test_the_strategys_plan_ends_with_its_overflow_moves_and_the_planners_has_none() -> None:
    # The planner's own plan is the arithmetic's alone: the tuner asks it where one more
    # replica adds capacity, which an overflow replica does not.
    bare = propose(PLACED, DEVICES, PROFILES, B_HOT)
    assert all(device != "d3" for _, device in bare.placement)
    plan = with_overflow(bare, DEVICES, PROFILES, B_HOT)
    assert plan.moves[-1] == Move("add", "b", "d3")
    assert ("b", "d3") in plan.placement
    assert fits(plan.placement, DEVICES, PROFILES)


def test_a_device_holding_two_busy_models_is_left_alone() -> None:
    # d0 slowed to speed 0.25: the arithmetic gives its two replicas nothing at 50 ms, but
    # each still answers a request in time; they are not traded for one overflow replica.
    slowed = {name: ModelProfile(p.name, p.memory_bytes, {**p.costs, "d0": p.costs["d3"]},
                                 p.max_batch, p.slo_s) for name, p in PROFILES.items()}
    two = frozenset({("a", "d0"), ("b", "d0"), ("a", "d1"), ("b", "d1"), ("c", "d2")})
    c_hot = {"a": 40.0, "b": 40.0, "c": 240.0}  # c, alone on the half-speed d2, needs most
    drops, adds = overflow_changes(two, DEVICES, slowed, c_hot)
    assert all(device != "d0" for _, device in drops + adds)
    assert adds == [("c", "d3")]


def _view(now_s: float, placement: Placement, work_s: float) -> PlacerView:
    return PlacerView(now_s, DEVICES, PROFILES, placement, placement, B_HOT, B_HOT,
                      {name: work_s for name in PROFILES}, moves_left=10)


def test_the_tuner_does_not_drop_an_overflow_replica_the_next_plan_would_load_again() -> None:
    settings = AutoSettings(plan_interval_s=1e9, tuner_pause_s=0.0,
                            tuner=TunerSettings(drop_hold_ticks=2, hold_ticks=1))
    strategy = AutoStrategy(settings)
    held = PLACED | {("b", "d3")}
    assert [m for m, _ in strategy.moves(_view(0.0, held, 0.0))] == []  # the first plan: none
    drops = []
    for tick in range(1, 10):  # every model idle in work: the tuner offers replicas back
        drops += [m for m, _ in strategy.moves(_view(float(tick), held, 0.0))]
    assert Move("drop", "b", "d3") not in drops
    assert Move("drop", "a", "d2") in drops  # the slowest of a's, which the plan would not add


def test_between_plans_the_overflow_replica_follows_the_need() -> None:
    strategy = AutoStrategy(AutoSettings(plan_interval_s=1e9, tuner_pause_s=0.0,
                                         settle_s=0.0))
    held = PLACED | {("a", "d3")}
    assert list(strategy.moves(_view(0.0, PLACED | {("b", "d3")}, 0.01))) == []  # the plan
    assert list(strategy.moves(_view(1.0, held, 0.01))) == [
        (Move("drop", "a", "d3"), "overflow"), (Move("add", "b", "d3"), "overflow")]


def test_a_model_on_fewer_devices_at_the_same_load_does_not_take_the_overflow_replica() -> None:
    # a holds d3's overflow replica and serves on d1 and d2; c serves on d0 alone. The program
    # gives both the same load, and c less demand: a swap would pay a load time for nothing
    # (and a short demand window flips such a near-tie back and forth).
    held = frozenset({("c", "d0"), ("b", "d1"), ("a", "d1"), ("a", "d2"), ("a", "d3")})
    demand = {"a": 200.0, "b": 60.0, "c": 180.0}
    capacity = assess(held, PROFILES, demand).capacity_per_s
    assert demand["a"] / capacity["a"] == pytest.approx(demand["c"] / capacity["c"])
    assert overflow_changes(held, DEVICES, PROFILES, demand) == ([], [])
    # With 1.5x a's demand, c is clearly the needier: the replica follows it.
    hot_c = {**demand, "c": 1.5 * demand["a"]}
    assert overflow_changes(held, DEVICES, PROFILES, hot_c) == ([("a", "d3")], [("c", "d3")])


def test_a_pinned_replica_is_neither_swapped_for_overflow_nor_dropped_by_the_tuner() -> None:
    pinned_a = {**PROFILES, "a": dataclasses.replace(PROFILES["a"],
                                                     pinned=frozenset({"d2", "d3"}))}
    held = PLACED | {("a", "d3")}
    assert overflow_changes(held, DEVICES, pinned_a, B_HOT) == ([], [])  # b is needier
    settings = AutoSettings(plan_interval_s=1e9, tuner_pause_s=0.0,
                            tuner=TunerSettings(drop_hold_ticks=2, hold_ticks=1))
    strategy = AutoStrategy(settings)

    def view(now_s: float) -> PlacerView:
        return PlacerView(now_s, DEVICES, pinned_a, held, held, B_HOT, B_HOT,
                          {name: 0.0 for name in pinned_a}, moves_left=10)

    drops = [m for tick in range(10) for m, _ in strategy.moves(view(float(tick)))
             if m.kind == "drop"]
    assert drops  # the tuner offers replicas back (every model idle in work), not a's pins
    assert all(m.model != "a" or m.device not in {"d2", "d3"} for m in drops)
