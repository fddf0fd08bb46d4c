"""The default admission rule: a queueing budget unless an SLO is declared.

With an injected clock (gated fake workers) for the rule itself, and in virtual time (the real
balancer on simulated devices) for the two regimes it is chosen for: a closed loop, whose queue
its clients bound, is queued; an open-loop overload is refused at arrival beyond the budget.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from benchmarks.virtual_time import SimDevice, VirtualLoop
from evenflow.balancer import BalancerConfig, ModelBalancer, Overloaded
from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.server.config.deployment_file import ConfigError, load
from tests.fakes import FakeWorker
from tests.unit.balancer_fakes import BalancerFactory, FakeTime, settle

pytestmark = pytest.mark.timeout(30)

UNEVEN = (1.0, 1.0, 0.5, 0.25)  # the server's sim model (10 ms + 2 ms per sample) at these speeds


def test_the_default_budget_is_the_target_and_at_least_half_a_second() -> None:
    assert BalancerConfig().queue_budget_s == 0.5  # 50 ms target: the floor
    assert BalancerConfig(latency_target_s=2.0).queue_budget_s == 2.0
    assert BalancerConfig(slo_s=0.05).queue_budget_s is None  # the SLO bounds the wait
    assert BalancerConfig(max_queue_delay_s=0.1).queue_budget_s == 0.1
    assert BalancerConfig(slo_s=0.05, max_queue_delay_s=0.01).queue_budget_s == 0.01
    assert BalancerConfig(max_queue_delay_s=math.inf).queue_budget_s is None
    with pytest.raises(ValueError, match="below latency_target_s"):
        BalancerConfig(slo_s=0.02)  # batches sized for 50 ms would break a 20 ms SLO


async def _fill(balancer: ModelBalancer, fake_time: FakeTime) -> tuple[list[float], str]:
    """Submit single samples to a busy replica until one is refused: the predicted finish of
    each admitted request, and the refusal's message."""
    replica = balancer.replicas[0]
    predicted_s: list[float] = []
    for _ in range(2000):
        before_s = replica.load(fake_time()).work_s(1)
        try:
            balancer.submit("q", 1)
        except Overloaded as exc:
            return predicted_s, str(exc)
        predicted_s.append(before_s)
    pytest.fail("nothing was refused")


@pytest.fixture
async def make_gated(fake_time: FakeTime
                     ) -> AsyncIterator[Callable[..., tuple[ModelBalancer, FakeWorker]]]:
    factory = BalancerFactory(fake_time)

    def make(base_s: float = 0.010, **overrides: object) -> tuple[ModelBalancer, FakeWorker]:
        worker = FakeWorker("w", base_s=base_s, per_sample_s=0.001, gated=True)
        balancer = factory([worker], **{"max_batch": 4, "adaptive_batching": False,
                                        **overrides})
        return balancer, worker

    yield make
    await factory.close()


async def _measured(make: Callable[..., tuple[ModelBalancer, FakeWorker]], **overrides: object
                    ) -> ModelBalancer:
    """A replica that has measured a batch and is busy with the next one."""
    balancer, worker = make(**overrides)
    first = balancer.submit("warm", 1)
    await settle()
    worker.release()
    await first
    balancer.submit("running", 1)
    await settle()
    return balancer


async def test_by_default_a_request_is_queued_past_the_target_up_to_the_budget(
        make_gated: Callable[..., tuple[ModelBalancer, FakeWorker]], fake_time: FakeTime) -> None:
    balancer = await _measured(make_gated)
    predicted_s, refusal = await _fill(balancer, fake_time)
    assert "over the queueing budget of 500 ms" in refusal
    assert max(predicted_s) > 4 * balancer.config.latency_target_s  # queued, not refused
    # What was refused would have waited past the budget; nothing admitted was predicted to.
    replica = balancer.replicas[0]
    assert replica.load(fake_time()).work_s(1) > 0.5
    assert max(predicted_s) <= 0.5 + replica.predict_s(4)
    assert balancer.counters.rejected == {"queue_delay": 1}


async def test_a_declared_slo_refuses_what_is_predicted_past_it(
        make_gated: Callable[..., tuple[ModelBalancer, FakeWorker]], fake_time: FakeTime) -> None:
    balancer = await _measured(make_gated, slo_s=0.05)
    predicted_s, refusal = await _fill(balancer, fake_time)
    assert "over its SLO of 50 ms" in refusal
    assert max(predicted_s) <= 0.05
    assert balancer.replicas[0].load(fake_time()).work_s(1) > 0.05
    assert balancer.counters.rejected == {"latency_target": 1}


async def test_the_default_budget_refuses_nothing_within_two_full_batches(
        make_gated: Callable[..., tuple[ModelBalancer, FakeWorker]], fake_time: FakeTime) -> None:
    # 300 ms a batch of at most 4: a queue of 8 samples is predicted to wait ~600 ms, over
    # the budget, but two full batches per replica are what a closed loop of 8 keeps queued.
    balancer = await _measured(make_gated, base_s=0.300)
    predicted_s, refusal = await _fill(balancer, fake_time)
    assert len(predicted_s) == 2 * 4  # queued behind the running batch
    assert max(predicted_s) > 0.5
    assert "over the queueing budget of 500 ms" in refusal
    # An operator's own budget is kept to the letter.
    strict = await _measured(make_gated, base_s=0.300, max_queue_delay_s=0.5)
    admitted, _ = await _fill(strict, fake_time)
    assert len(admitted) < 2 * 4


@pytest.fixture
def loop() -> Iterator[VirtualLoop]:
    virtual = VirtualLoop()
    yield virtual
    virtual.close()


