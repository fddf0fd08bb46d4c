"""The placer when moves overlap or fail under each other: two loads on demand that need the
same eviction, an eviction that refuses once its load has started, a swap only part of which
could start, a move whose model was reloaded or unloaded before it ran, and a drop whose add
failed. Fakes on a fake clock."""

from __future__ import annotations

import math

import pytest

from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.placer import PlacerSettings
from tests.unit.balancer_fakes import FakeTime, answered, settle
from tests.unit.placer_fakes import GIB, LOAD_S, World

pytestmark = pytest.mark.timeout(20)




async def test_two_loads_on_demand_share_one_eviction_without_counting_it_twice(
        world: World) -> None:
    # big fills d0 and stays; v, idle, fills d1. c1 and c2 ask for a replica in the same loop
    # turn: evicting v once makes room for both, and c2's load waits for that drain rather
    # than evict v a second time or fail.
    world.model("big", 16, on=("d0",), min_replicas=1)
    world.model("v", 8, on=("d1",))
    await world.run_for(6.0)  # v is idle now
    c1, c2 = world.model("c1", 4), world.model("c2", 4)
    first = c1.submit("x", 1, deadline_s=math.inf)
    second = c2.submit("y", 1, deadline_s=math.inf)
    await settle()  # no time passes: c2 does not wait for a tick to find the memory
    assert world.placer.snapshot().replicas == (
        ("big", "d0", "serving"), ("c1", "d1", "loading"), ("c2", "d1", "loading"))
    assert await answered(world.time, first, second, limit_s=LOAD_S + 1.0) == [
        ("out", "x"), ("out", "y")]
    assert (world.serving("c1"), world.serving("c2"), world.serving("v")) == (
        ["d1"], ["d1"], [])
    assert sorted(world.outcomes()) == [("add", "c1", "d1", "done"), ("add", "c2", "d1", "done"),
                                       ("drop", "v", "d1", "done")]


async def test_a_load_on_demand_whose_eviction_refuses_waits_for_memory() -> None:
    world = World(FakeTime(), settings=PlacerSettings(on_demand_wait_s=30.0))
    try:
        world.model("big", 16, on=("d0",), min_replicas=1)
        v = world.model("v", 8, on=("d1",))
        await world.run_for(6.0)  # v is idle: cold's load evicts it
        cold = world.model("cold", 4)
        parked = cold.submit("x", 1, deadline_s=math.inf)
        used = v.submit("y", 1)  # in the same turn v is used again: its drain refuses
        assert await answered(world.time, used) == [("out", "y")]
        assert ("add", "cold", "d1", "skipped: no memory") in world.outcomes()
        assert not parked.done()  # it waits for memory, as when no device had room
        # Once v has been idle a while again it is evicted, and the request is answered.
        assert await answered(world.time, parked, step_s=0.05, limit_s=15.0) == [("out", "x")]
        assert world.serving("cold") == ["d1"]
    finally:
        await world.close()


async def test_a_swap_whose_add_cannot_start_drops_nothing(world: World) -> None:
    world.model("x", 4, on=("d0", "d1"))
    world.model("y", 4)
    world.placer.carry_out([(Move("add", "y", "d1"), "plan")])  # loading: fits beside x
    world.placer.carry_out([(Move("drop", "x", "d1"), "plan"), (Move("add", "y", "d1"), "plan")])
    await world.run_for(LOAD_S + 0.5)
    assert (world.serving("x"), world.serving("y")) == (["d0", "d1"], ["d1"])
    assert world.outcomes() == [("add", "y", "d1", "done")]


async def test_a_drop_of_a_reloaded_model_leaves_the_new_models_replicas_alone(
        world: World) -> None:
    old = world.model("a", 4, on=("d0",))
    world.placer.carry_out([(Move("add", "a", "d1"), "plan"), (Move("drop", "a", "d0"), "plan")])
    await world.run_for(LOAD_S / 2)
    for device, memory_bytes in world.placer.forget_model("a"):  # a reload takes over
        world.placer.hold(device, memory_bytes)
    await old.close()
    new = world.model("a", 4, on=("d0",))
    await world.run_for(LOAD_S)
    assert world.serving("a") == ["d0"]
    assert [r.worker.name for r in new.replicas] == ["a@d0"]
    assert await answered(world.time, new.submit("x", 1)) == [("out", "x")]
    assert sorted(world.outcomes()) == [("add", "a", "d1", "skipped: model gone"),
                                       ("drop", "a", "d0", "skipped: replica gone")]


async def test_an_add_whose_model_is_forgotten_before_it_first_runs_is_skipped(
        world: World) -> None:
    world.model("a", 4, on=("d0",))
    world.placer.carry_out([(Move("add", "a", "d1"), "plan")])
    world.placer.forget_model("a")  # in the same turn: the add's task has not run yet
    await world.run_for(LOAD_S + 0.5)
    assert world.outcomes() == [("add", "a", "d1", "skipped: model gone")]
    assert world.loader.loaded == [] and world.placer.free_bytes()["d1"] == 8 * GIB


async def test_a_move_whose_load_fails_keeps_the_replica_it_meant_to_replace(
        world: World) -> None:
    world.model("a", 4, on=("d0",))  # idle: no floor of its own would keep it
    world.loader.fail = {("a", "d1")}
    world.placer.carry_out([(Move("add", "a", "d1"), "plan"), (Move("drop", "a", "d0"), "plan")])
    await world.run_for(LOAD_S + 0.5)
    assert world.serving("a") == ["d0"]
    assert world.outcomes() == [
        ("add", "a", "d1", "failed: out of memory while loading"),
        ("drop", "a", "d0", "skipped: the replica it waited for did not load")]


async def test_an_idle_model_can_lose_every_replica_at_once(world: World) -> None:
    # Two evictions of one idle model's replicas, as a load needing both devices asks: the
    # second is not refused because the first replica is still draining.
    world.model("v", 4, on=("d0", "d1"))
    await world.run_for(6.0)  # idle: min_replicas 0 and no request
    world.placer.carry_out([(Move("drop", "v", "d0"), "demand"),
                            (Move("drop", "v", "d1"), "demand")], budgeted=False)
    await world.run_for(1.0)
    assert world.outcomes() == [("drop", "v", "d0", "done"), ("drop", "v", "d1", "done")]
    assert world.serving("v") == []
