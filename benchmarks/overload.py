"""Overload: a server offered several times its capacity, open loop, with client deadlines.

The setting from the reliability issue: 2 sim devices costing 40 ms + 20 ms per sample, max
batch 8, latency target 500 ms (capacity 2 x 8 / 0.2 s = 80 req/s), offered ``--factor`` (3) x
capacity as a Poisson stream for ``--seconds`` with 5 s client deadlines. Reported: goodput
(successes within the target per second) and the successes within 1 s, each as a fraction of
capacity, the p99 of the successes, the p99 time to a refusal, and the answers by status. Run it
with the server's default admission (the target is no SLO: a request predicted to queue past
the default budget is refused), with the target declared an SLO (``--slo-ms``: a request
predicted to answer past it is refused) and, for comparison, with admission by time off
(``--max-queue-delay-ms inf``: only the count bound and the clients' deadlines limit the queue):

    python -m benchmarks.overload [--seconds 10] [--factor 3] [--modes default,slo,count-only]
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
from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.loadtest.percentiles import percentile
from evenflow.loadtest.runner import OK, Target, mlp_like_request, open_loop

BASE_MS, PER_SAMPLE_MS, MAX_BATCH, TARGET_MS, DEVICES = 40.0, 20.0, 8, 500.0, 2
CAPACITY_PER_S = DEVICES * MAX_BATCH / ((BASE_MS + PER_SAMPLE_MS * MAX_BATCH) / 1000.0)
DEADLINE_S = 5.0


def server_argv(*extra: str) -> list[str]:
    """The server at its defaults but for the device and model settings; ``extra`` after."""
    return evenflow_argv(
        "--model", "sim", "--devices", ",".join(["sim:1"] * DEVICES),
        "--sim-base-ms", str(BASE_MS), "--sim-per-sample-ms", str(PER_SAMPLE_MS),
        "--max-batch", str(MAX_BATCH), "--latency-target-ms", str(TARGET_MS), *extra,
        time_admission=True)


@dataclass(frozen=True, slots=True)
class OverloadResult:
    offered_per_s: float
    capacity_per_s: float
    goodput_per_s: float
    goodput_fraction: float  # of capacity
    within_1s_fraction: float  # successes within 1 s per second, of capacity
    success_p99_ms: float
    refusal_p99_ms: float
    answers: dict[str, int]
    sent: int


async def offer(url: str, rate_per_s: float, seconds: float, seed: int = 1) -> OverloadResult:
    """Offer ``rate_per_s`` (Poisson) for ``seconds``; every request gets a 5 s deadline."""
    target = Target(url, mlp_like_request("sim", "x", [1, 256]), timeout_s=DEADLINE_S)
    try:
        records, dropped = await open_loop(
            target, send_times_s(Arrival.parse("poisson"), rate_per_s, seconds, seed))
    finally:
        await target.close()
    assert not dropped, f"the generator dropped {dropped} requests"
    ok_ms = [r.latency_s * 1e3 for r in records if r.status == OK]
    refused_ms = [(r.done_s - r.sent_s) * 1e3 for r in records if r.status == "RESOURCE_EXHAUSTED"]
    good = sum(1 for latency_ms in ok_ms if latency_ms <= TARGET_MS)
    return OverloadResult(
        offered_per_s=rate_per_s, capacity_per_s=CAPACITY_PER_S, goodput_per_s=good / seconds,
        goodput_fraction=good / seconds / CAPACITY_PER_S,
        within_1s_fraction=sum(1 for ms in ok_ms if ms <= 1000.0) / seconds / CAPACITY_PER_S,
        success_p99_ms=percentile(ok_ms, 0.99) if ok_ms else float("nan"),
        refusal_p99_ms=percentile(refused_ms, 0.99) if refused_ms else float("nan"),
        answers=dict(Counter(r.status for r in records)), sent=len(records))


async def run(factor: float, seconds: float, extra: tuple[str, ...], log: Path) -> OverloadResult:
    server = start(server_argv(*extra), log)
    try:
        # One second at capacity first, so the latency fits are measured before the overload.
        await offer(server.url, CAPACITY_PER_S * 0.8, 1.0, seed=2)
        return await offer(server.url, CAPACITY_PER_S * factor, seconds)
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    parser.add_argument("--modes", default="default,slo,count-only",
                        help="comma list: default (queueing budget), slo (--slo-ms), count-only")
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = args.modes.split(",")
    modes = {name: extra for key, name, extra in (
        ("default", "queueing budget (default)", ()),
        ("slo", "target declared an SLO (--slo-ms)", ("--slo-ms", f"{TARGET_MS:g}")),
        ("count-only", "count bound only (--max-queue-delay-ms inf)",
         ("--max-queue-delay-ms", "inf"))) if key in chosen}
    results = {}
    print(f"capacity {CAPACITY_PER_S:.0f} req/s, offered {args.factor:g}x for {args.seconds:g} s, "
          f"target {TARGET_MS:.0f} ms, client deadline {DEADLINE_S:g} s")
    print(f"{'server':45} {'goodput/s':>9} {'/cap':>5} {'1s/cap':>6} {'ok p99':>8} "
          f"{'refusal p99':>11}  answers")
    for name, extra in modes.items():
        result = asyncio.run(run(args.factor, args.seconds, extra, args.out / "overload.log"))
        results[name] = asdict(result)
        print(f"{name:45} {result.goodput_per_s:9.1f} {result.goodput_fraction:5.2f} "
              f"{result.within_1s_fraction:6.2f} {result.success_p99_ms:6.0f}ms "
              f"{result.refusal_p99_ms:9.2f}ms  {result.answers}")
    out = args.out / "overload.json"
    out.write_text(json.dumps({"command": "python -m benchmarks.overload", "args": vars(args) | {
        "out": str(args.out)}, "time": time.time(), "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
