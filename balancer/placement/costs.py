"""Each model's batch cost on each device, for the planner: measured where it has run, else
estimated from where it has."""

from __future__ import annotations

from collections.abc import Mapping

from evenflow.balancer.capacity import DeviceCost


class CostBook:
    """A replica's reliable latency fit is its model's cost on that device, and is kept after
    the replica leaves (the planner must price moving back). Where a model has never run, its
    cost is its fastest measured one rescaled by how much slower the other device is: measured
    by the models that have run on both (a device that slowed down shows in every model's fit
    there), else from the declared speeds (``sim:SPEED``, 1 for real devices). A model measured
    nowhere costs the ``prior`` given, at the device's declared speed."""

    def __init__(self, device_speeds: Mapping[str, float]) -> None:
        self._speeds = dict(device_speeds)
        self._measured: dict[tuple[str, str], DeviceCost] = {}

    def set_speed(self, device: str, speed: float) -> None:
        self._speeds[device] = speed

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
            scale = self._slowdown(where, device)
            return DeviceCost(cost.base_s * scale, cost.per_sample_s * scale)
        return DeviceCost(prior.base_s, prior.per_sample_s, prior.speed * speed)

    def _slowdown(self, known: str, unknown: str) -> float:
        """How many times longer a batch takes on ``unknown`` than on ``known``: the median over
        the models measured on both, else the declared speeds' ratio."""
        ratios = sorted(self._measured[(name, unknown)].batch_s(1) / cost.batch_s(1)
                        for (name, where), cost in self._measured.items()
                        if where == known and (name, unknown) in self._measured)
        if ratios:
            return ratios[len(ratios) // 2]
        return self._speeds.get(known, 1.0) / self._speeds.get(unknown, 1.0)
