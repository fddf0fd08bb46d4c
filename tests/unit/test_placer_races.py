"""The placer when things change under its moves: a load whose device or model leaves while it
loads, the move budget against swaps, drops that would leave no healthy replica in routing or
take a pinned one, and shutdown with a load and a drain in flight. Fakes on a fake clock."""

from __future__ import annotations

import asyncio
import math

import pytest

from evenflow.balancer import WorkerLost
from evenflow.balancer.errors import DeviceLost
from evenflow.balancer.placement.moves import Move
from evenflow.balancer.placement.placer import PlacerSettings
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import FakeTime, answered, settle
from tests.unit.placer_fakes import GIB, LOAD_S, World

pytestmark = pytest.mark.timeout(20)




async def test_a_load_on_a_device_that_leaves_meanwhile_is_closed_not_routed_to(
        world: World) -> None:
    a = world.model("a", 4, on=("d0",))
    world.placer.carry_out([(Move("add", "a", "d1"), "plan")])
    await world.run_for(LOAD_S / 2)
    world.placer.remove_device("d1")
    await world.run_for(LOAD_S)
    (worker,) = world.loader.workers
    assert worker.closed
    assert [r.worker.name for r in a.replicas] == ["a@d0"]
    assert world.placer.snapshot().replicas == (("a", "d0", "serving"),)
    assert world.outcomes()[-1] == ("add", "a", "d1", "skipped: device gone")
    # Placement goes on: the next tick's move is carried out.
    world.model("b", 4)
    world.strategy.queued = [(Move("add", "b", "d0"), "plan")]
    await world.run_for(LOAD_S + 1.0)
    assert world.serving("b") == ["d0"]


async def test_a_load_for_a_model_unloaded_meanwhile_is_closed_and_holds_memory_till_then(
        world: World) -> None:
    a = world.model("a", 4, on=("d0",))
    world.placer.carry_out([(Move("add", "a", "d1"), "plan")])
    await world.run_for(LOAD_S / 2)
    # An unload: the placer forgets the model, then its balancer closes.
    assert world.placer.forget_model("a") == [("d0", 4 * GIB)]
    await a.close()
    assert world.placer.free_bytes() == {"d0": 16 * GIB, "d1": 4 * GIB}  # the load's, still
    await world.run_for(LOAD_S)
    (worker,) = world.loader.workers
    assert worker.closed
    assert [r.worker.name for r in a.replicas] == ["a@d0"]  # nothing added to it
    assert world.placer.free_bytes() == {"d0": 16 * GIB, "d1": 8 * GIB}
    assert world.outcomes()[-1] == ("add", "a", "d1", "skipped: model gone")


async def test_a_reloaded_model_loads_where_its_old_balancers_load_is_still_in_flight(
        world: World) -> None:
    old = world.model("a", 4, on=("d0",))
    world.placer.carry_out([(Move("add", "a", "d1"), "plan")])
    await world.run_for(LOAD_S / 2)
    draining = world.placer.forget_model("a")
    for device, memory_bytes in draining:
        world.placer.hold(device, memory_bytes)
    new = world.model("a", 4)
    world.placer.carry_out([(Move("add", "a", "d1"), "plan")])  # the old load's memory held
    await world.run_for(LOAD_S / 2)
    await old.close()
    for device, memory_bytes in draining:
        world.placer.release(device, memory_bytes)
    await world.run_for(LOAD_S)
    first, second = world.loader.workers
    assert first.closed and not second.closed
    assert [r.worker for r in new.replicas] == [second]
    assert world.serving("a") == ["d1"]
    assert await answered(world.time, new.submit("x", 1)) == [("out", "x")]


async def test_requests_parked_for_a_load_that_a_reload_orphans_fail_at_once(
        world: World) -> None:
    old = world.model("a", 4)  # no replica: the request parks and a load starts
    parked = old.submit("x", 1, deadline_s=math.inf)
    await world.run_for(LOAD_S / 2)
    assert not parked.done()
    for device, memory_bytes in world.placer.forget_model("a"):  # a reload takes over
        world.placer.hold(device, memory_bytes)
    await settle()
    error = parked.exception()
    assert isinstance(error, WorkerLost) and "reloaded or unloaded" in str(error)
    world.model("a", 4, on=("d1",))
    await asyncio.wait_for(old.drain(), timeout=1.0)  # close_model's drain has nothing left
    await world.run_for(LOAD_S)
    (orphan,) = world.loader.workers
    assert orphan.closed


async def test_a_failed_on_demand_load_after_a_wait_for_memory_lets_the_next_request_wait(
        world: World) -> None:
    world.model("big", 15, on=("d0",), min_replicas=1)
    world.model("filler", 7, on=("d1",), min_replicas=1)
    cold = world.model("cold", 4)
    first = cold.submit("x", 1, deadline_s=math.inf)
    await world.run_for(1.0)  # no memory anywhere: it waits
    world.placer.forget_model("filler")  # memory frees on d1; the load there fails
    world.loader.fail = {("cold", "d1")}
    await world.run_for(LOAD_S + 1.0)
    assert isinstance(first.exception(), WorkerLost)
    world.model("filler2", 7, on=("d1",), min_replicas=1)  # memory full again
    await world.run_for(5.0)  # past on_demand_wait_s since the first wait began
    second = cold.submit("y", 1, deadline_s=math.inf)
    await world.run_for(1.0)
    assert not second.done()  # a wait of its own, not the first one's expired clock


