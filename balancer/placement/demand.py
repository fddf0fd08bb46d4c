"""Each model's demand: the rate its samples arrive at (admitted or refused alike), over a
short sliding window (what the planner plans for: a shifted mix shows whole once the window
has passed, with nothing of the old mix left in it) and an exponentially weighted long one
(the statistics, and how busy a model has been)."""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class DemandMeter:
    """Rates from a cumulative count of arrived samples, sampled at any interval. Until a
    window has elapsed once, its rate is the mean since the first sample (an average of zeros
    before the start would understate a new model)."""

    short_window_s: float = 2.0
    long_tau_s: float = 30.0
    short_per_s: float = 0.0
    long_per_s: float = 0.0
    last_arrival_s: float = -math.inf  # when the count last moved
    _samples: collections.deque[tuple[float, int]] = field(default_factory=collections.deque)
    _since_s: float = 0.0

    def observe(self, arrived_samples: int, now_s: float) -> None:
        samples = self._samples
        if not samples:
            samples.append((now_s, arrived_samples))
            self._since_s = now_s
            return
        at_s, count = samples[-1]
        dt_s = now_s - at_s
        if dt_s <= 0.0:
            return
        if arrived_samples > count:
            self.last_arrival_s = now_s
        samples.append((now_s, arrived_samples))
        # Keep one sample at or before the window's start, so the window is always whole.
        while len(samples) > 2 and samples[1][0] <= now_s - self.short_window_s:
            samples.popleft()
        first_s, first = samples[0]
        self.short_per_s = (arrived_samples - first) / (now_s - first_s)
        rate = (arrived_samples - count) / dt_s
        elapsed_s = now_s - self._since_s
        weight = dt_s / elapsed_s if elapsed_s < self.long_tau_s else \
            1.0 - math.exp(-dt_s / self.long_tau_s)
        self.long_per_s += weight * (rate - self.long_per_s)

    def idle_for_s(self, now_s: float) -> float:
        return now_s - self.last_arrival_s
