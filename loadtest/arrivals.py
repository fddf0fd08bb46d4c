"""Open-loop arrival schedules: when each request is meant to be sent, seeded and repeatable.

``poisson``: exponential gaps (coefficient of variation 1). ``constant``: equal gaps (CV 0).
``gamma:CV``: gamma-distributed gaps with the given coefficient of variation; CV > 1 is burstier
than Poisson, CV < 1 smoother. The mean rate is the same for all of them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Arrival:
    kind: str  # "poisson", "constant" or "gamma"
    cv: float = 1.0

    @classmethod
    def parse(cls, text: str) -> Arrival:
        kind, _, arg = text.partition(":")
        if kind == "poisson" and not arg:
            return cls("poisson", 1.0)
        if kind == "constant" and not arg:
            return cls("constant", 0.0)
        if kind == "gamma":
            cv = float(arg)
            if cv <= 0:
                raise ValueError("gamma:CV needs CV > 0")
            return cls("gamma", cv)
        raise ValueError(f"unknown arrival {text!r}: poisson, constant or gamma:CV")

    def gaps_s(self, rate_per_s: float, count: int, rng: random.Random) -> list[float]:
        if rate_per_s <= 0:
            raise ValueError("rate must be > 0")
        mean_s = 1.0 / rate_per_s
        if self.kind == "constant":
            return [mean_s] * count
        if self.kind == "poisson":
            return [rng.expovariate(rate_per_s) for _ in range(count)]
        shape = 1.0 / (self.cv * self.cv)  # gamma: CV = 1/sqrt(shape); mean = shape * scale
        return [rng.gammavariate(shape, mean_s / shape) for _ in range(count)]


def send_times_s(arrival: Arrival, rate_per_s: float, duration_s: float,
                 seed: int) -> list[float]:
    """Offsets from the start, in seconds, of every request in ``[0, duration_s)``."""
    rng = random.Random(seed)
    times: list[float] = []
    now_s = 0.0
    chunk = max(16, int(rate_per_s * duration_s * 1.2) + 16)
    while True:
        for gap in arrival.gaps_s(rate_per_s, chunk, rng):
            now_s += gap
            if now_s >= duration_s:
                return times
            times.append(now_s)
