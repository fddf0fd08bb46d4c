"""The balancer's one time seam: a clock and the timers that run on that clock.

Pricing (predicted finish times, deadlines, arrival rates) reads the clock; every wait (a
forming batch's ``max_wait_s``, an idle replica's poll, the watchdog, a restart's backoff) is
a timer of the same source. Production uses ``LoopTime``: ``time.monotonic`` and the running
event loop's timers. A test injects a fake whose timers fire when the test moves its clock, so
it can use the server's real wait values and still decide exactly when each wait ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from evenflow.balancer.job import Clock


class Cancellable(Protocol):
    """A timer that has not fired yet can be cancelled (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None: ...


@runtime_checkable
class TimeSource(Protocol):
    """A monotonic clock (``clock``) and timers on it: ``call_later(delay_s, callback, *args)``
    runs ``callback(*args)`` on the event loop's thread once the clock has moved on by
    ``delay_s``, unless cancelled first."""

    @property
    def clock(self) -> Clock: ...

    def call_later(self, delay_s: float, callback: Callable[..., object],
                   *args: Any) -> Cancellable: ...


class LoopTime:
    """``clock`` (``time.monotonic`` unless given) with the running loop's timers.

    Delays are relative, so the timers keep to ``clock`` as long as it advances at the loop's
    pace: ``time.monotonic`` is asyncio's own clock, and a loop's ``time`` is its own.
    """

    __slots__ = ("_clock",)

    def __init__(self, clock: Clock = time.monotonic) -> None:
        self._clock = clock

    @property
    def clock(self) -> Clock:
        return self._clock

    def call_later(self, delay_s: float, callback: Callable[..., object],
                   *args: Any) -> Cancellable:
        return asyncio.get_running_loop().call_later(delay_s, callback, *args)


def as_time_source(clock: Clock | TimeSource) -> TimeSource:
    """``clock`` itself when it is a ``TimeSource``; a bare clock gets the loop's timers."""
    return clock if isinstance(clock, TimeSource) else LoopTime(clock)


def resolve(waiter: asyncio.Future[None]) -> None:
    """Wake ``waiter`` unless it is already done (its awaiting task was cancelled)."""
    if not waiter.done():
        waiter.set_result(None)


async def sleep_s(time_source: TimeSource, seconds: float) -> None:
    """``asyncio.sleep`` on ``time_source``'s timers."""
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    timer = time_source.call_later(seconds, resolve, waiter)
    try:
        await waiter
    finally:
        timer.cancel()
