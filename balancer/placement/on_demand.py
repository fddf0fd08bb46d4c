"""Where a model with no replica is loaded when a request for it comes: on the device it would
serve fastest among those it fits on, after evicting the least recently used of the replicas
the placer offers there (idle models', and overflow ones: ``overflow_replica``), evicting as
few as it can."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from evenflow.balancer.capacity import rate_within_per_s
from evenflow.balancer.placement.inventory import DeviceInfo, ModelProfile
from evenflow.balancer.placement.moves import Move


@dataclass(frozen=True, slots=True)
class Evictable:
    """A replica the placer would evict: its model's footprint and when the model last had a
    request."""

    model: str
    memory_bytes: int
    last_used_s: float


def rate_per_s(profile: ModelProfile, device: str) -> float:
    """What the capacity arithmetic gives ``profile``'s replica on ``device`` within its SLO."""
    return rate_within_per_s(profile.costs[device], profile.slo_s, profile.max_batch)


def on_demand_moves(profile: ModelProfile, devices: Sequence[DeviceInfo],
                    free_bytes: Mapping[str, int],
                    evictable: Mapping[str, Sequence[Evictable]]) -> list[Move] | None:
    """The evictions (drops) then the add that load ``profile``'s model; None if it fits
    nowhere now. Among the devices it fits on, the fewest evictions win, then the fastest."""
    best: tuple[tuple[int, float], list[Move]] | None = None
    for device in devices:
        if not profile.allowed_on(device.name):
            continue
        free = free_bytes[device.name]
        victims = sorted(evictable.get(device.name, ()), key=lambda e: e.last_used_s)
        evict: list[Evictable] = []
        for victim in victims:
            if free >= profile.memory_bytes:
                break
            evict.append(victim)
            free += victim.memory_bytes
        if free < profile.memory_bytes:
            continue
        # The oldest taken first may not all be needed once a large one is: spare the most
        # recently used of them that the load fits without.
        for victim in reversed(evict[:-1]):
            if free - victim.memory_bytes >= profile.memory_bytes:
                evict.remove(victim)
                free -= victim.memory_bytes
        rank = (len(evict), -rate_per_s(profile, device.name))
        if best is None or rank < best[0]:
            best = (rank, [Move("drop", victim.model, device.name) for victim in evict]
                    + [Move("add", profile.name, device.name)])
    return None if best is None else best[1]


def overflow_replica(profile: ModelProfile, device: str, serving: Collection[str]) -> bool:
    """Whether the replica on ``device`` is one the arithmetic gives no rate, beside one in
    routing (on a device in ``serving``) that it does: the model keeps all it is counted on
    without it."""
    return rate_per_s(profile, device) <= 0.0 and any(
        where != device and rate_per_s(profile, where) > 0.0 for where in serving)
