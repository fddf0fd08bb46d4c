"""A signal during start-up stops the start: the load is cancelled (and closes what it built)
rather than finished first, which may take longer than an orchestrator's grace."""

from __future__ import annotations

import asyncio

import pytest

from evenflow.server.engine.app import start_unless_stopped

pytestmark = pytest.mark.timeout(10)


class SlowApp:
    """A start that waits for ``loaded``, and says whether it was cancelled."""

    def __init__(self, port: int = 8001, fails: bool = False) -> None:
        self.started = asyncio.Event()
        self.loaded = asyncio.Event()
        self.cancelled = False
        self._port = port
        self._fails = fails

    async def start(self) -> int:
        self.started.set()
        try:
            await self.loaded.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        if self._fails:
            raise ValueError("the model failed to load")
        return self._port


async def test_a_signal_during_start_cancels_it() -> None:
    app, stop = SlowApp(), asyncio.Event()
    outcome = asyncio.create_task(start_unless_stopped(app, stop))
    await app.started.wait()
    stop.set()
    assert await outcome is None
    assert app.cancelled


async def test_a_start_that_ends_gives_its_port() -> None:
    app, stop = SlowApp(port=9001), asyncio.Event()
    outcome = asyncio.create_task(start_unless_stopped(app, stop))
    await app.started.wait()
    app.loaded.set()
    assert await outcome == 9001
    assert not app.cancelled


async def test_a_failed_start_raises_its_error() -> None:
    app, stop = SlowApp(fails=True), asyncio.Event()
    app.loaded.set()
    with pytest.raises(ValueError, match="failed to load"):
        await start_unless_stopped(app, stop)


async def test_cancelling_the_caller_cancels_the_start() -> None:
    app, stop = SlowApp(), asyncio.Event()
    outcome = asyncio.create_task(start_unless_stopped(app, stop))
    await app.started.wait()
    outcome.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outcome
    assert app.cancelled
