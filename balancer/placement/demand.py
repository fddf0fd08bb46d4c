"""Each model's demand: the rate its samples and requests arrive at (admitted or refused alike),
over a short sliding window (what the planner plans for: a shifted mix shows whole once the
window has passed, with nothing of the old mix left in it) and an exponentially weighted long
one (the statistics, and how busy a model has been).

Capacity is planned in samples; requests are what arrive at random, so how far two windows may
differ by chance is counted in requests (``change.ChangeTest``)."""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field


@dataclass(slots=True)
class DemandMeter:
    """Rates from cumulative counts of arrived samples and requests, sampled at any interval.
    Until a window has elapsed once, its rate is the mean since the first sample (an average
    of zeros before the start would understate a new model)."""

    short_window_s: float = 2.0
    long_tau_s: float = 30.0
    short_per_s: float = 0.0  # samples
    long_per_s: float = 0.0  # samples
    short_requests_per_s: float = 0.0
    long_requests_per_s: float = 0.0
    last_arrival_s: float = -math.inf  # when the count last moved
    # (when, arrived samples, arrived requests)
    _counts: collections.deque[tuple[float, int, int]] = field(
        default_factory=collections.deque)
    _since_s: float = 0.0

    def observe(self, arrived_samples: int, arrived_requests: int, now_s: float) -> None:
        counts = self._counts
        if not counts:
            counts.append((now_s, arrived_samples, arrived_requests))
            self._since_s = now_s
            return
        at_s, samples, requests = counts[-1]
        dt_s = now_s - at_s
        if dt_s <= 0.0:
            return
        if arrived_samples > samples:
            self.last_arrival_s = now_s
        counts.append((now_s, arrived_samples, arrived_requests))
        # Keep one count at or before the window's start, so the window is always whole.
        while len(counts) > 2 and counts[1][0] <= now_s - self.short_window_s:
            counts.popleft()
        first_s, first_samples, first_requests = counts[0]
        self.short_per_s = (arrived_samples - first_samples) / (now_s - first_s)
        self.short_requests_per_s = (arrived_requests - first_requests) / (now_s - first_s)
        elapsed_s = now_s - self._since_s
        weight = dt_s / elapsed_s if elapsed_s < self.long_tau_s else \
            1.0 - math.exp(-dt_s / self.long_tau_s)
        self.long_per_s += weight * ((arrived_samples - samples) / dt_s - self.long_per_s)
        self.long_requests_per_s += weight * (
            (arrived_requests - requests) / dt_s - self.long_requests_per_s)

    @property
    def samples_per_request(self) -> float:
        """The mean request's samples: the short window's, else the long one's, else 1."""
        for samples, requests in ((self.short_per_s, self.short_requests_per_s),
                                  (self.long_per_s, self.long_requests_per_s)):
            if requests > 0.0:
                return max(samples / requests, 1.0)
        return 1.0

    def idle_for_s(self, now_s: float) -> float:
        return now_s - self.last_arrival_s
