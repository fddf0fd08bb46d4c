"""cancel_and_wait: how an owner stops its background task; first_set: a wait for the first of
several events that leaves nothing pending."""

from __future__ import annotations

import asyncio

import pytest

from evenflow.server.edge import event_loop
from evenflow.server.edge.event_loop import cancel_and_wait


async def test_a_running_task_is_cancelled_and_awaited() -> None:
    started = asyncio.Event()

    async def forever() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(forever())
    await started.wait()
    await cancel_and_wait(task)
    assert task.cancelled()


async def test_none_and_a_finished_task_are_fine() -> None:
    await cancel_and_wait(None)
    task = asyncio.create_task(asyncio.sleep(0))
    await task
    await cancel_and_wait(task)


async def test_an_exception_the_task_ended_with_is_raised() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(fails())
    await asyncio.wait([task])
    with pytest.raises(RuntimeError, match="boom"):
        await cancel_and_wait(task)


async def test_the_callers_own_cancellation_is_not_swallowed() -> None:
    release = asyncio.Event()
    cancelled = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            await release.wait()  # cleaning up
            raise

    task = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    closer = asyncio.create_task(cancel_and_wait(task))
    await cancelled.wait()
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    release.set()
    await asyncio.wait([task])
    assert task.cancelled()


async def test_first_set_returns_on_any_event_and_leaves_no_wait_behind() -> None:
    a, b = asyncio.Event(), asyncio.Event()
    before = asyncio.all_tasks()
    waiting = asyncio.create_task(event_loop.first_set(a, b))
    await asyncio.sleep(0)  # one turn of the loop: its waits start
    assert not waiting.done()
    b.set()
    await waiting
    assert asyncio.all_tasks() - before == set()
    # Cancelled while waiting: its waits end with it.
    waiting = asyncio.create_task(event_loop.first_set(asyncio.Event()))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert asyncio.all_tasks() - before == set()
