"""The tuner's add, when memory is full: it may take the room of an idle model's replica, not of
a busy one's. Views built by hand and a fake planner; no loop, no clock but the numbers given."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from evenflow.balancer.capacity import DeviceCost
from evenflow.balancer.placement import auto, planner
from evenflow.balancer.placement.assessment import assess
from evenflow.balancer.placement.auto import AutoSettings, AutoStrategy
from evenflow.balancer.placement.change import ChangeTest
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile, Placement
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.view import PlacerView

GIB = 2**30
SPEEDS = {"d0": 1.0, "d1": 1.0}
DEVICES = [DeviceInfo(name, 16 * GIB) for name in SPEEDS]
PROFILES = {name: ModelProfile(name, 7 * GIB,
                               {d: DeviceCost(0.010, 0.002, s) for d, s in SPEEDS.items()},
                               64, 0.1) for name in "abc"}
# Memory is full: two replicas a device.
PLACED: Placement = frozenset({("a", "d0"), ("b", "d0"), ("b", "d1"), ("c", "d1")})
# What the planner proposes for a's doubled demand: b's second replica makes room for a.
SWAP = (Move("drop", "b", "d1"), Move("add", "a", "d1"))
TICK_S = 0.5


def tuner_moves(demand_per_s: Mapping[str, float], monkeypatch: pytest.MonkeyPatch, *,
                devices: Sequence[DeviceInfo] = DEVICES,
                profiles: Mapping[str, ModelProfile] = PROFILES,
                placed: Placement = PLACED, swap: tuple[Move, Move] = SWAP) -> list[Move]:
    """What the strategy moves while model ``a``'s queue stays long (its outstanding work per
    replica at 0.9 of its SLO), with no periodic plan and no change in the demand; the fake
    planner proposes ``swap`` for a's doubled demand."""
    def swap_for_a(placement: Placement, devices: Any, profiles: Any,
                   boosted: Mapping[str, float], settings: Any) -> planner.Plan:
        assert boosted["a"] == 2 * demand_per_s["a"]
        drop, add = swap
        after = placement - {(drop.model, drop.device)} | {(add.model, add.device)}
        return planner.Plan(after, swap, assess(placement, profiles, boosted),
                            assess(after, profiles, boosted))

    strategy = AutoStrategy(AutoSettings(plan_interval_s=1e9, change=ChangeTest(
        share=1.0, rate_factor=1e9)))
    moves: list[Move] = []
    for tick in range(40):
        now_s = tick * TICK_S
        # Past the first plan (from idle, at 2 s), only the tuner asks the planner.
        if now_s > 2.0:
            monkeypatch.setattr(auto, "propose", swap_for_a)
        work_s = {name: 0.09 if name == "a" else 0.01 for name in profiles}
        step = strategy.moves(PlacerView(now_s, devices, profiles, placed, placed, demand_per_s,
                                         demand_per_s, work_s, moves_left=30))
        moves += [move for move, reason in step if reason == "tuner"]
    return moves


def test_the_tuner_takes_an_idle_models_room(monkeypatch: pytest.MonkeyPatch) -> None:
    assert tuner_moves({"a": 50.0, "b": 0.0, "c": 50.0}, monkeypatch)[:2] == list(SWAP)


def test_the_tuner_does_not_take_a_busy_models_room(monkeypatch: pytest.MonkeyPatch) -> None:
    # b's replica on d1 serves part of b's demand: the long queue behind a is no reason to
    # shorten b's.
    demand = {"a": 50.0, "b": 200.0, "c": 50.0}
    assert assess(PLACED, PROFILES, demand).shares[("b", "d1")] > 0.0
    assert tuner_moves(demand, monkeypatch) == []


def test_a_busy_replica_without_a_share_is_not_room(monkeypatch: pytest.MonkeyPatch) -> None:
    # a, alone on d0, bounds the headroom; b has capacity to spare on d1, so the best sharing
    # gives its slow replica on d2 no time, while routing still sends it b's work.
    speeds = {"d0": 1.0, "d1": 1.0, "d2": 0.5}
    devices = [DeviceInfo(name, 8 * GIB) for name in speeds]  # one replica a device
    profiles = {name: ModelProfile(name, 7 * GIB,
                                   {d: DeviceCost(0.010, 0.002, s) for d, s in speeds.items()},
                                   64, 0.1) for name in "ab"}
    placed: Placement = frozenset({("a", "d0"), ("b", "d1"), ("b", "d2")})
    demand = {"a": 300.0, "b": 200.0}
    assert assess(placed, profiles, demand).shares[("b", "d2")] == 0.0
    swap = (Move("drop", "b", "d2"), Move("add", "a", "d2"))
    assert tuner_moves(demand, monkeypatch, devices=devices, profiles=profiles, placed=placed,
                       swap=swap) == []
