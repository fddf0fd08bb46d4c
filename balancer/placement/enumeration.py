"""Every placement that fits: the exact search the planner uses on small inventories, and the
bound the benchmark measures against."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence

from evenflow.balancer.placement.assessment import Assessment, assess
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile, Placement
from evenflow.balancer.placement.moves import floor_replicas


def _subsets(device: DeviceInfo, names: Sequence[str],
             profiles: Mapping[str, ModelProfile]) -> list[frozenset[tuple[str, str]]]:
    """The sets of ``names`` that fit ``device`` and include the models pinned to it."""
    allowed = [name for name in names if profiles[name].allowed_on(device.name)]
    pinned = {name for name in allowed if device.name in profiles[name].pinned}
    subsets = []
    for size in range(len(allowed) + 1):
        for subset in itertools.combinations(allowed, size):
            if pinned <= set(subset) and \
                    sum(profiles[n].memory_bytes for n in subset) <= device.memory_bytes:
                subsets.append(frozenset((n, device.name) for n in subset))
    return subsets


def count_placements(devices: Sequence[DeviceInfo], profiles: Mapping[str, ModelProfile],
                     names: Sequence[str]) -> int:
    """How many combinations ``placements`` would try (before the count filters)."""
    return math.prod(len(_subsets(device, names, profiles)) for device in devices)


def placements(devices: Sequence[DeviceInfo], profiles: Mapping[str, ModelProfile],
               demand_per_s: Mapping[str, float]) -> Iterator[Placement]:
    """Every placement of the models with demand or a floor that fits memory, keeps the pins,
    and gives each model between its floor and its maximum of replicas."""
    names = placed_models(profiles, demand_per_s)
    bounds = {n: (floor_replicas(profiles[n], demand_per_s.get(n, 0.0)),
                  profiles[n].max_replicas or len(devices)) for n in names}
    for choice in itertools.product(*(_subsets(d, names, profiles) for d in devices)):
        placement: Placement = frozenset().union(*choice)
        counts = dict.fromkeys(names, 0)
        for name, _ in placement:
            counts[name] += 1
        if all(low <= counts[n] <= high for n, (low, high) in bounds.items()):
            yield placement


def placed_models(profiles: Mapping[str, ModelProfile],
                  demand_per_s: Mapping[str, float]) -> list[str]:
    """The models a placement must hold: those with demand, and those with a floor."""
    return sorted(n for n, p in profiles.items()
                  if floor_replicas(p, demand_per_s.get(n, 0.0)) > 0)


def best_placement(devices: Sequence[DeviceInfo], profiles: Mapping[str, ModelProfile],
                   demand_per_s: Mapping[str, float]) -> tuple[Placement, Assessment]:
    """The placement with the most headroom for ``demand_per_s``, by enumeration."""
    best: tuple[Placement, Assessment] | None = None
    for placement in placements(devices, profiles, demand_per_s):
        result = assess(placement, profiles, demand_per_s)
        if best is None or result.headroom > best[1].headroom:
            best = (placement, result)
    if best is None:
        demanded = any(rate > 0.0 for rate in demand_per_s.values())
        return frozenset(), Assessment(0.0 if demanded else math.inf, {}, {})
    return best
