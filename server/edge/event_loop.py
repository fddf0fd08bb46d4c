"""The event loop every evenflow process runs on: uvloop where it is installed (it is a
dependency on the platforms it supports), else asyncio's own."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion on a new event loop and return its result."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it installs
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a background task its owner is closing and wait until it has ended. Its own
    cancellation is not raised here, an exception it ended with is; a cancellation of the
    caller still reaches the caller (``asyncio.wait`` does not swallow it)."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.result()


async def first_set(*events: asyncio.Event) -> None:
    """Return once any of ``events`` is set. The waits made for it are cancelled and awaited
    whichever way this ends, the caller's cancellation included, so none is left pending."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
