"""A move, the floors a move may not break, and the order that carries a placement into
another without breaking them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evenflow.balancer.placement.inventory import (
    DeviceInfo,
    ModelProfile,
    Placement,
    memory_used_bytes,
)


@dataclass(frozen=True, slots=True)
class Move:
    """``add``: load ``model`` on ``device``; ``drop``: drain and close that replica. A swap is a
    drop and an add on one device, the drop first (it frees the memory)."""

    kind: str  # "add" or "drop"
    model: str
    device: str


def floor_replicas(profile: ModelProfile, demand_per_s: float) -> int:
    """The fewest replicas a model may keep: its minimum, and one while it has demand."""
    return max(profile.min_replicas, len(profile.pinned), 1 if demand_per_s > 0.0 else 0)


def required(devices: Sequence[DeviceInfo], profiles: Mapping[str, ModelProfile]) -> Placement:
    """The replicas the configuration pins."""
    names = {device.name for device in devices}
    return frozenset((p.name, d) for p in profiles.values() for d in p.pinned if d in names)


def order_moves(current: Placement, target: Placement, devices: Sequence[DeviceInfo],
                profiles: Mapping[str, ModelProfile],
                demand_per_s: Mapping[str, float]) -> tuple[Move, ...] | None:
    """The moves from ``current`` to ``target`` in an order the ``Placer`` can carry out: an
    add only where the memory is free by then (after the drops before it on that device), a
    drop only while its model keeps its floor counting the adds of it before (the placer waits
    for those). None when no order exists (two full devices trading models): the placement
    is not reachable without a model going below its floor."""
    adds = sorted(target - current)
    drops = sorted(current - target)
    memory = {d.name: d.memory_bytes for d in devices}
    state = set(current)
    ordered: list[Move] = []
    while adds or drops:
        progressed = False
        for name, device in list(adds):
            used = memory_used_bytes(frozenset(state), device, profiles)
            if used + profiles[name].memory_bytes <= memory[device]:
                adds.remove((name, device))
                state.add((name, device))
                ordered.append(Move("add", name, device))
                progressed = True
        for name, device in list(drops):
            keeps = sum(1 for n, _ in state if n == name) - 1
            if keeps >= floor_replicas(profiles[name], demand_per_s.get(name, 0.0)):
                drops.remove((name, device))
                state.discard((name, device))
                ordered.append(Move("drop", name, device))
                progressed = True
                break  # a drop frees memory: try the adds again first
        if not progressed:
            return None
    return tuple(ordered)
