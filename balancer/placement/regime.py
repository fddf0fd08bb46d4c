"""The demand since the mix last changed: the mean of the short window's rates over every tick
since. A 2 s window at a hundred samples a second wanders by 7 % (one standard deviation), and
a placement's headroom hangs on its tightest model, so a steady mix planned for from one window
looks 20 % better placed otherwise now and then; the mean over the regime's ticks narrows as
the regime lasts (after 20 s, about a third of a window's spread)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class RegimeDemand:
    _sums_per_s: dict[str, float] = field(default_factory=dict)
    _ticks: int = 0

    def restart(self, demand_per_s: Mapping[str, float]) -> None:
        """A new regime, whose first window is ``demand_per_s``."""
        self._sums_per_s, self._ticks = {}, 0
        self.add(demand_per_s)

    def add(self, demand_per_s: Mapping[str, float]) -> None:
        for name, rate in demand_per_s.items():
            self._sums_per_s[name] = self._sums_per_s.get(name, 0.0) + rate
        self._ticks += 1

    def mean_per_s(self) -> dict[str, float]:
        if not self._ticks:
            return {}
        return {name: total / self._ticks for name, total in self._sums_per_s.items()}
