"""What the placer reports: its moves, its replicas, each device's memory and each model's
footprint, for the log, the metrics, the stats RPC, the dashboard and the devices page."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from evenflow.balancer.placement.inventory import UNLIMITED_BYTES


@dataclass(frozen=True, slots=True)
class MoveRecord:
    """A move carried out (or given up)."""

    at_s: float
    kind: str
    model: str
    device: str
    reason: str
    took_s: float
    outcome: str  # "done", "failed: ...", or "skipped: ..."


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """``memory_bytes``: what replicas may use there (declared, or measured at start);
    ``reserved_bytes``: what the replicas placed there (loading, serving or draining) and the
    loads outside the placer hold of it."""

    device: str
    memory_bytes: int
    reserved_bytes: int

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.reserved_bytes

    @property
    def limited(self) -> bool:
        """False for a device that declares no memory (``UNLIMITED_BYTES``)."""
        return self.memory_bytes < UNLIMITED_BYTES


@dataclass(frozen=True, slots=True)
class ModelFootprint:
    """What one replica of a model needs: ``memory_bytes`` (parameters, buffers and the
    activation peak at its largest batch, the largest measured on any replica) and
    ``load_s`` (the latest load and warm-up, or the configured guess before any)."""

    model: str
    memory_bytes: int
    load_s: float


@dataclass(frozen=True, slots=True)
class PlacementSnapshot:
    mode: str
    replicas: tuple[tuple[str, str, str], ...]  # (model, device, state)
    moves: Mapping[str, int]  # by "kind/reason/outcome-word"
    recent: tuple[MoveRecord, ...]
    demand_per_s: Mapping[str, float]  # samples, over the short window
    requests_per_s: Mapping[str, float]  # over the short window
    devices: tuple[DeviceMemory, ...] = ()
    models: tuple[ModelFootprint, ...] = ()
    # The long window's (a 30 s moving average): what the periodic plans and drops go by
    long_demand_per_s: Mapping[str, float] = field(default_factory=dict)  # samples
    long_requests_per_s: Mapping[str, float] = field(default_factory=dict)
