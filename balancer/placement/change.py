"""Whether the demand has changed enough to plan for at once: a model's share of the total, a
model's rate or the total has moved by a set amount *and* by more than counting noise explains.
A model's own rate counts because a placement's headroom hangs on its tightest model: one of
seven models arriving, or going idle, moves no share by much and every plan.

The demand the planner sees is a count of samples over a short window. At a few hundred samples
a second a 2 s window holds several hundred samples, and two such windows now and then differ
by 15-20 % in total with nothing changed; a plan for such a blip reshuffles replicas, each move
costing its model a replica's capacity for a load time. So each criterion is also a test: the
difference must be ``min_z`` standard deviations of the difference two windows of Poisson
arrivals at those rates would show. A real shift of the mix is far past it (a share moving 0.4
at 180 requests/s is about 10 standard deviations), a blip is not. What arrives at random is
requests, so the counts are of requests: a window of 8-sample requests holds an eighth of the
independent arrivals its sample count suggests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ChangeTest:
    """``share``: how far (absolute) a model's share of the total must move; ``rate_factor``:
    by what factor a model's rate, or the total, must move (from or to 0 is past any factor);
    ``min_z``: how many standard deviations of counting noise either must also be;
    ``window_s``: the length of the window the rates were counted over (so a rate gives a
    count)."""

    share: float = 0.15
    rate_factor: float = 1.15
    min_z: float = 4.0
    window_s: float = 2.0

    def is_big(self, now_per_s: Mapping[str, float], before_per_s: Mapping[str, float],
               samples_per_request: Mapping[str, float] | None = None) -> bool:
        """Whether demand ``now_per_s`` differs enough from ``before_per_s`` (samples/s per
        model). ``samples_per_request``: each model's mean request now (1 where missing), which
        turns both windows' sample rates into request counts."""
        total_now = sum(now_per_s.values())
        total_before = sum(before_per_s.values())
        if (total_now > 0.0) != (total_before > 0.0):
            return True  # from idle to busy or back
        if total_now <= 0.0:
            return False
        per_request = samples_per_request or {}

        def requests(rates: Mapping[str, float]) -> float:
            return self.window_s * sum(rate / max(per_request.get(name, 1.0), 1.0)
                                       for name, rate in rates.items())

        def moved(rate_now: float, rate_before: float, n_now: float, n_before: float) -> bool:
            return (max(rate_now, rate_before) > self.rate_factor * min(rate_now, rate_before)
                    and _counts_z(n_now, n_before) >= self.min_z)

        n_now, n_before = requests(now_per_s), requests(before_per_s)
        if moved(total_now, total_before, n_now, n_before):
            return True
        for name in sorted(set(now_per_s) | set(before_per_s)):
            rate_now, rate_before = now_per_s.get(name, 0.0), before_per_s.get(name, 0.0)
            if moved(rate_now, rate_before, requests({name: rate_now}),
                     requests({name: rate_before})):
                return True
            share_now, share_before = rate_now / total_now, rate_before / total_before
            if (abs(share_now - share_before) > self.share
                    and _shares_z(share_now, n_now, share_before, n_before) >= self.min_z):
                return True
        return False


def _counts_z(n_a: float, n_b: float) -> float:
    """How many standard deviations apart two Poisson counts are."""
    return abs(n_a - n_b) / math.sqrt(n_a + n_b) if n_a + n_b > 0.0 else 0.0


def _shares_z(p_a: float, n_a: float, p_b: float, n_b: float) -> float:
    """How many standard deviations apart two shares are, from ``n_a`` and ``n_b`` samples
    (the two-proportion test, the shares pooled for the variance)."""
    if n_a <= 0.0 or n_b <= 0.0:
        return 0.0
    pooled = (p_a * n_a + p_b * n_b) / (n_a + n_b)
    variance = pooled * (1.0 - pooled) * (1.0 / n_a + 1.0 / n_b)
    return abs(p_a - p_b) / math.sqrt(variance) if variance > 0.0 else 0.0
