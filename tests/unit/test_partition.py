import itertools
import math
import random

import pytest

from evenflow.balancer.partition import (
    InfeasiblePlan,
    even_split,
    even_split_per_device,
    plan_cost_per_device,
    plan_stages,
    plan_stages_per_device,
)


def brute_force(costs: list[float], stages: int, speeds: list[float],
                memory: list[int] | None = None, capacity: list[float] | None = None) -> float:
    best = math.inf
    n = len(costs)
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        worst = 0.0
        for i in range(stages):
            b, e = bounds[i], bounds[i + 1]
            if memory and capacity and sum(memory[b:e]) > capacity[i]:
                worst = math.inf
                break
            worst = max(worst, sum(costs[b:e]) / speeds[i])
        best = min(best, worst)
    return best


def test_known_costs_give_the_optimal_cut() -> None:
    plan = plan_stages([4, 1, 1, 1, 1, 4], 2)
    assert plan.bounds == (0, 3, 6)
    assert plan.stage_costs_s == (6, 6)
    plan = plan_stages([5, 1, 1, 1, 1, 1, 1, 1], 2)
    assert plan.bottleneck_s == 6
    assert plan.bounds == (0, 2, 8)


def test_slower_device_gets_fewer_layers() -> None:
    plan = plan_stages([1.0] * 9, 2, device_speeds=[1.0, 0.5])
    assert plan.bounds == (0, 6, 9)  # 6 layers at speed 1 vs 3 at speed 0.5: both 6


@pytest.mark.parametrize("seed", range(25))
def test_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    layers = rng.randint(2, 9)
    stages = rng.randint(1, min(4, layers))
    costs = [rng.uniform(0.1, 5.0) for _ in range(layers)]
    speeds = [rng.choice([0.25, 0.5, 1.0, 2.0]) for _ in range(stages)]
    plan = plan_stages(costs, stages, device_speeds=speeds)
    assert plan.bottleneck_s == pytest.approx(brute_force(costs, stages, speeds))
    assert plan.bounds[0] == 0 and plan.bounds[-1] == layers
    assert all(b < e for b, e in zip(plan.bounds, plan.bounds[1:], strict=False))


def test_memory_limits_are_respected() -> None:
    costs = [1.0] * 6
    memory = [10, 10, 10, 10, 10, 50]
    # Unconstrained, 3/3 is best; the last device holds only 60 bytes, the first 40.
    plan = plan_stages(costs, 2, layer_memory_bytes=memory, device_memory_bytes=[40, 60])
    assert plan.bounds == (0, 4, 6)
    assert plan.stage_memory_bytes == (40, 60)
    assert plan.bottleneck_s == brute_force(costs, 2, [1, 1], memory, [40, 60])


def test_infeasible_memory_is_an_error() -> None:
    with pytest.raises(InfeasiblePlan):
        plan_stages([1.0, 1.0], 2, layer_memory_bytes=[10, 100], device_memory_bytes=[50, 50])


def test_even_split_is_by_count() -> None:
    plan = even_split(8, 4, [8, 1, 1, 1, 1, 1, 1, 8])
    assert plan.bounds == (0, 2, 4, 6, 8)
    assert plan.bottleneck_s == 9


def test_bad_stage_count() -> None:
    with pytest.raises(ValueError):
        plan_stages([1.0], 2)


def brute_force_per_device(costs: list[list[float]]) -> float:
    stages, n = len(costs), len(costs[0])
    best = math.inf
    for cuts in itertools.combinations(range(1, n), stages - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(costs[i][bounds[i]:bounds[i + 1]]) for i in range(stages)))
    return best


def test_per_device_costs_follow_each_device_not_one_speed() -> None:
    # Device 0 is fast at the first layers, device 1 at the last: no single speed ratio says so.
    plan = plan_stages_per_device([[1.0, 1.0, 8.0], [8.0, 2.0, 1.0]])
    assert plan.bounds == (0, 2, 3)
    assert plan.stage_costs_s == (2.0, 1.0)
    assert plan_cost_per_device(plan, [[1.0, 1.0, 8.0], [8.0, 2.0, 1.0]]) == 2.0
    assert plan_cost_per_device(plan, [[2.0, 2.0, 8.0], [8.0, 2.0, 3.0]]) == 4.0


@pytest.mark.parametrize("seed", range(25))
def test_per_device_matches_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    layers = rng.randint(2, 9)
    stages = rng.randint(1, min(4, layers))
    costs = [[rng.uniform(0.1, 5.0) for _ in range(layers)] for _ in range(stages)]
    plan = plan_stages_per_device(costs)
    assert plan.bottleneck_s == pytest.approx(brute_force_per_device(costs))
    assert plan.bottleneck_s == pytest.approx(plan_cost_per_device(plan, costs))


def test_per_device_memory_limits_and_bad_shapes() -> None:
    costs = [[1.0] * 4, [1.0] * 4]
    plan = plan_stages_per_device(costs, layer_memory_bytes=[10, 10, 10, 30],
                                  device_memory_bytes=[30, 30])
    assert plan.bounds == (0, 3, 4)
    with pytest.raises(InfeasiblePlan):
        plan_stages_per_device(costs, layer_memory_bytes=[10, 10, 10, 40],
                               device_memory_bytes=[30, 30])
    with pytest.raises(ValueError):
        plan_stages_per_device([[1.0, 1.0], [1.0]])


def test_even_split_per_device_costs_each_stage_on_its_device() -> None:
    plan = even_split_per_device([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]])
    assert plan.bounds == (0, 2, 4)
    assert plan.stage_costs_s == (3.0, 70.0)
