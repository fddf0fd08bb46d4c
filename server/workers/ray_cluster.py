"""With ``--workers ray`` and no ``--devices``, the devices are the Ray cluster's: one ``cuda``
device per GPU, and one ``sim`` device per unit of the custom resource ``evenflow_sim`` (test
clusters and drills: ``ray start --resources '{"evenflow_sim": 2}'``). ``ClusterFollower``
polls the cluster's resources and adds a replica of every model when a device joins, and
removes one (drained) when a device leaves."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import ray

from evenflow.server.edge.event_loop import cancel_and_wait
from evenflow.server.engine.model_control import ModelManager
from evenflow.server.workers.devices import DeviceSpec, lowest_free_index
from evenflow.server.workers.ray_resources import SIM_RESOURCE

logger = logging.getLogger(__name__)
_KINDS = {"cuda": "GPU", "sim": SIM_RESOURCE}


def slot_counts() -> Counter[str]:
    """Devices of each kind the cluster's live nodes offer now."""
    resources = ray.cluster_resources()
    return Counter({kind: int(resources.get(name, 0)) for kind, name in _KINDS.items()})


def cluster_devices() -> list[DeviceSpec]:
    counts = slot_counts()
    return [DeviceSpec(kind, i, f"{kind}{i}") for kind in _KINDS for i in range(counts[kind])]


class ClusterFollower:
    """Owns one task that keeps the manager's devices equal to the cluster's."""

    def __init__(self, manager: ModelManager, interval_s: float = 0.5) -> None:
        self._manager = manager
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="ray:follow-cluster")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)  # a poll: Ray has no resource-change event
            try:
                await self.sync()
            except Exception:
                logger.exception("following the Ray cluster failed; trying again")

    async def sync(self) -> None:
        counts = await asyncio.to_thread(slot_counts)
        for kind in _KINDS:
            have = [d for d in self._manager.devices if d.kind == kind]
            for _ in range(counts[kind] - len(have)):
                # A device that left was drained and closed before this (the manager's
                # remove_device holds its lock through it): its name is free again.
                index = lowest_free_index(self._manager.devices, kind)
                device = DeviceSpec(kind, index, f"{kind}{index}")
                logger.info("Ray cluster: %s joined", device.name)
                await self._manager.add_device(device)
            if len(have) > counts[kind]:
                lost = self._manager.lost_devices()
                # The lost ones first (their node is gone), then the newest.
                leaving = sorted(have, key=lambda d: (d.name not in lost, -d.index))
                for device in leaving[:len(have) - counts[kind]]:
                    logger.info("Ray cluster: %s left", device.name)
                    await self._manager.remove_device(device.name)
