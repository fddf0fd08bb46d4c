"""Retries, the same for every transport, within one deadline per call.

A call that failed with UNAVAILABLE is tried again after an exponential backoff (``backoff_s``,
doubled each time), at most ``retries`` more times, and only while its deadline lasts: the
call's ``timeout_s`` is one deadline for every attempt together, each attempt gets only the
time left of it (over HTTP the server's ``timeout`` parameter says the time left too), and a
backoff that would end past the deadline ends the retries with the last UNAVAILABLE. Every
other failure is raised at once; refusals (RESOURCE_EXHAUSTED) are not retried: the server
measured that it cannot answer in time.

An infer request is not idempotent (a second run costs the server a second batch share, and a
request that crashed its worker would crash another), so it is sent again only where the
server cannot have run it (``not_run``): the call never left the client (no connection was
made, or the name did not resolve), or evenflow's server answered UNAVAILABLE for a request it
had not started (draining, no replica in service, dropped from a queue at shutdown), which it
marks ``evenflow-may-resend`` (gRPC trailing metadata, an HTTP header; ``proto/metadata.py``).
An UNAVAILABLE without the mark (a connection lost after the request went out, a worker lost
while running it, another server's) is raised at once: the server may have run the request.
Health, readiness and metadata calls only read, and are retried on any UNAVAILABLE."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from evenflow.client.errors import InferenceServerError, ServerUnavailableError

T = TypeVar("T")
E = TypeVar("E", bound=InferenceServerError)

# Resend: whether a call that failed with this UNAVAILABLE may be sent again.
Resend = Callable[[ServerUnavailableError], bool]

# The errors after which the server cannot have run the request. A weak set, not an attribute:
# the exception stays the public class as it is, and is forgotten with it.
_NOT_RUN: weakref.WeakSet[InferenceServerError] = weakref.WeakSet()


def not_run(error: E) -> E:
    """``error``, marked as one after which the server cannot have run the request (no
    connection was made, or the server said so), so that sending it again cannot run it
    twice."""
    _NOT_RUN.add(error)
    return error


def any_unavailable(error: ServerUnavailableError) -> bool:
    """Reads: every UNAVAILABLE is retried."""
    return True


def marked_not_run(error: ServerUnavailableError) -> bool:
    """An infer: retried only if the server cannot have run it (``not_run``)."""
    return error in _NOT_RUN


class _Deadline:
    def __init__(self, timeout_s: float | None, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._at_s = None if timeout_s is None else clock() + timeout_s

    def left_s(self) -> float | None:
        return None if self._at_s is None else self._at_s - self._clock()


class _Schedule:
    """One call's attempts: the time each gets, and the wait before each retry."""

    def __init__(self, retries: Retries, timeout_s: float | None) -> None:
        self._deadline = _Deadline(timeout_s, retries.clock)
        self.left_s = timeout_s  # the first attempt gets ``timeout_s`` itself
        self._retries_left = retries.retries
        self._next_wait_s = retries.backoff_s
        self._last: ServerUnavailableError | None = None

    def wait_s(self, error: ServerUnavailableError, resend: Resend) -> float:
        """How long to wait before sending again after ``error``; raises ``error`` where it is
        not sent again (no retries left, not ``resend``, or the wait outlasts the deadline)."""
        left_s = self._deadline.left_s()
        if (self._retries_left == 0 or not resend(error)
                or (left_s is not None and left_s <= self._next_wait_s)):
            raise error
        self._retries_left -= 1
        self._last = error
        wait_s, self._next_wait_s = self._next_wait_s, self._next_wait_s * 2
        return wait_s

    def woke(self) -> None:
        """After a wait: the next attempt's time; raises the last failure if the wait overslept
        the deadline."""
        self.left_s = self._deadline.left_s()
        if self.left_s is not None and self.left_s <= 0 and self._last is not None:
            raise self._last


@dataclass(frozen=True, slots=True)
class Retries:
    retries: int = 2
    backoff_s: float = 0.05
    # Injected by tests, to run the deadline arithmetic without waiting.
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False, compare=False)
    asleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False,
                                                       compare=False)

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0:
            raise ValueError("retries and retry_backoff_s must be >= 0")

    def call(self, attempt: Callable[[float | None], T], timeout_s: float | None,
             resend: Resend = any_unavailable) -> T:
        """``attempt(time left)`` until it answers, within ``timeout_s`` for all attempts
        (None: no deadline)."""
        schedule = _Schedule(self, timeout_s)
        while True:
            try:
                return attempt(schedule.left_s)
            except ServerUnavailableError as exc:
                wait_s = schedule.wait_s(exc, resend)
            self.sleep(wait_s)
            schedule.woke()

    async def acall(self, attempt: Callable[[float | None], Awaitable[T]],
                    timeout_s: float | None, resend: Resend = any_unavailable) -> T:
        """``call`` for coroutines."""
        schedule = _Schedule(self, timeout_s)
        while True:
            try:
                return await attempt(schedule.left_s)
            except ServerUnavailableError as exc:
                wait_s = schedule.wait_s(exc, resend)
            await self.asleep(wait_s)
            schedule.woke()