def _balancer(config: BalancerConfig, devices: list[SimDevice]) -> ModelBalancer:
    balancer = ModelBalancer(model_name="sim", workers=devices, config=config,
                             clock=asyncio.get_running_loop().time, rng=random.Random(0))
    balancer.start()
    return balancer


async def _closed_loop(config: BalancerConfig, clients: int, seconds: float
                       ) -> tuple[int, int]:
    """``clients`` each keeping one request in flight on the uneven devices from a cold start,
    each until its first refusal: (answered, refused)."""
    loop = asyncio.get_running_loop()
    balancer = _balancer(config, [SimDevice(f"sim{i}", s) for i, s in enumerate(UNEVEN)])
    end_s = loop.time() + seconds
    answered = refused = 0

    async def client() -> None:
        nonlocal answered, refused
        while loop.time() < end_s:
            try:
                await balancer.submit(None, 1)
                answered += 1
            except Overloaded:
                refused += 1
                return  # as perf_analyzer stops at a refusal

    await asyncio.gather(*(client() for _ in range(clients)))
    await balancer.close()
    return answered, refused


def test_a_closed_loop_of_128_is_queued_not_refused(loop: VirtualLoop) -> None:
    answered, refused = loop.run_until_complete(_closed_loop(BalancerConfig(), 128, 3.0))
    assert refused == 0
    assert answered > 1000
    # The same loop against the 50 ms target declared an SLO is refused: the default differs.
    _, refused_under_slo = loop.run_until_complete(
        _closed_loop(BalancerConfig(slo_s=0.05), 128, 3.0))
    assert refused_under_slo > 0


# Two slow devices: 40 ms + 20 ms per sample, batches of 8 (200 ms): 80 requests a second.
SLOW_CAPACITY_PER_S = 2 * 8 / 0.2


async def _open_loop(config: BalancerConfig, factor: float, seconds: float
                     ) -> tuple[list[float], int, int]:
    """Poisson arrivals at ``factor`` x capacity on the two slow devices after a second at
    0.8 x: (latencies of the answered, answered, refused) after the warm-up."""
    loop = asyncio.get_running_loop()
    balancer = _balancer(config, [SimDevice(f"slow{i}", 1.0, base_s=0.040, per_sample_s=0.020)
                                  for i in range(2)])
    latencies_s: list[float] = []
    pending: list[asyncio.Future[object]] = []
    refused = 0
    start_s = loop.time()
    warmup = send_times_s(Arrival.parse("poisson"), 0.8 * SLOW_CAPACITY_PER_S, 1.0, seed=2)
    overload = send_times_s(Arrival.parse("poisson"), factor * SLOW_CAPACITY_PER_S, seconds,
                            seed=1)
    for offset_s, measured in [*((o, False) for o in warmup), *((1.0 + o, True) for o in overload)]:
        await asyncio.sleep(max(0.0, start_s + offset_s - loop.time()))
        arrived_s = loop.time()
        try:
            future = balancer.submit(None, 1)
        except Overloaded:
            refused += measured
            continue
        if measured:
            future.add_done_callback(
                lambda _, a=arrived_s: latencies_s.append(loop.time() - a))
        pending.append(future)
    await asyncio.gather(*pending)
    await balancer.close()
    return latencies_s, len(latencies_s), refused


SLOW = BalancerConfig(max_batch=8, latency_target_s=0.5)


def test_an_open_loop_overload_is_refused_beyond_the_budget(loop: VirtualLoop) -> None:
    seconds = 8.0
    latencies_s, answered, refused = loop.run_until_complete(_open_loop(SLOW, 3.0, seconds))
    within_1_s = sum(1 for latency_s in latencies_s if latency_s <= 1.0)
    assert within_1_s / seconds >= 0.9 * SLOW_CAPACITY_PER_S
    assert refused >= 0.5 * (answered + refused)  # the excess, refused at arrival
    assert max(latencies_s) <= 1.0


def test_an_open_loop_overload_under_a_declared_slo_meets_it(loop: VirtualLoop) -> None:
    seconds = 8.0
    latencies_s, _, refused = loop.run_until_complete(
        _open_loop(BalancerConfig(max_batch=8, latency_target_s=0.5, slo_s=0.5), 3.0, seconds))
    within_slo = sum(1 for latency_s in latencies_s if latency_s <= 0.5)
    assert within_slo / seconds >= 0.9 * SLOW_CAPACITY_PER_S
    assert refused > 0


def test_slo_ms_declares_an_slo_and_latency_target_ms_does_not() -> None:
    declared = load(None, {"balancing": {"slo_ms": 200.0}}).balancer
    assert (declared.slo_s, declared.latency_target_s) == (0.2, 0.2)
    assert declared.queue_budget_s is None
    aimed = load(None, {"balancing": {"latency_target_ms": 200.0}}).balancer
    assert (aimed.slo_s, aimed.latency_target_s) == (None, 0.2)
    assert aimed.queue_budget_s == 0.5
    both = load(None, {"balancing": {"slo_ms": 300.0, "latency_target_ms": 200.0}}).balancer
    assert (both.slo_s, both.latency_target_s) == (0.3, 0.2)
    per_model = load(None, {"balancing": {"latency_target_ms": 40.0},
                            "models": {"m": {"source": "mlp", "slo_ms": 80.0}}})
    (model,) = per_model.model_configs()
    assert model.balancer is not None
    assert (model.balancer.slo_s, model.balancer.latency_target_s) == (0.08, 0.08)
    with pytest.raises(ConfigError, match=r"balancing.latency_target_ms = 200.0: must not "
                                          r"exceed slo_ms \(100.0"):
        load(None, {"balancing": {"slo_ms": 100.0, "latency_target_ms": 200.0}})
