"""The fast-timescale tuner: a model whose replicas hold too much outstanding work gets one
more, one whose replicas sit nearly idle gives one back, with hysteresis; and the budget of
moves per minute that the planner and the tuner share, so a burst does not thrash."""

from __future__ import annotations

import collections
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TunerSettings:
    """Thresholds on a model's mean outstanding work per replica in service, as fractions of
    its SLO: over ``add_above`` for ``hold_ticks`` ticks in a row asks for a replica, under
    ``drop_below`` for ``drop_hold_ticks`` in a row offers one back. After a decision the
    model is left alone for ``hold_ticks`` ticks (its new replica has to load and take work
    before the signal means anything again)."""

    add_above: float = 0.5
    drop_below: float = 0.02
    hold_ticks: int = 4
    drop_hold_ticks: int = 40


class Tuner:
    def __init__(self, settings: TunerSettings = TunerSettings()) -> None:
        self.settings = settings
        self._over: collections.Counter[str] = collections.Counter()
        self._under: collections.Counter[str] = collections.Counter()
        self._quiet: collections.Counter[str] = collections.Counter()

    def observe(self, model: str, mean_work_s: float, slo_s: float) -> str | None:
        """One tick's signal for ``model``: "add", "drop" or None. A signal stands (comes
        again each tick its load stays) until ``settle``: the caller decides on one model a
        tick, and another's signal must wait for its turn, not be lost."""
        settings = self.settings
        if self._quiet[model] > 0:
            self._quiet[model] -= 1
            return None
        over = mean_work_s > settings.add_above * slo_s
        under = mean_work_s < settings.drop_below * slo_s
        self._over[model] = self._over[model] + 1 if over else 0
        self._under[model] = self._under[model] + 1 if under else 0
        if self._over[model] >= settings.hold_ticks:
            return "add"
        if self._under[model] >= settings.drop_hold_ticks:
            return "drop"
        return None

    def reset(self, model: str | None = None) -> None:
        """A tick on which ``model`` (every model, if None) was not observed: its runs of ticks
        over or under a threshold end, as the ticks around the gap are not in a row."""
        for counts in (self._over, self._under):
            if model is None:
                counts.clear()
            else:
                counts.pop(model, None)

    def settle(self, model: str) -> None:
        """A decision on ``model``'s signal was made (moves, or none): it is left alone for
        ``hold_ticks`` ticks, then counts afresh."""
        self._over[model] = self._under[model] = 0
        self._quiet[model] = self.settings.hold_ticks


class MoveBudget:
    """At most ``per_minute`` moves in any 60 s."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._times_s: collections.deque[float] = collections.deque()

    def left(self, now_s: float) -> int:
        while self._times_s and self._times_s[0] <= now_s - 60.0:
            self._times_s.popleft()
        return max(0, self.per_minute - len(self._times_s))

    def spend(self, now_s: float, count: int = 1) -> None:
        self._times_s.extend([now_s] * count)
