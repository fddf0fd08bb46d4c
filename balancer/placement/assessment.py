"""How much of a demand a placement serves within each model's SLO: the capacity arithmetic of
``evenflow.balancer.capacity`` per device and model, as a linear program.

A device's time is shared among the models placed on it that have demand. A model given a share
``x`` of device ``d`` serves ``x * r(model, d)`` samples per second, where ``r`` is its rate at
its largest batch within the SLO on that device, with ``n + 1`` batches in a request's worst
wait when ``n`` busy models share the device. ``headroom`` is the largest factor ``R`` such that
``R`` times every model's demand is served at once; ``R >= 1`` serves all of it. Maximising
``R`` keeps the demand mix whole (it never buys one model's goodput with another's), which is
what SLO goodput of a mix measures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from evenflow.balancer.capacity import rate_within_per_s
from evenflow.balancer.placement.inventory import ModelProfile, Placement
from evenflow.balancer.placement.simplex import maximize

# Headroom is capped so that a placement with no demand on it stays a bounded program.
MAX_HEADROOM = 1e6


@dataclass(frozen=True, slots=True)
class Assessment:
    """A placement under a demand: its headroom, each replica's share of its device, and each
    model's capacity at those shares (samples/s)."""

    headroom: float
    shares: Mapping[tuple[str, str], float]
    capacity_per_s: Mapping[str, float]


def replica_rates_per_s(placement: Placement, profiles: Mapping[str, ModelProfile],
                        demand_per_s: Mapping[str, float]) -> dict[tuple[str, str], float]:
    """Each replica's rate within its model's SLO on its device (samples/s, given the whole
    device), counting as sharers only the models there that have demand."""
    busy: dict[str, int] = {}
    for name, device in placement:
        if demand_per_s.get(name, 0.0) > 0.0:
            busy[device] = busy.get(device, 0) + 1
    rates = {}
    for name, device in placement:
        profile = profiles[name]
        rates[(name, device)] = rate_within_per_s(profile.costs[device], profile.slo_s,
                                                  profile.max_batch, max(1, busy.get(device, 0)))
    return rates


def serving_replicas(placement: Placement, profiles: Mapping[str, ModelProfile],
                     demand_per_s: Mapping[str, float]) -> set[tuple[str, str]]:
    """The replicas that serve demand: their model has some, and they answer within its SLO
    on their device (routing sends them work, whatever share the best sharing gives them)."""
    rates = replica_rates_per_s(placement, profiles, demand_per_s)
    return {pair for pair, rate in rates.items()
            if rate > 0.0 and demand_per_s.get(pair[0], 0.0) > 0.0}


def assess(placement: Placement, profiles: Mapping[str, ModelProfile],
           demand_per_s: Mapping[str, float]) -> Assessment:
    """The best sharing of each device among its models for ``demand_per_s`` (samples/s)."""
    demanded = sorted(name for name, rate in demand_per_s.items() if rate > 0.0)
    rates = replica_rates_per_s(placement, profiles, demand_per_s)
    pairs = sorted(pair for pair in placement if pair[0] in demand_per_s
                   and demand_per_s[pair[0]] > 0.0 and rates[pair] > 0.0)
    if not demanded:
        return Assessment(MAX_HEADROOM, {}, {})
    placed = {name for name, _ in pairs}
    if any(name not in placed for name in demanded):
        return Assessment(0.0, {}, {name: 0.0 for name in demanded})
    devices = sorted({device for _, device in pairs})
    # Variables: one share per replica, then R. Rows: per model R * demand <= its capacity;
    # per device the shares sum to at most 1; R <= MAX_HEADROOM.
    width = len(pairs) + 1
    a: list[list[float]] = []
    b: list[float] = []
    for name in demanded:
        row = [0.0] * width
        for j, pair in enumerate(pairs):
            if pair[0] == name:
                row[j] = -rates[pair]
        row[-1] = demand_per_s[name]
        a.append(row)
        b.append(0.0)
    for device in devices:
        a.append([1.0 if pair[1] == device else 0.0 for pair in pairs] + [0.0])
        b.append(1.0)
    a.append([0.0] * len(pairs) + [1.0])
    b.append(MAX_HEADROOM)
    headroom, x = maximize([0.0] * len(pairs) + [1.0], a, b)
    shares = {pair: x[j] for j, pair in enumerate(pairs)}
    capacity = {name: sum(rates[pair] * shares[pair] for pair in pairs if pair[0] == name)
                for name in demanded}
    return Assessment(headroom, shares, capacity)
