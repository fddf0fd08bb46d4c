"""The placement planner: the LP, the capacity arithmetic of a placement, the greedy search
and the enumeration it is measured against, the floors an overflow swap keeps, the demand
meter, the tuner's hysteresis (alone and in the strategy) and the move budget. Pure functions
and plain objects: no loop, no clock but the numbers given."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Collection, Mapping, Sequence

import pytest

from evenflow.balancer.capacity import DeviceCost, largest_batch_within, rate_within_per_s
from evenflow.balancer.placement import auto
from evenflow.balancer.placement.assessment import assess
from evenflow.balancer.placement.auto import AutoSettings, AutoStrategy
from evenflow.balancer.placement.costs import CostBook
from evenflow.balancer.placement.demand import DemandMeter
from evenflow.balancer.placement.enumeration import best_placement
from evenflow.balancer.placement.inventory import (
    DeviceInfo,
    ModelProfile,
    Placement,
    devices_of,
    fits,
)
from evenflow.balancer.placement.moves import Move, floor_replicas, order_moves
from evenflow.balancer.placement.overflow import overflow_changes
from evenflow.balancer.placement.planner import (
    Plan,
    PlannerSettings,
    candidate_moves,
    propose,
    propose_greedy,
)
from evenflow.balancer.placement.simplex import maximize
from evenflow.balancer.placement.tuner import MoveBudget, Tuner, TunerSettings
from evenflow.balancer.placement.view import PlacerView

GIB = 2**30
SPEEDS = {"d0": 1.0, "d1": 1.0, "d2": 0.5, "d3": 0.25}
DEVICES = [DeviceInfo(name, (16 if speed >= 1 else 8) * GIB) for name, speed in SPEEDS.items()]


def profile(name: str, memory_gib: float, base_s: float = 0.01, per_sample_s: float = 0.002,
            **kwargs: object) -> ModelProfile:
    return ModelProfile(name, int(memory_gib * GIB),
                        {d: DeviceCost(base_s, per_sample_s, s) for d, s in SPEEDS.items()},
                        64, 0.05, **kwargs)  # type: ignore[arg-type]


PROFILES = {p.name: p for p in (profile("big", 9), profile("mid", 6, 0.006, 0.0012),
                                profile("small", 4, 0.004, 0.0008))}


def test_simplex_finds_the_optimum_of_a_textbook_program() -> None:
    value, x = maximize([3, 5], [[1, 0], [0, 2], [3, 2]], [4, 12, 18])
    assert value == pytest.approx(36.0)
    assert x == pytest.approx([2.0, 6.0])


def test_simplex_refuses_an_infeasible_origin_and_an_unbounded_program() -> None:
    with pytest.raises(ValueError, match="b >= 0"):
        maximize([1], [[1]], [-1])
    with pytest.raises(ValueError, match="unbounded"):
        maximize([1, 1], [[1, -1]], [1])


def test_simplex_matches_brute_force_on_random_small_programs() -> None:
    rng = random.Random(3)
    for _ in range(50):
        a = [[rng.uniform(0.1, 2.0) for _ in range(2)] for _ in range(3)]
        b = [rng.uniform(0.5, 3.0) for _ in range(3)]
        c = [rng.uniform(0.0, 2.0) for _ in range(2)]
        value, x = maximize(c, a, b)
        assert all(sum(r[j] * x[j] for j in range(2)) <= bi + 1e-9
                   for r, bi in zip(a, b, strict=True))
        grid = max(c[0] * u + c[1] * v for u, v in itertools.product(
            [i / 200 * 30 for i in range(201)], repeat=2)
            if all(r[0] * u + r[1] * v <= bi for r, bi in zip(a, b, strict=True)))
        assert value >= grid - 1e-9


def test_a_device_of_its_own_is_the_slo_limits_arithmetic() -> None:
    cost = DeviceCost(0.010, 0.002, 1.0)
    # 2 t(b) <= 50 ms: t(7) = 24 ms; shared by two busy models, 3 t(b) <= 50 ms: b = 3.
    assert largest_batch_within(cost, 0.05, 64) == 7
    assert largest_batch_within(cost, 0.05, 64, models_sharing=2) == 3
    assert rate_within_per_s(cost, 0.05, 64) == pytest.approx(7 / 0.024)


def test_assessment_shares_devices_and_charges_sharing() -> None:
    alone: Placement = frozenset({("big", "d0"), ("mid", "d1")})
    shared: Placement = frozenset({("big", "d0"), ("mid", "d0")})
    demand = {"big": 100.0, "mid": 100.0}
    a, b = assess(alone, PROFILES, demand), assess(shared, PROFILES, demand)
    assert a.headroom > b.headroom > 0.0
    assert sum(b.shares.values()) == pytest.approx(1.0)
    # A model with demand and no replica: nothing of the mix is served whole.
    assert assess(frozenset({("big", "d0")}), PROFILES, demand).headroom == 0.0
    # An idle model on a device does not slow the busy one there.
    idle_too: Placement = frozenset({("big", "d0"), ("mid", "d0")})
    assert assess(idle_too, PROFILES, {"big": 100.0}).headroom == pytest.approx(
        assess(frozenset({("big", "d0")}), PROFILES, {"big": 100.0}).headroom)


def test_memory_is_never_exceeded_by_any_plan() -> None:
    rng = random.Random(11)
    placement: Placement = frozenset()
    for _ in range(40):
        demand = {name: rng.choice([0.0, rng.uniform(10, 800)]) for name in PROFILES}
        plan = propose(placement, DEVICES, PROFILES, demand)
        assert fits(plan.placement, DEVICES, PROFILES)
        current = placement
        for move in plan.moves:  # every intermediate placement fits as well
            current = current | {(move.model, move.device)} if move.kind == "add" else \
                current - {(move.model, move.device)}
            if move.kind == "add":
                assert fits(current, DEVICES, PROFILES), plan.moves
        placement = plan.placement


def test_a_plan_keeps_every_model_with_demand_placed() -> None:
    rng = random.Random(5)
    placement, _ = best_placement(DEVICES, PROFILES, {"big": 300.0, "mid": 100.0,
                                                       "small": 50.0})
    for _ in range(30):
        demand = {name: rng.uniform(1.0, 600.0) for name in PROFILES}
        plan = propose(placement, DEVICES, PROFILES, demand)
        current = placement
        for move in plan.moves:
            current = current - {(move.model, move.device)} if move.kind == "drop" else \
                current | {(move.model, move.device)}
            # Every step on the way fits, and leaves every model (each has demand) a replica:
            # a swap's drop frees memory for another model's add, never its model's last one.
            assert fits(current, DEVICES, PROFILES), plan.moves
            assert all(devices_of(current, name) for name in PROFILES), (current, plan.moves)
        for name in PROFILES:
            assert devices_of(plan.placement, name), (name, plan.moves)
        placement = plan.placement


FIRST = {"big": 600.0, "mid": 300.0, "small": 100.0}
SECOND = {"big": 100.0, "mid": 300.0, "small": 600.0}


def test_the_exact_planner_moves_to_near_the_best_placement_in_one_plan() -> None:
    placement, _ = best_placement(DEVICES, PROFILES, FIRST)
    plan = propose(placement, DEVICES, PROFILES, SECOND)
    _, best = best_placement(DEVICES, PROFILES, SECOND)
    assert plan.before.headroom < 0.9 * best.headroom
    assert plan.after.headroom >= 0.97 * best.headroom
    assert 0 < len(plan.moves) <= PlannerSettings().max_moves


def test_the_greedy_planner_follows_a_shift_as_well() -> None:
    placement, _ = best_placement(DEVICES, PROFILES, FIRST)
    before = assess(placement, PROFILES, SECOND).headroom
    for _ in range(3):  # three plans: a few moves each
        placement = propose_greedy(placement, DEVICES, PROFILES, SECOND).placement
    _, best = best_placement(DEVICES, PROFILES, SECOND)
    after = assess(placement, PROFILES, SECOND).headroom
    assert after > before
    assert after >= 0.75 * best.headroom


def test_moves_are_ordered_so_no_model_drops_below_its_floor() -> None:
    devices = [DeviceInfo("d0", 10 * GIB), DeviceInfo("d1", 10 * GIB)]
    profiles = {"a": profile("a", 8), "b": profile("b", 8)}
    demand = {"a": 10.0, "b": 10.0}
    # Trading places between two full devices: each would have to leave before the other
    # arrives, so there is no order that keeps both served.
    assert order_moves(frozenset({("a", "d0"), ("b", "d1")}), frozenset({("a", "d1"),
                       ("b", "d0")}), devices, profiles, demand) is None
    # With room for one more, the move is: a's new replica first, then its old one leaves.
    roomy = [DeviceInfo("d0", 10 * GIB), DeviceInfo("d1", 20 * GIB)]
    moves = order_moves(frozenset({("a", "d0"), ("b", "d1")}),
                        frozenset({("a", "d1"), ("b", "d1")}), roomy, profiles, demand)
    assert moves == (Move("add", "a", "d1"), Move("drop", "a", "d0"))


def test_a_good_placement_is_left_alone() -> None:
    demand = {"big": 600.0, "mid": 300.0, "small": 100.0}
    placement, _ = best_placement(DEVICES, PROFILES, demand)
    jittered = {name: rate * 1.02 for name, rate in demand.items()}
    assert propose(placement, DEVICES, PROFILES, jittered).moves == ()


def test_floors_pins_and_maximum_counts() -> None:
    profiles = {**PROFILES, "mid": profile("mid", 6, pinned=frozenset({"d3"}), max_replicas=1),
                "small": profile("small", 4, min_replicas=2)}
    plan = propose(frozenset(), DEVICES, profiles, {"big": 500.0, "mid": 500.0})
    assert devices_of(plan.placement, "mid") == ["d3"]
    assert len(devices_of(plan.placement, "small")) >= 2
    assert floor_replicas(profiles["small"], 0.0) == 2
    assert floor_replicas(PROFILES["big"], 0.0) == 0
    assert floor_replicas(PROFILES["big"], 1.0) == 1


def test_an_overflow_replica_is_not_swapped_out_below_its_models_minimum() -> None:
    # b is hot and alone on d0; a has two replicas, one of them d3's overflow replica. b is
    # clearly needier, so d3 changes hands; unless a's minimum is two, which the drop would
    # refuse (and the add after it would fail for memory, tick after tick).
    profiles = {name: profile(name, 7) for name in "abc"}
    held: Placement = frozenset({("b", "d0"), ("c", "d1"), ("a", "d2"), ("a", "d3")})
    hot_b = {"a": 80.0, "b": 240.0, "c": 80.0}
    assert overflow_changes(held, DEVICES, profiles, hot_b) == ([("a", "d3")], [("b", "d3")])
    floored = {**profiles, "a": profile("a", 7, min_replicas=2)}
    assert overflow_changes(held, DEVICES, floored, hot_b) == ([], [])


def test_a_model_that_fits_nowhere_is_not_placed() -> None:
    profiles = {**PROFILES, "huge": profile("huge", 20)}
    plan = propose(frozenset(), DEVICES, profiles, {"huge": 100.0, "big": 100.0})
    assert not devices_of(plan.placement, "huge")
    assert devices_of(plan.placement, "big")


def test_demand_meter_short_and_long_windows() -> None:
    meter = DemandMeter(short_window_s=2.0, long_tau_s=30.0)
    count = 0
    assert meter.samples_per_request == 1.0  # nothing measured yet
    requests = 0
    for step in range(41):  # 100 samples/s in 4-sample requests for 20 s
        meter.observe(count, requests, step * 0.5)
        count += 50
        requests += 12 if step % 2 else 13
    assert meter.short_per_s == pytest.approx(100.0, rel=0.01)
    assert meter.long_per_s == pytest.approx(100.0, rel=0.01)
    assert meter.short_requests_per_s == pytest.approx(25.0, rel=0.05)
    assert meter.samples_per_request == pytest.approx(4.0, rel=0.05)
    for step in range(41, 46):  # then nothing: 2 s later the short window has forgotten
        meter.observe(count, requests, step * 0.5)
    assert meter.short_per_s == 0.0
    assert meter.samples_per_request == pytest.approx(4.0, rel=0.05)  # the long window's
    for step in range(46, 61):
        meter.observe(count, requests, step * 0.5)
    assert 50.0 < meter.long_per_s < 100.0
    assert meter.idle_for_s(30.0) == pytest.approx(10.0, abs=0.5)


def decided(tuner: Tuner, model: str, mean_work_s: float, slo_s: float) -> str | None:
    """One tick's signal, decided on at once (as the strategy does when it is the model's
    turn)."""
    signal = tuner.observe(model, mean_work_s, slo_s)
    if signal is not None:
        tuner.settle(model)
    return signal


def test_tuner_hysteresis_holds_under_an_oscillating_load() -> None:
    tuner = Tuner(TunerSettings(add_above=0.5, drop_below=0.02, hold_ticks=4,
                                drop_hold_ticks=8))
    slo_s = 0.05
    # Over and under the add threshold every other tick: never a decision.
    signals = [decided(tuner, "m", 0.04 if tick % 2 else 0.01, slo_s) for tick in range(200)]
    assert set(signals) == {None}
    # Over for four ticks in a row: one add, then quiet while the replica loads.
    signals = [decided(tuner, "m", 0.04, slo_s) for _ in range(8)]
    assert signals.count("add") == 1
    signals = [decided(tuner, "m", 0.0, slo_s) for _ in range(30)]
    assert signals.count("drop") == 2  # every 8 + 4 quiet ticks


def tuner_drops(monkeypatch: pytest.MonkeyPatch, works: Sequence[Mapping[str, float]],
                in_flight: Collection[int] = ()) -> dict[int, list[Move]]:
    """The tuner's drops, by tick, for a and b, each with a replica on d0 and d1 and no
    demand, given each tick's mean outstanding work (``works``) and the ticks with moves in
    flight. Plans move nothing, so the tuner is alone in deciding, and holds for 4 ticks."""
    def no_moves(placement: Placement, *_: object) -> Plan:
        before = assess(placement, profiles, {})
        return Plan(placement, (), before, before)

    monkeypatch.setattr(auto, "propose", no_moves)
    devices = DEVICES[:2]
    profiles = {name: profile(name, 4) for name in "ab"}
    placed: Placement = frozenset((name, d.name) for name in profiles for d in devices)
    strategy = AutoStrategy(AutoSettings(plan_interval_s=1e9, tuner_pause_s=0.0,
                                         tuner=TunerSettings(hold_ticks=4, drop_hold_ticks=4)))
    drops: dict[int, list[Move]] = {}
    idle = dict.fromkeys(profiles, 0.0)
    for tick, work_s in enumerate(works):
        view = PlacerView(0.5 * tick, devices, profiles, placed, placed, idle, idle, work_s,
                          moves_left=30, moves_in_flight=1 if tick in in_flight else 0)
        moved = [move for move, reason in strategy.moves(view) if reason == "tuner"]
        if moved:
            drops[tick] = moved
    return drops


def test_the_tuner_counts_a_model_on_a_tick_another_model_moves(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a's work is under the drop threshold every tick; b's too but on tick 4, when it is
    # between the thresholds. a's drop comes first, and b's run of ticks restarts at tick 4
    # whether or not a moved then: b gives a replica back at tick 8, 4 ticks under after it.
    under, between = 0.0, 0.1 * profile("b", 4).slo_s
    works = [{"a": under, "b": between if tick == 4 else under} for tick in range(10)]
    drops = tuner_drops(monkeypatch, works)
    first_b = min(tick for tick, moves in drops.items() if moves[0].model == "b")
    assert first_b == 8, drops


def test_a_tick_the_tuner_sits_out_breaks_its_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Under the drop threshold every tick, with moves in flight on tick 2: the 4 ticks in a
    # row are 3 to 6, not 0, 1, 3 and 4 around the pause.
    works = [{"a": 0.0, "b": 0.0} for _ in range(8)]
    drops = tuner_drops(monkeypatch, works, in_flight={2})
    assert min(drops) == 6, drops


def test_move_budget_is_per_minute() -> None:
    budget = MoveBudget(3)
    budget.spend(0.0, 2)
    assert budget.left(10.0) == 1
    budget.spend(30.0)
    assert budget.left(59.0) == 0
    assert budget.left(60.5) == 2
    assert budget.left(90.5) == 3


def test_cost_book_prefers_measurements_and_rescales_them() -> None:
    book = CostBook({"d0": 1.0, "d2": 0.5})
    prior = DeviceCost(0.002, 0.0002)
    assert book.cost("m", "d2", prior).batch_s(1) == pytest.approx(prior.batch_s(1) / 0.5)
    book.observe("m", "d0", 0.010, 0.002)
    assert book.cost("m", "d0", prior).batch_s(1) == pytest.approx(0.012)
    assert book.cost("m", "d2", prior).batch_s(1) == pytest.approx(0.024)
    book.forget("m")
    assert math.isclose(book.cost("m", "d0", prior).batch_s(1), prior.batch_s(1))


def test_a_fit_at_one_batch_size_rescales_the_known_cost_there() -> None:
    book = CostBook({"d0": 1.0, "d2": 0.5})
    prior = DeviceCost(0.002, 0.0002)
    book.observe("m", "d0", 0.010, 0.002)
    # On d2 the model is estimated at 2x d0's cost; one-sample batches take 30 ms there.
    book.observe_at("m", "d2", 1, 0.030, prior)
    cost = book.cost("m", "d2", prior)
    assert cost.batch_s(1) == pytest.approx(0.030)
    assert cost.base_s / cost.per_sample_s == pytest.approx(5.0)  # d0's split, kept


def test_a_mean_over_batches_of_one_and_two_rescales_exactly() -> None:
    # Batches of one (48 ms) and, a tenth of the time, two (56 ms) on a speed-0.25 device: at
    # a 100 ms SLO one-sample batches fit twice (96 ms); the cost at one must read 48 ms, not
    # the mean latency (48.8 ms) taken as one sample's.
    book = CostBook({"slow": 0.25})
    prior = DeviceCost(0.010, 0.002)
    book.observe_at("m", "slow", 1.1, 0.9 * 0.048 + 0.1 * 0.056, prior)
    assert book.cost("m", "slow", prior).batch_s(1) == pytest.approx(0.048)


def test_a_model_measured_only_at_one_size_on_a_slow_device_is_estimated_right_elsewhere(
) -> None:
    # Its only measurement is rescaled from the prior at the device's declared speed: the
    # estimate on a device four times as fast must be a quarter of it, not a sixteenth.
    book = CostBook({"fast": 1.0, "slow": 0.25})
    prior = DeviceCost(0.010, 0.002)
    book.observe_at("m", "slow", 1, 0.048, prior)
    assert book.cost("m", "slow", prior).batch_s(1) == pytest.approx(0.048)
    assert book.cost("m", "fast", prior).batch_s(1) == pytest.approx(0.012)


def test_a_device_that_steps_slower_for_one_model_is_slower_for_every_model_there() -> None:
    book = CostBook({"d0": 1.0, "d1": 1.0})
    prior = DeviceCost(0.002, 0.0002)
    book.observe("a", "d0", 0.010, 0.002)
    book.observe("b", "d0", 0.020, 0.004)
    book.observe("b", "d1", 0.020, 0.004)
    book.observe_at("a", "d0", 1, 0.048, prior)  # a re-learned d0 at 4x
    assert book.cost("b", "d0", prior).batch_s(1) == pytest.approx(0.096)
    assert book.cost("b", "d1", prior).batch_s(1) == pytest.approx(0.024)  # another device
    # b's replica on d0 reports its old fit again, unchanged (it ran nothing meanwhile): that
    # is no measurement, and the slowdown stands.
    book.observe("b", "d0", 0.020, 0.004)
    assert book.cost("b", "d0", prior).batch_s(1) == pytest.approx(0.096)
    # Its fit moves: that is a measurement, and it is b's cost there (a small move, no step).
    book.observe("b", "d0", 0.080, 0.014)
    assert book.cost("b", "d0", prior).batch_s(1) == pytest.approx(0.094)
    assert book.cost("a", "d0", prior).batch_s(1) == pytest.approx(0.048)


def test_a_fit_that_only_splits_its_cost_anew_is_no_step_of_the_device() -> None:
    # a ran batches of 8 only (17 ms): its cost is the prior's split scaled there, 12.75 ms at
    # one sample. Then its batches vary, and the fit learns its real split, 1 ms + 2 ms per
    # sample: 3 ms at one sample, 4x less, but the same 17 ms at the size it runs. Nothing
    # about the device changed, so b's cost there stays.
    book = CostBook({"d0": 1.0})
    prior = DeviceCost(0.010, 0.0005)
    book.observe_at("a", "d0", 8, 0.017, prior)
    assert book.cost("a", "d0", prior).batch_s(1) == pytest.approx(0.01275)
    book.observe("b", "d0", 0.004, 0.0004, 1.0)
    book.observe("a", "d0", 0.001, 0.002, 8.0)
    assert book.cost("b", "d0", prior).batch_s(1) == pytest.approx(0.0044)
    # The device slowing 3x shows at the size a runs, and b's cost follows.
    book.observe("a", "d0", 0.003, 0.006, 8.0)
    assert book.cost("b", "d0", prior).batch_s(1) == pytest.approx(0.0132)


def test_candidate_moves_come_in_the_same_order_whatever_the_string_hashes() -> None:
    # The greedy search keeps the first of equally good moves, so their order decides the plan;
    # a frozenset's order follows string hashes, which differ between processes.
    small = {f"m{i}": profile(f"m{i}", 2) for i in range(6)}
    placement: Placement = frozenset((name, "d0") for name in reversed(sorted(small)))
    placement |= {(name, "d1") for name in small}
    drops = [step[0].model for step, _ in candidate_moves(placement, DEVICES, small,
                                                          dict.fromkeys(small, 10.0))
             if len(step) == 1 and step[0].kind == "drop" and step[0].device == "d0"]
    assert drops == sorted(small)


@pytest.mark.parametrize(("p_load_s", "q_load_s", "added"), [(30.0, 1.0, "q"), (1.0, 30.0, "p")])
def test_between_near_equal_placements_the_planner_loads_the_quicker_model(
        p_load_s: float, q_load_s: float, added: str) -> None:
    # p and q, alike but for their load times, share d0 and are both short of capacity; a
    # replica of either on the free d1 serves them equally well.
    devices = [DeviceInfo("d0", 16 * GIB), DeviceInfo("d1", 16 * GIB)]
    costs = {d: DeviceCost(0.01, 0.002, 1.0) for d in ("d0", "d1")}
    profiles = {"p": ModelProfile("p", 7 * GIB, costs, 64, 0.05, load_s=p_load_s),
                "q": ModelProfile("q", 7 * GIB, costs, 64, 0.05, load_s=q_load_s)}
    placed: Placement = frozenset({("p", "d0"), ("q", "d0")})
    demand = {"p": 150.0, "q": 150.0}
    for search in (propose, propose_greedy):
        plan = search(placed, devices, profiles, demand)
        assert [m for m in plan.moves if m.kind == "add"] == [Move("add", added, "d1")]
