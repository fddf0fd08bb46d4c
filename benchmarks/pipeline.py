"""Pipeline parallelism on simulated devices: ``simlayers`` (8 layers of unequal cost) over 1, 2
and 4 stages, the exact partitioner beside an even split by layer count, then one device slowed
2x mid-run.

    python -m benchmarks.pipeline [--seconds 5] [--batch 8]

Per configuration: throughput (samples/s), speed-up over one device, and pipeline efficiency =
throughput / the throughput the plan's slowest stage allows (batch / slowest stage time). The
partitioner's slowest stage is checked against a brute-force search over every contiguous cut.
Writes .bench/pipeline.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from pathlib import Path

import grpc

from benchmarks.harness import REPO, closed_loop_run, evenflow_argv, start, write_json
from evenflow.loadtest.runner import OK, Target, binned_throughput, closed_loop, mlp_like_request
from evenflow.proto import evenflow_pb2 as ef
from evenflow.proto import evenflow_pb2_grpc as ef_grpc
from evenflow.server.models.builtin import DEFAULT_SIM_LAYER_MS

CONFIGS = (("sim:1", "optimal"), ("sim:1,sim:1", "optimal"), ("sim:1,sim:1", "even"),
           ("sim:1,sim:1,sim:1,sim:1", "optimal"), ("sim:1,sim:1,sim:1,sim:1", "even"))


def layer_cost_s(ms: float, batch: int) -> float:
    return (ms + ms / 10.0 * batch) / 1000.0  # simlayers: SimProfile(ms, ms / 10)


def brute_force_bottleneck_s(costs: list[float], speeds: list[float]) -> float:
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(costs)), len(speeds) - 1):
        bounds = [0, *cuts, len(costs)]
        best = min(best, max(sum(costs[b:e]) / s
                             for b, e, s in zip(bounds, bounds[1:], speeds, strict=False)))
    return best


async def stats(url: str) -> ef.ReplicaStats:
    async with grpc.aio.insecure_channel(url) as channel:
        response = await ef_grpc.EvenflowStatsStub(channel).GetStats(ef.GetStatsRequest())
    return response.models[0].replicas[0]


async def measure(url: str, seconds: float, concurrency: int) -> tuple[float, int, int]:
    run = await closed_loop_run(url, mlp_like_request("simlayers", "x", [1, 256]),
                                concurrency=concurrency, seconds=seconds, warmup_s=1.0)
    return run.ok_per_s, len(run.records), len(run.records) - run.ok


def server(devices: str, partition: str, batch: int, out: Path, tag: str):  # type: ignore[no-untyped-def]
    stages = len(devices.split(","))
    return start(evenflow_argv(
        "--model", "simlayers", "--devices", devices, "--pipeline-stages", str(stages),
        "--pipeline-partition", partition, "--batch-policy", "fixed", "--max-batch", str(batch),
        "--max-wait-ms", "0", "--admin", "--max-queued-requests", "100000"), out / f"{tag}.log")


async def slowdown_run(args: argparse.Namespace, costs: list[float]) -> dict:
    devices = "sim:1,sim:1,sim:1,sim:1"
    srv = server(devices, "optimal", args.batch, args.out, "pipeline_slowdown")
    target = Target(srv.url, mlp_like_request("simlayers", "x", [1, 256]))
    try:
        await closed_loop(target, concurrency=args.concurrency, duration_s=1.0)
        t0 = time.monotonic()
        run = asyncio.create_task(closed_loop(target, concurrency=args.concurrency,
                                              duration_s=3.0 + args.after_s))
        await asyncio.sleep(3.0)  # the scenario's timeline, not a synchronization
        async with grpc.aio.insecure_channel(srv.url) as channel:
            await ef_grpc.EvenflowAdminStub(channel).SetDeviceSpeed(
                ef.SetDeviceSpeedRequest(device="sim2", speed=0.5))
        records = await run
        replica = await stats(srv.url)
    finally:
        await target.close()
        srv.stop()
    series = binned_throughput(records, t0, t0 + 3.0 + args.after_s, 0.5)
    after = series[-int(3.0 / 0.5):]
    best_s = brute_force_bottleneck_s(costs, [1.0, 1.0, 0.5, 1.0])
    best_per_s = args.batch / best_s
    return {"throughput_series_per_s": series, "bin_s": 0.5, "slowed_at_s": 3.0,
            "throughput_last_3s_per_s": sum(after) / len(after), "best_possible_per_s": best_per_s,
            "ratio_to_best": sum(after) / len(after) / best_per_s,
            "sent": len(records), "lost": sum(1 for r in records if r.status != OK),
            "num_repartitions": replica.num_repartitions,
            "plan_after": [(s.device, s.first_layer, s.last_layer) for s in replica.stages]}


async def main_async(args: argparse.Namespace) -> None:
    costs = [layer_cost_s(ms, args.batch) for ms in DEFAULT_SIM_LAYER_MS]
    rows = []
    for devices, partition in CONFIGS:
        srv = server(devices, partition, args.batch, args.out, f"pipeline_{partition}_{devices}")
        try:
            throughput, sent, lost = await measure(srv.url, args.seconds, args.concurrency)
            replica = await stats(srv.url)
        finally:
            srv.stop()
        stages = len(devices.split(","))
        # One stage is a plain (unpipelined) replica: the whole chain is its "slowest stage".
        bottleneck_s = max((s.planned_s for s in replica.stages), default=sum(costs))
        best_s = brute_force_bottleneck_s(costs, [1.0] * stages)
        rows.append({"stages": stages, "partition": partition, "throughput_per_s": throughput,
                     "bound_per_s": args.batch / bottleneck_s,
                     "efficiency": throughput / (args.batch / bottleneck_s),
                     "plan_bottleneck_ms": bottleneck_s * 1000, "brute_force_ms": best_s * 1000,
                     "plan_is_best": abs(bottleneck_s - best_s) < 1e-9, "sent": sent,
                     "lost": lost,
                     "plan": [(s.device, s.first_layer, s.last_layer, s.planned_s * 1000)
                              for s in replica.stages]})
        print(f"{stages} stage(s) {partition}: {throughput:.1f} samples/s", flush=True)
    single = rows[0]["throughput_per_s"]
    print(f"\nsimlayers {list(DEFAULT_SIM_LAYER_MS)} ms (+10 %/sample), fixed batch {args.batch}")
    print(f"{'stages':>6} {'partition':>9} {'samples/s':>10} {'speed-up':>9} {'bound/s':>8} "
          f"{'effic.':>7} {'slowest ms':>11} {'brute ms':>9} {'lost':>5}")
    for row in rows:
        row["speedup"] = row["throughput_per_s"] / single
        print(f"{row['stages']:>6} {row['partition']:>9} {row['throughput_per_s']:>10.1f} "
              f"{row['speedup']:>9.2f} {row['bound_per_s']:>8.1f} {row['efficiency']:>7.3f} "
              f"{row['plan_bottleneck_ms']:>11.2f} {row['brute_force_ms']:>9.2f} "
              f"{row['lost']:>5}")
    slow = await slowdown_run(args, costs)
    print(f"\nslow-down: sim2 at speed 0.5 from t=3 s; {slow['num_repartitions']} re-partition(s),"
          f" plan after {slow['plan_after']}; last 3 s {slow['throughput_last_3s_per_s']:.1f}/s "
          f"vs best possible {slow['best_possible_per_s']:.1f}/s "
          f"({slow['ratio_to_best']:.3f}); {slow['sent']} sent, {slow['lost']} lost")
    write_json(args.out / "pipeline.json", {"layer_ms": list(DEFAULT_SIM_LAYER_MS),
                                            "batch": args.batch, "rows": rows,
                                            "slowdown": slow})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--after-s", type=float, default=7.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=96)
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