@pytest.mark.parametrize("skipped_first", [False, True])
async def test_the_budget_runs_a_swap_whole_or_not_at_all(skipped_first: bool) -> None:
    # With one move left the swap does not start; with two it does, whatever moves before it
    # in the list do not start (a is on d0 already).
    world = World(FakeTime(), settings=PlacerSettings(moves_per_minute=2 if skipped_first
                                                      else 1))
    try:
        world.model("a", 6, on=("d0",))
        world.model("b", 6, on=("d1",))
        first = [(Move("add", "a", "d0"), "plan")] if skipped_first else []
        world.placer.carry_out([*first, (Move("drop", "b", "d1"), "overflow"),
                                (Move("add", "a", "d1"), "overflow")])
        await world.run_for(LOAD_S + 1.0)
        if skipped_first:
            assert (world.serving("a"), world.serving("b")) == (["d0", "d1"], [])
        else:
            assert (world.serving("a"), world.serving("b")) == (["d0"], ["d1"])
            assert world.outcomes() == []
    finally:
        await world.close()


async def test_a_drop_never_takes_the_last_healthy_replica_out_of_routing(
        world: World) -> None:
    a = world.model("a", 4, on=("d0", "d1"))
    lost = next(r.worker for r in a.replicas if r.worker.name == "a@d1")
    assert isinstance(lost, FakeWorker)
    lost.fail_with.append(DeviceLost("d1 fell off the bus"))  # out of routing for good
    for i in range(20):
        assert await answered(world.time, a.submit(i, 1)) == [("out", i)]
        if not lost.fail_with:
            break
    assert [r.healthy for r in a.replicas if r.worker is lost] == [False]
    world.placer.carry_out([(Move("drop", "a", "d0"), "tuner")])
    await world.run_for(0.5)
    assert a.serving and world.serving("a") == ["d0", "d1"]
    assert world.outcomes()[-1] == (
        "drop", "a", "d0", "skipped: it would leave 0 healthy replicas in routing, under 1")
    assert await answered(world.time, a.submit("x", 1)) == [("out", "x")]


async def test_a_pinned_replica_is_never_dropped(world: World) -> None:
    world.model("a", 4, on=("d0", "d1"), pinned=frozenset({"d1"}))
    world.placer.carry_out([(Move("drop", "a", "d1"), "tuner")])
    await world.run_for(0.5)
    assert world.serving("a") == ["d0", "d1"]
    assert world.outcomes()[-1] == ("drop", "a", "d1", "skipped: pinned there")


async def test_close_abandons_a_load_in_flight_and_fails_its_parked_requests(
        world: World) -> None:
    cold = world.model("cold", 4)
    future = cold.submit("x", 1)
    await world.run_for(LOAD_S / 2)
    closing = asyncio.ensure_future(world.placer.close())
    await settle()
    assert closing.done()  # no fake time passed: the load was not waited for
    assert (world.loader.cancelled, world.loader.workers) == (1, [])
    assert isinstance(future.exception(), WorkerLost)
    assert world.placer.snapshot().replicas == ()
    assert world.outcomes()[-1] == ("add", "cold", "d0", "skipped: abandoned at shutdown")


async def test_close_lets_a_drain_in_progress_finish(world: World) -> None:
    a = world.model("a", 4, on=("d0", "d1"))
    world.model("c", 4)
    workers = [r.worker for r in a.replicas]
    for worker in workers:
        assert isinstance(worker, FakeWorker)
        worker.gated = True
    future = a.submit("x", 1)
    await settle()
    (busy,) = [w for w in workers if isinstance(w, FakeWorker) and w.num_waiting]
    device = busy.devices[0]
    # The drain of a's busy replica, an add waiting for the room it makes, and a load on
    # demand in progress.
    world.placer.carry_out([(Move("drop", "a", device), "plan"),
                            (Move("add", "c", device), "plan")])
    cold = world.model("cold", 2)
    parked = cold.submit("y", 1)
    await world.run_for(LOAD_S / 2)
    closing = asyncio.ensure_future(world.placer.close())
    await world.run_for(0.5)
    assert not closing.done()  # the drain waits for its running batch
    busy.release()
    await settle()
    assert closing.done()
    assert future.result() == ("out", "x") and busy.closed
    assert isinstance(parked.exception(), WorkerLost)
    assert world.loader.workers == []
    assert sorted(world.outcomes()) == [
        ("add", "c", device, "skipped: abandoned at shutdown"),
        ("add", "cold", "d0", "skipped: abandoned at shutdown"),
        ("drop", "a", device, "done")]


async def test_an_eviction_a_drop_would_refuse_is_not_proposed(world: World) -> None:
    # a is idle on both devices, its replica on d1 out of routing (lost): evicting a@d0 would
    # leave it no healthy replica, so the drop would refuse and the load after it would fail
    # for memory. a@d1 goes instead, and cold loads there.
    a = world.model("a", 8, on=("d0", "d1"))
    world.model("pinned", 8, on=("d0",), pinned=frozenset({"d0"}))
    lost = next(r.worker for r in a.replicas if r.worker.name == "a@d1")
    assert isinstance(lost, FakeWorker)
    lost.fail_with.append(DeviceLost("d1 fell off the bus"))
    for i in range(20):
        assert await answered(world.time, a.submit(i, 1)) == [("out", i)]
        if not lost.fail_with:
            break
    await world.run_for(6.0)  # a is idle now
    cold = world.model("cold", 8)
    assert await answered(world.time, cold.submit("x", 1), limit_s=10.0) == [("out", "x")]
    assert world.serving("cold") == ["d1"] and world.serving("a") == ["d0"]
    assert ("drop", "a", "d1", "done") in world.outcomes()
    assert not any(o.startswith("skipped") for *_, o in world.outcomes())
