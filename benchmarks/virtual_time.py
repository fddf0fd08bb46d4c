"""The real ``ModelBalancer`` on simulated devices in virtual time: policy experiments in seconds.

    python -m benchmarks.virtual_time [--latency-targets-ms 40,50] [--rate-per-s R]
                                      [--overhead-ms 2] [--seconds 20] [--seed 1]

An asyncio event loop whose clock jumps to the next timer instead of sleeping drives the
production balancer (routing, batching, latency fits, controllers, stealing) against devices
whose batches cost ``(a + c * b) / speed`` exactly. Nothing else competes for the CPU, so the
numbers isolate the policy from the front-end: the same comparison as ``uneven_devices`` (each
policy's saturated throughput; p50 / p99 under Poisson arrivals at 80 % of least-work's), without
gRPC. ``--overhead-ms`` adds a fixed per-request transport time to every latency (the gRPC round
trip the real benchmark pays). The run is deterministic for a seed.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import random
import selectors
from collections.abc import Sequence
from dataclasses import dataclass, replace

from evenflow.balancer import BalancerConfig, ModelBalancer, Policy
from evenflow.balancer.job import BatchResult, BatchTiming, Job, SingleDeviceWorker
from evenflow.loadtest.percentiles import percentile

SPEEDS = (1.0, 1.0, 0.5, 0.25)


class VirtualSelector(selectors.DefaultSelector):
    """A selector that never waits: ``select(timeout)`` moves the virtual clock on instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now_s = 0.0

    def select(self, timeout: float | None = None) -> list:  # type: ignore[override]
        if timeout is None:
            raise RuntimeError("virtual time: nothing scheduled, the simulation would hang")
        self.now_s += max(0.0, timeout)
        return super().select(0)


class VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._virtual = VirtualSelector()
        super().__init__(self._virtual)

    def time(self) -> float:
        return self._virtual.now_s


@dataclass(slots=True)
class SimDevice(SingleDeviceWorker):
    """A device whose batch of ``b`` samples takes ``(base_s + per_sample_s * b) / speed``."""

    name: str
    speed: float
    base_s: float = 0.010  # the server's sim model defaults (SimProfile: 10 ms + 2 ms/sample)
    per_sample_s: float = 0.002
    overhead_s: float = 0.0  # per batch, whatever the speed (a real server's hand-offs)

    @property
    def devices(self) -> Sequence[str]:
        return (self.name,)

    async def run(self, jobs: Sequence[Job]) -> BatchResult:
        samples = sum(job.num_samples for job in jobs)
        cost_s = (self.base_s + self.per_sample_s * samples) / self.speed + self.overhead_s
        await asyncio.sleep(cost_s)
        return BatchResult([None] * len(jobs), BatchTiming(0.0, cost_s, 0.0))

    async def restart(self) -> None:
        return None  # a simulated device never dies

    async def close(self) -> None:
        return None


def make_balancer(config: BalancerConfig, speeds: Sequence[float]) -> ModelBalancer:
    loop = asyncio.get_running_loop()
    devices = [SimDevice(f"sim{i}", speed) for i, speed in enumerate(speeds)]
    balancer = ModelBalancer(model_name="sim", workers=devices, config=config, clock=loop.time,
                             rng=random.Random(0))
    balancer.start()
    return balancer


async def closed_loop(config: BalancerConfig, speeds: Sequence[float], concurrency: int,
                      warmup_s: float, seconds: float) -> float:
    """Completed requests per second with ``concurrency`` clients each keeping one in flight.
    Admission by time is off: this measures capacity, and the clients bound the queue."""
    loop = asyncio.get_running_loop()
    balancer = make_balancer(replace(config, max_queue_delay_s=math.inf), speeds)
    end_s = loop.time() + warmup_s + seconds
    done_in_window = 0

    async def client() -> None:
        nonlocal done_in_window
        while loop.time() < end_s:
            await balancer.submit(None, 1)
            if end_s - seconds <= loop.time() < end_s:
                done_in_window += 1

    await asyncio.gather(*(client() for _ in range(concurrency)))
    await balancer.drain()
    await balancer.close()
    return done_in_window / seconds


