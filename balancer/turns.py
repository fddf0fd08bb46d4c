"""Turns on a shared device: the replicas of several models that share one device run one batch
at a time there, and the next turn goes to the replica whose most urgent request is due first.

Without turns, each model's replica forms its batch when its own queue is ready and then waits
for the device behind the other models' batches, so the batch is fixed before it can start:
requests that arrive during the wait cannot join it, and the device serves the models in
whatever order their batches happened to form. With turns, a replica forms its batch only once
the device is its own (late binding to the device), sized from how long its oldest request has
waited by then, and the order is earliest-due-first across the models.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class DeviceTurns:
    """One holder per device at a time; the others wait in order of ``due_s`` (ties in the
    order they asked). A turn is taken with ``take`` and must be handed on with ``give_back``;
    a waiter cancelled before its turn leaves the line, one cancelled as its turn came passes
    it on."""

    def __init__(self) -> None:
        self._held: set[str] = set()
        self._waiting: dict[str, list[tuple[float, int, asyncio.Future[None]]]] = {}
        self._order = itertools.count()

    def held(self, device: str) -> bool:
        return device in self._held

    def waiting(self, device: str) -> int:
        """How many replicas wait for a turn on ``device``."""
        return sum(1 for *_, future in self._waiting.get(device, ()) if not future.done())

    async def take(self, device: str, due_s: float) -> None:
        """Return once ``device`` is this caller's: at once when nobody holds it."""
        if device not in self._held:
            self._held.add(device)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting.setdefault(device, []), (due_s, next(self._order), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.give_back(device)  # the turn came with the cancellation: pass it on
            raise

    def give_back(self, device: str) -> None:
        """End the holder's turn: the most urgent waiter's turn begins, or the device is free."""
        line = self._waiting.get(device)
        while line:
            *_, future = heapq.heappop(line)
            if not future.done():  # a cancelled waiter's entry is skipped here
                future.set_result(None)
                return
        self._waiting.pop(device, None)
        self._held.discard(device)
