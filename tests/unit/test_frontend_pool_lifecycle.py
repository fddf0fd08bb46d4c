"""FrontendPool's front-end processes over their lifetime, with a hand-written stand-in for
``Child`` (no process is started): a restart never outlives the drain or ``stop``, a front-end
that fails to start takes its siblings' launches with it, and ``stop`` stops them all at once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import pytest

from evenflow.server.engine.proxied_calls import ProxiedCalls
from evenflow.server.engine.served import ModelTable
from evenflow.server.processes import frontend_pool
from evenflow.server.processes.frontend_pool import FrontendPool
from evenflow.server.processes.ipc import frontend_messages as msg
from evenflow.server.processes.supervisor import ChildNotReady

pytestmark = pytest.mark.timeout(20)

_WAIT_S = 5.0  # generous: what the tests wait for happens within a loop turn or a backoff


class FakeChild:
    """A front-end process as the pool sees it. ``until_ready`` waits for ``ready`` (set by the
    test, or at once), or raises ChildNotReady when ``fails``; ``stop`` waits for
    ``stop_gate`` (the process takes its time to exit), then it has exited."""

    def __init__(self, pid: int, *, ready: bool, fails: asyncio.Event | None) -> None:
        self.pid = pid
        self.ready = asyncio.Event()
        if ready:
            self.ready.set()
        self.fails = fails  # raise ChildNotReady once it is set
        self.waiting_ready = asyncio.Event()
        self.stopping = asyncio.Event()
        self.stop_gate: asyncio.Event | None = None
        self.killed = False
        self._exited = asyncio.Event()
        self._code = 0

    @property
    def alive(self) -> bool:
        return not self._exited.is_set()

    def exit(self, code: int) -> None:
        if self.alive:
            self._code = code
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        return self._code

    async def until_ready(self, ready: asyncio.Future[Any], timeout_s: float) -> None:
        self.waiting_ready.set()
        if self.fails is not None:
            await self.fails.wait()
            self.exit(1)
            raise ChildNotReady("front-end: its process exited with code 1 while starting",
                                exit_code=1, stderr_tail="")
        await self.ready.wait()

    async def stop(self, timeout_s: float) -> bool:
        self.stopping.set()
        if self.stop_gate is not None:
            await self.stop_gate.wait()
        self.exit(0)
        return True

    async def kill(self) -> int:
        self.killed = True
        self.exit(-9)
        return self._code


class FakeLauncher:
    """Stands in for the ``Child`` class: ``start`` makes a FakeChild (the process exists from
    then on) and, while ``start_gate`` is set to an unset event, waits for it before it
    returns, as a spawn that is still writing the settings; cancelled then, it kills the
    child, as ``Child.start`` does (tests/unit/test_supervisor.py)."""

    def __init__(self) -> None:
        self.children: list[FakeChild] = []
        self.start_gate: asyncio.Event | None = None
        self.ready_at_once = True
        self.failing: dict[int, asyncio.Event] = {}  # by launch number
        self._changed = asyncio.Event()

    async def start(self, name: str, python_args: Any, *, settings: object) -> FakeChild:
        number = len(self.children)
        child = FakeChild(1000 + number, ready=self.ready_at_once,
                          fails=self.failing.get(number))
        self.children.append(child)
        self._changed.set()
        if self.start_gate is not None:
            try:
                await self.start_gate.wait()
            except asyncio.CancelledError:
                await child.kill()
                raise
        return child

    async def until_started(self, count: int) -> FakeChild:
        async def wait() -> None:
            while len(self.children) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), _WAIT_S)
        return self.children[count - 1]


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> FakeLauncher:
    fake = FakeLauncher()
    monkeypatch.setattr(frontend_pool, "Child", fake)
    return fake


def _pool(count: int) -> FrontendPool:
    return FrontendPool(count=count, settings=lambda *_: cast(msg.FrontendSettings, None),
                        models=ModelTable([]), calls=ProxiedCalls(), host="127.0.0.1", port=0)


class _Restarting(logging.Handler):
    """Set when the pool logs that it restarts a front-end: its watch is then in the backoff
    (nothing is awaited between that line and the sleep)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.logged = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "restarting it" in record.getMessage():
            self.logged.set()


