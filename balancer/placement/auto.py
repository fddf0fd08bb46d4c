"""``--placement auto``: the planner on a slow timescale (and at once on a big change in the
demand mix), the tuner on a fast one."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from evenflow.balancer.placement.assessment import serving_replicas
from evenflow.balancer.placement.change import ChangeTest
from evenflow.balancer.placement.inventory import devices_of
from evenflow.balancer.placement.moves import Move, floor_replicas
from evenflow.balancer.placement.overflow import (
    overflow_changes,
    overflow_replicas,
    with_overflow,
)
from evenflow.balancer.placement.planner import Plan, PlannerSettings, propose
from evenflow.balancer.placement.regime import RegimeDemand
from evenflow.balancer.placement.tuner import Tuner, TunerSettings
from evenflow.balancer.placement.view import PlacerView

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class AutoSettings:
    """``plan_interval_s``: how often the planner runs while nothing is moving. ``change``: what
    counts as a big change in the demand (``change.ChangeTest``), which plans once it has held
    for ``settle_s`` (the demand meter's short window: by then the window holds only the new
    mix). ``periodic_min_gain``: the gain a periodic plan's moves must bring
    (the demand has not changed much, so a move then is mostly estimation noise, and each costs
    its model a replica's capacity for a load time; it plans for the mean demand since the last
    big change, ``regime.RegimeDemand``). ``confirm_s``: a periodic plan moves only if it finds
    such a gain again this long after it first did, with new measurements of the costs and the
    demand, so one estimate's noise moves nothing. ``tuner_pause_s``: after a plan's moves,
    how long the tuner waits before its signal means anything again."""

    plan_interval_s: float = 10.0
    periodic_min_gain: float = 0.2
    confirm_s: float = 2.0
    cost_factor: float = 1.5
    change: ChangeTest = field(default_factory=ChangeTest)
    settle_s: float = 2.0
    tuner_pause_s: float = 5.0
    planner: PlannerSettings = field(default_factory=PlannerSettings)
    tuner: TunerSettings = field(default_factory=TunerSettings)


class AutoStrategy:
    def __init__(self, settings: AutoSettings = AutoSettings()) -> None:
        self.settings = settings
        self._tuner = Tuner(settings.tuner)
        self._planned_at_s = -math.inf
        self._regime = RegimeDemand()  # the demand since the last big change
        self._changed_at_s: float | None = None  # when a big change was first seen
        self._moved_at_s = -math.inf  # when moves were last in flight
        self._gain_seen_at_s: float | None = None  # a periodic plan's gain, to be confirmed
        self._planned_costs_s: dict[tuple[str, str], float] = {}  # one sample, at the last plan

    def moves(self, view: PlacerView) -> Sequence[tuple[Move, str]]:
        planned = self._planned(view)
        if planned is not None:
            # The tuner sits this tick out: "ticks in a row" must not span it.
            self._tuner.reset()
            return planned
        return self._tune(view) or self._follow_overflow(view)

    def _planned(self, view: PlacerView) -> Sequence[tuple[Move, str]] | None:
        """This tick's moves when the tuner sits it out, else None: a plan's moves, or none
        while the placement is not steady (no budget, moves in flight or just ended, a change
        in the demand settling or planned for, costs that moved). A periodic plan that moves
        nothing leaves the tick to the tuner: nothing changed that its runs of ticks
        measure."""
        now_s = view.now_s
        if view.moves_in_flight:
            self._moved_at_s = now_s
        if view.moves_left <= 0:
            return ()
        if self.settings.change.is_big(view.demand_per_s, self._regime.mean_per_s(),
                                       view.samples_per_request):
            if self._changed_at_s is None:
                self._changed_at_s = now_s
            if now_s - self._changed_at_s >= self.settings.settle_s:
                self._regime.restart(view.demand_per_s)
                return self._made(view, self._propose(view, self.settings.planner.min_gain,
                                                      view.demand_per_s), "change",
                                  view.demand_per_s)
            return ()  # the window still holds some of the old mix
        self._changed_at_s = None
        self._regime.add(view.demand_per_s)
        if view.moves_in_flight:
            return ()
        if self._costs_moved(view):
            demand_per_s = self._regime.mean_per_s()
            return self._made(view, self._propose(view, self.settings.periodic_min_gain,
                                                  demand_per_s), "costs", demand_per_s)
        if now_s - self._planned_at_s >= self.settings.plan_interval_s:
            periodic = self._plan_periodic(view)
            if periodic:
                return periodic
        if now_s - self._moved_at_s >= self.settings.tuner_pause_s:
            return None
        return ()

    def _costs_moved(self, view: PlacerView) -> bool:
        """Whether a replica in routing costs ``cost_factor`` more or less than when the last
        plan was made."""
        for name, device in view.serving:
            planned_s = self._planned_costs_s.get((name, device))
            now_s = _one_sample_s(view, name, device)
            if planned_s is not None and min(planned_s, now_s) > 0.0 and \
                    max(planned_s, now_s) >= self.settings.cost_factor * min(planned_s, now_s):
                return True
        return False

    def _plan_periodic(self, view: PlacerView) -> Sequence[tuple[Move, str]]:
        seen_at_s = self._gain_seen_at_s
        if seen_at_s is not None and view.now_s - seen_at_s < self.settings.confirm_s:
            return ()  # until new windows and fits have come in
        demand_per_s = self._regime.mean_per_s()
        plan = self._propose(view, self.settings.periodic_min_gain, demand_per_s)
        if plan.moves and seen_at_s is None:
            self._gain_seen_at_s = view.now_s
            return ()
        return self._made(view, plan, "periodic", demand_per_s)

    def _propose(self, view: PlacerView, min_gain: float,
                 demand_per_s: Mapping[str, float]) -> Plan:
        settings = replace(self.settings.planner, min_gain=min_gain,
                           max_moves=min(self.settings.planner.max_moves, view.moves_left))
        return with_overflow(propose(view.placement, view.devices, view.profiles,
                                     demand_per_s, settings),
                             view.devices, view.profiles, demand_per_s)

    def _made(self, view: PlacerView, plan: Plan, cause: str,
              demand_per_s: Mapping[str, float]) -> Sequence[tuple[Move, str]]:
        """Record that a plan was made, and return its moves."""
        self._planned_at_s = view.now_s
        self._changed_at_s = self._gain_seen_at_s = None
        self._planned_costs_s = {(name, device): _one_sample_s(view, name, device)
                                 for name, device in view.placement}
        if plan.moves:
            # Why replicas move: what the plan expects to gain, for which demand and costs.
            logger.info("placement plan (%s): headroom %.2f -> %.2f for %s samples/s; costs "
                        "at one sample %s ms", cause, plan.before.headroom,
                        plan.after.headroom, _rounded(demand_per_s),
                        _rounded({f"{name}@{device}": 1e3 * cost.batch_s(1)
                                  for name, profile in sorted(view.profiles.items())
                                  for device, cost in sorted(profile.costs.items())}))
        return [(move, "plan") for move in plan.moves]

    def _tune(self, view: PlacerView) -> Sequence[tuple[Move, str]]:
        """The tuner's moves for the first model (by name) whose signal brings some. Every
        model is observed every tick the tuner runs, whether or not one before it moves, so
        its runs of ticks have no gaps; a model with no measure of its work this tick (no
        replica in routing, or only cold ones) has its runs broken. A signal decided on, with
        moves or without, is settled; one whose turn did not come stands while the tuner
        runs."""
        signals: dict[str, str] = {}
        for name in sorted(view.profiles):
            work_s = view.mean_work_s.get(name)
            if work_s is None:
                self._tuner.reset(name)
            elif signal := self._tuner.observe(name, work_s, view.profiles[name].slo_s):
                signals[name] = signal
        for name, signal in signals.items():
            self._tuner.settle(name)
            moves = self._more(view, name) if signal == "add" else self._fewer(view, name)
            if moves:
                return [(move, "tuner") for move in moves]
        return ()

    def _more(self, view: PlacerView, name: str) -> Sequence[Move]:
        """One more replica of ``name``, after the drops that make room for it, if one helps.
        Planned as if its demand were twice what was measured: the planner then finds where
        one more replica helps most (swapping out an idle one if memory is short), or says
        that none does."""
        boosted = {**view.demand_per_s, name: 2.0 * max(view.demand_per_s.get(name, 0.0), 1.0)}
        plan = propose(view.placement, view.devices, view.profiles, boosted,
                       replace(self.settings.planner, max_moves=min(2, view.moves_left)))
        adds = [m for m in plan.moves if m.kind == "add" and m.model == name]
        if not adds:
            return ()
        moves = plan.moves[:plan.moves.index(adds[0]) + 1]
        return () if _takes_busy_room(view, moves) else moves

    @staticmethod
    def _fewer(view: PlacerView, name: str) -> Sequence[Move]:
        """The drop of ``name``'s slowest replica, if it may give one back. A pinned replica
        stays whatever the load: the operator asked for it there."""
        profile = view.profiles[name]
        placed = [d for d in devices_of(view.serving, name) if d not in profile.pinned]
        floor = floor_replicas(profile, view.long_demand_per_s.get(name, 0.0))
        if len(devices_of(view.placement, name)) <= max(floor, 1) or not placed:
            return ()
        slowest = max(placed, key=lambda d: profile.costs[d].batch_s(1))
        without = view.placement - {(name, slowest)}
        if (name, slowest) in overflow_replicas(without, view.devices, view.profiles,
                                                view.demand_per_s):
            return ()  # the next plan would load it again
        return (Move("drop", name, slowest),)

    @staticmethod
    def _follow_overflow(view: PlacerView) -> Sequence[tuple[Move, str]]:
        """Between plans, the overflow replicas follow the neediest model (a plan is made only
        for a big change or a 20 % gain; the need can move without either)."""
        drops, adds = overflow_changes(view.placement, view.devices, view.profiles,
                                       view.demand_per_s)
        return [(Move("drop", n, d), "overflow") for n, d in drops] + [
            (Move("add", n, d), "overflow") for n, d in adds]


def _takes_busy_room(view: PlacerView, moves: Sequence[Move]) -> bool:
    """Whether ``moves`` (a tuner's add, after the drops that make room for it) drop a replica
    that serves demand. The tuner plans as if its model's demand were doubled, which may take
    a replica from a model that is busy for real; a long queue behind one model is no reason
    to shorten another's. Room made of free memory, or of replicas that serve no demand (an
    idle model's, or one too slow to answer within its model's SLO), costs nothing.

    A replica's share in the best sharing (``assess``) does not tell: where another model
    bounds the headroom, the program is indifferent to how a model with capacity to spare
    spreads over its replicas and may give one of them no time, while routing still sends it
    that model's work."""
    drops = [(move.model, move.device) for move in moves if move.kind == "drop"]
    if not drops:
        return False
    serving = serving_replicas(view.placement, view.profiles, view.demand_per_s)
    return any(pair in serving for pair in drops)


def _one_sample_s(view: PlacerView, name: str, device: str) -> float:
    return view.profiles[name].costs[device].batch_s(1)


def _rounded(values: Mapping[str, float]) -> str:
    return ", ".join(f"{key}={value:.3g}" for key, value in sorted(values.items()))
