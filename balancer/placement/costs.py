"""Each model's batch cost on each device, for the planner: measured where it has run, else
estimated from where it has."""

from __future__ import annotations

from collections.abc import Mapping

from evenflow.balancer.capacity import DeviceCost


class CostBook:
    """A replica's reliable latency fit is its model's cost on that device, and is kept after
    the replica leaves (the planner must price moving back). Where a model has never run, its
    cost is its fastest measured one rescaled by the two devices' speeds (the declared
    speeds: ``sim:SPEED``, 1 for real devices), else the ``prior`` given."""

    def __init__(self, device_speeds: Mapping[str, float]) -> None:
        self._speeds = dict(device_speeds)
        self._measured: dict[tuple[str, str], DeviceCost] = {}

    def observe(self, model: str, device: str, base_s: float, per_sample_s: float) -> None:
        self._measured[(model, device)] = DeviceCost(base_s, per_sample_s)

    def forget(self, model: str) -> None:
        for key in [key for key in self._measured if key[0] == model]:
            del self._measured[key]

    def cost(self, model: str, device: str, prior: DeviceCost) -> DeviceCost:
        measured = self._measured.get((model, device))
        if measured is not None:
            return measured
        speed = self._speeds.get(device, 1.0)
        elsewhere = [(where, cost) for (name, where), cost in self._measured.items()
                     if name == model]
        if elsewhere:
            where, cost = min(elsewhere, key=lambda item: item[1].batch_s(1))
            scale = self._speeds.get(where, 1.0) / speed
            return DeviceCost(cost.base_s * scale, cost.per_sample_s * scale)
        return DeviceCost(prior.base_s, prior.per_sample_s, prior.speed * speed)
