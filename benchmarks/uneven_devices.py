"""Balancing policies on uneven devices: ``sim`` model on ``sim:1,sim:1,sim:0.5,sim:0.25``.

    python -m benchmarks.uneven_devices [--seconds 6] [--concurrency 64]

For each policy (least-work, round-robin, shared-queue, pow2, all with evenflow's adaptive batch
sizes, and shared-queue with one fixed model-wide batch size, Triton as usually deployed), in
one run, against a fresh server:
  * closed loop at ``--concurrency`` (saturating): throughput, its ratio to the sum of what each
    device achieves alone under the same settings (measured in this run), and the spread
    (max - min) of per-device busy fractions, from the server's own stats;
  * open loop, Poisson, at 80 % of least-work's closed-loop throughput: p50 / p99; least-work
    and shared-queue alternate ``--repeats`` times on the same arrival sequences (paired), and
    the p99 ratio is reported as the median and range over the pairs; then the same pairs with
    perf_analyzer as the generator (Poisson, same rate) unless ``--no-perf-analyzer``.
Then, least-work again with device sim0 slowed 4x through the admin RPC mid-run: time until
throughput is back to >= 0.9 of the new capacity (sum of devices alone at the new speeds).
Writes .bench/uneven_devices_<target>ms.json. ``--latency-target-ms`` (default 50, the server's
default) is passed to every server the script starts.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import grpc

from benchmarks.harness import (
    REPO,
    Server,
    evenflow_argv,
    perf_analyzer_at_rate,
    perf_analyzer_binary,
    start,
    write_json,
)
from evenflow.loadtest.arrivals import Arrival, send_times_s
from evenflow.loadtest.histogram import LatencyHistogram
from evenflow.loadtest.percentiles import percentile
from evenflow.loadtest.runner import (
    OK,
    Target,
    binned_throughput,
    closed_loop,
    mlp_like_request,
    open_loop,
)
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc

DEVICES = "sim:1,sim:1,sim:0.5,sim:0.25"
# Each policy's server flags. Every policy uses evenflow's adaptive per-replica batch sizes, so
# only routing differs; "shared-queue+fixed" is Triton as usually deployed: one queue, one
# model-wide batch size (--max-batch) for every instance, not sized from latency.
POLICIES = {
    "least-work": ("--policy", "least-work"),
    "round-robin": ("--policy", "round-robin"),
    "shared-queue": ("--policy", "shared-queue"),
    "pow2": ("--policy", "pow2"),
    "shared-queue+fixed": ("--policy", "shared-queue", "--batch-policy", "fixed"),
}
PAIRED = ("least-work", "shared-queue")  # the p99 comparison, repeated


def start_sim_server(args: argparse.Namespace, devices: str, policy: str, tag: str) -> Server:
    return start(evenflow_argv("--model", "sim", "--devices", devices, *POLICIES[policy],
                               "--admin", "--max-queued-requests", "100000",
                               "--latency-target-ms", str(args.latency_target_ms)),
                 args.out / f"{tag}.log")


async def get_stats(url: str) -> ef.GetStatsResponse:
    async with grpc.aio.insecure_channel(url) as channel:
        return await ef_grpc.EvenflowStatsStub(channel).GetStats(ef.GetStatsRequest())


async def set_speed(url: str, device: str, speed: float) -> None:
    async with grpc.aio.insecure_channel(url) as channel:
        await ef_grpc.EvenflowAdminStub(channel).SetDeviceSpeed(
            ef.SetDeviceSpeedRequest(device=device, speed=speed))


async def saturate(url: str, concurrency: int, seconds: float, warmup_s: float) -> dict:
    """Closed loop; throughput and busy fractions over the window after the warm-up."""
    target = Target(url, mlp_like_request("sim", "x", [1, 256]))
    try:
        await closed_loop(target, concurrency=concurrency, duration_s=warmup_s)
        before = await get_stats(url)
        t0 = time.monotonic()
        records = await closed_loop(target, concurrency=concurrency, duration_s=seconds)
        t1 = time.monotonic()
        after = await get_stats(url)
    finally:
        await target.close()
    ok = [r for r in records if r.status == OK]
    busy = {}
    for old, new in zip(before.models[0].replicas, after.models[0].replicas, strict=True):
        busy[new.devices[0]] = (new.busy_s - old.busy_s) / (t1 - t0)
    batch_sizes = {r.devices[0]: r.batch_size for r in after.models[0].replicas}
    return {"throughput_per_s": len(ok) / (t1 - t0), "errors": len(records) - len(ok),
            "busy_fraction": busy, "busy_spread": max(busy.values()) - min(busy.values()),
            "batch_size": batch_sizes}


async def open_loop_point(url: str, rate_per_s: float, seconds: float, seed: int) -> dict:
    target = Target(url, mlp_like_request("sim", "x", [1, 256]))
    try:
        # Warm up under the same load, so the fits and controllers start the measurement in the
        # steady state rather than converging during it (every policy gets the same warm-up).
        await open_loop(target, send_times_s(Arrival.parse("poisson"), rate_per_s, 2.0,
                                             seed + 1))
        records, dropped = await open_loop(
            target, send_times_s(Arrival.parse("poisson"), rate_per_s, seconds, seed))
    finally:
        await target.close()
    hist = LatencyHistogram()
    hist.record_all_s(r.latency_s for r in records if r.status == OK)
    lag_ms = [(r.sent_s - r.intended_s) * 1000 for r in records]
    return {"rate_per_s": rate_per_s, "summary_ms": hist.summary_ms(),
            "errors": sum(1 for r in records if r.status != OK), "dropped": dropped,
            "generator_lag_p99_ms": percentile(lag_ms, 0.99) if lag_ms else 0.0}


def perf_analyzer_cross_check(args: argparse.Namespace, rate: float) -> dict:
    """The paired p99 comparison again with Triton's C++ load generator, whose own latency is
    far below the Python generator's on these 2 cores."""
    p99_ms: dict[str, list[float]] = {policy: [] for policy in PAIRED}
    for repeat in range(args.repeats):
        for policy in PAIRED:
            server = start_sim_server(args, DEVICES, policy, f"{policy}_pa_{repeat}")
            try:
                point = perf_analyzer_at_rate(server.url, "sim", rate, args.out)
            finally:
                server.stop()
            p99_ms[policy].append(point.p99_ms)
            print(f"perf_analyzer {policy} @ {rate:.0f}/s: {point.infer_per_s:.0f} infer/s, "
                  f"p50 {point.p50_ms:.1f} ms p99 {point.p99_ms:.1f} ms", flush=True)
    return {"p99_ms": p99_ms, "p99_ratios": [
        lw / sq for lw, sq in zip(p99_ms["least-work"], p99_ms["shared-queue"], strict=True)]}


