"""What a placement strategy sees at one tick, and what it may ask for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile, Placement
from evenflow.balancer.placement.moves import Move


@dataclass(frozen=True, slots=True)
class PlacerView:
    """``placement``: every replica that holds memory (loading, serving or draining);
    ``serving``: those in routing. Demand in samples/s. ``mean_work_s``: a model's mean
    outstanding work per replica in routing. ``samples_per_request``: each model's mean request
    (1 where not given). ``moves_left``: the budget's remaining moves;
    ``moves_in_flight``: moves started and not finished."""

    now_s: float
    devices: Sequence[DeviceInfo]
    profiles: Mapping[str, ModelProfile]
    placement: Placement
    serving: Placement
    demand_per_s: Mapping[str, float]
    long_demand_per_s: Mapping[str, float]
    mean_work_s: Mapping[str, float]
    moves_left: int
    moves_in_flight: int = 0
    samples_per_request: Mapping[str, float] = field(default_factory=dict)


class Strategy(Protocol):
    """Decides moves; the ``Placer`` carries them out (loads first, drains after) within the
    move budget, so a strategy may propose freely."""

    def moves(self, view: PlacerView) -> Sequence[tuple[Move, str]]:
        """The moves to make now, in order, each with its reason (for the log and metrics)."""
        ...


class Static:
    """The placement never changes (a model still gets a replica on demand when it has none,
    which the ``Placer`` does whatever the strategy)."""

    def moves(self, view: PlacerView) -> Sequence[tuple[Move, str]]:
        return ()
