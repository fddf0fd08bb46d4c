"""Retries, the same for every transport: a call that failed with UNAVAILABLE (the server
could not be reached, or said it cannot serve now) is tried again after an exponential
backoff; every other failure is raised at once. Refusals (RESOURCE_EXHAUSTED) are not retried:
the server measured that it cannot answer in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from evenflow.client.errors import ServerUnavailableError

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Retries:
    retries: int = 2
    backoff_s: float = 0.05

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0:
            raise ValueError("retries and retry_backoff_s must be >= 0")

    def call(self, attempt: Callable[[], T]) -> T:
        delay_s = self.backoff_s
        for remaining in range(self.retries, -1, -1):
            try:
                return attempt()
            except ServerUnavailableError:
                if remaining == 0:
                    raise
            time.sleep(delay_s)
            delay_s *= 2
        raise AssertionError("unreachable")

    async def acall(self, attempt: Callable[[], Awaitable[T]]) -> T:
        delay_s = self.backoff_s
        for remaining in range(self.retries, -1, -1):
            try:
                return await attempt()
            except ServerUnavailableError:
                if remaining == 0:
                    raise
            await asyncio.sleep(delay_s)
            delay_s *= 2
        raise AssertionError("unreachable")