async def test_a_restart_due_after_the_drain_does_not_start_a_process(
        launcher: FakeLauncher) -> None:
    pool = _pool(1)
    restarting = _Restarting()
    logger = logging.getLogger(frontend_pool.__name__)
    logger.addHandler(restarting)
    try:
        await pool.start()
        first = launcher.children[0]
        first.exit(1)
        await asyncio.wait_for(restarting.logged.wait(), _WAIT_S)
        await pool.drain()
        # The watch wakes from its backoff after the drain; it must not launch a front-end
        # that would serve undrained.
        watches = [t for t in asyncio.all_tasks() if t.get_name() == "frontend:0"]
        assert len(watches) == 1
        await asyncio.wait_for(watches[0], _WAIT_S)
        assert len(launcher.children) == 1
    finally:
        logger.removeHandler(restarting)
        await pool.stop()


async def test_a_restart_under_way_when_the_pool_stops_leaves_no_process(
        launcher: FakeLauncher) -> None:
    pool = _pool(1)
    try:
        await pool.start()
        launcher.start_gate = asyncio.Event()  # the restart's spawn is under way
        launcher.children[0].exit(1)
        restarted = await launcher.until_started(2)
        stopping = asyncio.create_task(pool.stop())
        launcher.start_gate.set()  # its spawn ends before or after stop cancels it: either way
        await asyncio.wait_for(stopping, _WAIT_S)
        assert not restarted.alive
    finally:
        await pool.stop()
    assert [c.alive for c in launcher.children] == [False, False]


async def test_a_restart_waiting_for_its_hello_when_the_pool_stops_is_killed(
        launcher: FakeLauncher) -> None:
    pool = _pool(1)
    try:
        await pool.start()
        launcher.ready_at_once = False
        launcher.children[0].exit(1)
        restarted = await launcher.until_started(2)
        await asyncio.wait_for(restarted.waiting_ready.wait(), _WAIT_S)
        await asyncio.wait_for(pool.stop(), _WAIT_S)
        assert not restarted.alive
    finally:
        await pool.stop()


async def test_a_front_end_that_fails_to_start_takes_its_siblings_launches_with_it(
        launcher: FakeLauncher) -> None:
    pool = _pool(3)
    fail = asyncio.Event()
    launcher.failing[1] = fail
    launcher.ready_at_once = False  # the others are still starting when it fails
    try:
        starting = asyncio.create_task(pool.start())
        await launcher.until_started(3)
        for child in launcher.children:
            await asyncio.wait_for(child.waiting_ready.wait(), _WAIT_S)
        fail.set()
        with pytest.raises(OSError, match="while starting"):
            await asyncio.wait_for(starting, _WAIT_S)
        # No launch is left running: its process is dead, killed, not left to start alone.
        assert [c.alive for c in launcher.children] == [False, False, False]
        assert [c.killed for c in launcher.children] == [True, True, True]
    finally:
        await pool.stop()


async def test_stop_stops_the_front_ends_at_once(launcher: FakeLauncher) -> None:
    pool = _pool(3)
    await pool.start()
    # Each exits only once all have been told to: one after another, none would.
    everyone = asyncio.Event()
    for child in launcher.children:
        child.stop_gate = everyone

    async def release() -> None:
        for child in launcher.children:
            await child.stopping.wait()
        everyone.set()

    releasing = asyncio.create_task(release())
    try:
        await asyncio.wait_for(pool.stop(), _WAIT_S)
        assert [c.alive for c in launcher.children] == [False, False, False]
    finally:
        everyone.set()
        await releasing
        await pool.stop()
