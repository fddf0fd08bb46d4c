"""The slow-timescale planner: which models get replicas on which devices, within memory, to
serve the measured demand with the most headroom (``assessment``).

``propose`` searches greedily from the current placement: each step tries every single move
(add a replica, drop one, or swap one model for another on a device) and keeps the best, while
it raises the headroom by at least ``min_gain``; so a placement that serves its demand well is
left alone, and each plan moves a few replicas at most. ``best_placement`` enumerates every
placement that fits (small inventories only): the bound the benchmark measures against.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from evenflow.balancer.placement.assessment import Assessment, assess
from evenflow.balancer.placement.inventory import (
    DeviceInfo,
    ModelProfile,
    Placement,
    devices_of,
    memory_used_bytes,
)


@dataclass(frozen=True, slots=True)
class Move:
    """``add``: load ``model`` on ``device``; ``drop``: drain and close that replica. A swap is a
    drop and an add on one device, the drop first (it frees the memory)."""

    kind: str  # "add" or "drop"
    model: str
    device: str


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    """``min_gain``: the relative headroom gain a move must bring (moves cost a load and a
    drain; a smaller gain is noise in the demand). ``max_moves``: single moves per plan.
    ``enough_headroom``: above this, extra replicas are not sought (memory is better kept for
    models that may come)."""

    min_gain: float = 0.05
    max_moves: int = 4
    enough_headroom: float = 4.0


@dataclass(frozen=True, slots=True)
class Plan:
    placement: Placement
    moves: tuple[Move, ...]
    before: Assessment
    after: Assessment


def floor_replicas(profile: ModelProfile, demand_per_s: float) -> int:
    """The fewest replicas a model may keep: its minimum, and one while it has demand."""
    return max(profile.min_replicas, len(profile.pinned), 1 if demand_per_s > 0.0 else 0)


def required(devices: Sequence[DeviceInfo], profiles: Mapping[str, ModelProfile]) -> Placement:
    """The replicas the configuration pins."""
    names = {device.name for device in devices}
    return frozenset((p.name, d) for p in profiles.values() for d in p.pinned if d in names)


def _free_bytes(placement: Placement, device: DeviceInfo,
                profiles: Mapping[str, ModelProfile]) -> int:
    return device.memory_bytes - memory_used_bytes(placement, device.name, profiles)


def candidate_moves(placement: Placement, devices: Sequence[DeviceInfo],
                    profiles: Mapping[str, ModelProfile],
                    demand_per_s: Mapping[str, float]
                    ) -> Iterator[tuple[tuple[Move, ...], Placement]]:
    """Every single move from ``placement`` that keeps memory, the replica bounds and the
    pins: adds, drops, and swaps on one device."""
    counts = {name: len(devices_of(placement, name)) for name in profiles}
    for device in devices:
        free = _free_bytes(placement, device, profiles)
        here = [name for name, where in placement if where == device.name]
        droppable = [name for name in here
                     if device.name not in profiles[name].pinned
                     and counts[name] > floor_replicas(profiles[name],
                                                       demand_per_s.get(name, 0.0))]
        for name in droppable:
            yield (Move("drop", name, device.name),), placement - {(name, device.name)}
        for profile in profiles.values():
            if (profile.name, device.name) in placement or not profile.allowed_on(device.name):
                continue
            if profile.max_replicas is not None and counts[profile.name] >= profile.max_replicas:
                continue
            if demand_per_s.get(profile.name, 0.0) <= 0.0 and \
                    counts[profile.name] >= floor_replicas(profile, 0.0):
                continue  # nothing to serve: no replica is worth its memory
            added = placement | {(profile.name, device.name)}
            if profile.memory_bytes <= free:
                yield (Move("add", profile.name, device.name),), added
                continue
            for name in droppable:
                if name != profile.name and \
                        profile.memory_bytes <= free + profiles[name].memory_bytes:
                    yield ((Move("drop", name, device.name),
                            Move("add", profile.name, device.name)),
                           added - {(name, device.name)})


def _better(after: Assessment, before: Assessment, min_gain: float) -> bool:
    if before.headroom <= 0.0:
        return after.headroom > 0.0
    return after.headroom > before.headroom * (1.0 + min_gain)


def propose(placement: Placement, devices: Sequence[DeviceInfo],
            profiles: Mapping[str, ModelProfile], demand_per_s: Mapping[str, float],
            settings: PlannerSettings = PlannerSettings()) -> Plan:
    """First whatever the floors need (pins, minimum counts, one replica for a model with
    demand), each where it serves the most; then the moves, best first, that raise headroom by
    ``min_gain`` each, up to ``max_moves`` of them."""
    before = assess(placement, profiles, demand_per_s)
    current = placement | required(devices, profiles)
    moves = [Move("add", n, d) for n, d in sorted(current - placement)]
    assessment = assess(current, profiles, demand_per_s)
    while _below_floor(current, profiles, demand_per_s):
        best = _best_step(current, devices, profiles, demand_per_s, floor_only=True)
        if best is None:
            break  # a model that fits nowhere stays unplaced
        step, current, assessment = best
        moves += step
    improving = 0
    while improving < settings.max_moves and assessment.headroom < settings.enough_headroom:
        best = _best_step(current, devices, profiles, demand_per_s, floor_only=False)
        if best is None or not _better(best[2], assessment, settings.min_gain):
            break
        step, current, assessment = best
        moves += step
        improving += len(step)
    return Plan(current, tuple(moves), before, assessment)


def _best_step(current: Placement, devices: Sequence[DeviceInfo],
               profiles: Mapping[str, ModelProfile], demand_per_s: Mapping[str, float], *,
               floor_only: bool) -> tuple[tuple[Move, ...], Placement, Assessment] | None:
    """The single move with the most headroom after it (fewer moves on a tie); with
    ``floor_only``, only among moves that give a model below its floor a replica."""
    best: tuple[tuple[Move, ...], Placement, Assessment] | None = None
    for step, candidate in candidate_moves(current, devices, profiles, demand_per_s):
        if floor_only and not _fills_floor(candidate, current, profiles, demand_per_s):
            continue
        result = assess(candidate, profiles, demand_per_s)
        if best is None or result.headroom > best[2].headroom or (
                result.headroom == best[2].headroom and len(step) < len(best[0])):
            best = (step, candidate, result)
    return best


def _below_floor(placement: Placement, profiles: Mapping[str, ModelProfile],
                 demand_per_s: Mapping[str, float]) -> bool:
    return any(len(devices_of(placement, name)) < floor_replicas(p, demand_per_s.get(name, 0.0))
               for name, p in profiles.items())


def _fills_floor(candidate: Placement, current: Placement,
                 profiles: Mapping[str, ModelProfile],
                 demand_per_s: Mapping[str, float]) -> bool:
    """Whether ``candidate`` gives a replica to a model that is below its floor in
    ``current`` without taking one below its floor (a model below its floor is worth a move
    whatever it does to headroom)."""
    def short(placement: Placement) -> int:
        return sum(max(0, floor_replicas(p, demand_per_s.get(name, 0.0))
                       - len(devices_of(placement, name))) for name, p in profiles.items())
    return short(candidate) < short(current)


def placements(devices: Sequence[DeviceInfo], profiles: Mapping[str, ModelProfile],
               demanded: Sequence[str]) -> Iterator[Placement]:
    """Every placement of ``demanded`` models that fits memory, each placed at least once."""
    per_device = []
    for device in devices:
        allowed = [name for name in demanded if profiles[name].allowed_on(device.name)]
        subsets = []
        for size in range(len(allowed) + 1):
            for subset in itertools.combinations(allowed, size):
                if sum(profiles[n].memory_bytes for n in subset) <= device.memory_bytes:
                    subsets.append(frozenset((n, device.name) for n in subset))
        per_device.append(subsets)
    for choice in itertools.product(*per_device):
        placement: Placement = frozenset().union(*choice)
        if all(any(name == n for n, _ in placement) for name in demanded):
            yield placement


def best_placement(devices: Sequence[DeviceInfo], profiles: Mapping[str, ModelProfile],
                   demand_per_s: Mapping[str, float]) -> tuple[Placement, Assessment]:
    """The placement with the most headroom for ``demand_per_s``, by enumeration."""
    demanded = sorted(name for name, rate in demand_per_s.items() if rate > 0.0)
    best: tuple[Placement, Assessment] | None = None
    for placement in placements(devices, profiles, demanded):
        result = assess(placement, profiles, demand_per_s)
        if best is None or result.headroom > best[1].headroom:
            best = (placement, result)
    if best is None:
        return frozenset(), Assessment(0.0 if demanded else math.inf, {}, {})
    return best
