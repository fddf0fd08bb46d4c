"""Retries, the same for every transport, within one deadline per call.

A call that failed with UNAVAILABLE is tried again after an exponential backoff (``backoff_s``,
doubled each time), at most ``retries`` more times, and only while its deadline lasts: the
call's ``timeout_s`` is one deadline for every attempt together, each attempt gets only the
time left of it (over HTTP the server's ``timeout`` parameter says the time left too), and a
backoff that would end past the deadline ends the retries with the last UNAVAILABLE. Every
other failure is raised at once; refusals (RESOURCE_EXHAUSTED) are not retried: the server
measured that it cannot answer in time.

An infer request is not idempotent, so over HTTP it is sent again only where the server cannot
have started it: the connection was never made (refused, no route, a name that does not
resolve: ``unsent``), or the server answered UNAVAILABLE itself (a draining server, a 503 that
is no refusal). A connection lost after the request went out (reset, or closed before the
answer) is raised at once, not retried: the server may have run the request. Over gRPC every
UNAVAILABLE is retried (gRPC's status for a channel that could not connect and for a server
that cannot serve now). Health, readiness and metadata calls only read, and are retried on any
UNAVAILABLE."""

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

# The errors a transport raised before its request left the client. A weak set, not an
# attribute: the exception stays the public class as it is, and is forgotten with it.
_UNSENT: weakref.WeakSet[InferenceServerError] = weakref.WeakSet()


def unsent(error: E) -> E:
    """``error``, marked as raised before the request was sent (no connection was made), so
    that sending the request again cannot run it twice."""
    _UNSENT.add(error)
    return error


def any_unavailable(error: ServerUnavailableError) -> bool:
    """Reads, and gRPC's calls: every UNAVAILABLE is retried."""
    return True


def not_delivered(error: ServerUnavailableError) -> bool:
    """An HTTP infer: retried only if it was never sent, or the server answered UNAVAILABLE
    (an answer: ``http_status``) and so did not run it."""
    return error.http_status is not None or error in _UNSENT


class _Deadline:
    def __init__(self, timeout_s: float | None, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._at_s = None if timeout_s is None else clock() + timeout_s

    def left_s(self) -> float | None:
        return None if self._at_s is None else self._at_s - self._clock()

    def lasts_past(self, wait_s: float) -> bool:
        """Whether time is left after waiting ``wait_s``."""
        left_s = self.left_s()
        return left_s is None or left_s > wait_s


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
        (None: no deadline). The first attempt gets ``timeout_s`` itself."""
        deadline = _Deadline(timeout_s, self.clock)
        left_s = timeout_s
        delay_s = self.backoff_s
        last: ServerUnavailableError  # the failure a retry follows
        for remaining in range(self.retries, -1, -1):
            try:
                return attempt(left_s)
            except ServerUnavailableError as exc:
                if remaining == 0 or not resend(exc) or not deadline.lasts_past(delay_s):
                    raise
                last = exc
            self.sleep(delay_s)
            delay_s *= 2
            left_s = deadline.left_s()
            if left_s is not None and left_s <= 0:  # the backoff overslept the deadline
                raise last
        raise AssertionError("unreachable")

    async def acall(self, attempt: Callable[[float | None], Awaitable[T]],
                    timeout_s: float | None, resend: Resend = any_unavailable) -> T:
        """``call`` for coroutines."""
        deadline = _Deadline(timeout_s, self.clock)
        left_s = timeout_s
        delay_s = self.backoff_s
        last: ServerUnavailableError  # the failure a retry follows
        for remaining in range(self.retries, -1, -1):
            try:
                return await attempt(left_s)
            except ServerUnavailableError as exc:
                if remaining == 0 or not resend(exc) or not deadline.lasts_past(delay_s):
                    raise
                last = exc
            await self.asleep(delay_s)
            delay_s *= 2
            left_s = deadline.left_s()
            if left_s is not None and left_s <= 0:  # the backoff overslept the deadline
                raise last
        raise AssertionError("unreachable")
