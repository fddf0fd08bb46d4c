"""Overflow replicas: a device the plan leaves without work gets a replica of the model that
needs capacity most, if that model can answer a request there within its SLO when the device
is idle.

The capacity arithmetic (``assessment``) prices a device at the worst case, a request that
waits for a whole batch before its own, and so gives nothing to a device on which ``2 t(1)``
is over the SLO. Such a device still answers a request within the SLO when it is idle, which is
exactly when the model's other replicas are backed up: least-work routing sends it the requests
that would otherwise finish late or be refused, and admission keeps it from taking more than it
can answer in time. Its memory would otherwise hold nothing that serves.

Which model needs it most: the one whose serving replicas run nearest their capacity (demand
over the capacity the assessment gives it). Under the max-min program every model that limits
the headroom sits at the same load, so ties go to the model with the fewest serving replicas
(a queue pooled over several devices rarely backs up all of them at once; one on a single
device does), then to the larger demand, then to the name.

A device's overflow replica changes model only for a clearly needier one: a load 1.5x the
holder's, or with loads within that, 1.5x its demand; and never for a model under half its
capacity, whose replicas rarely back up. A swap costs a load time, and the planner's demand is
a short window's: a model's load moves a step or two from one window to the next, which must
not move a replica back and forth. Nor must the program's indifference: a model that does not
limit the headroom may get any capacity beyond its demand, so light loads differ by more than
1.5x from one solution to the next.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evenflow.balancer.placement.assessment import assess, serving_replicas
from evenflow.balancer.placement.inventory import (
    DeviceInfo,
    ModelProfile,
    Placement,
    memory_used_bytes,
    models_on,
)
from evenflow.balancer.placement.moves import Move, floor_replicas
from evenflow.balancer.placement.planner import Plan

# Loads closer than this count as a tie: the program's loads are equal for every model that
# limits the headroom, and demand estimates are not finer than this.
LOAD_STEP = 0.05

# A model takes a device's overflow replica from another only with this much more load, or,
# with loads within it, this much more demand; and only at this load or more.
SWAP_RATIO = 1.5
SWAP_MIN_LOAD = 0.5

Need = tuple[float, int, float, str]  # sorts neediest first


@dataclass(frozen=True, slots=True)
class _Demand:
    load: float  # demand over the capacity the assessment gives the model; inf for none
    rate_per_s: float


def answers_alone_within_slo(profile: ModelProfile, device: str) -> bool:
    return profile.allowed_on(device) and profile.costs[device].batch_s(1) <= profile.slo_s


def _demands(placement: Placement, profiles: Mapping[str, ModelProfile],
             demand_per_s: Mapping[str, float]) -> dict[str, _Demand]:
    capacity = assess(placement, profiles, demand_per_s).capacity_per_s
    demands = {}
    for name, rate in demand_per_s.items():
        if rate <= 0.0 or name not in profiles:
            continue
        have = capacity.get(name, 0.0)
        demands[name] = _Demand(rate / have if have > 0.0 else math.inf, rate)
    return demands


def _need(demand: _Demand, serving: int, name: str) -> Need:
    steps = -math.inf if math.isinf(demand.load) else -round(demand.load / LOAD_STEP)
    return (steps, serving, -demand.rate_per_s, name)


def _clearly_needier(demand: _Demand, other: _Demand) -> bool:
    """A load ``SWAP_RATIO`` times the other's, or with loads within that, a demand that
    much larger; at ``SWAP_MIN_LOAD`` or more (the module's docstring)."""
    if demand.load < SWAP_MIN_LOAD:
        return False
    if math.isinf(demand.load) and math.isinf(other.load):  # neither has capacity elsewhere
        return demand.rate_per_s >= SWAP_RATIO * other.rate_per_s
    if demand.load >= SWAP_RATIO * other.load:
        return True
    if other.load >= SWAP_RATIO * demand.load:
        return False
    return demand.rate_per_s >= SWAP_RATIO * other.rate_per_s


def overflow_changes(placement: Placement, devices: Sequence[DeviceInfo],
                     profiles: Mapping[str, ModelProfile],
                     demand_per_s: Mapping[str, float]
                     ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The overflow replicas to drop and to add, in that order: on each device where no
    replica serves demand, one replica of the neediest model (the module's docstring) that
    fits there, may have another replica and answers one request there within its SLO. A
    device's overflow replica is swapped only for a clearly needier model, and never when its
    model would go below its floor (``floor_replicas``: its configured minimum, and one while
    it has demand) or it is pinned there. A device that holds two or more busy models is left
    alone."""
    serving_pairs = serving_replicas(placement, profiles, demand_per_s)
    serving: dict[str, int] = {}
    for name, _ in serving_pairs:
        serving[name] = serving.get(name, 0) + 1
    demands = _demands(placement, profiles, demand_per_s)
    order = sorted(demands, key=lambda n: _need(demands[n], serving.get(n, 0), n))
    counts = {name: sum(1 for n, _ in placement if n == name) for name in profiles}
    busy_devices = {device for _, device in serving_pairs}
    drops: list[tuple[str, str]] = []
    adds: list[tuple[str, str]] = []
    for device in devices:
        if device.name in busy_devices:
            continue
        here = [name for name in models_on(placement, device.name) if name in demands]
        if len(here) > 1:
            continue  # replicas of two busy models (a device that slowed): not spare memory
        free = device.memory_bytes - memory_used_bytes(placement, device.name, profiles)
        for name in order:
            if name in here:
                break  # the neediest model that can go here already is
            profile = profiles[name]
            room = free + sum(profiles[n].memory_bytes for n in here)
            if profile.memory_bytes > room or not answers_alone_within_slo(profile,
                                                                          device.name):
                continue
            if profile.max_replicas is not None and counts[name] >= profile.max_replicas:
                continue
            if any(counts[n] <= floor_replicas(profiles[n], demands[n].rate_per_s)
                   or device.name in profiles[n].pinned
                   or not _clearly_needier(demands[name], demands[n]) for n in here):
                break  # what is there is needed as much, at its floor, or pinned here
            drops += [(n, device.name) for n in here]
            adds.append((name, device.name))
            for n in here:
                counts[n] -= 1
            counts[name] += 1
            break
    return drops, adds


def overflow_replicas(placement: Placement, devices: Sequence[DeviceInfo],
                      profiles: Mapping[str, ModelProfile],
                      demand_per_s: Mapping[str, float]) -> list[tuple[str, str]]:
    """The overflow replicas ``overflow_changes`` would add to ``placement``."""
    return overflow_changes(placement, devices, profiles, demand_per_s)[1]


def with_overflow(plan: Plan, devices: Sequence[DeviceInfo],
                  profiles: Mapping[str, ModelProfile],
                  demand_per_s: Mapping[str, float]) -> Plan:
    """``plan`` with its overflow replicas swapped in last: the headroom is unchanged, as the
    capacity arithmetic gives them none."""
    drops, adds = overflow_changes(plan.placement, devices, profiles, demand_per_s)
    if not adds:
        return plan
    moves = tuple(Move("drop", n, d) for n, d in drops) + tuple(Move("add", n, d)
                                                               for n, d in adds)
    target = (plan.placement - frozenset(drops)) | frozenset(adds)
    return Plan(target, plan.moves + moves, plan.before, plan.after)
