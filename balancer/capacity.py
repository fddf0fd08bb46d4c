"""The most a set of devices can serve within a latency SLO: the reference that SLO goodput is
measured against.

A device whose batch of ``b`` samples takes ``t(b) = a + c * b`` serves at most ``b / t(b)``
samples per second. Under a p99 SLO, a request may arrive just as a batch starts; it then waits
for that batch and runs in the next one, so a batch size is usable only if ``2 t(b) <= SLO``.
``b / t(b)`` grows with ``b`` (the fixed cost ``a`` is shared by more samples), so each device
contributes the rate of its largest usable batch, and nothing when even ``2 t(1)`` is over the
SLO. The sum over devices is the reference goodput (docs/architecture.md derives it).

It is not a strict upper bound: a policy that keeps most requests off the worst case (a request
that finds an idle device waits for no batch) can pass p99 a little above it; a result above 1.0
says how pessimistic the worst-case-arrival assumption is for that load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DeviceCost:
    """A device's batch cost: ``(base_s + per_sample_s * b) / speed``."""

    base_s: float
    per_sample_s: float
    speed: float = 1.0

    def batch_s(self, batch_size: float) -> float:
        return (self.base_s + self.per_sample_s * batch_size) / self.speed


def largest_batch_within(cost: DeviceCost, slo_s: float, max_batch: int,
                         models_sharing: int = 1) -> int:
    """The largest batch ``b <= max_batch`` with ``(models_sharing + 1) t(b) <= slo_s``; 0 when
    none is. A device shared by ``n`` busy models runs their batches in turn, so a request may
    wait for its own model's running batch and one batch of each other model before its own:
    ``n + 1`` batches, taken as equally long (``2 t(b)`` for a device of its own)."""
    batches = models_sharing + 1.0
    if cost.per_sample_s <= 0.0:
        return max_batch if batches * cost.batch_s(1) <= slo_s else 0
    size = math.floor((slo_s / batches * cost.speed - cost.base_s) / cost.per_sample_s + 1e-9)
    return max(0, min(max_batch, size))


def rate_within_per_s(cost: DeviceCost, slo_s: float, max_batch: int,
                      models_sharing: int = 1) -> float:
    """Samples per second the device serves a model at its largest batch within ``slo_s``,
    given all its time (a share of it serves that share of this rate)."""
    size = largest_batch_within(cost, slo_s, max_batch, models_sharing)
    return size / cost.batch_s(size) if size else 0.0


def slo_limit_per_s(costs: Sequence[DeviceCost], slo_s: float, max_batch: int) -> float:
    """The reference goodput in samples per second: the sum over devices of ``b / t(b)`` at
    each device's largest batch within the SLO."""
    return sum(rate_within_per_s(cost, slo_s, max_batch) for cost in costs)
