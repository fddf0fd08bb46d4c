"""Fakes for driving the real balancer in unit tests: a time source whose timers fire only when
the test moves its clock, a ``settle`` that lets already-runnable callbacks run, and a factory
of balancers that tears them down with their invariants checked.

With ``FakeTime`` a test uses the server's real wait values (a 2 ms ``max_wait_s``, a 30 s
watchdog) and still decides exactly when each wait ends: nothing waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

from evenflow.balancer import BalancerConfig, ModelBalancer, Worker
from evenflow.balancer.ledger import DeviceLedger
from tests.fakes import FakeWorker


class _Timer:
    __slots__ = ("args", "callback", "cancelled")

    def __init__(self, callback: Callable[..., object], args: tuple[Any, ...]) -> None:
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeTime:
    """A ``TimeSource`` the test moves by hand: ``advance`` runs each timer that comes due, in
    due order and with the clock at its due time, as an event loop would."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now_s = start_s
        self._timers: list[tuple[float, int, _Timer]] = []
        self._order = itertools.count()

    def __call__(self) -> float:
        return self.now_s

    @property
    def clock(self) -> Callable[[], float]:
        return self

    def call_later(self, delay_s: float, callback: Callable[..., object],
                   *args: Any) -> _Timer:
        timer = _Timer(callback, args)
        heapq.heappush(self._timers, (self.now_s + max(0.0, delay_s), next(self._order), timer))
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock on by ``seconds``, firing what comes due meanwhile (timers a callback
        sets within the step fire in it too)."""
        until_s = self.now_s + seconds
        while self._timers and self._timers[0][0] <= until_s:
            due_s, _, timer = heapq.heappop(self._timers)
            self.now_s = max(self.now_s, due_s)
            if not timer.cancelled:
                timer.callback(*timer.args)
        self.now_s = until_s

    @property
    def num_pending(self) -> int:
        """Timers set and neither fired nor cancelled."""
        return sum(1 for _, _, timer in self._timers if not timer.cancelled)


def seed_fit(balancer: ModelBalancer, index: int, base_s: float, per_sample_s: float) -> None:
    """Teach replica ``index`` a reliable fit ``base_s + per_sample_s * b`` (white-box: what a
    few dozen measured batches of several sizes would teach it)."""
    estimator = balancer.replicas[index]._estimator
    for size in (1, 2, 4, 8, 16, 3, 6, 12, 24):
        estimator.observe(size, base_s + per_sample_s * size)


async def settle(rounds: int = 20) -> None:
    """Let callbacks that are runnable now run (no time passes)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def answered(time: FakeTime, *futures: asyncio.Future[Any], step_s: float = 0.001,
                  limit_s: float = 60.0) -> list[Any]:
    """The futures' results (or their exception, raised), moving ``time`` on in ``step_s``
    steps while any is pending: batches that wait for mates, restarts that back off. Fails
    when they are not all done within ``limit_s`` of fake time."""
    waited_s = 0.0
    while True:
        await settle()
        if all(future.done() for future in futures):
            return [future.result() for future in futures]
        assert waited_s < limit_s, f"not answered within {limit_s} s of fake time"
        time.advance(step_s)
        waited_s += step_s


def release_all(balancer: ModelBalancer) -> None:
    """Open every gate a gated ``FakeWorker`` of ``balancer`` holds."""
    for replica in balancer.replicas:
        worker = replica.worker
        while isinstance(worker, FakeWorker) and worker.num_waiting:
            worker.release()


class BalancerFactory:
    """Builds started balancers on one ``FakeTime`` (the config's defaults unless overridden)
    and closes them all in ``close``, asserting that no replica loop survives."""

    def __init__(self, time: FakeTime) -> None:
        self.time = time
        self._made: list[ModelBalancer] = []

    def __call__(self, workers: Sequence[Worker], *, model_name: str = "m",
                 ledger: DeviceLedger | None = None, **overrides: Any) -> ModelBalancer:
        balancer = ModelBalancer(model_name=model_name, workers=workers,
                                 config=BalancerConfig(**overrides), clock=self.time,
                                 rng=random.Random(0), ledger=ledger)
        balancer.start()
        self._made.append(balancer)
        return balancer

    async def close(self) -> None:
        made, self._made = self._made, []
        for balancer in made:
            release_all(balancer)
            await balancer.close()
            # Teardown invariant: no replica loop survives close, and the workers are closed.
            assert all(r._task is None for r in balancer.replicas)
            assert all(r.worker.closed for r in balancer.replicas  # type: ignore[attr-defined]
                       if isinstance(r.worker, FakeWorker))
