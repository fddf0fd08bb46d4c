"""Live progress in the terminal (rich): current rate, p99 of the last second, errors.

Generator processes publish into shared counters; the parent draws them. Off when the output is
not a terminal (CI, tests, pipes).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from evenflow.loadtest.percentiles import ordered_percentile
from evenflow.loadtest.runner import OK, RequestRecord


class Progress:
    """Shared counters, picklable into spawned generator processes."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._done = context.Value("q", 0)
        self._errors = context.Value("q", 0)
        self._p99_ms = context.Value("d", 0.0)

    async def report_from(self, records: Callable[[], Sequence[RequestRecord]]) -> None:
        """In a generator: publish what its record list holds, twice a second."""
        seen = 0
        while True:
            await asyncio.sleep(0.5)
            current = records()
            fresh = current[seen:]
            seen = len(current)
            errors = sum(1 for r in fresh if r.status != OK)
            latencies = sorted(r.latency_s for r in fresh if r.status == OK)
            with self._done.get_lock():
                self._done.value += len(fresh) - errors
            with self._errors.get_lock():
                self._errors.value += errors
            if latencies:
                self._p99_ms.value = ordered_percentile(latencies, 0.99) * 1000

    def snapshot(self) -> tuple[int, int, float]:
        return int(self._done.value), int(self._errors.value), float(self._p99_ms.value)

    def reset(self) -> None:
        self._done.value = 0
        self._errors.value = 0
        self._p99_ms.value = 0.0


class LiveView:
    """Draws a Progress while a point runs."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = self.console.is_terminal

    async def watch(self, progress: Progress, label: str, duration_s: float) -> None:
        if not self.enabled:
            return
        start_s = time.monotonic()
        last_done, last_s = 0, start_s
        with Live(console=self.console, refresh_per_second=4, transient=True) as live:
            while True:
                await asyncio.sleep(0.5)
                done, errors, p99_ms = progress.snapshot()
                now_s = time.monotonic()
                rate = (done - last_done) / max(1e-9, now_s - last_s)
                last_done, last_s = done, now_s
                live.update(_table(label, now_s - start_s, duration_s, rate, p99_ms, done, errors))


def _table(label: str, elapsed_s: float, duration_s: float, rate: float, p99_ms: float,
           done: int, errors: int) -> Any:
    table = Table(show_header=True, header_style="bold")
    for column in ("point", "elapsed", "rate/s", "p99 ms", "done", "errors"):
        table.add_column(column)
    table.add_row(label, f"{elapsed_s:.1f}/{duration_s:.0f} s", f"{rate:.0f}", f"{p99_ms:.1f}",
                  str(done), str(errors))
    return table
