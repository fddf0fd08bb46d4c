"""The one percentile definition (nearest rank) every report uses."""

from __future__ import annotations

import numpy as np
import pytest

from evenflow.loadtest.percentiles import ordered_percentile, percentile


def test_nearest_rank_on_a_small_list() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]  # the textbook example
    assert [percentile(values, q) for q in (0.0, 0.05, 0.3, 0.4, 0.5, 1.0)] == [
        15.0, 15.0, 20.0, 20.0, 35.0, 50.0]


def test_matches_numpy_inverted_cdf_and_accepts_any_order() -> None:
    values = np.random.default_rng(0).exponential(size=1001)
    for q in (0.5, 0.9, 0.99, 0.999):
        assert percentile(values.tolist(), q) == np.quantile(values, q, method="inverted_cdf")
    assert ordered_percentile(np.sort(values), 0.99) == percentile(values.tolist(), 0.99)


def test_p99_of_100_values_is_the_99th() -> None:
    assert percentile(range(1, 101), 0.99) == 99.0


@pytest.mark.parametrize(("values", "q"), [([], 0.5), ([1.0], 1.5), ([1.0], -0.1)])
def test_bad_arguments_are_refused(values: list[float], q: float) -> None:
    with pytest.raises(ValueError):
        percentile(values, q)


def test_the_admission_margin_rises_at_once_and_falls_lazily() -> None:
    from evenflow.balancer.stats import Lateness

    lateness = Lateness(window=512, quantile=0.99)
    for _ in range(100):
        lateness.add(0.001)
        lateness.refresh(0.0)
    assert lateness.margin_s == pytest.approx(0.001)
    for _ in range(20):  # a stall: answers come 50 ms later than predicted
        lateness.add(0.050)
    lateness.refresh(0.0)
    assert lateness.margin_s == pytest.approx(0.050)  # raised by the next refresh
    for _ in range(600):  # the stall has left the window; the margin falls back, lazily
        lateness.add(0.0)
        lateness.refresh(0.0)
    assert lateness.margin_s == 0.0


def test_a_margin_no_answer_has_renewed_lately_is_forgotten_with_its_window() -> None:
    from evenflow.balancer.stats import LATENESS_FORGET_S, Lateness

    lateness = Lateness()
    lateness.add(0.015)
    lateness.refresh(0.0)
    assert lateness.margin_at(LATENESS_FORGET_S) == pytest.approx(0.015)  # fresh at the limit
    assert lateness.margin_at(LATENESS_FORGET_S + 0.001) == 0.0
    lateness.add(0.001)  # the old value went with the window: the next margin is the new one
    lateness.refresh(LATENESS_FORGET_S + 0.002)
    assert lateness.margin_at(LATENESS_FORGET_S + 0.002) == pytest.approx(0.001)
