"""The slow-timescale planner: which models get replicas on which devices, within memory, to
serve the measured demand with the most headroom (``assessment``).

Where the placements that fit are few enough to try (``max_enumerated``), ``propose`` tries them
all (an exact search, ``enumeration``) and moves to the one within ``near_best`` of the best
that is soonest in service (the least load and warm-up time of the replicas it adds, then the
fewest moves) from the current placement, if it beats the current headroom by ``min_gain``.
Otherwise it searches greedily from the current placement: each step tries every single move
(add a replica, drop one, or swap one model for another on a device) and keeps the best while
it gains ``min_gain``. Either way a placement that serves its demand well is left
alone, and the moves come in an order that never takes a model below its floor.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from evenflow.balancer.placement.assessment import Assessment, assess
from evenflow.balancer.placement.enumeration import count_placements, placed_models, placements
from evenflow.balancer.placement.inventory import (
    DeviceInfo,
    ModelProfile,
    Placement,
    devices_of,
    memory_used_bytes,
    models_on,
)
from evenflow.balancer.placement.moves import Move, floor_replicas, order_moves, required


@dataclass(frozen=True, slots=True)
class PlannerSettings:
    """``min_gain``: the relative headroom gain a move must bring (moves cost a load and a
    drain; a smaller gain is noise in the demand). ``max_moves``: single moves per plan.
    ``enough_headroom``: above this, extra replicas are not sought (memory is better kept for
    models that may come). ``max_enumerated``: the most placements the exact search tries
    (each is one small LP). ``near_best``: how far below the best headroom a placement that
    needs fewer moves may be and still be chosen."""

    min_gain: float = 0.05
    max_moves: int = 8
    enough_headroom: float = 4.0
    max_enumerated: int = 4000
    near_best: float = 0.03


@dataclass(frozen=True, slots=True)
class Plan:
    placement: Placement
    moves: tuple[Move, ...]
    before: Assessment
    after: Assessment


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
        here = models_on(placement, device.name)  # sorted: ties break the same every run
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
    return _better_headroom(after.headroom, before.headroom, min_gain)


def propose(placement: Placement, devices: Sequence[DeviceInfo],
            profiles: Mapping[str, ModelProfile], demand_per_s: Mapping[str, float],
            settings: PlannerSettings = PlannerSettings()) -> Plan:
    """The plan from ``placement`` for ``demand_per_s``: exact where the placements are few
    enough to try, else greedy (the module's docstring). A model that fits on no device is left
    out: it cannot be served whatever the others do."""
    demand_per_s = {name: rate for name, rate in demand_per_s.items()
                    if name in profiles and placeable(profiles[name], devices)}
    names = placed_models(profiles, demand_per_s)
    if count_placements(devices, profiles, names) <= settings.max_enumerated:
        return propose_exact(placement, devices, profiles, demand_per_s, settings)
    return propose_greedy(placement, devices, profiles, demand_per_s, settings)


def placeable(profile: ModelProfile, devices: Sequence[DeviceInfo]) -> bool:
    return any(profile.allowed_on(d.name) and profile.memory_bytes <= d.memory_bytes
               for d in devices)


def _keep_idle(target: Placement, current: Placement, devices: Sequence[DeviceInfo],
               profiles: Mapping[str, ModelProfile], names: Sequence[str]) -> Placement:
    """``target`` plus the current replicas of models it does not hold (idle ones) that still
    fit beside it: a replica kept costs nothing, one dropped may have to load again."""
    memory = {d.name: d.memory_bytes for d in devices}
    kept = set(target)
    for name, device in sorted(current):
        if name in names:
            continue
        used = memory_used_bytes(frozenset(kept), device, profiles)
        if used + profiles[name].memory_bytes <= memory[device]:
            kept.add((name, device))
    return frozenset(kept)


def propose_exact(placement: Placement, devices: Sequence[DeviceInfo],
                  profiles: Mapping[str, ModelProfile], demand_per_s: Mapping[str, float],
                  settings: PlannerSettings = PlannerSettings()) -> Plan:
    """Try every placement (``enumeration.placements``); see the module's docstring."""
    before = assess(placement, profiles, demand_per_s)
    names = placed_models(profiles, demand_per_s)
    scored = [(assess(p, profiles, demand_per_s), p)
              for p in placements(devices, profiles, demand_per_s)]
    if not scored:
        return Plan(placement, (), before, before)
    best = max(result.headroom for result, _ in scored)
    must = _below_floor(placement, profiles, demand_per_s)
    if not must and not _better_headroom(best, before.headroom, settings.min_gain):
        return Plan(placement, (), before, before)
    near = []
    for result, target in scored:
        if result.headroom < best * (1.0 - settings.near_best):
            continue
        if not must and not _better_headroom(result.headroom, before.headroom,
                                             settings.min_gain):
            continue
        full = _keep_idle(target, placement, devices, profiles, names)
        near.append((_load_s(full - placement, profiles), len(full ^ placement),
                     -result.headroom, sorted(full), full, result))
    near.sort(key=lambda item: item[:4])
    for _, count, _, _, full, _result in near:
        if count > settings.max_moves and not must:
            break
        moves = order_moves(placement, full, devices, profiles, demand_per_s)
        if moves is not None:
            return Plan(full, moves, before, assess(full, profiles, demand_per_s))
    return Plan(placement, (), before, before)


def _load_s(added: Placement, profiles: Mapping[str, ModelProfile]) -> float:
    """The load and warm-up time of the replicas ``added`` (a placement's cost to reach: each
    adds capacity only once warm, and holds its device's memory meanwhile)."""
    return sum(profiles[name].load_s for name, _ in added)


def _better_headroom(after: float, before: float, min_gain: float) -> bool:
    return after > 0.0 if before <= 0.0 else after > before * (1.0 + min_gain)


def propose_greedy(placement: Placement, devices: Sequence[DeviceInfo],
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
    """The single move with the most headroom after it (on a tie, the shorter load, then
    fewer moves); with
    ``floor_only``, only among moves that give a model below its floor a replica."""
    best: tuple[tuple[Move, ...], Placement, Assessment] | None = None
    for step, candidate in candidate_moves(current, devices, profiles, demand_per_s):
        if floor_only and not _fills_floor(candidate, current, profiles, demand_per_s):
            continue
        result = assess(candidate, profiles, demand_per_s)
        if best is None or result.headroom > best[2].headroom or (
                result.headroom == best[2].headroom
                and (_load_s(candidate - current, profiles), len(step))
                < (_load_s(best[1] - current, profiles), len(best[0]))):
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


