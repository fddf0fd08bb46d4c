"""The placer on live balancers with fakes and a fake clock: moves load first and drain after,
memory is never exceeded while they run, a model always keeps a replica in routing, idle models
are evicted least recently used first, and a request for a model being loaded waits within its
deadline."""

from __future__ import annotations

import logging
import math

import pytest

from evenflow.balancer import DeadlineExceeded, WorkerLost
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.view import Static
from tests.unit.balancer_fakes import FakeTime, answered
from tests.unit.placer_fakes import GIB, LOAD_S, World


async def test_a_swap_loads_first_and_never_leaves_the_model_without_a_replica(
        world: World) -> None:
    a = world.model("a", 6, on=("d0",))
    world.model("b", 6, on=("d1",))
    # Move a from d0 to d1: b must leave d1 first (memory), and a's drop on d0 must wait for
    # its new replica on d1 to be in routing.
    world.placer.carry_out([(Move("drop", "b", "d1"), "plan"), (Move("add", "a", "d1"), "plan"),
                            (Move("drop", "a", "d0"), "plan")])
    answers = []
    for _ in range(40):  # requests keep coming through the whole move
        answers.append(a.submit("x", 1))
        await world.run_for(0.1)
        assert a.serving, world.placer.snapshot()
    assert world.serving("a") == ["d1"]
    assert await answered(world.time, *answers) == [("out", "x")] * 40
    # b was idle, so it could be dropped to make room (it loads again on demand).
    assert world.serving("b") == []


async def test_a_drop_that_would_leave_a_busy_model_without_a_replica_is_skipped(
        world: World) -> None:
    a = world.model("a", 4, on=("d0",))
    pending = a.submit("x", 1)
    world.placer.carry_out([(Move("drop", "a", "d0"), "plan")])
    await world.run_for(0.5)
    assert world.serving("a") == ["d0"]
    assert await answered(world.time, pending) == [("out", "x")]
    recent = world.placer.snapshot().recent
    assert recent[-1].outcome.startswith("skipped")


async def test_memory_is_never_exceeded_while_moves_run(world: World) -> None:
    world.model("a", 9, on=("d0",))
    world.model("b", 6, on=("d0",))
    world.model("c", 7, on=("d1",))
    # Too much at once for d0: the placer must hold the add until the drop frees memory.
    world.placer.carry_out([(Move("add", "c", "d0"), "plan")])
    await world.run_for(3.0)
    assert "d0" not in world.serving("c")  # 9 + 6 + 7 > 16: skipped, not squeezed in
    world.placer.carry_out([(Move("drop", "b", "d0"), "plan"), (Move("add", "c", "d0"), "plan")])
    await world.run_for(3.0)
    assert world.serving("c") == ["d0", "d1"]


async def test_a_request_for_a_model_with_no_replica_waits_for_its_load(world: World) -> None:
    cold = world.model("cold", 4)
    future = cold.submit("x", 1)  # parks; the placer starts a load at once
    await world.run_for(LOAD_S / 2)
    assert not future.done()
    assert [m for m, _, state in world.placer.snapshot().replicas] == ["cold"]
    assert await answered(world.time, future) == [("out", "x")]
    assert world.serving("cold") == ["d0"]  # the faster-loading, roomier of equal devices


async def test_a_parked_request_whose_deadline_passes_during_the_load_fails_then(
        world: World) -> None:
    cold = world.model("cold", 4)
    soon = cold.submit("x", 1, deadline_s=world.time.now_s + 0.5)
    late = cold.submit("y", 1, deadline_s=world.time.now_s + 10.0)
    await world.run_for(0.45)
    assert not soon.done()
    await world.run_for(0.1)
    assert isinstance(soon.exception(), DeadlineExceeded)
    assert await answered(world.time, late) == [("out", "y")]


async def test_idle_models_are_evicted_least_recently_used_first(world: World) -> None:
    older = world.model("older", 8, on=("d0",))
    newer = world.model("newer", 8, on=("d0",))
    world.model("small", 8, on=("d1",))
    for balancer in (older, newer):
        await answered(world.time, balancer.submit("x", 1))
        await world.run_for(1.0)  # older was used a second before newer
    await world.run_for(5.0)  # both idle now
    cold = world.model("cold", 8)
    future = cold.submit("x", 1)
    assert await answered(world.time, future, limit_s=10.0) == [("out", "x")]
    assert world.serving("cold") == ["d0"]
    assert world.serving("older") == [] and world.serving("newer") == ["d0"]
    # older comes back on demand, evicting the least recently used idle one again.
    await world.run_for(5.0)
    assert await answered(world.time, older.submit("y", 1), limit_s=10.0) == [("out", "y")]


async def test_an_overflow_replica_of_a_busy_model_makes_room_for_one_loaded_on_demand(
) -> None:
    # d1 at speed 0.3 answers one request in 37 ms, within the 50 ms SLO, but not two batches:
    # the arithmetic gives busy's replica there nothing, so it is an overflow replica.
    world = World(FakeTime(), speeds={"d1": 0.3})
    try:
        busy = world.model("busy", 7, on=("d0", "d1"))
        other = world.model("other", 7, on=("d0",))
        cold = world.model("cold", 6)
        await world.run_for(1.0)
        for balancer in (busy, other):
            await answered(world.time, balancer.submit("x", 1))
        await world.run_for(1.0)  # the placer has seen both used: neither is idle
        future = cold.submit("x", 1)  # d0 has 2 GiB free, d1 1 GiB: nothing idle to evict
        assert await answered(world.time, future, limit_s=10.0) == [("out", "x")]
        assert world.serving("cold") == ["d1"]
        assert world.serving("busy") == ["d0"] and world.serving("other") == ["d0"]
    finally:
        await world.close()


