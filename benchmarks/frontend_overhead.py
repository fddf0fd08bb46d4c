"""evenflow serving ``mlp`` on one CPU device vs a bare grpc.aio+uvloop echo server, both under
perf_analyzer (closed loop, 1-sample requests) at the same concurrencies, alternated A B A B.

A third server, ``ef-noop``, is evenflow serving a model that costs nothing (the ``sim`` model at
0 ms on a ``sim`` device, served under the name ``mlp``): the gap between it and ``echo`` is
evenflow's own per-request cost (decode, admission, routing, batching, two thread hops, encode);
the gap between it and ``evenflow`` is the model's compute competing for the same two cores.

Two more echo servers give the floor of answering asynchronously at all (``--defer``, see
``benchmarks.echo_server``): ``echo-turn`` answers the requests of a loop turn together on the
next turn, ``echo-thread`` after a worker thread has seen them (one batch in flight): what any
batching server with a thread per device pays before its own work. ``ef-noop`` over
``echo-thread`` is then evenflow's own cost alone (``/ echo-thread`` column).

``--streaming`` measures echo, echo-thread, evenflow and ef-noop over ModelStreamInfer as well
(perf_analyzer ``--streaming``: one stream per concurrency slot, one request in flight on each);
a ``+stream`` series' ratios are to the echo servers over streams.

    python -m benchmarks.frontend_overhead [--concurrency 1,16,64] [--repeats 3]

Prints infer/s, p50 and p99 (median over repeats, with min..max) and each server's throughput
over ``echo``'s and ``echo-thread``'s; writes the JSON to .bench/frontend_overhead.json.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from benchmarks.harness import (
    REPO,
    STREAM,
    PerfPoint,
    Server,
    evenflow_argv,
    median,
    perf_analyzer,
    start,
    write_json,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=3000)
    parser.add_argument("--evenflow-args", default="--max-wait-ms 2",
                        help="extra evenflow serve flags")
    parser.add_argument("--streaming", action="store_true",
                        help="measure echo, echo-thread, evenflow and ef-noop over "
                             "ModelStreamInfer too (perf_analyzer --streaming), as NAME+stream")
    parser.add_argument("--out", type=Path, default=REPO / ".bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    servers: dict[str, Server] = {
        "echo": start([sys.executable, "-m", "benchmarks.echo_server"], args.out / "echo.log"),
        "echo-turn": start([sys.executable, "-m", "benchmarks.echo_server", "--defer", "turn"],
                           args.out / "echo-turn.log"),
        "echo-thread": start([sys.executable, "-m", "benchmarks.echo_server", "--defer",
                              "thread"], args.out / "echo-thread.log"),
        "evenflow": start(evenflow_argv("--model", "mlp", "--devices", "cpu",
                                        *args.evenflow_args.split()),
                          args.out / "evenflow.log"),
        "ef-noop": start(evenflow_argv("--model", "mlp=sim", "--devices", "sim:1",
                                       "--sim-base-ms", "0", "--sim-per-sample-ms", "0",
                                       *args.evenflow_args.split()),
                         args.out / "ef-noop.log"),
    }
    # series name -> (server, over ModelStreamInfer)
    series = {name: (name, False) for name in servers}
    if args.streaming:
        series |= {f"{name}{STREAM}": (name, True)
                   for name in ("echo", "echo-thread", "evenflow", "ef-noop")}
    results: dict[str, dict[int, list[PerfPoint]]] = {n: {c: [] for c in concurrencies}
                                                      for n in series}
    cpu: dict[str, dict[int, list[float]]] = {n: {c: [] for c in concurrencies} for n in series}
    loads: list[float] = []
    try:
        for concurrency in concurrencies:
            for repeat in range(args.repeats):
                for name, (server_name, streamed) in series.items():  # A B A B: drift hits all
                    server = servers[server_name]
                    loads.append(os.getloadavg()[0])
                    cpu_before = server.cpu_s()
                    point = perf_analyzer(server.url, "mlp", concurrency, args.out,
                                          window_ms=args.window_ms,
                                          streaming=streamed)
                    cpu[name][concurrency].append(server.cpu_s() - cpu_before)
                    results[name][concurrency].append(point)
                    print(f"  {name:18s} c={concurrency:<3d} rep {repeat}: "
                          f"{point.infer_per_s:8.0f} infer/s p50 {point.p50_ms:6.2f} ms "
                          f"p99 {point.p99_ms:6.2f} ms{'' if point.stable else ' (unstable)'}",
                          flush=True)
    finally:
        for server in servers.values():
            server.stop()

    rows = []
    print(f"\n{'conc':>4} {'server':>18} {'infer/s (min..max)':>24} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'srv cpu s':>9} {'/ echo':>6} {'/ echo-thread':>13}")
    for concurrency in concurrencies:
        for name in series:
            suffix = STREAM if name.endswith(STREAM) else ""  # ratios within one transport
            echo_tput = median([p.infer_per_s for p in results["echo" + suffix][concurrency]])
            thread_tput = median([p.infer_per_s
                                  for p in results["echo-thread" + suffix][concurrency]])
            points = results[name][concurrency]
            tput = [p.infer_per_s for p in points]
            row = {"concurrency": concurrency, "server": name,
                   "infer_per_s": median(tput), "infer_per_s_min": min(tput),
                   "infer_per_s_max": max(tput),
                   "p50_ms": median([p.p50_ms for p in points]),
                   "p99_ms": median([p.p99_ms for p in points]),
                   "server_cpu_s": median(cpu[name][concurrency]),
                   "generator_cpu_s": median([p.generator_cpu_s for p in points]),
                   "all_stable": all(p.stable for p in points),
                   "ratio_vs_echo": median(tput) / echo_tput,
                   "ratio_vs_echo_thread": median(tput) / thread_tput}
            rows.append(row)
            print(f"{concurrency:>4} {name:>18} {row['infer_per_s']:>8.0f} "
                  f"({min(tput):.0f}..{max(tput):.0f}){'':>3} {row['p50_ms']:>7.2f} "
                  f"{row['p99_ms']:>7.2f} {row['server_cpu_s']:>9.1f} "
                  f"{row['ratio_vs_echo']:>6.2f} {row['ratio_vs_echo_thread']:>13.2f}"
                  f"{'' if row['all_stable'] else ' *'}")
    print("* = perf_analyzer reported an unstable window for at least one repeat")
    write_json(args.out / "frontend_overhead.json",
               {"rows": rows, "load_average_before_points": loads})


if __name__ == "__main__":
    main()
