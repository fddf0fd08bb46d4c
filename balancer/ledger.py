"""Which replicas, of every model, share each device: a device runs one model's batch at a
time, so a replica's next batch waits for the other models' work there too."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

from evenflow.balancer.policies import ReplicaLoad
from evenflow.balancer.turns import DeviceTurns


class Priced(Protocol):
    """What the ledger needs of a replica: the devices it runs on, and its own work there."""

    @property
    def devices(self) -> Sequence[str]: ...

    def own_load(self, now_s: float) -> ReplicaLoad: ...


class DeviceLedger:
    """Replicas by device name, across the models of one server. Each model's balancer adds
    its replicas on start and removes them on close; a replica asks for the outstanding work
    of the others on its devices (``others_work_s``) when it prices itself, and takes
    ``turns`` on a device it shares, so that the models' batches there run one at a time."""

    def __init__(self) -> None:
        self.turns = DeviceTurns()
        self._by_device: defaultdict[str, list[Priced]] = defaultdict(list)
        # Each replica's sharers, computed when the ledger changes: asked on every routing
        # decision, for every replica, and almost always empty.
        self._others: dict[int, tuple[Priced, ...]] = {}

    def add(self, replica: Priced) -> None:
        for device in replica.devices:
            self._by_device[device].append(replica)
        self._others.clear()

    def remove(self, replica: Priced) -> None:
        for device in replica.devices:
            sharing = self._by_device[device]
            if replica in sharing:
                sharing.remove(replica)
            if not sharing:
                del self._by_device[device]
        self._others.clear()

    def shared(self, replica: Priced) -> bool:
        """Whether another replica runs on any of ``replica``'s devices."""
        return bool(self._sharers(replica))

    def _sharers(self, replica: Priced) -> tuple[Priced, ...]:
        others = self._others.get(id(replica))
        if others is None:
            found: dict[int, Priced] = {}
            for device in replica.devices:
                for other in self._by_device.get(device, ()):
                    if other is not replica:
                        found[id(other)] = other
            others = self._others[id(replica)] = tuple(found.values())
        return others

    def others_work_s(self, replica: Priced, now_s: float) -> float:
        """Seconds of work (running and queued) that other replicas hold on ``replica``'s
        devices, each counted once. A replica that has not measured a batch yet prices its own
        work as unknown (infinite, so that routing probes it before trusting it); as another
        model's work it counts nothing until it has measured."""
        total_s = 0.0
        for other in self._sharers(replica):
            work_s = other.own_load(now_s).work_s()
            if math.isfinite(work_s):
                total_s += work_s
        return total_s