async def test_a_failed_load_fails_the_parked_requests_and_frees_the_memory(
        world: World) -> None:
    cold = world.model("cold", 4)
    world.loader.fail = {("cold", "d0")}
    future = cold.submit("x", 1)
    await world.run_for(LOAD_S + 0.5)
    assert isinstance(future.exception(), WorkerLost)
    assert world.placer.snapshot().replicas == ()


async def test_a_model_that_fits_nowhere_waits_then_fails(world: World) -> None:
    world.model("big", 15, on=("d0",), min_replicas=1)
    await answered(world.time, world.balancers["big"].submit("x", 1))
    huge = world.model("huge", 12)
    future = huge.submit("x", 1, deadline_s=math.inf)
    await world.run_for(4.0)
    assert not future.done()  # waits for memory, up to on_demand_wait_s
    await world.run_for(2.0)
    assert isinstance(future.exception(), WorkerLost)


async def test_under_the_static_strategy_only_a_model_with_no_replica_moves() -> None:
    world = World(FakeTime(), strategy=Static())
    try:
        busy = world.model("busy", 6, on=("d0", "d1"))
        world.model("idle", 6, on=("d0",))
        cold = world.model("cold", 2)
        for i in range(20):  # ticks pass with work queued: nothing is rebalanced
            busy.submit(i, 1)
            await world.run_for(0.5)
        assert await answered(world.time, cold.submit("x", 1)) == [("out", "x")]
        await world.run_for(30.0)  # long enough for a tuner to give back an unused replica
        assert world.placer.snapshot().replicas == (
            ("busy", "d0", "serving"), ("busy", "d1", "serving"), ("cold", "d0", "serving"),
            ("idle", "d0", "serving"))
        assert [(r.kind, r.model, r.reason) for r in world.placer.snapshot().recent] == [
            ("add", "cold", "demand")]
    finally:
        await world.close()


async def test_a_measured_footprint_only_ever_raises_a_models_memory(world: World) -> None:
    """A replica that measured its activation peak: the model needs more on every device, so
    an add that fitted by the parameters alone no longer does."""
    world.model("a", 6, on=("d0",))
    world.model("b", 2, on=("d1",))  # d1 has 8 GiB: room for a at 6, not at 7
    free_before = world.placer.free_bytes()["d0"]
    world.placer.raise_memory_bytes("a", int(5 * GIB))  # less than known: kept
    assert world.placer.free_bytes()["d0"] == free_before
    world.placer.raise_memory_bytes("a", int(7 * GIB))
    assert world.placer.free_bytes()["d0"] == free_before - GIB
    world.placer.carry_out([(Move("add", "a", "d1"), "plan")])
    await world.run_for(3.0)
    assert world.serving("a") == ["d0"]


async def test_a_device_a_measured_footprint_overcommits_is_warned_about_once(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    world.model("a", 6, on=("d1",))
    world.model("b", 2, on=("d1",))  # d1's 8 GiB are full
    with caplog.at_level(logging.WARNING, logger="evenflow.balancer.placement.placer"):
        world.placer.raise_memory_bytes("a", 7 * GIB)
        world.placer.raise_memory_bytes("a", int(7.5 * GIB))  # still over: no second warning
    assert [r.getMessage() for r in caplog.records if "over its" in r.getMessage()] == [
        "placement: device d1: replicas reserve 9.00 GiB, over its 8.00 GiB, since a measured "
        "activation peak raised a footprint"]
    assert world.placer.free_bytes() == {"d0": 16 * GIB, "d1": -int(1.5 * GIB)}


async def test_the_snapshot_counts_each_devices_reserved_memory_and_each_models_footprint(
        world: World) -> None:
    world.model("a", 6, on=("d0",))
    world.model("b", 3)
    world.placer.hold("d1", 1 * GIB)  # a first replica the engine is building
    world.placer.carry_out([(Move("add", "b", "d1"), "plan")])
    await world.run_for(LOAD_S / 2)
    loading = world.placer.snapshot()
    # A load holds its memory from its start, beside the engine's hold.
    assert [(d.device, d.memory_bytes, d.reserved_bytes) for d in loading.devices] == [
        ("d0", 16 * GIB, 6 * GIB), ("d1", 8 * GIB, 4 * GIB)]
    world.placer.release("d1", 1 * GIB)
    world.placer.set_load_s("b", 1.25)
    world.placer.raise_memory_bytes("b", 5 * GIB)
    await world.run_for(LOAD_S)
    done = world.placer.snapshot()
    assert [(d.device, d.reserved_bytes, d.free_bytes) for d in done.devices] == [
        ("d0", 6 * GIB, 10 * GIB), ("d1", 5 * GIB, 3 * GIB)]
    assert [(m.model, m.memory_bytes, m.load_s) for m in done.models] == [
        ("a", 6 * GIB, LOAD_S), ("b", 5 * GIB, 1.25)]