def _record_latency(latencies_s: list[float], loop: asyncio.AbstractEventLoop, sent_s: float,
                    _answer: asyncio.Future[object]) -> None:
    latencies_s.append(loop.time() - sent_s)


async def open_loop(config: BalancerConfig, speeds: Sequence[float], rate_per_s: float,
                    warmup_s: float, seconds: float, seed: int) -> list[float]:
    """Latencies (s) of Poisson arrivals at ``rate_per_s`` after a warm-up under the same load.
    Admission by time is off: this compares routing, and every request must be served."""
    loop = asyncio.get_running_loop()
    balancer = make_balancer(replace(config, max_queue_delay_s=math.inf), speeds)
    rng = random.Random(seed)
    latencies_s: list[float] = []
    pending: list[asyncio.Future[object]] = []
    t_s = loop.time()
    start_s = t_s
    while t_s < start_s + warmup_s + seconds:
        t_s += rng.expovariate(rate_per_s)
        await asyncio.sleep(max(0.0, t_s - loop.time()))
        sent_s = loop.time()
        future = balancer.submit(None, 1)
        if sent_s >= start_s + warmup_s:
            future.add_done_callback(functools.partial(_record_latency, latencies_s, loop, sent_s))
        pending.append(future)
    await asyncio.gather(*pending)
    await balancer.drain()
    await balancer.close()
    return latencies_s


async def compare(args: argparse.Namespace, base: BalancerConfig) -> None:
    """One latency target: every policy's capacity, then p50 / p99 at the open-loop rate."""
    overhead_s = args.overhead_ms / 1000.0
    configs = {p: replace(base, policy=p) for p in Policy}
    capacity = {p: await closed_loop(configs[p], SPEEDS, args.concurrency, 2.0, args.seconds)
                for p in Policy}
    rate = args.rate_per_s or 0.8 * capacity[Policy.LEAST_WORK]
    alone = sum([await closed_loop(base, [s], args.concurrency, 2.0, args.seconds)
                 for s in SPEEDS])
    print(f"\nlatency target {base.latency_target_s * 1000:g} ms; speeds {SPEEDS}; sum alone "
          f"{alone:.1f}/s; open loop at {rate:.1f}/s (+{args.overhead_ms:g} ms per request)")
    print(f"{'policy':>13} {'req/s':>7} {'/sum':>6} {'p50':>6} {'p99':>6} {'p99/sq':>7}")
    p99 = {}
    rows = []
    for policy in Policy:
        lat = [x + overhead_s for x in
               await open_loop(configs[policy], SPEEDS, rate, 2.0, args.seconds, args.seed)]
        p99[policy] = percentile(lat, 0.99) * 1000
        rows.append((policy, capacity[policy], percentile(lat, 0.5) * 1000, p99[policy]))
    for policy, tput, p50_ms, p99_ms in rows:
        print(f"{policy.value:>13} {tput:>7.1f} {tput / alone:>6.3f} {p50_ms:>6.1f} "
              f"{p99_ms:>6.1f} {p99_ms / p99[Policy.SHARED_QUEUE]:>7.2f}")


async def main_async(args: argparse.Namespace) -> None:
    for target_ms in args.latency_targets_ms:
        await compare(args, BalancerConfig(
            latency_target_s=target_ms / 1000.0, max_batch=args.max_batch,
            adaptive_batching=args.batch_policy == "adaptive", max_queued_requests=10**6))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--overhead-ms", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--latency-targets-ms", type=lambda text: [float(x) for x in
                                                                   text.split(",")],
                        default=[50.0], help="comma list; one table per target (default 50)")
    parser.add_argument("--rate-per-s", type=float, default=0.0,
                        help="open-loop rate (default: 80 %% of least-work's capacity)")
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--batch-policy", choices=("adaptive", "fixed"), default="adaptive")
    args = parser.parse_args()
    loop = VirtualLoop()
    try:
        loop.run_until_complete(main_async(args))
    finally:
        loop.close()


if __name__ == "__main__":
    main()
