"""The watchdog blames a worker that hangs, never an event loop that stalled: run on the
virtual-time loop, where a stall is the clock jumping while no callback runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from benchmarks.virtual_time import VirtualLoop
from evenflow.balancer.watchdog import SETTLE_S, Watchdog

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def loop() -> Iterator[VirtualLoop]:
    virtual = VirtualLoop()
    yield virtual
    virtual.close()


def _stall(loop: VirtualLoop, seconds: float) -> None:
    """The loop thread held for ``seconds``: time passes, and nothing else runs meanwhile."""
    loop._virtual.now_s += seconds


async def _watched(call_s: float, timeout_s: float = 2.0) -> tuple[str, float]:
    loop = asyncio.get_running_loop()
    start_s = loop.time()
    try:
        async with Watchdog(timeout_s):
            await asyncio.sleep(call_s)
    except TimeoutError:
        return "fired", loop.time() - start_s
    return "answered", loop.time() - start_s


def test_a_call_that_answers_in_time_is_left_alone(loop: VirtualLoop) -> None:
    assert loop.run_until_complete(_watched(1.9)) == ("answered", pytest.approx(1.9))


def test_a_hung_call_fires_once_the_loop_has_run_on_time_for_the_settle_time(
        loop: VirtualLoop) -> None:
    verdict, after_s = loop.run_until_complete(_watched(100.0))
    assert verdict == "fired" and after_s == pytest.approx(2.0 + SETTLE_S)


def test_an_answer_that_came_during_a_stall_past_the_deadline_is_read(loop: VirtualLoop) -> None:
    # The call answers at 0.05 s, but the loop is held from 0.01 s to 3.01 s: when it wakes,
    # the answer and the deadline are both due in the same turn.
    loop.call_at(0.01, _stall, loop, 3.0)
    verdict, after_s = loop.run_until_complete(_watched(0.05))
    assert verdict == "answered" and after_s == pytest.approx(3.01)


def test_a_hung_call_still_fires_when_stalls_delay_the_settling(loop: VirtualLoop) -> None:
    loop.call_at(2.05, _stall, loop, 1.0)  # during the settle time: the verdict waits
    verdict, after_s = loop.run_until_complete(_watched(100.0))
    assert verdict == "fired" and after_s == pytest.approx(3.05 + SETTLE_S)


def test_a_timeout_error_of_the_call_itself_is_not_the_watchdogs(loop: VirtualLoop) -> None:
    async def body() -> bool:
        watchdog = Watchdog(2.0)
        with pytest.raises(TimeoutError):
            async with watchdog:
                raise TimeoutError("the worker's own")
        return watchdog.expired

    assert loop.run_until_complete(body()) is False
