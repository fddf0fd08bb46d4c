import pytest

from evenflow.balancer import BatchSizeController, LatencyFit, LatencyModel, best_batch_size


@pytest.mark.parametrize(
    ("base_s", "per_sample_s", "target_s", "max_wait_s", "cap", "expected"),
    [
        (0.010, 0.002, 0.050, 0.002, 64, 7),  # (0.048/2 - 0.010) / 0.002 = 7
        (0.001, 0.0001, 0.050, 0.0, 64, 64),  # the cap binds
        (0.001, 0.0001, 0.050, 0.0, 1000, 240),
        (0.040, 0.008, 0.050, 0.002, 64, 1),  # target unreachable: smallest batch
        (0.005, 0.001, 0.030, 0.000, 64, 10),
    ],
)
def test_best_batch_size(base_s: float, per_sample_s: float, target_s: float, max_wait_s: float,
                         cap: int, expected: int) -> None:
    fit = LatencyFit(base_s, per_sample_s, reliable=True)
    assert best_batch_size(fit, latency_target_s=target_s, max_wait_s=max_wait_s,
                           cap=cap) == expected


def run_closed_loop(controller: BatchSizeController, model: LatencyModel, base_s: float,
                    per_sample_s: float, batches: int) -> list[int]:
    """Saturated replica: every batch is full at the controller's current size."""
    sizes = []
    for _ in range(batches):
        size = controller.batch_size
        latency_s = base_s + per_sample_s * size
        model.observe(size, latency_s)
        controller.update(model.fit, size, latency_s)
        sizes.append(size)
    return sizes


def test_controller_converges_to_best_size() -> None:
    controller = BatchSizeController(max_batch=64, latency_target_s=0.050, max_wait_s=0.002)
    model = LatencyModel()
    sizes = run_closed_loop(controller, model, 0.010, 0.002, 60)
    assert sizes[-10:] == [7] * 10


def test_controller_reacts_to_step_change() -> None:
    controller = BatchSizeController(max_batch=64, latency_target_s=0.100, max_wait_s=0.0)
    model = LatencyModel()
    run_closed_loop(controller, model, 0.002, 0.0005, 80)
    assert controller.batch_size == 64  # (0.05 - 0.002) / 0.0005 = 96, capped
    sizes = run_closed_loop(controller, model, 0.008, 0.002, 40)  # 4x slower
    assert sizes[-5:] == [21] * 5  # (0.05 - 0.008) / 0.002 = 21


def test_aimd_halves_when_over_target_before_fit_is_reliable() -> None:
    controller = BatchSizeController(max_batch=64, latency_target_s=0.050, max_wait_s=0.0)
    controller.batch_size = 40
    controller.update(LatencyFit(0.0, 0.0, reliable=False), 40, 0.030)  # 2 * 30 ms > 50 ms
    assert controller.batch_size == 20
    controller.update(LatencyFit(0.0, 0.0, reliable=False), 20, 0.010)
    assert controller.batch_size == 21


def test_fixed_policy_always_uses_max_batch() -> None:
    controller = BatchSizeController(max_batch=32, latency_target_s=0.001, max_wait_s=0.0,
                                     adaptive=False)
    controller.update(LatencyFit(0.1, 0.1, reliable=True), 32, 10.0)
    assert controller.batch_size == 32


def test_out_of_memory_lowers_cap() -> None:
    controller = BatchSizeController(max_batch=64, latency_target_s=1.0, max_wait_s=0.0,
                                     adaptive=False)
    controller.on_out_of_memory(64)
    assert controller.cap == 32
    assert controller.batch_size == 32


def settled_controller() -> tuple[BatchSizeController, LatencyFit]:
    controller = BatchSizeController(max_batch=64, latency_target_s=0.050, max_wait_s=0.002)
    fit = LatencyFit(0.010, 0.002, reliable=True)
    controller.update(fit, 7, fit.predict_s(7))
    assert controller.batch_size == 7
    return controller, fit


@pytest.mark.parametrize(
    ("waited_s", "expected"),
    [
        (0.000, 20),  # nobody waited: (0.050 - 0.010) / 0.002
        (0.010, 15),  # the oldest request has waited 10 ms: 30 ms of compute are left
        (0.024, 8),   # about one batch waited out (near saturation): a little above nominal
        (0.045, 7),   # the target is nearly spent: never below the worst-case size
    ],
)
def test_live_batch_size_grows_with_the_time_left_to_the_oldest_request(
        waited_s: float, expected: int) -> None:
    controller, fit = settled_controller()
    assert controller.live_batch_size(fit, waited_s) == expected


def test_live_batch_size_respects_cap_fixed_policy_and_unreliable_fits() -> None:
    controller, fit = settled_controller()
    controller.on_out_of_memory(12)  # cap 6, batch size 6
    assert controller.live_batch_size(fit, 0.0) == 6
    fixed = BatchSizeController(max_batch=32, latency_target_s=0.050, max_wait_s=0.0,
                                adaptive=False)
    assert fixed.live_batch_size(fit, 0.0) == 32
    fresh = BatchSizeController(max_batch=64, latency_target_s=0.050, max_wait_s=0.002)
    assert fresh.live_batch_size(LatencyFit(0.010, 0.002, reliable=False), 0.0) == 1
