import pytest

from evenflow.balancer import LatencyModel
from evenflow.balancer.capacity import rate_within_per_s
from evenflow.balancer.estimator import MIN_BATCH_S
from evenflow.server.config.server_config import ModelConfig
from evenflow.server.engine.placement import prior_cost
from evenflow.server.models.builtin import build_sim
from evenflow.server.models.spec import SimProfile


def feed(model: LatencyModel, base_s: float, per_sample_s: float, sizes: list[int]) -> None:
    for size in sizes:
        model.observe(size, base_s + per_sample_s * size)


def test_fit_recovers_linear_cost() -> None:
    model = LatencyModel()
    feed(model, 0.010, 0.002, [1, 4, 8, 16, 32, 2, 12] * 3)
    fit = model.fit
    assert fit.base_s == pytest.approx(0.010, rel=1e-6)
    assert fit.per_sample_s == pytest.approx(0.002, rel=1e-6)
    assert fit.reliable


def test_single_batch_size_scales_prior_and_is_unreliable() -> None:
    model = LatencyModel(prior_base_s=0.004, prior_per_sample_s=0.001)
    feed(model, 0.010, 0.002, [8] * 10)  # t(8) = 0.026; prior t(8) = 0.012
    fit = model.fit
    assert fit.predict_s(8) == pytest.approx(0.026)
    assert not fit.reliable
    # Accurate at that size, though: settled there (the placement's cost book uses it).
    assert fit.settled and fit.batch_size == pytest.approx(8.0)


def test_a_prior_of_no_cost_prices_a_batch_at_the_floor_and_still_scales() -> None:
    model = LatencyModel(prior_base_s=0.0, prior_per_sample_s=0.0)
    assert model.fit.predict_s(1) == MIN_BATCH_S  # never free: routing divides by it
    feed(model, 0.010, 0.002, [8] * 10)  # one size: the floor's split (all fixed), scaled
    assert model.fit.predict_s(8) == pytest.approx(0.026)
    with pytest.raises(ValueError, match="prior"):
        LatencyModel(prior_base_s=-0.001)


def test_a_step_learned_at_one_batch_size_settles_there_without_being_reliable() -> None:
    # A device slows 4x and its SLO now holds the replica to batches of one.
    model = LatencyModel()
    feed(model, 0.010, 0.002, [1, 4, 8, 16, 32, 2, 12, 6] * 5)
    assert model.fit.reliable
    feed(model, 0.040, 0.008, [1] * 3)
    assert model.num_step_changes == 1 and not model.fit.settled  # not accurate lately yet
    feed(model, 0.040, 0.008, [1] * 10)
    fit = model.fit
    assert fit.settled and not fit.reliable
    assert (fit.batch_size, fit.latency_s) == (pytest.approx(1.0), pytest.approx(0.048))
    assert fit.predict_s(1) == pytest.approx(0.048)


def test_step_change_is_learned_quickly() -> None:
    model = LatencyModel()
    sizes = [1, 4, 8, 16, 32, 2, 12, 6]
    feed(model, 0.010, 0.002, sizes * 5)
    feed(model, 0.040, 0.008, sizes * 2)  # the device became 4x slower
    assert model.num_step_changes >= 1
    assert model.fit.predict_s(16) == pytest.approx(0.040 + 0.008 * 16, rel=0.05)


def test_noisy_flat_slope_never_goes_negative() -> None:
    model = LatencyModel()
    for size, latency in [(1, 0.011), (2, 0.010), (3, 0.0105), (4, 0.0098)] * 4:
        model.observe(size, latency)
    assert model.fit.per_sample_s > 0
    assert model.fit.base_s >= 0


def test_forgetting_must_be_a_fraction() -> None:
    with pytest.raises(ValueError):
        LatencyModel(forgetting=1.0)


def test_a_simulated_model_of_no_cost_gets_a_finite_capacity() -> None:
    """A ``sim`` model at 0 ms (it measures the server around it) is priced by its declared
    cost before it runs: the placement's capacity arithmetic divided by it."""
    free = SimProfile(base_ms=0.0, per_sample_ms=0.0)
    cost = prior_cost(ModelConfig(name="sim", source="sim", sim_profile=free),
                      build_sim(free))
    assert cost.batch_s(1) == MIN_BATCH_S
    assert 0.0 < rate_within_per_s(cost, slo_s=0.05, max_batch=64) < float("inf")
