"""The calls a process has sent across a boundary and not yet had answered: one future per call,
by call id, so that the receiving side can resolve an answer by its id and a dead peer can fail
every waiter at once."""

from __future__ import annotations

import asyncio
import itertools
from typing import Generic, TypeVar

T = TypeVar("T")


class PendingCalls(Generic[T]):
    """A table of futures by call id.

    The caller owns each entry: ``add`` gives it a fresh id and a future of the running loop,
    and the caller ``discard``s the id in a ``finally`` once it stops waiting (answered, failed
    or cancelled). ``resolve`` and ``fail`` skip ids that are gone and futures already done (a
    caller that was cancelled, a call given up on), so a late answer is dropped, never raised.
    ``fail_all`` is for a peer that is gone: every waiter gets the error and the table empties.
    """

    def __init__(self) -> None:
        self._ids = itertools.count()
        self._futures: dict[int, asyncio.Future[T]] = {}

    def add(self) -> tuple[int, asyncio.Future[T]]:
        """A new call: its id and the future its answer resolves."""
        call_id = next(self._ids)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._futures[call_id] = future
        return call_id, future

    def discard(self, call_id: int) -> None:
        """Forget a call (its caller stopped waiting); unknown ids are ignored."""
        self._futures.pop(call_id, None)

    def resolve(self, call_id: int, value: T) -> bool:
        """Answer a call; False when no one waits for it any more."""
        future = self._futures.get(call_id)
        if future is None or future.done():
            return False
        future.set_result(value)
        return True

    def fail(self, call_id: int, error: BaseException) -> bool:
        """Fail one call; False when no one waits for it any more."""
        future = self._futures.get(call_id)
        if future is None or future.done():
            return False
        future.set_exception(error)
        return True

    def fail_all(self, error: BaseException) -> None:
        """Fail every call still waiting with ``error`` and empty the table."""
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_exception(error)

    def __len__(self) -> int:
        return len(self._futures)

    def __contains__(self, call_id: object) -> bool:
        return call_id in self._futures
