"""Cutting a chain of layers into contiguous pipeline stages, one stage per device.

``plan_stages`` is exact: a dynamic programme over (stage, first layer of the next stage) that
minimises the slowest stage's time, where stage ``i`` runs on device ``i`` at that device's
speed and must fit in that device's memory. O(S * L^2) for S stages and L layers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StagePlan:
    """Stage ``i`` holds layers ``bounds[i]:bounds[i+1]`` and runs on device ``i``."""

    bounds: tuple[int, ...]  # S + 1 layer indices, from 0 to L
    stage_costs_s: tuple[float, ...]
    stage_memory_bytes: tuple[int, ...]

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_costs_s)

    def layers(self, stage: int) -> range:
        return range(self.bounds[stage], self.bounds[stage + 1])

    def describe(self) -> str:
        return "; ".join(f"stage {i}: layers {b}-{e - 1} ({c * 1000:.2f} ms, {m / 2**20:.1f} MiB)"
                         for i, (b, e, c, m) in enumerate(zip(
                             self.bounds, self.bounds[1:], self.stage_costs_s,
                             self.stage_memory_bytes, strict=False)))


class InfeasiblePlan(ValueError):
    """No contiguous cut fits the layers into the devices' memory."""


def plan_stages(layer_costs_s: Sequence[float], num_stages: int, *,
                device_speeds: Sequence[float] | None = None,
                layer_memory_bytes: Sequence[int] | None = None,
                device_memory_bytes: Sequence[float] | None = None) -> StagePlan:
    """Best contiguous cut of the layers into ``num_stages`` non-empty stages.

    ``layer_costs_s[j]`` is layer j's time on a device of speed 1; on device i it takes
    ``layer_costs_s[j] / device_speeds[i]``.
    """
    num_layers = len(layer_costs_s)
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot cut {num_layers} layers into {num_stages} stages")
    speeds = list(device_speeds or [1.0] * num_stages)
    memory = list(layer_memory_bytes or [0] * num_layers)
    capacity = list(device_memory_bytes or [math.inf] * num_stages)
    if len(speeds) != num_stages or len(capacity) != num_stages or len(memory) != num_layers:
        raise ValueError("one speed and memory size per stage, one memory size per layer")
    cost_prefix = [0.0]
    memory_prefix = [0]
    for cost, size in zip(layer_costs_s, memory, strict=True):
        cost_prefix.append(cost_prefix[-1] + cost)
        memory_prefix.append(memory_prefix[-1] + size)

    def stage_cost(stage: int, begin: int, end: int) -> float:
        if memory_prefix[end] - memory_prefix[begin] > capacity[stage]:
            return math.inf
        return (cost_prefix[end] - cost_prefix[begin]) / speeds[stage]

    # best[i][j]: the smallest bottleneck placing layers 0..j-1 on stages 0..i-1.
    best = [[math.inf] * (num_layers + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (num_layers + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for stage in range(1, num_stages + 1):
        for end in range(stage, num_layers - (num_stages - stage) + 1):
            for begin in range(stage - 1, end):
                value = max(best[stage - 1][begin], stage_cost(stage - 1, begin, end))
                if value < best[stage][end]:
                    best[stage][end] = value
                    cut[stage][end] = begin
    if math.isinf(best[num_stages][num_layers]):
        raise InfeasiblePlan(f"no cut of {num_layers} layers into {num_stages} stages fits the "
                             "devices' memory")
    bounds = [num_layers]
    for stage in range(num_stages, 0, -1):
        bounds.append(cut[stage][bounds[-1]])
    bounds.reverse()
    return _plan(bounds, cost_prefix, memory_prefix, speeds)


def even_split(num_layers: int, num_stages: int, layer_costs_s: Sequence[float],
               device_speeds: Sequence[float] | None = None) -> StagePlan:
    """The naive plan, for contrast: the same number of layers per stage."""
    bounds = [round(i * num_layers / num_stages) for i in range(num_stages + 1)]
    cost_prefix = [0.0]
    for cost in layer_costs_s:
        cost_prefix.append(cost_prefix[-1] + cost)
    return _plan(bounds, cost_prefix, [0] * (num_layers + 1),
                 list(device_speeds or [1.0] * num_stages))


def _plan(bounds: list[int], cost_prefix: list[float], memory_prefix: list[int],
          speeds: list[float]) -> StagePlan:
    costs = tuple((cost_prefix[e] - cost_prefix[b]) / speeds[i]
                  for i, (b, e) in enumerate(itertools.pairwise(bounds)))
    sizes = tuple(memory_prefix[e] - memory_prefix[b]
                  for b, e in itertools.pairwise(bounds))
    return StagePlan(tuple(bounds), costs, sizes)


def plan_stages_cost(plan: StagePlan, layer_costs_s: Sequence[float],
                     speeds: Sequence[float]) -> float:
    """The bottleneck of an existing cut at other device speeds."""
    return max(sum(layer_costs_s[j] for j in plan.layers(i)) / speeds[i]
               for i in range(len(speeds)))
