"""The reference a placement strategy is measured against: for each phase of a scenario, the
best placement for that phase's demand mix (by enumeration, ``planner.best_placement``), from
the same capacity arithmetic the planner uses. The scenario's bound is the highest total rate
every phase's best placement serves within the SLO; the static baseline keeps the first
phase's best placement throughout."""

from __future__ import annotations

import functools

from benchmarks.placement_sim import Scenario
from evenflow.balancer.placement.enumeration import best_placement
from evenflow.balancer.placement.inventory import Placement


@functools.cache
def phase_bounds_per_s(scenario: Scenario, slo_s: float) -> tuple[float, ...]:
    """Per phase, the highest total request rate its best placement serves (requests of one
    sample: the demand of a mix at 1 request/s is the mix itself)."""
    bounds = []
    for phase, speeds in zip(scenario.phases, scenario.phase_speeds(), strict=True):
        _, assessment = best_placement(scenario.devices(), scenario.profiles(slo_s, speeds),
                                       phase.shares)
        bounds.append(assessment.headroom)
    return tuple(bounds)


def bound_per_s(scenario: Scenario, slo_s: float) -> float:
    """The rate held through every phase: the lowest phase bound."""
    return min(phase_bounds_per_s(scenario, slo_s))


@functools.cache
def first_phase_placement(scenario: Scenario, slo_s: float) -> Placement:
    placement, _ = best_placement(scenario.devices(), scenario.profiles(slo_s),
                                  scenario.phases[0].shares)
    return placement
