"""The real-server placement benchmark's traffic and tally, on the virtual-time loop: which
requests it sends when, in which phase they count, and how their answers land in the run."""

from __future__ import annotations

import itertools

import grpc
import pytest

from benchmarks.placement_bound import bound_per_s
from benchmarks.placement_real import (
    SETTLE_S,
    WARMUP_S,
    Arrival,
    Counts,
    Tally,
    arrivals,
    config_text,
    moves_while_counted,
    scaled,
)
from benchmarks.placement_sim import Phase, Run, Scenario, SimModel
from benchmarks.virtual_time import VirtualLoop
from evenflow.client import ServerOverloadedError
from evenflow.proto import evenflow_pb2 as ef

pytestmark = pytest.mark.timeout(20)

MODELS = (SimModel("a", 7.0, 0.010, 0.002), SimModel("b", 7.0, 0.010, 0.002))
TWO_PHASES = Scenario("two", MODELS, (Phase(20.0, (("a", 1.0),)), Phase(20.0, (("b", 1.0),))))


BEGIN_S = 100.0


def _arrivals(rate_per_s: float, seed: int) -> tuple[list[Arrival], list[float]]:
    """The arrivals from ``BEGIN_S``, and the loop's time at which each was yielded."""
    loop = VirtualLoop()

    async def collect() -> tuple[list[Arrival], list[float]]:
        got, at = [], []
        async for arrival in arrivals(TWO_PHASES, rate_per_s, seed, BEGIN_S):
            got.append(arrival)
            at.append(loop.time())
        return got, at

    try:
        return loop.run_until_complete(collect())
    finally:
        loop.close()


def test_each_request_is_sent_at_its_time_and_tagged_with_its_phase() -> None:
    got, sent_at = _arrivals(200.0, seed=3)
    assert sent_at == [a.at_s for a in got]
    assert all(x.at_s < y.at_s for x, y in itertools.pairwise(got))
    warmup = [a for a in got if a.phase == -1]
    first = [a for a in got if a.phase == 0]
    second = [a for a in got if a.phase == 1]
    assert len(warmup) + len(first) + len(second) == len(got)
    # The warm-up and the first phase run the first mix, the second phase its own.
    assert {a.model for a in warmup + first} == {"a"}
    assert {a.model for a in second} == {"b"}
    assert not any(a.counted for a in warmup)
    assert got[0].at_s > BEGIN_S and max(a.at_s for a in warmup) < BEGIN_S + WARMUP_S
    # Within a phase, exactly the requests after the settling time count.
    for index, requests in enumerate((first, second)):
        phase_start_s = BEGIN_S + WARMUP_S + 20.0 * index
        assert all(phase_start_s <= a.at_s < phase_start_s + 20.0 for a in requests)
        assert all(a.counted == (a.at_s >= phase_start_s + SETTLE_S) for a in requests)
        assert any(a.counted for a in requests) and not all(a.counted for a in requests)
    # About the rate asked for, over the warm-up and both phases.
    assert len(got) == pytest.approx(200.0 * (WARMUP_S + 40.0), rel=0.05)


def test_a_seed_gives_the_same_requests() -> None:
    first, _ = _arrivals(100.0, seed=5)
    again, _ = _arrivals(100.0, seed=5)
    other, _ = _arrivals(100.0, seed=6)
    assert [(a.model, a.at_s - first[0].at_s) for a in first] == \
        [(a.model, a.at_s - again[0].at_s) for a in again]
    assert [a.at_s - first[0].at_s for a in first[:10]] != \
        [a.at_s - other[0].at_s for a in other[:10]]


def test_the_tally_counts_answers_within_the_slo_and_failures_by_kind() -> None:
    run = Run.empty(phases=2, seconds=4)
    counts = Counts()
    tally = Tally(run, counts, slo_s=0.1, measured_from_s=10.0)
    warm = Arrival("a", 5.0, -1, counted=False)
    settling = Arrival("a", 10.5, 0, counted=False)
    fast = Arrival("a", 11.2, 0, counted=True)
    slow = Arrival("b", 12.3, 1, counted=True)
    refused = Arrival("b", 12.4, 1, counted=True)
    for arrival in (warm, settling, fast, slow, refused):
        tally.sent(arrival)
    tally.answered(warm, 5.05)
    tally.answered(settling, 10.55)
    tally.answered(fast, 11.25)
    tally.answered(slow, 12.5)  # 200 ms: answered, but after the SLO
    tally.failed(refused, ServerOverloadedError(grpc.StatusCode.RESOURCE_EXHAUSTED, "overloaded"))

    assert counts.sent == 5 and counts.ok == 4 and counts.unanswered == 0
    assert counts.by_status == {"ServerOverloadedError": 1}
    assert counts.ok_latency_s == pytest.approx(0.05 + 0.05 + 0.05 + 0.2)
    # Only requests after the settling time count towards a phase's goodput...
    assert run.phase_sent == [1, 2]
    assert run.phase_errors == [0, 1]
    assert [round(x, 3) for x in run.phase_latencies_s[0]] == [0.05]
    assert [round(x, 3) for x in run.phase_latencies_s[1]] == [0.2]
    # ...while recovery reads every second after the warm-up, by when a request was sent.
    assert run.sent_by_second == [1, 1, 2, 0, 0]
    assert run.ok_by_second == [1, 1, 0, 0, 0]


def test_a_time_scale_makes_batch_costs_and_the_bound_scale_together() -> None:
    slowed = scaled(TWO_PHASES, 4.0)
    assert [(m.base_s, m.per_sample_s) for m in slowed.models] == \
        [(pytest.approx(0.040), pytest.approx(0.008))] * 2
    assert slowed.phases == TWO_PHASES.phases and slowed.speeds == TWO_PHASES.speeds
    # Costs and SLO K times longer: the same placements fit, at 1/K of the rate.
    assert bound_per_s(slowed, 0.4) == pytest.approx(bound_per_s(TWO_PHASES, 0.1) / 4)
    assert 'sim_base_ms = 40' in config_text(slowed, 0.4)
    assert scaled(TWO_PHASES, 1.0) is TWO_PHASES


def test_only_moves_done_while_requests_count_are_reported_in_their_phase() -> None:
    begin_uptime_s = 3.0  # the server had run 3 s when the warm-up began
    phase_1_s = begin_uptime_s + WARMUP_S + TWO_PHASES.start_s(1)

    def move(at_s: float, outcome: str = "done") -> ef.PlacementMove:
        return ef.PlacementMove(at_s=at_s, kind="add", model="b", device="sim1",
                                reason="plan", took_s=2.0, outcome=outcome)

    moves = [move(begin_uptime_s + 1.0),  # in the warm-up
             move(phase_1_s + SETTLE_S - 0.5),  # still settling
             move(phase_1_s + SETTLE_S + 1.0),
             move(phase_1_s + SETTLE_S + 2.0, "skipped: no memory")]
    assert moves_while_counted(TWO_PHASES, moves, begin_uptime_s) == \
        [f"phase 1 +{SETTLE_S + 1.0:.1f} s: add b on sim1 (plan)"]
