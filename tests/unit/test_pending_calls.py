"""The pending-call table: answers by id, late answers dropped, fail-all for a dead peer."""

from __future__ import annotations

import asyncio

import pytest

from evenflow.server.processes.pending_calls import PendingCalls


class Gone(Exception):
    pass


async def test_an_answer_resolves_the_call_with_its_id() -> None:
    calls: PendingCalls[str] = PendingCalls()
    first, first_future = calls.add()
    second, second_future = calls.add()
    assert first != second and len(calls) == 2
    assert calls.resolve(second, "two")
    assert await second_future == "two"
    assert not first_future.done()


async def test_a_failed_call_raises_its_error_to_the_caller() -> None:
    calls: PendingCalls[str] = PendingCalls()
    call_id, future = calls.add()
    assert calls.fail(call_id, Gone("one"))
    with pytest.raises(Gone, match="one"):
        await future


async def test_answers_for_discarded_or_finished_calls_are_dropped() -> None:
    calls: PendingCalls[str] = PendingCalls()
    call_id, future = calls.add()
    future.cancel()  # the caller went away before the answer came
    assert not calls.resolve(call_id, "late")
    assert not calls.fail(call_id, Gone())
    calls.discard(call_id)
    assert call_id not in calls and len(calls) == 0
    assert not calls.resolve(call_id, "later")
    calls.discard(call_id)  # twice is harmless


async def test_fail_all_fails_every_waiter_and_empties_the_table() -> None:
    calls: PendingCalls[int] = PendingCalls()
    futures = [calls.add()[1] for _ in range(3)]
    answered_id, answered = calls.add()
    calls.resolve(answered_id, 7)
    calls.fail_all(Gone("peer exited"))
    assert len(calls) == 0
    results = await asyncio.gather(*futures, return_exceptions=True)
    assert all(isinstance(r, Gone) for r in results)
    assert await answered == 7  # already answered: untouched
    call_id, future = calls.add()  # the table keeps serving after a fail-all
    assert call_id not in (0, 1, 2, 3)
    calls.resolve(call_id, 8)
    assert await future == 8


async def test_a_caller_that_discards_in_finally_leaves_nothing_behind_when_cancelled() -> None:
    calls: PendingCalls[int] = PendingCalls()
    sent = asyncio.Event()

    async def call() -> int:
        call_id, future = calls.add()
        try:
            sent.set()
            return await future
        finally:
            calls.discard(call_id)

    task = asyncio.create_task(call())
    await sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 0
