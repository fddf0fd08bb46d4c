"""Each model's batch cost on each device, for the planner: measured where it has run, else
estimated from where it has."""

from __future__ import annotations

from collections.abc import Mapping

from evenflow.balancer.capacity import DeviceCost

# A model's cost on a device moving by this factor at once is a step of the device (the latency
# fits call a miss of 1.5x a surprise, three in a row a step), not noise.
STEP_FACTOR = 1.5


class CostBook:
    """A replica's reliable latency fit is its model's cost on that device, and is kept after
    the replica leaves (the planner must price moving back). A fit measured at one batch size
    only (a replica its SLO holds to batches of one, or one re-learning a device that slowed)
    gives that size's cost and not how it splits: the cost known there (measured before, or
    estimated) is rescaled to it (``observe_at``).

    A device that slows down (or speeds up) does so for every model on it, while only the
    models it still runs batches for re-learn their fits: a measured cost that steps by
    ``STEP_FACTOR`` or more rescales the other models' measured costs on that device by the
    same factor, until their own fits say otherwise. The step is read at the batch size the
    new fit was measured at: a fit that only splits the same latency differently between
    fixed and per-sample cost (first measured at one size, later at several) differs most at
    sizes it never ran, and is no step of the device. A fit is taken only when it has changed
    since the replica last reported it, so a replica that runs nothing keeps no stale cost.

    Where a model has never run, its cost is its fastest measured one rescaled by how much
    slower the other device is: measured by the models that have run on both, else from the
    declared speeds (``sim:SPEED``, 1 for real devices). A model measured nowhere costs the
    ``prior`` given, at the device's declared speed."""

    def __init__(self, device_speeds: Mapping[str, float]) -> None:
        self._speeds = dict(device_speeds)
        self._measured: dict[tuple[str, str], DeviceCost] = {}
        self._reported: dict[tuple[str, str], tuple[float, ...]] = {}

    def set_speed(self, device: str, speed: float) -> None:
        self._speeds[device] = speed

    def observe(self, model: str, device: str, base_s: float, per_sample_s: float,
                batch_size: float = 1.0) -> None:
        """A replica's reliable fit there, measured at batches of ``batch_size`` on average."""
        if self._fresh(model, device, (base_s, per_sample_s)):
            self._set(model, device, DeviceCost(base_s, per_sample_s), batch_size)

    def observe_at(self, model: str, device: str, batch_size: float, latency_s: float,
                   prior: DeviceCost) -> None:
        """Batches of ``batch_size`` on average take ``latency_s`` there now (the fit's split
        between fixed and per-sample cost unknown): the cost as known, every part scaled to
        match. A linear cost's mean over the batches is its value at their mean size, so a
        mean over batches of one and two is as exact as either."""
        if not self._fresh(model, device, (batch_size, latency_s)):
            return
        known = self.cost(model, device, prior)
        known_s = known.batch_s(batch_size)
        scale = (latency_s / known_s if known_s > 0.0 else 1.0) / known.speed
        # Measured costs are kept at speed 1 (the speed folded in): the estimates read them so.
        self._set(model, device, DeviceCost(known.base_s * scale, known.per_sample_s * scale),
                  batch_size)

    def _fresh(self, model: str, device: str, report: tuple[float, ...]) -> bool:
        fresh = self._reported.get((model, device)) != report
        self._reported[(model, device)] = report
        return fresh

    def _set(self, model: str, device: str, cost: DeviceCost, batch_size: float) -> None:
        before = self._measured.get((model, device))
        self._measured[(model, device)] = cost
        size = max(batch_size, 1.0)
        if before is None or before.batch_s(size) <= 0.0 or cost.batch_s(size) <= 0.0:
            return
        factor = cost.batch_s(size) / before.batch_s(size)
        if max(factor, 1.0 / factor) < STEP_FACTOR:
            return
        for (name, where), other in list(self._measured.items()):
            if where == device and name != model:
                self._measured[(name, where)] = DeviceCost(other.base_s * factor,
                                                           other.per_sample_s * factor)

    def forget(self, model: str) -> None:
        for key in [key for key in self._measured if key[0] == model]:
            del self._measured[key]
            self._reported.pop(key, None)

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
