"""Soak: a server held at 70 % of its capacity for a long time, open loop; errors and memory.

Two sim devices (10 ms + 2 ms per sample at speed 1, the default 50 ms latency target), Poisson
arrivals at ``--load`` x capacity for ``--seconds``. Admission by time is off
(``--max-queue-delay-ms inf``): this measures stability, and with batch sizes that fill the
target, Poisson bursts at 70 % load put a few requests (0.07 % in a 20 s run) past what the
latency target admits; ``benchmarks.overload`` measures admission. The server's resident
memory is sampled every ``--sample-s``; growth is measured from the end of the warm-up (the
first fifth) to the end. Reported: answers by status, RSS after warm-up and at the end,
growth, p99 latency.

    python -m benchmarks.soak                 # 10 minutes
    python -m benchmarks.soak --seconds 30    # what CI runs (tests/integration/test_soak.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks.harness import REPO, evenflow_argv, start
from evenflow.balancer import BalancerConfig, LatencyFit, best_batch_size
from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.loadtest.percentiles import percentile
from evenflow.loadtest.runner import OK, RequestRecord, Target, mlp_like_request, open_loop

BASE_MS, PER_SAMPLE_MS, DEVICES = 10.0, 2.0, 2


def capacity_per_s() -> float:
    """What the devices serve at the batch size the controller picks for the default target."""
    config = BalancerConfig()
    fit = LatencyFit(BASE_MS / 1e3, PER_SAMPLE_MS / 1e3, reliable=True)
    batch = best_batch_size(fit, latency_target_s=config.latency_target_s,
                            max_wait_s=config.max_wait_s, cap=config.max_batch)
    return DEVICES * batch / fit.predict_s(batch)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


@dataclass(frozen=True, slots=True)
class SoakResult:
    seconds: float
    rate_per_s: float
    sent: int
    answers: dict[str, int]
    p99_ms: float
    rss_after_warmup_mib: float
    rss_end_mib: float
    rss_growth: float  # fraction, end over after-warm-up
    rss_samples_mib: list[float]


async def soak(seconds: float, load: float, sample_s: float, log: Path) -> SoakResult:
    server = start(evenflow_argv("--model", "sim", "--devices", ",".join(["sim:1"] * DEVICES),
                                 "--sim-base-ms", str(BASE_MS),
                                 "--sim-per-sample-ms", str(PER_SAMPLE_MS)), log)
    rate = load * capacity_per_s()
    target = Target(server.url, mlp_like_request("sim", "x", [1, 256]), timeout_s=10.0)
    records: list[RequestRecord] = []
    samples: list[float] = []

    async def sample_memory() -> None:
        while True:
            samples.append(rss_mib(server.proc.pid))
            await asyncio.sleep(sample_s)

    sampler = asyncio.create_task(sample_memory())
    try:
        await open_loop(target, send_times_s(Arrival.parse("poisson"), rate, seconds, 11),
                        records=records)
    finally:
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        samples.append(rss_mib(server.proc.pid))
        await target.close()
        server.stop()
    warm = samples[max(1, len(samples) // 5)]
    ok_ms = [r.latency_s * 1e3 for r in records if r.status == OK]
    return SoakResult(seconds=seconds, rate_per_s=rate, sent=len(records),
                      answers=dict(Counter(r.status for r in records)),
                      p99_ms=percentile(ok_ms, 0.99) if ok_ms else float("nan"),
                      rss_after_warmup_mib=warm, rss_end_mib=samples[-1],
                      rss_growth=samples[-1] / warm - 1.0, rss_samples_mib=samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--load", type=float, default=0.7, help="offered load / capacity")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(soak(args.seconds, args.load, args.sample_s, args.out / "soak.log"))
    print(f"{result.seconds:g} s at {result.rate_per_s:.0f} req/s ({args.load:.0%} of "
          f"{capacity_per_s():.0f}): {result.sent} sent, answers {result.answers}, "
          f"p99 {result.p99_ms:.1f} ms; server RSS {result.rss_after_warmup_mib:.1f} MiB after "
          f"warm-up -> {result.rss_end_mib:.1f} MiB at the end ({result.rss_growth:+.1%})")
    out = args.out / f"soak_{args.seconds:g}s.json"
    out.write_text(json.dumps({"command": "python -m benchmarks.soak", "time": time.time(),
                               "args": {k: str(v) for k, v in vars(args).items()},
                               "result": asdict(result)}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
