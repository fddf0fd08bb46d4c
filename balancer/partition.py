"""Cutting a chain of layers into contiguous pipeline stages, one stage per device.

``plan_stages_per_device`` is exact: a dynamic programme over (stage, first layer of the next
stage) that minimises the slowest stage's time, where layer ``j`` costs
``stage_layer_costs_s[i][j]`` on stage ``i``'s device and every stage must fit in its device's
memory. O(S * L^2) for S stages and L layers. Costs per device, not one cost per layer scaled by a
device speed, because devices differ per layer: a GPU speeds a matmul up far more than a norm.
``plan_stages`` is the special case of one cost per layer and a speed per device.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

CostMatrix = Sequence[Sequence[float]]  # [stage][layer] seconds


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


def scaled_costs(layer_costs_s: Sequence[float],
                 device_speeds: Sequence[float]) -> list[list[float]]:
    """The cost matrix of layers that take ``layer_costs_s[j] / device_speeds[i]`` on device i."""
    return [[cost / speed for cost in layer_costs_s] for speed in device_speeds]


def plan_stages(layer_costs_s: Sequence[float], num_stages: int, *,
                device_speeds: Sequence[float] | None = None,
                layer_memory_bytes: Sequence[int] | None = None,
                device_memory_bytes: Sequence[float] | None = None) -> StagePlan:
    """Best contiguous cut of the layers into ``num_stages`` non-empty stages.

    ``layer_costs_s[j]`` is layer j's time on a device of speed 1; on device i it takes
    ``layer_costs_s[j] / device_speeds[i]``.
    """
    speeds = list(device_speeds or [1.0] * num_stages)
    if len(speeds) != num_stages:
        raise ValueError("one speed per stage")
    if not 1 <= num_stages <= len(layer_costs_s):
        raise ValueError(f"cannot cut {len(layer_costs_s)} layers into {num_stages} stages")
    return plan_stages_per_device(scaled_costs(layer_costs_s, speeds),
                                  layer_memory_bytes=layer_memory_bytes,
                                  device_memory_bytes=device_memory_bytes)


def plan_stages_per_device(stage_layer_costs_s: CostMatrix, *,
                           layer_memory_bytes: Sequence[int] | None = None,
                           device_memory_bytes: Sequence[float] | None = None) -> StagePlan:
    """Best contiguous cut into one non-empty stage per row of ``stage_layer_costs_s``, where
    ``stage_layer_costs_s[i][j]`` is layer j's time on stage i's device."""
    num_stages = len(stage_layer_costs_s)
    num_layers = len(stage_layer_costs_s[0]) if num_stages else 0
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"cannot cut {num_layers} layers into {num_stages} stages")
    if any(len(row) != num_layers for row in stage_layer_costs_s):
        raise ValueError("every stage needs a cost for every layer")
    memory = list(layer_memory_bytes or [0] * num_layers)
    capacity = list(device_memory_bytes or [math.inf] * num_stages)
    if len(capacity) != num_stages or len(memory) != num_layers:
        raise ValueError("one memory size per stage and one per layer")
    cost_prefix = [_prefix(row) for row in stage_layer_costs_s]
    memory_prefix = _prefix_bytes(memory)

    def stage_cost(stage: int, begin: int, end: int) -> float:
        if memory_prefix[end] - memory_prefix[begin] > capacity[stage]:
            return math.inf
        return cost_prefix[stage][end] - cost_prefix[stage][begin]

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
    return _plan(bounds, cost_prefix, memory_prefix)


def even_split(num_layers: int, num_stages: int, layer_costs_s: Sequence[float],
               device_speeds: Sequence[float] | None = None) -> StagePlan:
    """The naive plan, for contrast: the same number of layers per stage."""
    return even_split_per_device(scaled_costs(layer_costs_s,
                                              list(device_speeds or [1.0] * num_stages)))


def even_split_per_device(stage_layer_costs_s: CostMatrix) -> StagePlan:
    """The same number of layers per stage, costed with each stage's own device's costs."""
    num_stages = len(stage_layer_costs_s)
    num_layers = len(stage_layer_costs_s[0])
    bounds = [round(i * num_layers / num_stages) for i in range(num_stages + 1)]
    return _plan(bounds, [_prefix(row) for row in stage_layer_costs_s],
                 [0] * (num_layers + 1))


def _prefix(values: Sequence[float]) -> list[float]:
    return [0.0, *itertools.accumulate(values)]


def _prefix_bytes(values: Sequence[int]) -> list[int]:
    return [0, *itertools.accumulate(values)]


def _plan(bounds: list[int], cost_prefix: Sequence[Sequence[float]],
          memory_prefix: Sequence[int]) -> StagePlan:
    costs = tuple(cost_prefix[i][e] - cost_prefix[i][b]
                  for i, (b, e) in enumerate(itertools.pairwise(bounds)))
    sizes = tuple(memory_prefix[e] - memory_prefix[b]
                  for b, e in itertools.pairwise(bounds))
    return StagePlan(tuple(bounds), costs, sizes)


def plan_stages_cost(plan: StagePlan, layer_costs_s: Sequence[float],
                     speeds: Sequence[float]) -> float:
    """The bottleneck of an existing cut at other device speeds."""
    return plan_cost_per_device(plan, scaled_costs(layer_costs_s, speeds))


def plan_cost_per_device(plan: StagePlan, stage_layer_costs_s: CostMatrix) -> float:
    """The bottleneck of an existing cut under another cost matrix."""
    return max(sum(row[j] for j in plan.layers(i)) for i, row in enumerate(stage_layer_costs_s))