def median_and_range(values: list[float]) -> str:
    """``median M (range LO..HI)``; of an even count, the lower middle value."""
    ordered = sorted(values)
    return (f"median {ordered[(len(ordered) - 1) // 2]:.2f} "
            f"(range {ordered[0]:.2f}..{ordered[-1]:.2f})")


def median_point(points: list[dict]) -> dict:
    """The repetition whose p99 is the median (a real run, not a mix of runs)."""
    ordered = sorted(points, key=lambda p: p["summary_ms"].get("p99", float("inf")))
    return ordered[(len(ordered) - 1) // 2]


async def slowdown(url: str, concurrency: int, before_s: float, after_s: float,
                   new_capacity: float) -> dict:
    """Slow sim0 4x mid-run; report throughput over time and the recovery time."""
    target = Target(url, mlp_like_request("sim", "x", [1, 256]))
    try:
        await closed_loop(target, concurrency=concurrency, duration_s=2.0)
        t0 = time.monotonic()
        run = asyncio.create_task(closed_loop(target, concurrency=concurrency,
                                              duration_s=before_s + after_s))
        await asyncio.sleep(before_s)  # the scenario's timeline, not a synchronization
        t_slow = time.monotonic()
        await set_speed(url, "sim0", 0.25)
        records = await run
    finally:
        await target.close()
    bin_s = 0.25
    window_bins = 4  # a 1 s sliding window
    series = binned_throughput(records, t0, t0 + before_s + after_s, bin_s)
    first_after = int((t_slow - t0) / bin_s)
    recovered_s = None
    for i in range(first_after, len(series) - window_bins + 1):
        window = sum(series[i:i + window_bins]) / window_bins
        if window >= 0.9 * new_capacity:
            recovered_s = max(0.0, (i + window_bins) * bin_s - (t_slow - t0))
            break
    steady = series[-int(2.0 / bin_s):]
    return {"bin_s": bin_s, "throughput_series": series, "slowed_at_s": t_slow - t0,
            "new_capacity_per_s": new_capacity,
            "throughput_last_2s_per_s": sum(steady) / len(steady),
            "recovered_within_s": recovered_s}


async def main_async(args: argparse.Namespace) -> None:  # noqa: PLR0915 - a linear script
    out: Path = args.out
    alone: dict[str, float] = {}
    for speed in ("1", "0.5", "0.25"):
        server = start_sim_server(args, f"sim:{speed}", "least-work", f"alone_{speed}")
        try:
            result = await saturate(server.url, args.concurrency, args.seconds, args.warmup_s)
        finally:
            server.stop()
        alone[speed] = result["throughput_per_s"]
        print(f"alone sim:{speed}: {alone[speed]:.1f} req/s (batch {result['batch_size']})",
              flush=True)
    capacity = 2 * alone["1"] + alone["0.5"] + alone["0.25"]
    new_capacity = alone["1"] + alone["0.25"] + alone["0.5"] + alone["0.25"]

    results: dict[str, dict] = {}
    for policy in POLICIES:
        server = start_sim_server(args, DEVICES, policy, policy)
        try:
            closed = await saturate(server.url, args.concurrency, args.seconds, args.warmup_s)
            results[policy] = {"closed": closed}
        finally:
            server.stop()
        print(f"{policy}: {closed['throughput_per_s']:.1f} req/s, busy spread "
              f"{closed['busy_spread']:.3f}", flush=True)
    rate = 0.8 * results["least-work"]["closed"]["throughput_per_s"]
    # The tail comparison is repeated, least-work and shared-queue alternating (A B A B), each
    # pair on the same arrival sequence; round-robin and pow2 are overloaded at this rate, once.
    for repeat in range(args.repeats):
        for policy in POLICIES if repeat == 0 else PAIRED:
            server = start_sim_server(args, DEVICES, policy, f"{policy}_open_{repeat}")
            try:
                point = await open_loop_point(server.url, rate, args.seconds, args.seed + repeat)
            finally:
                server.stop()
            results[policy].setdefault("open_repeats", []).append(point)
            summary = point["summary_ms"]
            print(f"{policy} @ {rate:.0f}/s: p50 {summary.get('p50', 0):.1f} ms "
                  f"p99 {summary.get('p99', 0):.1f} ms", flush=True)
    for policy in POLICIES:
        results[policy]["open"] = median_point(results[policy]["open_repeats"])
    p99_ratios = [lw["summary_ms"]["p99"] / sq["summary_ms"]["p99"] for lw, sq in zip(
        results["least-work"]["open_repeats"], results["shared-queue"]["open_repeats"],
        strict=True)]
    cross_check = perf_analyzer_cross_check(args, rate) if args.perf_analyzer else {}

    server = start_sim_server(args, DEVICES, "least-work", "slowdown")
    try:
        slow = await slowdown(server.url, args.concurrency, 3.0, 6.0, new_capacity)
    finally:
        server.stop()

    print(f"\ndevices {DEVICES}; latency target {args.latency_target_ms:g} ms; sum of devices "
          f"alone: {capacity:.1f} req/s (sim:1 {alone['1']:.1f}, sim:0.5 {alone['0.5']:.1f}, "
          f"sim:0.25 {alone['0.25']:.1f})")
    print(f"{'policy':>18} {'req/s':>7} {'/sum':>6} {'/rr':>6} {'busy spread':>12} "
          f"{'p50@80%':>8} {'p99@80%':>8} {'p99/sq':>7}")
    rr = results["round-robin"]["closed"]["throughput_per_s"]
    sq_p99 = results["shared-queue"]["open"]["summary_ms"].get("p99", float("nan"))
    rows = []
    for policy in POLICIES:
        closed, open_ = results[policy]["closed"], results[policy]["open"]
        tput = closed["throughput_per_s"]
        p50 = open_["summary_ms"].get("p50", float("nan"))
        p99 = open_["summary_ms"].get("p99", float("nan"))
        row = {"policy": policy, "throughput_per_s": tput, "ratio_to_sum": tput / capacity,
               "ratio_to_round_robin": tput / rr, "busy_spread": closed["busy_spread"],
               "busy_fraction": closed["busy_fraction"], "batch_size": closed["batch_size"],
               "open_loop": open_}
        rows.append(row)
        print(f"{policy:>18} {tput:>7.1f} {tput / capacity:>6.3f} {tput / rr:>6.2f} "
              f"{closed['busy_spread'] * 100:>10.1f}pp {p50:>8.1f} {p99:>8.1f} "
              f"{p99 / sq_p99:>7.2f}")
    print(f"\np99 at 80 % load, least-work / shared-queue, {len(p99_ratios)} paired runs: "
          f"{median_and_range(p99_ratios)}; the table shows each policy's median run")
    fixed_p99 = results["shared-queue+fixed"]["open"]["summary_ms"].get("p99", float("nan"))
    lw_p99 = results["least-work"]["open"]["summary_ms"].get("p99", float("nan"))
    print(f"least-work p99 / shared-queue+fixed p99 (Triton's fixed batch size): "
          f"{lw_p99 / fixed_p99:.2f}")
    if cross_check:
        ratios_pa = cross_check["p99_ratios"]
        print(f"perf_analyzer (C++ client, Poisson at the same rate), {len(ratios_pa)} paired "
              f"runs: p99 least-work / shared-queue {median_and_range(ratios_pa)}")
    recovered = slow["recovered_within_s"]
    print(f"\nslow-down: sim0 set to 0.25 at t={slow['slowed_at_s']:.2f} s; new capacity "
          f"{new_capacity:.1f} req/s; last 2 s {slow['throughput_last_2s_per_s']:.1f} req/s "
          f"({slow['throughput_last_2s_per_s'] / new_capacity:.2f}); back to >= 0.9 within "
          f"{'never' if recovered is None else f'{recovered:.2f} s'}")
    write_json(out / f"uneven_devices_{args.latency_target_ms:g}ms.json", {
        "devices": DEVICES, "alone_per_s": alone, "capacity_per_s": capacity,
        "open_loop_rate_per_s": rate, "rows": rows, "p99_ratios_to_shared_queue": p99_ratios,
        "perf_analyzer_cross_check": cross_check,
        "slowdown": slow,
        "settings": vars(args) | {"out": str(args.out)}})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-perf-analyzer", dest="perf_analyzer", action="store_false",
                        help="skip the perf_analyzer cross-check of the p99 comparison")
    parser.add_argument("--repeats", type=int, default=3,
                        help="paired least-work / shared-queue open-loop runs (default 3)")
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    parser.add_argument("--latency-target-ms", type=float, default=50.0,
                        help="the servers' --latency-target-ms (every policy and device alone)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.perf_analyzer:
        perf_analyzer_binary()  # fail now, not after minutes of measuring
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
