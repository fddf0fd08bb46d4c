"""Turns on a shared device (``DeviceTurns``): one holder per device, the next turn to the most
urgent waiter, and no turn lost to a cancelled waiter."""

from __future__ import annotations

import asyncio

import pytest

from evenflow.balancer.turns import DeviceTurns
from tests.unit.balancer_fakes import settle


async def test_a_free_device_is_taken_at_once_and_freed_when_nobody_waits() -> None:
    turns = DeviceTurns()
    await turns.take("dev0", due_s=1.0)
    assert turns.held("dev0") and not turns.held("dev1")
    turns.give_back("dev0")
    assert not turns.held("dev0")
    await asyncio.wait_for(turns.take("dev0", due_s=2.0), timeout=1.0)  # free again


async def test_devices_take_turns_independently() -> None:
    turns = DeviceTurns()
    await turns.take("dev0", due_s=1.0)
    await asyncio.wait_for(turns.take("dev1", due_s=1.0), timeout=1.0)
    assert turns.held("dev0") and turns.held("dev1")


async def test_the_next_turn_goes_to_the_earliest_due_then_to_who_asked_first() -> None:
    turns = DeviceTurns()
    await turns.take("dev0", due_s=0.0)
    order: list[str] = []

    async def waiter(name: str, due_s: float) -> None:
        await turns.take("dev0", due_s)
        order.append(name)

    tasks = [asyncio.create_task(waiter(name, due_s))
             for name, due_s in (("late", 3.0), ("tie-first", 2.0), ("tie-second", 2.0),
                                 ("urgent", 1.0))]
    await settle()
    assert turns.waiting("dev0") == 4 and not order
    for expected in ("urgent", "tie-first", "tie-second", "late"):
        turns.give_back("dev0")
        await settle()
        assert order[-1] == expected
        assert turns.held("dev0")  # handed on, never free in between
    turns.give_back("dev0")
    assert not turns.held("dev0")
    await asyncio.gather(*tasks)


async def held_with_two_waiting(turns: DeviceTurns) -> tuple[asyncio.Task[None], ...]:
    """dev0 held, and two waiters in line for it: due at 1 s, then at 2 s."""
    await turns.take("dev0", due_s=0.0)
    waiters = tuple(asyncio.create_task(turns.take("dev0", due_s=due_s)) for due_s in (1.0, 2.0))
    await settle()
    return waiters


async def test_a_waiter_cancelled_before_its_turn_leaves_the_line() -> None:
    turns = DeviceTurns()
    gone, kept = await held_with_two_waiting(turns)
    gone.cancel()
    await settle()
    assert turns.waiting("dev0") == 1
    turns.give_back("dev0")
    await settle()
    assert kept.done() and turns.held("dev0")  # the cancelled one was skipped
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_a_waiter_cancelled_as_its_turn_came_passes_it_on() -> None:
    turns = DeviceTurns()
    unlucky, after = await held_with_two_waiting(turns)
    turns.give_back("dev0")  # unlucky's turn is granted...
    unlucky.cancel()  # ...and it is cancelled before it could run
    await settle()
    with pytest.raises(asyncio.CancelledError):
        await unlucky
    assert after.done() and turns.held("dev0")
    turns.give_back("dev0")
    assert not turns.held("dev0")


async def test_a_cancelled_last_waiter_frees_the_device() -> None:
    turns = DeviceTurns()
    await turns.take("dev0", due_s=0.0)
    unlucky = asyncio.create_task(turns.take("dev0", due_s=1.0))
    await settle()
    turns.give_back("dev0")
    unlucky.cancel()
    await settle()
    assert not turns.held("dev0") and turns.waiting("dev0") == 0
