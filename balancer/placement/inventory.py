"""What a placement is made of: devices with memory, models with their footprint and their
batch cost on each device, and a placement (which model has a replica on which device)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from evenflow.balancer.capacity import DeviceCost

# A placement: the (model, device) pairs that have a replica. Frozen, so plans can be compared,
# hashed and cached.
Placement = frozenset[tuple[str, str]]


# The memory of a device that declares none (a ``sim`` device not given any): placement there
# is bounded by replica counts alone.
UNLIMITED_BYTES = 1 << 62


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """A device and the memory its replicas may use: declared in the configuration, else for
    a GPU 90 % of its total, no more than was free at start where that is known
    (``server/engine/device_memory``); a ``sim`` device's is declared, or ``UNLIMITED_BYTES``."""

    name: str
    memory_bytes: int


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """One model as the planner sees it.

    Attributes:
        memory_bytes: a replica's footprint: parameters and buffers in the served dtype plus
            the activation peak at its max batch and largest padding bucket (measured at
            warm-up), the same on every device.
        costs: its batch cost on each device (the replica's latency fit, or a prior scaled by
            the device's speed where it has never run).
        slo_s: the latency its requests must be answered within (the declared SLO, else the
            latency target).
        load_s: how long a replica takes to load and warm up.
        min_replicas, max_replicas: bounds on its replica count (the configuration's); a model
            with ``min_replicas == 0`` may be evicted when idle and loaded again on demand.
        pinned: devices it always has a replica on.
    """

    name: str
    memory_bytes: int
    costs: Mapping[str, DeviceCost]
    max_batch: int
    slo_s: float
    load_s: float = 0.0
    min_replicas: int = 0
    max_replicas: int | None = None
    pinned: frozenset[str] = field(default_factory=frozenset)

    def allowed_on(self, device: str) -> bool:
        return device in self.costs


def devices_of(placement: Placement, model: str) -> list[str]:
    return sorted(device for name, device in placement if name == model)


def models_on(placement: Placement, device: str) -> list[str]:
    return sorted(name for name, where in placement if where == device)


def memory_used_bytes(placement: Placement, device: str,
                      profiles: Mapping[str, ModelProfile]) -> int:
    return sum(profiles[name].memory_bytes for name, where in placement if where == device)


def fits(placement: Placement, devices: Iterable[DeviceInfo],
         profiles: Mapping[str, ModelProfile]) -> bool:
    """Whether every device holds its replicas within its memory."""
    return all(memory_used_bytes(placement, device.name, profiles) <= device.memory_bytes
               for device in devices)
