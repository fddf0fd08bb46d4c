"""SLO goodput: the highest offered rate at which the p99 of successful requests stays within a
latency SLO and errors stay below a threshold (the headline figure of Clipper, Nexus, Clockwork,
Shepherd, AlpaServe).

The search only needs ``measure(rate_per_s, seed) -> Probe``: one open-loop run at that rate.
It brackets the boundary by doubling or halving, then bisects. In the bisection each rate is
judged by the majority of ``repeats`` runs with different seeds (it stops as soon as the
majority is settled), because near the boundary one run passes or fails by chance. The result
is the highest rate judged passing; its range runs from the highest rate at or below it where
every run passed to the lowest rate above it where every run failed.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Probe:
    """One open-loop run at ``rate_per_s``."""

    rate_per_s: float
    seed: int
    p50_s: float  # of successful requests; nan when none succeeded
    p99_s: float
    error_fraction: float  # of requests sent: refused, failed or timed out
    throughput_per_s: float  # successful answers per second

    def passes(self, slo_s: float, max_error_fraction: float) -> bool:
        return (not math.isnan(self.p99_s) and self.p99_s <= slo_s
                and self.error_fraction <= max_error_fraction)


Measure = Callable[[float, int], Awaitable[Probe]]


@dataclass(frozen=True, slots=True)
class SearchSettings:
    slo_s: float
    start_per_s: float  # first rate tried; a guess near the answer saves probes
    max_error_fraction: float = 0.01
    tolerance: float = 0.03  # stop when the bracket is this narrow, relative to its low end
    repeats: int = 3  # runs per rate in the bisection (majority decides)
    min_per_s: float = 1.0  # below this the goodput is reported as 0
    max_probes: int = 60

    def __post_init__(self) -> None:
        if self.slo_s <= 0 or self.start_per_s <= 0:
            raise ValueError("the SLO and the start rate must be > 0")
        if self.repeats < 1 or self.tolerance <= 0:
            raise ValueError("repeats must be >= 1 and tolerance > 0")


@dataclass(slots=True)
class SloGoodput:
    """The search's answer and every run it made."""

    slo_s: float
    max_error_fraction: float
    goodput_per_s: float
    low_per_s: float  # the confidence range (see the module docstring)
    high_per_s: float
    probes: list[Probe] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"slo_ms": self.slo_s * 1e3, "max_error_fraction": self.max_error_fraction,
                "goodput_per_s": self.goodput_per_s, "low_per_s": self.low_per_s,
                "high_per_s": self.high_per_s,
                "probes": [{"rate_per_s": p.rate_per_s, "seed": p.seed, "p50_ms": p.p50_s * 1e3,
                            "p99_ms": p.p99_s * 1e3, "error_fraction": p.error_fraction,
                            "throughput_per_s": p.throughput_per_s} for p in self.probes]}


class _Judge:
    def __init__(self, measure: Measure, settings: SearchSettings, first_seed: int) -> None:
        self._measure = measure
        self._settings = settings
        self._seed = first_seed
        self.probes: list[Probe] = []

    async def once(self, rate_per_s: float) -> bool:
        probe = await self._measure(rate_per_s, self._seed)
        self._seed += 1
        self.probes.append(probe)
        settings = self._settings
        return probe.passes(settings.slo_s, settings.max_error_fraction)

    async def majority(self, rate_per_s: float) -> bool:
        needed = self._settings.repeats // 2 + 1
        passed = failed = 0
        while passed < needed and failed < needed:
            if await self.once(rate_per_s):
                passed += 1
            else:
                failed += 1
        return passed >= needed

    @property
    def exhausted(self) -> bool:
        return len(self.probes) >= self._settings.max_probes


async def search_goodput(measure: Measure, settings: SearchSettings,
                         first_seed: int = 0) -> SloGoodput:
    """Find the SLO goodput by bracketing then bisection (see the module docstring)."""
    judge = _Judge(measure, settings, first_seed)
    low, high = 0.0, math.inf
    rate = settings.start_per_s
    while not judge.exhausted:  # bracket: one run per rate, the boundary is a factor 2 away
        if await judge.once(rate):
            low = rate
            if math.isfinite(high):
                break
            rate *= 2.0
        else:
            high = rate
            if low > 0.0:
                break
            rate /= 2.0
            if rate < settings.min_per_s:
                break
    while low > 0.0 and math.isfinite(high) and high - low > settings.tolerance * low \
            and not judge.exhausted:
        middle = (low + high) / 2.0
        if await judge.majority(middle):
            low = middle
        else:
            high = middle
    return SloGoodput(settings.slo_s, settings.max_error_fraction, low,
                      *_confidence_range(judge.probes, low, high, settings), probes=judge.probes)


def _confidence_range(probes: list[Probe], low: float, high: float,
                      settings: SearchSettings) -> tuple[float, float]:
    by_rate: dict[float, list[bool]] = {}
    for probe in probes:
        by_rate.setdefault(probe.rate_per_s, []).append(
            probe.passes(settings.slo_s, settings.max_error_fraction))
    all_passed = [r for r, verdicts in by_rate.items() if r <= low and all(verdicts)]
    all_failed = [r for r, verdicts in by_rate.items() if r >= high and not any(verdicts)]
    return max(all_passed, default=0.0), min(all_failed, default=high)
