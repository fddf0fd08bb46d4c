"""Each model's demand: the rate its samples arrive at (admitted or refused alike), over a
short window (what the planner plans for: a shift shows within seconds) and a long one (what
says a model has gone idle, and the statistics)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class DemandMeter:
    """Exponentially weighted arrival rates from a cumulative count of arrived samples,
    sampled at any interval. Until a window has elapsed once, its rate is the plain mean since
    the first sample (an average of zeros before the start would understate a new model)."""

    short_tau_s: float = 2.0
    long_tau_s: float = 30.0
    short_per_s: float = 0.0
    long_per_s: float = 0.0
    last_arrival_s: float = -math.inf  # when the count last moved
    _count: int | None = None
    _since_s: float = 0.0
    _at_s: float = 0.0

    def observe(self, arrived_samples: int, now_s: float) -> None:
        if self._count is None:
            self._count, self._since_s, self._at_s = arrived_samples, now_s, now_s
            return
        dt_s = now_s - self._at_s
        if dt_s <= 0.0:
            return
        added = arrived_samples - self._count
        if added > 0:
            self.last_arrival_s = now_s
        rate = added / dt_s
        elapsed_s = now_s - self._since_s
        self.short_per_s = self._blend(self.short_per_s, rate, dt_s, self.short_tau_s,
                                       elapsed_s)
        self.long_per_s = self._blend(self.long_per_s, rate, dt_s, self.long_tau_s, elapsed_s)
        self._count, self._at_s = arrived_samples, now_s

    @staticmethod
    def _blend(previous: float, rate: float, dt_s: float, tau_s: float,
               elapsed_s: float) -> float:
        weight = dt_s / elapsed_s if elapsed_s < tau_s else 1.0 - math.exp(-dt_s / tau_s)
        return previous + weight * (rate - previous)

    def idle_for_s(self, now_s: float) -> float:
        return now_s - self.last_arrival_s
