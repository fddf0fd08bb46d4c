"""How the placement benchmark reads recovery after a phase change from a run's per-second
counts, against runs whose answer is known."""

from __future__ import annotations

import math

import pytest

from benchmarks.placement import answers_recovery_s
from benchmarks.placement_sim import Run

pytestmark = pytest.mark.timeout(10)


def _run(sent: list[int], ok: list[int]) -> Run:
    run = Run.empty(phases=1, seconds=len(sent) - 1)
    run.sent_by_second[:] = sent
    run.ok_by_second[:] = ok
    return run


def test_a_second_with_fewer_arrivals_but_every_one_answered_counts_as_recovered() -> None:
    # Mean rate 100/s; second 6 holds 85 arrivals by chance and answers all of them. Against
    # the mean rate it would read as unrecovered and restart the clock at second 7.
    sent = [100, 100, 100, 100, 100, 100, 85, 100, 100, 100, 100]
    ok = [100, 40, 50, 95, 98, 97, 85, 99, 100, 98, 100]
    assert answers_recovery_s(_run(sent, ok), start_s=1.0, end_s=11.0) == 2.0


def test_a_later_dip_restarts_the_recovery() -> None:
    sent = [100] * 11
    ok = [100, 40, 95, 95, 80, 95, 95, 95, 95, 95, 100]
    assert answers_recovery_s(_run(sent, ok), start_s=1.0, end_s=11.0) == 4.0


def test_a_run_that_never_recovers_reads_infinite() -> None:
    sent = [100] * 6
    ok = [100, 50, 95, 95, 95, 50]
    # The second that ends the phase is left out: seconds 1 to 3 count, recovered at 2.
    assert answers_recovery_s(_run(sent, ok), start_s=1.0, end_s=5.0) == 1.0
    assert math.isinf(answers_recovery_s(_run(sent, [100, 50, 50, 50, 50, 50]),
                                         start_s=1.0, end_s=6.0))
