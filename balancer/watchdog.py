"""A deadline on an awaited worker call that blames the worker, never a stalled event loop.

``asyncio.timeout`` fires by the clock alone. When the loop itself is held (a long garbage
collection, a blocking call on the loop thread, a starved core) the batch's answer can be sitting
in a socket, unread, when the loop wakes; the timer is due in the same turn and cancels the
waiting task before it reads the answer, and a healthy worker is declared lost. ``Watchdog``
fires only once the deadline has passed *and* the loop has then run on time for ``settle_s``:
when the deadline comes due it re-arms for ``settle_s``; if that timer in turn runs late by more
than half of ``settle_s`` the loop was stalled again, and it re-arms once more. A hung worker is
therefore caught ``settle_s`` after its deadline on a responsive loop (plus any stall), and an
answer that arrived during a stall is read first.

Its timers and its sense of lateness are those of the ``TimeSource`` it is given (the loop's
by default), the same one that prices the batch it watches.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from evenflow.balancer.timebase import Cancellable, LoopTime, TimeSource

SETTLE_S = 0.1


class Watchdog:
    """``async with Watchdog(timeout_s):`` raises ``TimeoutError`` when the body outlives the
    deadline as described above; ``expired`` tells that apart from a ``TimeoutError`` the body
    raised itself."""

    __slots__ = ("_handle", "_loop", "_settle_s", "_time", "_timeout", "_timeout_s")

    def __init__(self, timeout_s: float, settle_s: float = SETTLE_S,
                 time: TimeSource | None = None) -> None:
        self._timeout_s = timeout_s
        self._settle_s = settle_s
        self._time = time
        self._timeout = asyncio.timeout(None)
        self._handle: Cancellable | None = None

    @property
    def expired(self) -> bool:
        return self._timeout.expired()

    async def __aenter__(self) -> Watchdog:
        self._loop = asyncio.get_running_loop()
        if self._time is None:
            self._time = LoopTime(self._loop.time)
        await self._timeout.__aenter__()
        due_s = self._time.clock() + self._timeout_s
        self._handle = self._time.call_later(self._timeout_s, self._due, due_s, False)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        await self._timeout.__aexit__(exc_type, exc, tb)

    def _due(self, due_s: float, settling: bool) -> None:
        time = self._time
        assert time is not None  # set on entry
        now_s = time.clock()
        if settling and now_s - due_s <= self._settle_s / 2:
            self._handle = None
            # Due now on the loop's own clock: cancels the task; __aexit__ raises TimeoutError.
            self._timeout.reschedule(self._loop.time())
            return
        self._handle = time.call_later(self._settle_s, self._due, now_s + self._settle_s, True)
